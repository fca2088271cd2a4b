"""Issue #33: answers a user can trust.  One-line refusals (exit 2) for an event file with
replicas or a router, for a request trace given as --trace, for requests over the model's
context; sizing, warnings and the verdict object (docs/simulate.md, "Sizing", "Warnings",
"Verdict", "Bounds")."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.results.compare_view import label_bounds, verdict_info
from kvsim.results.warnings import result_warnings

runner = CliRunner()


def _mooncake(path, n=6, prompt=600, out=20, gap_us=1_000_000):
    with open(path, "w") as f:
        for i in range(n):
            blocks = list(range((prompt + 511) // 512))
            f.write(json.dumps({"timestamp": i * gap_us // 1000, "input_length": prompt,
                                "output_length": out, "hash_ids": blocks}) + "\n")
    return path


@pytest.mark.parametrize("extra", [["--replicas", "8"], ["--router", "prefix"]])
def test_event_file_cannot_be_rerouted(tmp_path, extra):
    ev = tmp_path / "e.parquet"
    ev.write_bytes(b"")
    res = runner.invoke(app, ["compare", "--trace", str(ev), *extra])
    assert res.exit_code == 2
    assert "--request-trace" in res.output and "recorded schedule" in res.output


def test_request_trace_given_as_trace_points_to_request_trace(tmp_path):
    f = _mooncake(tmp_path / "m.jsonl")
    res = runner.invoke(app, ["compare", "--trace", str(f)])
    assert res.exit_code == 2
    assert "--request-trace" in res.output and "request trace" in res.output


def test_requests_over_context_are_refused_then_dropped(tmp_path):
    f = _mooncake(tmp_path / "m.jsonl", prompt=9000)
    res = runner.invoke(app, ["compare", "--request-trace", str(f), "--policies", "lru"])
    assert res.exit_code == 2
    assert "6 of 6 requests exceed llama-3-8b's context of 8,192 tokens" in res.output
    assert "--drop-over-context" in res.output


def test_sizing_proposes_replicas():
    from kvsim.analysis.sizing import TARGET_UTILISATION, estimate_load
    from kvsim.ingest.requests import RequestTable

    n = 200
    df = pd.DataFrame({"request_id": np.arange(n), "arrival_us": np.arange(n) * 1000,
                       "prompt_tokens": np.full(n, 4096), "output_tokens": np.full(n, 100),
                       "block_ids": [[i * 100 + k for k in range(8)] for i in range(n)]})
    load = estimate_load(RequestTable(df, 512), "llama-3-8b", "h100-sxm", 256, 8192)
    assert load.prefill_tokens == n * 4096 and load.utilisation > 1
    assert load.replicas == int(np.ceil(load.busy_upper_s / (load.span_s
                                                            * TARGET_UTILISATION)))
    assert load.busy_upper_s == pytest.approx(load.busy_s)  # no reuse: the two agree
    assert load.decode_batch == 256
    same = df.assign(block_ids=[[k for k in range(8)] for _ in range(n)])
    reuse = estimate_load(RequestTable(same, 512), "llama-3-8b", "h100-sxm", 256, 8192)
    assert reuse.prefill_tokens == 4096 and reuse.busy_s < load.busy_s
    assert reuse.busy_upper_s == pytest.approx(load.busy_upper_s)
    # a pool of 1,000 16-token blocks holds 3.8 of these 4,146-token contexts: decode
    # batches of 3.8 sequences, so the same trace is more work (issue #33, Mooncake)
    small = estimate_load(RequestTable(df, 512), "llama-3-8b", "h100-sxm", 256, 8192,
                          hbm_blocks=1000, block_size_tokens=16)
    assert small.decode_batch == pytest.approx(16_000 / 4146)
    assert small.busy_s > load.busy_s and small.replicas >= load.replicas


def _row(p, hit, offline=False, **kw):
    return {"policy": p, "offline": offline, "hbm_hit_rate": hit, "requests": 10,
            "lookup_tokens": 100, "hit_tokens": 50, "evictions_hbm": 5, **kw}


def test_verdict_no_meaningful_difference_and_ties():
    df = pd.DataFrame([_row("lru", 0.5000), _row("fifo", 0.5006), _row("arc", 0.4995)])
    v = verdict_info(df)
    assert not v["meaningful"] and v["text"].startswith("no meaningful difference between")
    df = pd.DataFrame([_row("lru", 0.40), _row("fifo", 0.50), _row("arc", 0.498)])
    v = verdict_info(df)
    assert v["meaningful"] and v["best"] == ["fifo"] and v["tied"] == ["arc"]
    assert v["margin_vs_baseline_pp"] == pytest.approx(10.0)
    # 0.8 pp: within the measured seed-to-seed spread (threshold 1.0 pp since issue #33's
    # measurement; 0.5 named arc the loser)
    df = pd.DataFrame([_row("lru", 0.40), _row("fifo", 0.50), _row("arc", 0.492)])
    v = verdict_info(df)
    assert v["threshold_pp"] == 1.0 and v["tied"] == ["arc"]
    same = pd.DataFrame([_row("lru", 0.5, evictions_hbm=0), _row("fifo", 0.5, evictions_hbm=0)])
    v = verdict_info(same)
    assert v["identical"][0]["reason"].startswith("everything fits in HBM")
    assert "everything fits in HBM" in v["text"]


def test_bounds_labelled_and_demoted_when_beaten():
    df = pd.DataFrame([_row("lru", 0.5), _row("belady", 0.6, True), _row("optimal", 0.55, True)])
    out = label_bounds(df, "engine").set_index("policy")
    assert out.loc["belady", "bound_claim"] == "heuristic"
    assert out.loc["optimal", "bound_claim"] == "bound"
    df.loc[0, "hbm_hit_rate"] = 0.56  # an online policy above the "bound": not one here
    out = label_bounds(df, "engine").set_index("policy")
    assert out.loc["optimal", "bound_claim"] == "heuristic"
    assert "lru beats it" in out.loc["optimal", "bound_note"]
    closed = label_bounds(pd.DataFrame([_row("lru", 0.5), _row("belady", 0.4, True)]), "closed")
    assert closed.set_index("policy").loc["belady", "bound_claim"] == "heuristic"
    pre = label_bounds(pd.DataFrame([_row("lru", 0.5, preemptions=3),
                                     _row("optimal", 0.6, True)]), "engine")
    assert pre.set_index("policy").loc["optimal", "bound_claim"] == "heuristic"


def test_result_warnings():
    rows = [_row("lru", 0.1, requests=0, preemptions=0, makespan_us=0),
            _row("fifo", 0.1, requests=10, preemptions=50, makespan_us=9e6,
                 hbm_capacity_blocks=10)]
    codes = {w["code"] for w in result_warnings(rows, span_us=1e6)}
    assert {"no_requests", "preemption_storm", "overload"} <= codes
    codes = {w["code"] for w in result_warnings(rows[1:], schedule_budget_blocks=100,
                                                largest_request_blocks=20)}
    assert {"hbm_below_budget", "request_larger_than_hbm"} <= codes
