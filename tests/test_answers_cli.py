"""Issue #33: answers a user can trust.  One-line refusals (exit 2) for an event file with
replicas or a router, for a request trace given as --trace, for requests over the model's
context; sizing, warnings and the verdict object (docs/simulate.md, "Sizing", "Warnings",
"Verdict", "Bounds")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.results.compare_view import identical_cause, label_bounds, verdict_info
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
    # the default model is llama-3.1-8b (131,072 tokens); an agentic session's prompts
    # run past it, and the refusal names the limit and a model whose context holds them
    f = _mooncake(tmp_path / "m.jsonl", prompt=140_000)
    res = runner.invoke(app, ["compare", "--request-trace", str(f), "--policies", "lru"])
    assert res.exit_code == 2
    assert "6 of 6 requests exceed llama-3.1-8b's context of 131,072 tokens" in res.output
    assert "--drop-over-context" in res.output
    assert "qwen2.5-7b-1m, 1,010,000 tokens" in res.output
    short = runner.invoke(app, ["compare", "--request-trace", str(f), "--policies", "lru",
                                "--model", "llama-3-8b"])
    assert short.exit_code == 2 and "llama-3.1-8b, 131,072 tokens" not in short.output


def test_default_model_serves_prompts_past_8k(tmp_path):
    """Issue #33: on defaults a real trace's 9k-token prompts are served (the default model
    is llama-3.1-8b, 131,072 tokens), not refused against llama-3-8b's 8,192."""
    from kvsim.spec.models import DEFAULT_MODEL, load_model

    assert DEFAULT_MODEL == "llama-3.1-8b"
    assert load_model(DEFAULT_MODEL).max_position_embeddings == 131_072
    f = _mooncake(tmp_path / "m.jsonl", prompt=9000)
    res = runner.invoke(app, ["simulate", "--request-trace", str(f), "--json"])
    assert res.exit_code == 0, res.output
    assert "exceed" not in res.output
    assert json.loads(res.stdout)["policies"][0]["requests"] == 6


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
    # HBM evicted only into DRAM (spills, no drop) and nothing was read back: why the
    # policies tie (Claude Code trace_0420 on the defaults: 15,521 demotions, 0 % lower hit)
    lower = dict(evictions_hbm=0, evictions=0, spills_hbm=9, bytes_moved=900,
                 dram_hit_rate=0.0, cxl_hit_rate=0.0, nvme_hit_rate=0.0)
    v = verdict_info(pd.DataFrame([_row("lru", 0.5, **lower), _row("fifo", 0.5, **lower)]))
    assert v["identical"][0]["reason"].startswith("every block that left HBM went to a lower")
    assert "never read back" in v["text"]
    read = {**lower, "dram_hit_rate": 0.01}  # a block read back: the reason is not known
    v = verdict_info(pd.DataFrame([_row("lru", 0.5, **read), _row("fifo", 0.5, **read)]))
    assert v["identical"][0]["reason"] is None
    assert identical_cause([_row("lru", 0.5, **lower)]) is None  # one run proves nothing


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


@pytest.mark.parametrize(("warm", "measured", "warned"), [
    (64, 1, True), (1, 9, True), (90, 10, False), (0, 1, False), (5, 0, False)])
def test_few_measured_requests_after_the_warm_up(warm, measured, warned):
    """A warm-up leaving fewer than 10 requests measured is warned about (main: silent);
    no warm-up, or nothing served (no_requests says that), is not this warning."""
    rows = [_row("lru", 0.1, requests=measured, warmup_requests=warm, preemptions=0,
                 makespan_us=1.0)]
    codes = [w["code"] for w in result_warnings(rows)]
    assert ("few_measured" in codes) == warned, codes


def test_dropped_requests_count_as_misses_in_the_hit_rates():
    """Issue #33: at 8 GB the Mooncake trace's 297 longest requests can never be admitted;
    leaving their prompts out of the hit rates made 8 GB score above 16 GB (5.02 % vs
    4.36 % under --replicas auto).  Their prompts now count as looked up and missed."""
    from kvsim.ingest.requests import RequestTable
    from kvsim.modes.closed.cluster import _dropped_prompts
    from kvsim.modes.closed.serving_metrics import count_dropped_as_misses

    df = pd.DataFrame({"request_id": np.arange(4), "arrival_us": [0, 10, 20, 30],
                       "prompt_tokens": [100, 5000, 40, 5000], "output_tokens": [5, 5, 5, 6],
                       "block_ids": [[1], [2], [3], [4]]})
    kept = RequestTable(df.iloc[[0, 2]].reset_index(drop=True), 512)
    missed = _dropped_prompts(RequestTable(df, 512), kept, 16)
    assert missed.tolist() == [[10, 30], [5000, 5000], [313, 313]]
    s = {"hbm_hit_rate": 0.5, "prefix_hit_rate": 0.75, "block_hit_rate": 0.5,
         "hbm_block_hit_rate": 0.25, "lookup_tokens": 140, "prompt_blocks": 10}
    count_dropped_as_misses(s, 10_000, 626)
    assert s["lookup_tokens"] == 10_140 and s["prompt_blocks"] == 636
    assert s["hbm_hit_rate"] == pytest.approx(70 / 10_140)
    assert s["prefix_hit_rate"] == pytest.approx(105 / 10_140)
    assert s["hbm_block_hit_rate"] == pytest.approx(2.5 / 636)
    same = {"hbm_hit_rate": 0.5, "lookup_tokens": 140, "prompt_blocks": 10}
    count_dropped_as_misses(same, 0, 0)
    assert same == {"hbm_hit_rate": 0.5, "lookup_tokens": 140, "prompt_blocks": 10}


