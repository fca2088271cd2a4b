"""The closed loop over the hybrid pool (kvsim.engine.vllm_hybrid) against vLLM 0.33.0's
own ``Scheduler`` driving a full-attention + sliding-window ``KVCacheConfig``.

tests/fixtures/vllm_hybrid.json's ``closed_loop`` is bench/vllm/record_hybrid.py's recording:
8 requests (shared prefixes, decodes past the 32-token window, a pool of 30 blocks that
forces a preemption), and the same requests over full attention + Mamba ("align": the
scheduler clips prefill chunks at block boundaries); every step's scheduled tokens, admissions with hit tokens,
preemptions, finished requests and free blocks.  kvsim must match every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.engine.vllm_hybrid import HybridVllmScheduler, serve_hybrid
from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest
from kvsim.memory.hybrid import FULL, MAMBA, SLIDING_WINDOW, GroupSpec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_hybrid.json"
RECORDING = json.loads(FIXTURE.read_text())
CLOSED = RECORDING["closed_loop"]


def _setup(rec: dict):
    eng = rec["engine"]
    cfg = EngineConfig(block_size=16, num_gpu_blocks=eng["num_gpu_blocks"],
                       max_num_seqs=eng["max_num_seqs"],
                       max_num_batched_tokens=eng["max_num_batched_tokens"],
                       max_model_len=eng["max_model_len"],
                       scheduler_reserve_full_isl=eng["scheduler_reserve_full_isl"])
    groups = [GroupSpec(g["kind"], g["block_size"], g.get("sliding_window", 0))
              for g in rec["groups"]]
    reqs = []
    for i, r in enumerate(rec["requests"]):
        toks = list(r["prompt"]) + [rec["output_base"] + 1000 * i + k
                                    for k in range(r["output_len"])]
        reqs.append(SimRequest(idx=i, request_id=str(i), all_tokens=toks,
                               prompt_len=len(r["prompt"]), output_len=r["output_len"]))
    return cfg, groups, reqs


@pytest.mark.parametrize("name", ["closed_loop", "closed_loop_mamba"])
def test_closed_loop_matches_vllm_scheduler_step_by_step(name):
    rec = RECORDING[name]
    cfg, groups, reqs = _setup(rec)
    sched = HybridVllmScheduler(cfg, groups)
    for r in reqs:
        sched.add_request(r)
    got = []
    for _ in rec["steps"]:
        res = sched.step()
        got.append({"sched": [list(x) for x in res.sched],
                    "new": sorted(list(x) for x in res.new + res.resumed),
                    "preempted": res.preempted, "free_sched": res.free_sched,
                    "finished": sorted(res.finished), "free_blocks": res.free_blocks})
    want = [{**s, "new": sorted(s["new"])} for s in rec["steps"]]
    assert got == want
    assert not sched.has_requests()
    # the sliding-window recording exercises a preemption
    assert sum(len(s["preempted"]) for s in want) == (1 if name == "closed_loop" else 0)


def test_serve_hybrid_summary():
    cfg, groups, reqs = _setup(CLOSED)
    out = serve_hybrid(cfg, groups, reqs)
    # vLLM's has_requests() holds one more, empty step (finished ids still to report)
    assert out.steps == sum(1 for s in CLOSED["steps"] if s["sched"]) == len(CLOSED["steps"]) - 1
    assert out.finished == len(reqs) and out.preemptions == 1
    # first admissions' hits, as vLLM reported them
    first = {}
    for s in CLOSED["steps"]:
        for i, hit in s["new"]:
            first.setdefault(i, hit)
    assert out.hit_tokens == first
    assert out.freed_by_window > 0


def test_sliding_window_lets_more_requests_run_than_full_attention():
    # the same pool and requests, every layer group full attention: blocks outside the
    # window are never freed, so fewer requests run at once and more steps are needed
    cfg, groups, reqs = _setup(CLOSED)
    hybrid = serve_hybrid(cfg, groups, reqs)
    cfg, _, reqs = _setup(CLOSED)
    full = serve_hybrid(cfg, [GroupSpec(FULL, 16), GroupSpec(FULL, 16)], reqs)
    assert hybrid.steps < full.steps
    assert full.freed_by_window == 0


def test_mamba_prefill_chunks_end_on_block_boundaries():
    # vLLM's _mamba_block_aligned_split: request 0 (84-token prompt) gets 64 tokens, then
    # 16 (to the boundary at 80) where the sliding-window run gave it the remaining 20
    mamba = RECORDING["closed_loop_mamba"]["steps"]
    assert mamba[0]["sched"] == [[0, 64]] and mamba[1]["sched"][0] == [0, 16]
    assert CLOSED["steps"][1]["sched"][0] == [0, 20]
    cfg, groups, reqs = _setup(RECORDING["closed_loop_mamba"])
    assert [g.kind for g in groups] == [FULL, MAMBA]
    sched = HybridVllmScheduler(cfg, groups)
    r = reqs[0]
    sched.add_request(r)
    assert sched._clip_prefill(r, 84, 0) == 80   # not past the last boundary before 84
    assert sched._clip_prefill(r, 50, 0) == 48   # a chunk short of the end: aligned
    r.num_computed = 40
    assert sched._clip_prefill(r, 30, 0) == 8    # starting mid-block: to the boundary


def test_mamba_block_size_must_be_the_engines():
    cfg, _, _ = _setup(CLOSED)
    with pytest.raises(ValueError, match="block size"):
        HybridVllmScheduler(cfg, [GroupSpec(FULL, 16), GroupSpec(MAMBA, 32)])
    assert SLIDING_WINDOW


SINGLE = ["agentic_0505", "overload", "chunked_prefill", "priority", "reset",
          "multiturn_output_reuse", "preempt_heavy", "overload_noreserve", "overload_watermark"]


@pytest.mark.parametrize("name", SINGLE)
def test_one_full_group_agrees_with_every_scheduler_recording(name, monkeypatch):
    """The hybrid pool with one full-attention group is vLLM's plain KVCacheManager: over
    the recordings of vLLM's scheduler (tests/fixtures/vllm_sched; the salted one left out,
    the hybrid pool does not salt) every step agrees on every field but the KV events,
    which the hybrid closed loop does not emit."""
    import kvsim.analysis.sched_validate as sv

    monkeypatch.setattr(sv, "VllmScheduler", lambda cfg, pool, max_seqs: HybridVllmScheduler(
        cfg, [GroupSpec(FULL, cfg.block_size)], max_seqs))
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_sched"
    r = sv.validate_sched(fixtures / f"{name}.jsonl.gz", engine="python", pool="reference")
    assert r.steps_vllm == r.steps_kvsim
    for f in sv.FIELDS:
        if f != "events":
            assert r.agreement(f) == 1.0, f


def test_simulate_warns_that_its_pool_treats_a_hybrid_model_alike():
    from kvsim.analysis.sizing import hybrid_warning

    assert hybrid_warning("llama-3.1-8b") is None
    assert hybrid_warning("deepseek-v3") is None          # MLA: one full-attention group
    w = hybrid_warning("gpt-oss-20b")
    assert w["code"] == "hybrid_model" and "12 sliding-window layers (128 tokens)" in w["message"]
    w = hybrid_warning("qwen3-next-80b-a3b")
    assert "36 linear-attention layers" in w["message"]
