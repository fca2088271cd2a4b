"""kvsim's engine step function (kvsim.engine.vllm_scheduler) against vLLM 0.33.0's own v1
scheduler, step by step, on every committed recording (tests/fixtures/vllm_sched,
docs/vllm-recordings.md).  vLLM is not needed: the recordings hold what it did.

Every fixture must agree on every step and every compared field: scheduled set and token
counts (in order), block ids, prefix hits, preemptions (in order), finished requests,
free blocks after schedule() and after the step, KV events by content, reset outcomes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvsim.analysis.sched_validate import FIELDS, validate_sched
from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest, VllmScheduler, chain_hashes
from kvsim.ingest.vllm_sched import load_sched_recording

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_sched"
FAST = ["agentic_0505", "overload", "chunked_prefill", "priority", "salted_tenants", "reset",
        "multiturn_output_reuse", "preempt_heavy",
        # overload with scheduler_reserve_full_isl false / watermark 0.05 (specs/)
        "overload_noreserve", "overload_watermark",
        # speculative decoding: n-gram, k = 3, acceptance 0.7 (kvsim.engine.vllm_spec)
        "spec_decode"]


def _summary(name: str) -> dict:
    with gzip.open(FIXTURES / f"{name}.jsonl.gz", "rt") as fh:
        for line in fh:
            d = json.loads(line)
            if d["kind"] == "summary":
                return d
    raise AssertionError("no summary")


#: (step function, pool): the compiled port (what the closed loop runs) and its witness,
#: the plain-Python port, over the compiled pool and the plain-Python reference pool
ENGINES = [("compiled", "fast"), ("python", "fast"), ("python", "reference")]


def _check_full_agreement(name: str, engine: str = "compiled", pool: str = "fast") -> None:
    r = validate_sched(FIXTURES / f"{name}.jsonl.gz", pool=pool, engine=engine)
    s = _summary(name)
    assert r.first_divergence is None, r.first_divergence.describe()
    assert r.steps_vllm == r.steps_kvsim == s["steps"]
    for f in FIELDS:
        assert r.agreement(f) == 1.0, f
    assert r.preemptions == {"vllm": s["preemptions"], "kvsim": s["preemptions"]}
    assert r.hit_tokens["new"] == {"vllm": s["new_hit_tokens"], "kvsim": s["new_hit_tokens"]}
    assert r.hit_tokens["resumed"] == {"vllm": s["resumed_hit_tokens"],
                                       "kvsim": s["resumed_hit_tokens"]}
    assert r.events["stored_blocks"]["kvsim"] == s["stored_blocks"]
    assert r.events["removed_blocks"]["kvsim"] == s["removed_blocks"]
    assert r.events["cleared"]["kvsim"] == s["cleared"]


@pytest.mark.parametrize(("engine", "pool"), ENGINES)
@pytest.mark.parametrize("name", FAST)
def test_fixture_agrees_step_by_step(name, engine, pool):
    """The compiled step function, and the Python one over the compiled pool of the replay
    and over its plain-Python twin."""
    _check_full_agreement(name, engine, pool)


def test_mooncake200_agrees_and_preempts_7_times_compiled():
    """8,326 steps, 7 preemptions, 101,888 hit tokens at first admission and 57,008 at
    resume: all equal, every step (the compiled step function: ~2 s)."""
    _check_full_agreement("mooncake200")


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["fast", "reference"])
def test_mooncake200_agrees_and_preempts_7_times(pool):
    """The same with the plain-Python step function (~15 s each)."""
    _check_full_agreement("mooncake200", "python", pool)


# ---- the divergences of issue #32, each pinned on a fixture --------------------------
def _first_steps(name: str, n: int, **over):
    """Run the step function over the first n recorded steps; -> (recording, results)."""
    rec = load_sched_recording(FIXTURES / f"{name}.jsonl.gz")
    from kvsim.analysis.sched_validate import build_requests
    sched = VllmScheduler(EngineConfig.from_recording({**rec.engine, **over}))
    reqs = build_requests(rec)
    out = []
    for s in rec.steps[:n]:
        for i in s.get("arrived", []):
            sched.add_request(reqs[i])
        out.append(sched.step())
    return rec, out


def test_preemption_happens_where_vllm_preempts():
    """overload: a running request that cannot grow preempts the last running request
    (recompute), and nothing is admitted in that step."""
    rec, res = _first_steps("overload", 600)
    steps = [k for k, r in enumerate(res) if r.preempted]
    assert steps == [k for k, s in enumerate(rec.steps) if s.get("preempted")]
    for k in steps:
        assert not res[k].new and not res[k].resumed


def test_priority_victim_is_first_max():
    rec, res = _first_steps("priority", 84)
    got = [i for r in res for i in r.preempted]
    assert got == [i for s in rec.steps for i in s.get("preempted", [])]
    assert len(got) == 3


def test_cache_salt_is_first_block_extra_key():
    """salted_tenants: tenants with the same prompts hit only their own blocks; the
    unsalted request hits neither tenant."""
    assert chain_hashes(list(range(32)), 16, "a")[0] != chain_hashes(list(range(32)), 16, None)[0]
    rec, res = _first_steps("salted_tenants", 62)
    hits = {i: h for r in res for i, h in r.new}
    assert hits == {i: h for s in rec.steps for i, h in s.get("new", [])}
    assert sum(hits.values()) == 1024


def test_reset_prefix_cache_is_replayed():
    r = validate_sched(FIXTURES / "reset.jsonl.gz")
    assert r.events["cleared"] == {"vllm": 2, "kvsim": 2}
    assert r.agreement("reset") == 1.0


def test_output_blocks_are_cached_and_hit():
    """multiturn_output_reuse: turn 2's prompt holds turn 1's output; it hits 48 tokens
    (3 full blocks, one of them output tokens)."""
    rec, res = _first_steps("multiturn_output_reuse", 65)
    hits = [h for r in res for _, h in r.new]
    assert hits == [h for s in rec.steps for _, h in s.get("new", [])]
    assert 48 in hits


def test_hit_is_capped_at_num_tokens_minus_one():
    """A block-aligned prompt sent again hits all but its last block (no dedup)."""
    sched = VllmScheduler(EngineConfig(num_gpu_blocks=20, max_num_seqs=4,
                                       max_num_batched_tokens=256))
    toks = list(range(1, 65))
    for i in range(2):
        sched.add_request(SimRequest(idx=i, request_id=f"{i:05d}", all_tokens=toks + [9, 9],
                                     prompt_len=64, output_len=2))
        while sched.has_requests():
            res = sched.step()
            if res.new:
                assert res.new == [(i, 0 if i == 0 else 48)]


def test_reserve_full_isl_changes_mooncake_like_admission():
    """Without scheduler_reserve_full_isl vLLM preempts far more (docs: 102 vs 7 on
    mooncake200); on overload the recorded run then diverges at step 60, where vLLM
    waits for request 8's whole prompt to fit and the first-chunk rule admits it."""
    r = validate_sched(FIXTURES / "overload.jsonl.gz",
                       engine_overrides={"scheduler_reserve_full_isl": False})
    d = r.first_divergence
    assert (d.step, d.field, d.requests) == (60, "sched", [8])
    assert (8, 15) in d.kvsim and all(i != 8 for i, _ in d.vllm)
    assert r.step_agreement < 1.0


