"""The closed loop over the hybrid pool (kvsim.modes.closed.hybrid_serve): requests arriving
over time, the step clock, per-group figures.

* Against vLLM 0.33.0's real ``Scheduler`` with requests added between steps
  (tests/fixtures/vllm_hybrid.json ``staggered``: full attention + a 32-token sliding
  window, 3 preemptions; ``staggered_mamba``: full attention + Mamba "align"; recorded by
  bench/vllm/record_hybrid.py): kvsim's closed loop, one step = 1 ms (a fitted timing
  profile with a = 1 ms), request i arriving at ``arrive_steps[i]`` ms, must schedule the
  same tokens, admit with the same hits, preempt and finish the same requests and leave the
  same free blocks, step by step.
* With one full-attention group it is the compiled closed loop: same TTFT, e2e, hits and
  lookups per request, same steps and preemptions.
* ``kvsim simulate --model gpt-oss-20b`` serves through it (per-group keys in ``--json``);
  options it does not model are refused with one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.ingest import read_requests
from kvsim.memory.hybrid import FULL, GroupSpec, chain_hashes
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.hybrid_serve import serve_hybrid_trace
from kvsim.spec.sim_config import SimConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_hybrid.json"
RECORDING = json.loads(FIXTURE.read_text())
BS = 16


def _one_ms_profile(tmp_path: Path) -> Path:
    p = tmp_path / "one_ms.toml"
    p.write_text('schema = "kvsim.timing.fitted/1"\nmodel = ""\ngpu = ""\n[fit]\n'
                 "a_ms = 1.0\nb_ms_per_prefill_token = 0.0\nc_ms_per_decode_seq = 0.0\n"
                 "d_ms_per_context_token = 0.0\n")
    return p


def _mooncake(tmp_path: Path, rows: list[tuple[int, int, int]]) -> Path:
    """A Mooncake JSONL of (timestamp ms, input, output) rows, ids unique per request."""
    p = tmp_path / "t.jsonl"
    with p.open("w") as f:
        for i, (t, n, o) in enumerate(rows):
            ids = [100000 * (i + 1) + k for k in range(-(-n // 512))]
            f.write(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                "hash_ids": ids}) + "\n")
    return p


@pytest.mark.parametrize("name", ["staggered", "staggered_mamba"])
def test_closed_loop_with_arrivals_matches_vllm_scheduler(tmp_path, name):
    rec = RECORDING[name]
    eng = rec["engine"]
    reqs = rec["requests"]
    arrive = rec["arrive_steps"]
    table = read_requests(_mooncake(tmp_path, [(a, len(r["prompt"]), r["output_len"])
                                               for a, r in zip(arrive, reqs)]))
    # the recording's tokens are known: hashes of prompt + outputs, as vLLM keys them
    hoff = [0]
    hh: list[int] = []
    for i, r in enumerate(reqs):
        toks = list(r["prompt"]) + [rec["output_base"] + 1000 * i + k
                                    for k in range(r["output_len"])]
        hh += [h & ((1 << 63) - 1) for h in chain_hashes(toks, BS)]  # int64, still odd
        hoff.append(len(hh))
    groups = [GroupSpec(g["kind"], g["block_size"], g.get("sliding_window", 0))
              for g in rec["groups"]]
    config = SimConfig(model="llama-3.1-8b", hbm_blocks=eng["num_gpu_blocks"] - 1,
                       dram_gb=0, cxl_gb=0, nvme_gb=0)
    opts = EngineOptions(model="llama-3.1-8b", max_num_seqs=eng["max_num_seqs"],
                         max_num_batched_tokens=eng["max_num_batched_tokens"],
                         watermark=0.0, timing=str(_one_ms_profile(tmp_path)))
    got = []
    out = serve_hybrid_trace(
        table, config, opts, groups=groups, block_bytes=1,
        hashes=(np.asarray(hoff, np.int64), np.asarray(hh, np.int64)),
        on_step=lambda res: got.append({
            "sched": [list(x) for x in res.sched],
            "new": sorted(list(x) for x in res.new + res.resumed),
            "preempted": res.preempted, "free_sched": res.free_sched,
            "finished": sorted(res.finished), "free_blocks": res.free_blocks}))
    want = [{**s, "new": sorted(s["new"])} for s in rec["steps"]]
    # vLLM's has_requests() holds one more, empty step (finished ids still to report)
    assert want[-1]["sched"] == [] and got == want[:-1]
    s = out.summary
    assert s["steps"] == len(want) - 1
    assert s["preemptions"] == sum(len(x["preempted"]) for x in want)
    assert s["preemptions"] == (3 if name == "staggered" else 0)
    assert s["requests"] == len(reqs) and s["dropped_requests"] == 0
    # the clock: one step = 1 ms, arrivals at their step
    assert s["makespan_us"] == 1000.0 * (len(want) - 1)
    admitted = {}  # admit_us: the last admission (a resumption after a preemption)
    for k, st in enumerate(want):
        for i, _ in st["new"]:
            admitted[i] = 1000.0 * k
    assert out.requests["admit_us"].tolist() == [admitted[i] for i in range(len(reqs))]
    # per group: every held block released at the end; the window / Mamba group freed blocks
    assert s["hybrid_held_blocks_peak"][0] > 0
    assert all(r["freed_blocks"] > 0 for r in s["group_rows"] if r["kind"] != FULL)
    first_hits = {}
    for st in want:
        for i, hit in st["new"]:
            first_hits.setdefault(i, hit)
    assert sum(first_hits.values()) > 0
    assert s["hybrid_hit_blocks"][0] > 0


def test_one_full_group_is_the_compiled_closed_loop(tmp_path):
    """Shared prefixes, arrivals over time and a pool small enough to preempt: with one
    full-attention group the hybrid loop and the compiled loop agree exactly."""
    from kvsim.engine.engine_model import build_cost_model
    from kvsim.modes.closed.cluster import serve

    rng = np.random.default_rng(7)
    rows, lines = [], []
    t = 0
    for i in range(40):
        t += int(rng.integers(0, 60))
        n = int(rng.integers(300, 3000))
        shared = int(rng.integers(0, 3))  # 0-2 blocks of 512 from a common prefix
        ids = list(range(shared)) + [1000 * (i + 1) + k for k in range(-(-n // 512) - shared)]
        lines.append(json.dumps({"timestamp": t, "input_length": n,
                                 "output_length": int(rng.integers(50, 600)),
                                 "hash_ids": ids[:max(-(-n // 512), 1)]}))
        rows.append(n)
    p = tmp_path / "m.jsonl"
    p.write_text("\n".join(lines) + "\n")
    table = read_requests(p)
    model = "llama-3.1-8b"
    config = SimConfig(model=model, hbm_blocks=320, dram_gb=0, cxl_gb=0, nvme_gb=0)
    opts = EngineOptions(model=model, hybrid_pool="off")
    cost = build_cost_model(model, config.hardware)
    a = serve_hybrid_trace(table, config, opts, groups=[GroupSpec(FULL, 16)],
                           block_bytes=cost.block_bytes)
    b = serve(table, "lru", config, engine=opts)
    ra, rb = a.requests, b.requests
    assert b.summary["preemptions"] > 0  # the case exercises preemption
    assert a.summary["preemptions"] == b.summary["preemptions"]
    assert a.summary["steps"] == b.summary["steps"]
    for c in ("arrival_us", "admit_us", "ttft_us", "e2e_us", "lookup_tokens",
              "hbm_hit_tokens", "preemptions"):
        assert np.array_equal(ra[c].to_numpy(np.float64), rb[c].to_numpy(np.float64),
                              equal_nan=True), c
    # outputs and TPOT, preempted requests included: a resumed request's recompute samples
    # its next token (vLLM), which the compiled loop once left uncounted (500 of 501)
    want = table.df.set_index("request_id").loc[rb["request_id"], "output_tokens"].to_numpy()
    assert np.array_equal(rb["output_tokens"].to_numpy(), want)
    assert np.array_equal(ra["output_tokens"].to_numpy(), want)
    assert np.array_equal(ra["tpot_us"].to_numpy(), rb["tpot_us"].to_numpy(), equal_nan=True)
    assert a.summary["hbm_hit_rate"] == b.summary["hbm_hit_rate"]
    assert a.summary["ttft_p99_us"] == b.summary["ttft_p99_us"]


def test_simulate_gpt_oss_serves_through_the_hybrid_pool(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    p = _mooncake(tmp_path, [(k * 50, 1500 + 100 * k, 40) for k in range(6)])
    runner = CliRunner()
    r = runner.invoke(app, ["simulate", "--request-trace", str(p), "--model", "gpt-oss-20b",
                            "--hbm-gb", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    s = out["policies"][0]
    assert s["hybrid_pool"] is True and s["requests"] == 6
    assert s["hybrid_groups"] == ["full/16", "sliding_window(128)/16"]
    assert s["hybrid_window_freed_blocks"] > 0 and s["hybrid_freed_blocks"][0] == 0
    assert s["hbm_pool_blocks"] == 10 ** 9 // s["hybrid_block_bytes"]
    assert "hybrid_pool_hbm_only" in [w["code"] for w in out["warnings"]]
    assert "hybrid_model" not in [w["code"] for w in out["warnings"]]
    # an option the hybrid loop does not model: one line, exit 2
    for extra, option in ((["--dram-gb", "10"], "--dram-gb"), (["--replicas", "2"],
                                                               "--replicas"),
                          (["--policy", "s3fifo"], "--policy")):
        r = runner.invoke(app, ["simulate", "--request-trace", str(p), "--model",
                                "gpt-oss-20b", "--hbm-gb", "1", *extra])
        assert r.exit_code == 2, r.output
        assert option in r.output and "--hybrid-pool off" in r.output