def test_overload_warning_is_printed_once_before_the_replay(tmp_path):
    """The sizing warning goes to stderr before the replay (a user on defaults sees the
    proposed replica count at once, not after a long overloaded run), once, and stays in
    the --json warnings."""
    f = _mooncake(tmp_path / "m.jsonl", n=40, prompt=8000, out=50, gap_us=1000)
    res = runner.invoke(app, ["simulate", "--request-trace", str(f), "--json"])
    assert res.exit_code == 0, res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("warning: this trace overloads")]
    assert len(lines) == 1
    err = res.stderr
    assert err.index("warning: this trace overloads") < err.index("compiling") \
        if "compiling" in err else True
    codes = [w["code"] for w in json.loads(res.stdout)["warnings"]]
    assert codes.count("overload_predicted") == 1


@pytest.mark.parametrize(("counts", "single", "code"), [
    ({"lookup_tokens": 900, "hit_tokens": 0, "evictions_hbm": 0}, True, "no_shared_content"),
    ({"lookup_tokens": 900, "hit_tokens": 300, "evictions_hbm": 0}, True, "no_eviction"),
    ({"lookup_tokens": 900, "hit_tokens": 300, "evictions_hbm": 4}, True, None),
    ({"lookup_tokens": 900, "hit_tokens": 0, "evictions_hbm": 4}, True, None),
    ({"lookup_tokens": 0, "hit_tokens": 0, "evictions_hbm": 0}, True, None),  # nothing looked up
    ({"lookup_tokens": 900, "hit_tokens": 0, "evictions_hbm": 0, "warmup_requests": 3}, True,
     None),  # the window's counts: the warm-up's choices decide what it hits
    ({"lookup_tokens": 900, "hit_tokens": 300, "evictions_hbm": 0}, False, None),  # a sweep
    # --live-offload: the policy chose which live blocks to spill, none cached was evicted
    ({"lookup_tokens": 900, "hit_tokens": 300, "evictions_hbm": 0, "live_spills": 5}, True,
     None),
    ({"lookup_tokens": 900, "hit_tokens": 0, "evictions_hbm": 0, "live_spills": 5}, True, None),
    ({"lookup_tokens": 900, "hit_tokens": 300, "evictions_hbm": 0, "bytes_moved": 64}, True,
     None),  # blocks moved between tiers
    # a lower tier: HBM's evictions are demotions (spills_hbm), none dropped
    ({"lookup_tokens": 900, "hit_tokens": 300, "evictions_hbm": 0, "spills_hbm": 7}, True,
     None),
])
def test_a_single_run_whose_policy_never_chose_is_warned_about(counts, single, code):
    """A simulate run whose policy never chose (nothing evicted from HBM) is warned about:
    every policy gives the same result (main: printed silently as the policy's hit rate)."""
    rows = [_row("lru", 0.1, requests=10, preemptions=0, makespan_us=1.0,
                 hbm_capacity_blocks=64, **counts)]
    codes = [w["code"] for w in result_warnings(rows, single_run=single)]
    assert [c for c in codes if c in ("no_shared_content", "no_eviction")] == \
        ([code] if code else []), codes


def test_a_trace_without_content_warns_in_simulate_and_explains_in_compare(tmp_path):
    """Azure's trace carries token counts only: simulate says its 0 % hit rate is no
    policy's doing; compare's verdict says why every policy ties and prints no warning."""
    trace = Path(__file__).parent / "ingest" / "data" / "azure_small.csv"
    res = runner.invoke(app, ["simulate", "--request-trace", str(trace), "--model",
                              "llama-3.1-8b", "--json"])
    assert res.exit_code == 0, res.output
    warned = [x for x in res.stderr.splitlines() if x.startswith("warning: ")]
    assert len(warned) == 1 and "no prompt content is shared" in warned[0], res.stderr
    assert [w["code"] for w in json.loads(res.stdout)["warnings"]] == ["no_shared_content"]
    res = runner.invoke(app, ["compare", "--request-trace", str(trace), "--model",
                              "llama-3.1-8b", "--policies", "lru,fifo", "--json"])
    assert res.exit_code == 0, res.output
    assert not [x for x in res.stderr.splitlines() if x.startswith("warning: ")], res.stderr
    verdict = json.loads(res.stdout)["verdict"]
    assert "no prompt content is shared" in verdict["identical"][0]["reason"]