def test_divergence_names_step_request_and_field(tmp_path):
    """A recording altered at one step: validate reports that step, the field, the
    request and both values."""
    src = FIXTURES / "preempt_heavy.jsonl.gz"
    lines = gzip.open(src, "rt").read().splitlines()
    out = []
    changed = None
    for line in lines:
        d = json.loads(line)
        if d["kind"] == "step" and changed is None and d.get("preempted"):
            changed = d["step"]
            victim = d["preempted"][0]
            d["preempted"] = []
            line = json.dumps(d)
        out.append(line)
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as fh:
        fh.write("\n".join(out) + "\n")
    r = validate_sched(bad)
    d = r.first_divergence
    assert (d.step, d.field, d.requests) == (changed, "preempted", [victim])
    assert d.vllm == [] and d.kvsim == [victim]
    assert "step" in d.describe()
    assert r.preemption_agreement < 1.0 and r.step_agreement == 1.0


def test_unknown_schema_version_is_rejected(tmp_path):
    from kvsim.core.errors import KvsimInputError
    p = tmp_path / "v2.jsonl"
    p.write_text(json.dumps({"kind": "header", "schema": "kvsim-vllm-sched",
                             "version": 2}) + "\n")
    with pytest.raises(KvsimInputError, match="version 2"):
        load_sched_recording(p)


def test_cli_sched_recording_table_and_json():
    from typer.testing import CliRunner

    from kvsim.cli import app
    runner = CliRunner()
    path = str(FIXTURES / "priority.jsonl.gz")
    res = runner.invoke(app, ["validate", "--sched-recording", path, "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.stdout)
    assert j["agreement"]["sched"] == 1.0 and j["agreement"]["events"] == 1.0
    assert j["preemptions"] == {"vllm": 3, "kvsim": 3}
    assert j["first_divergence"] is None
    res = runner.invoke(app, ["validate", "--sched-recording", path])
    assert res.exit_code == 0 and "no divergence" in res.stdout
    assert "preemption agreement" in res.stdout
    res = runner.invoke(app, ["validate", "--sched-recording", path, "--events", path])
    assert res.exit_code != 0 and "exactly one" in res.output
