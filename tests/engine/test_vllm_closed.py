"""vLLM's scheduler inside kvsim's closed loop (EngineOptions(scheduler="vllm"),
kvsim.engine.vllm_rows): every committed recording of vLLM 0.33's own scheduler replayed
through the real closed loop (policy lru, HBM only, the recording's engine config and step
clock) agrees on every step: scheduled set and tokens, preemptions, admissions with their
hit tokens, finished requests, the KV manager's events, and the replay's own free HBM
blocks.  The replay counts vLLM's preemptions itself and finds every hit the scheduler
assumed (no lost hit tokens)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvsim.analysis.sched_closed import validate_sched_closed
from kvsim.core.errors import KvsimInputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_sched"
#: every recording but mooncake200 (slow, below); ``reset`` replays vLLM's
#: reset_prefix_cache() calls (Engine.set_resets; refused before)
CLOSED = ["chunked_prefill", "overload", "preempt_heavy", "priority", "salted_tenants",
          "multiturn_output_reuse", "overload_noreserve", "overload_watermark", "agentic_0505",
          "reset"]


def _summary(name: str) -> dict:
    with gzip.open(FIXTURES / f"{name}.jsonl.gz", "rt") as fh:
        for line in fh:
            d = json.loads(line)
            if d["kind"] == "summary":
                return d
    raise AssertionError("no summary")


def _check(name: str) -> None:
    r = validate_sched_closed(FIXTURES / f"{name}.jsonl.gz")
    s = _summary(name)
    assert r.first_divergence is None, r.first_divergence.describe()
    assert r.steps_vllm == r.steps_kvsim == r.replay["steps"]
    for f, n in r.agree.items():
        assert n == r.steps, f
    assert r.preemptions == {"vllm": s["preemptions"], "kvsim": s["preemptions"]}
    assert r.replay["preemptions"] == s["preemptions"]
    assert r.replay["lost_hit_tokens"] == 0
    assert r.hit_tokens["new"] == {"vllm": s["new_hit_tokens"], "kvsim": s["new_hit_tokens"]}
    assert r.hit_tokens["resumed"] == {"vllm": s["resumed_hit_tokens"],
                                       "kvsim": s["resumed_hit_tokens"]}


@pytest.mark.parametrize("name", CLOSED)
def test_closed_loop_agrees_with_vllm_every_step(name):
    _check(name)


@pytest.mark.slow
def test_mooncake200_closed_loop_preempts_7_times():
    """The issue's overload: 200 Mooncake requests at real lengths, 10,000 usable blocks;
    vLLM preempts 7 times, and so does the closed loop (it reported 0 before)."""
    _check("mooncake200")


def test_closed_loop_preempts_where_vllm_preempts():
    """overload served by the closed loop's API (kvsim.modes.closed.cluster.serve) with
    vLLM's scheduler: 23 recompute preemptions, as vLLM made.  kvsim's own scheduler never
    preempts (decodes wait for a block); its deadlock breaker forces decodes over the
    budget and the replay then preempts 16 times.  Fails on main (no scheduler option)."""
    import tempfile

    from kvsim.analysis.sched_closed import _clock_profile, _table
    from kvsim.analysis.sched_validate import build_requests
    from kvsim.ingest.vllm_sched import load_sched_recording
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    rec = load_sched_recording(FIXTURES / "overload.jsonl.gz")
    eng = rec.engine
    table, _ = _table(rec, build_requests(rec))
    config = SimConfig(mode="engine", hbm_blocks=int(eng["num_gpu_blocks"]) - 1, dram_gb=0,
                       cxl_gb=0, nvme_gb=0)
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scheduler in ("vllm", "kvsim"):
            opts = EngineOptions(block_size_tokens=rec.block_size,
                                 max_num_seqs=int(eng["max_num_seqs"]),
                                 max_num_batched_tokens=int(eng["max_num_batched_tokens"]),
                                 timing=str(_clock_profile(rec, Path(tmp))),
                                 scheduler=scheduler, watermark=0.0)
            got[scheduler] = serve(table, "lru", config, engine=opts).summary["preemptions"]
    assert got == {"vllm": 23, "kvsim": 16}


def test_reset_recording_replays_every_reset():
    """vLLM's reset_prefix_cache() through the closed loop (refused before: 'the closed
    loop does not replay resets'): refused at step 3 (requests hold blocks), forced at
    step 25 with reset_running_requests (its 2 preemptions, then the clear), accepted
    when idle before request 8 arrives: outcomes [False], [True], [True] on their steps,
    2 clears, and the replay's pool keeps vLLM's free blocks and hits after each (1,088
    new and 128 resumed hit tokens, none lost: request 8 hits nothing)."""
    r = validate_sched_closed(FIXTURES / "reset.jsonl.gz")
    assert r.first_divergence is None, r.first_divergence.describe()
    assert r.agree["reset"] == r.agree["free"] == r.steps == 66
    assert r.replay["preemptions"] == 2 and r.replay["lost_hit_tokens"] == 0
    assert r.hit_tokens == {"new": {"vllm": 1088, "kvsim": 1088},
                            "resumed": {"vllm": 128, "kvsim": 128}}


def test_resets_need_vllms_scheduler():
    """Engine.set_resets with kvsim's scheduler, or a reset that names no step and no
    request: one line naming the option."""
    from kvsim.engine.vllm_rows import reset_table

    with pytest.raises(KvsimInputError, match="before_arrival_of"):
        reset_table([{"do": "reset_prefix_cache"}], 4)
    with pytest.raises(KvsimInputError, match="request row in 0..3"):
        reset_table([{"before_arrival_of": 4}], 4)
    e = _engine("kvsim")
    with pytest.raises(KvsimInputError, match="--scheduler vllm"):
        e.set_resets([{"at_step": 0}])


def _engine(scheduler):
    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    table = build_request_table({"arrival_us": [0, 1_000_000], "prompt_tokens": [64, 64],
                                 "output_tokens": [4, 4], "block_ids": [[1, 2, 3, 4]] * 2,
                                 "hashed_tokens": [64, 64]}, block_size_tokens=16)
    config = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0)
    opts = EngineOptions(scheduler=scheduler)
    cost, hbm_blocks, costs, block_bytes, off, ids, table2, _ = prepare(table, config, opts)
    e = Engine(table2, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks,
               costs, block_bytes)
    e.set_block_facts(block_facts(table2, off, ids, opts.block_size_tokens))
    return e


@pytest.mark.parametrize("resets,saved", [([], 48), ([{"before_arrival_of": 1}], 0),
                                          ([{"at_step": 1}], 48)])
def test_a_reset_while_idle_empties_the_replays_cache(resets, saved):
    """Two identical 64-token prompts 1 s apart: the second hits 48 tokens (3 blocks; the
    last token is always computed).  A reset before it arrives (the engine is idle, so it
    succeeds) leaves the replay's HBM pool nothing to hit: 0, and no lost hit tokens
    (the scheduler assumed none either).  A reset at step 1 (request 0 still runs) is
    refused, as vLLM refuses it: 48."""
    e = _engine("vllm")
    if resets:
        e.set_resets(resets)
    e.advance()
    e.finish()
    assert e.lost_hit_tokens == 0
    assert _saved(e) == saved


def _saved(e):
    from kvsim.core import layout as L

    return int(sum(e.run.C[L.M_HIT_TOK + t] for t in range(4)))


def test_unmodelled_features_are_refused():
    """n > 1 with scheduler vllm: one line naming --scheduler."""
    import numpy as np

    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    table = build_request_table({"arrival_us": [0, 10], "prompt_tokens": [32, 32],
                                 "output_tokens": [4, 4], "block_ids": [[1, 2], [1, 2]],
                                 "hashed_tokens": [32, 32], "n": [1, 2]},
                                block_size_tokens=16)
    with pytest.raises(KvsimInputError, match="--scheduler vllm does not model n > 1"):
        serve(table, "lru", SimConfig(mode="engine", hbm_blocks=64),
              engine=EngineOptions(scheduler="vllm"))
    assert np.all(table.df["n"].to_numpy() >= 1)


def test_cli_closed_loop_json():
    from typer.testing import CliRunner

    from kvsim.cli import app
    res = CliRunner().invoke(app, ["validate", "--sched-recording",
                                   str(FIXTURES / "priority.jsonl.gz"), "--closed-loop",
                                   "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.stdout)
    assert j["engine"] == "closed-loop" and j["first_divergence"] is None
    assert j["agreement"]["sched"] == 1.0 and j["agreement"]["free"] == 1.0
    assert j["preemptions"] == {"vllm": 3, "kvsim": 3} and j["replay"]["preemptions"] == 3


def test_lower_tier_hits_count_as_loaded():
    """A 64-block prefix evicted from a 100-block HBM by a 90-block prompt comes back from
    DRAM: with DRAM on, vLLM's scheduler counts the chain continued there as computed
    (vLLM's KV-connector tokens) and the replay promotes it: the same 1,024 prefill
    tokens saved and 55 promotions as kvsim's scheduler, none lost."""
    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    pre = list(range(1, 65))
    table = build_request_table(
        {"arrival_us": [0, 2_000_000, 60_000_000], "prompt_tokens": [1032, 1440, 1032],
         "output_tokens": [4, 4, 4], "block_ids": [pre + [999], list(range(5000, 5090)),
                                                    pre + [998]],
         "hashed_tokens": [1024, 1440, 1024]}, block_size_tokens=16)
    got = {}
    for sched in ("kvsim", "vllm"):
        for dram in (0, 1):
            s = serve(table, "lru", SimConfig(mode="engine", hbm_blocks=100, dram_gb=dram,
                                              cxl_gb=0, nvme_gb=0),
                      engine=EngineOptions(scheduler=sched)).summary
            got[sched, dram] = (s["prefill_tokens_saved"], s["promotions"],
                                s["lost_hit_tokens"])
    assert got[("vllm", 0)] == got[("kvsim", 0)] == (144, 0, 0)
    assert got[("vllm", 1)] == got[("kvsim", 1)] == (1024, 55, 0)


def test_cli_scheduler_option_is_checked():
    from typer.testing import CliRunner

    from kvsim.cli import app
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--profile", "deadline_pressure", "--requests", "4",
                              "--schedule", "recorded", "--scheduler", "vllm"])
    assert res.exit_code == 2 and "--scheduler" in res.output
    res = runner.invoke(app, ["compare", "--profile", "deadline_pressure", "--requests", "4",
                              "--scheduler", "foo"])
    assert res.exit_code == 2 and "auto | vllm | kvsim" in res.output
