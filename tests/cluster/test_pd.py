"""Prefill/decode disaggregation (kvsim.modes.closed.disagg; docs/disaggregation.md), exact
cases on hand-built Request tables (interpreted engine)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.cluster import serve
from kvsim.modes.closed.disagg import PdOptions, parse_pd, transfer_us
from kvsim.spec.sim_config import SimConfig

B = 16
A = list(range(1, 21))  # 20 blocks of 16 tokens
C = list(range(100, 120))
INF = float("inf")


def _table(arrival, prompt, output, ids):
    return build_request_table({"arrival_us": arrival, "prompt_tokens": prompt,
                                "output_tokens": output, "block_ids": ids,
                                "hashed_tokens": [min(len(x) * B, p) for x, p in
                                                  zip(ids, prompt)]},
                               block_size_tokens=B)


def cfg(engine: str = "interpreted", **kw) -> SimConfig:
    return SimConfig(engine=engine, **kw)


def block_bytes() -> int:
    # llama-3-8b (the default model): 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
    return 32 * 8 * 128 * 2 * 2 * B


def _steps(res):
    st = res.steps
    return st["start_us"].to_numpy(float), st["latency_us"].to_numpy(float)


@pytest.mark.parametrize("engine", ["interpreted", "compiled"])
def test_infinite_link_decode_steps_are_the_aggregated_decode_steps_shifted(engine):
    """P/D 1:1, zero latency, infinite bandwidth, no staging cap, requests that never
    overlap: the prefill replica runs exactly the aggregated engine's prefill steps; the
    decode replica runs, per request, one one-token step (vLLM recomputes the last prompt
    token of a loaded prompt) then exactly the aggregated engine's decode steps, each
    shifted by ``ceil(t_p) - t_p + r`` (t_p: the prefill's end; arrivals are whole
    microseconds; r: the one-token step)."""
    t = _table([0, 5_000_000], [20 * B] * 2, [4, 4], [A, C])
    agg = serve(t, "lru", cfg(engine), replicas=1)
    s_a, l_a = _steps(agg)
    assert len(s_a) == 8  # per request: one prefill step, three decode steps
    pd = serve(t, "lru", cfg(engine), pd=PdOptions(1, 1, link_bytes_per_s=INF,
                                                    link_latency_us=0.0))
    s_d, l_d = _steps(pd)
    assert len(s_d) == 8  # per request: the recompute step, three decode steps
    sm = pd.summary
    assert sm["pd_prefill_steps"] == 2
    for r in range(2):
        a0 = 4 * r
        t_p = s_a[a0] + l_a[a0]  # the prefill's end = the aggregated first token
        recompute = l_d[a0]
        assert s_d[a0] == math.ceil(t_p)
        shift = math.ceil(t_p) - t_p + recompute
        # the decode steps: same durations, starts shifted by `shift`
        np.testing.assert_array_equal(l_d[a0 + 1:a0 + 4], l_a[a0 + 1:a0 + 4])
        np.testing.assert_allclose(s_d[a0 + 1:a0 + 4], s_a[a0 + 1:a0 + 4] + shift,
                                   rtol=0, atol=1e-6)
    # TPOT is the aggregated engine's; the client's first token comes after the recompute
    assert sm["tpot_p50_us"] == pytest.approx(agg.summary["tpot_p50_us"], abs=1e-6)
    assert sm["pd_prefill_ttft_p50_us"] == pytest.approx(agg.summary["ttft_p50_us"],
                                                         abs=1e-6)
    assert sm["ttft_p50_us"] == pytest.approx(math.ceil(l_a[0]) + l_d[0], abs=1e-6)
    assert sm["pd_transfer_p99_us"] == 0.0 and sm["pd_staging_blocked_us"] == 0.0
    assert sm["pd_link_bytes"] == 2 * 20 * block_bytes()  # nothing cached on the decode side


def test_one_transfer_alone_is_latency_plus_bytes_over_bandwidth():
    t = _table([0], [20 * B], [4], [A])
    agg = serve(t, "lru", cfg(), replicas=1)
    s_a, l_a = _steps(agg)
    pd = serve(t, "lru", cfg(), pd=PdOptions(1, 1, link_bytes_per_s=12.5e9,
                                             link_latency_us=10.0))
    T = 10.0 + 20 * block_bytes() / 12.5e3  # us: 10 + 5,242,880 B / 12.5 GB/s = 429.4304
    assert transfer_us(20 * block_bytes(), PdOptions(1, 1)) == T
    sm = pd.summary
    assert sm["pd_transfer_p50_us"] == pytest.approx(T, abs=1e-9)
    assert sm["pd_link_queue_p99_us"] == 0.0
    s_d, l_d = _steps(pd)
    t_p = s_a[0] + l_a[0]
    assert s_d[0] == math.ceil(t_p + T)  # the decode side sees it when the transfer ends
    np.testing.assert_allclose(s_d[1:], s_a[1:] + math.ceil(t_p + T) - t_p + l_d[0],
                               rtol=0, atol=1e-6)


def test_two_transfers_on_one_link_queue_fifo():
    """Two prompts prefilled in one step on one prefill replica: with --link-model queue
    the second transfer waits for the first (T, 2T); timed alone both take T."""
    t = _table([0, 0], [20 * B] * 2, [2, 2], [A, C])
    opt = PdOptions(1, 1, link_bytes_per_s=12.5e9, link_latency_us=10.0)
    T = 10.0 + 20 * block_bytes() / 12.5e3
    q = serve(t, "lru", cfg(link_model="queue"), pd=opt).summary
    assert q["pd_transfer_p50_us"] == pytest.approx(1.5 * T)  # of (T, 2T)
    assert q["pd_transfer_p99_us"] == pytest.approx(1.99 * T)
    assert q["pd_link_queue_p99_us"] == pytest.approx(0.99 * T)  # of (0, T)
    alone = serve(t, "lru", cfg(), pd=opt).summary
    assert alone["pd_transfer_p99_us"] == pytest.approx(T)
    assert q["pd_link_bytes"] == alone["pd_link_bytes"] == 40 * block_bytes()


def test_staging_waits_for_the_decode_sides_free_blocks():
    """A 30-block pool (29 usable) in each replica; two 20-block prompts: the second
    transfer cannot reserve 20 blocks while the first request holds its 21 (or has them
    reserved), so it starts when the first request's decode ends and frees them."""
    t = _table([0, 0], [20 * B] * 2, [4, 4], [A, C])
    opt = PdOptions(1, 1, link_bytes_per_s=INF, link_latency_us=0.0)
    res = serve(t, "lru", cfg(hbm_blocks=30), pd=opt)
    sm = res.summary
    assert sm["pd_staging_blocked_requests"] == 1
    s_d, l_d = _steps(res)
    # decode steps: request 0's recompute + 3 decodes, then request 1's
    assert len(s_d) == 8
    end0 = s_d[3] + l_d[3]  # request 0 finishes: its blocks return to the free queue
    assert s_d[4] == math.ceil(end0)  # request 1 staged, sent (instantly), admitted
    rq = res.requests.set_index("request_id")
    assert rq.loc[1, "pd_transfer_start_us"] == s_d[3] + l_d[3]
    assert sm["pd_staging_blocked_us"] == end0 - rq.loc[1, "pd_prefill_done_us"]
    big = serve(t, "lru", cfg(), pd=opt).summary  # room for both: no wait
    assert big["pd_staging_blocked_requests"] == 0


def test_max_inflight_caps_transfers_to_one_decode_replica():
    t = _table([0, 0], [20 * B] * 2, [2, 2], [A, C])
    T = 10.0 + 20 * block_bytes() / 12.5e3
    opt = PdOptions(1, 1, link_bytes_per_s=12.5e9, link_latency_us=10.0, max_inflight=1)
    sm = serve(t, "lru", cfg(), pd=opt).summary  # timed alone, but one at a time
    assert sm["pd_staging_blocked_requests"] == 1
    assert sm["pd_staging_blocked_p99_us"] == pytest.approx(0.99 * T)  # of (0, T)


def test_bad_pd_options_are_one_line_errors():
    assert parse_pd("3:5") == (3, 5) and parse_pd(None) is None
    for bad in ("3", "0:4", "a:b", "1:2:3", "-1:2"):
        with pytest.raises(KvsimInputError, match="--pd P:D"):
            parse_pd(bad)
    with pytest.raises(KvsimInputError, match="pd-link-gbps"):
        PdOptions(1, 1, link_bytes_per_s=0.0)
    with pytest.raises(KvsimInputError, match="pd-max-inflight"):
        PdOptions(1, 1, max_inflight=-1)


SAMPLE = ["--request-trace", "traces/sample_mooncake.jsonl", "--model", "llama-3.1-8b",
          "--block-size", "512", "--hbm-gb", "2", "--engine", "interpreted"]


def _cli(args):
    import os
    from pathlib import Path

    from typer.testing import CliRunner

    from kvsim.cli import app

    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])
    try:
        return CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)


def test_cli_pd_json_and_table():
    import json

    res = _cli(["simulate", *SAMPLE, "--pd", "1:2", "--router", "prefix", "--link-model",
                "queue", "--pd-link-gbps", "25", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    s = out["policies"][0]
    assert s["pd"] == "1:2" and s["replicas"] == 3 and out["config"]["pd"] == "1:2"
    assert s["pd_link_bytes_per_s"] == 25e9 / 8
    assert s["pd_link_bytes"] > 0 and s["pd_transfers"] > 0
    assert s["ttft_p50_us"] > s["pd_prefill_ttft_p50_us"]
    assert [r["pool"] for r in out["replicas"]] == ["prefill", "decode", "decode"]
    text = _cli(["simulate", *SAMPLE, "--pd", "1:2"])
    assert text.exit_code == 0, text.output
    assert "P/D 1:2: pools" in text.stdout and "P->D KV transfers" in text.stdout


@pytest.mark.parametrize("extra, fragment", [
    (["--pd", "2"], "--pd P:D"),
    (["--pd", "1:1", "--replicas", "2"], "--pd"),
    (["--pd", "500:500"], "--pd"),  # the memory budget, before any replica is allocated
])
def test_cli_bad_pd_options(extra, fragment):
    from tests.helpers import assert_one_line_error

    assert_one_line_error(_cli(["simulate", "--request-trace", "x.jsonl", *extra]), fragment)


def test_cli_compare_pd():
    import json

    res = _cli(["compare", *SAMPLE, "--policies", "lru", "--pd", "1:1", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["policy"]: r for r in json.loads(res.stdout)["policies"]}
    assert rows["lru"]["pd"] == "1:1" and rows["lru"]["pd_link_bytes"] > 0


def test_warmup_measures_the_later_requests_only():
    t = _table([0, 5_000_000], [20 * B] * 2, [4, 4], [A, C])
    opt = PdOptions(1, 1, link_bytes_per_s=12.5e9, link_latency_us=10.0)
    full = serve(t, "lru", cfg(), pd=opt).summary
    warm = serve(t, "lru", cfg(warmup_requests=1), pd=opt).summary
    # the two requests are alike and alone: request 1's figures are request 0's
    assert warm["ttft_p50_us"] == pytest.approx(full["ttft_p50_us"], abs=1e-6)
    assert warm["pd_transfers"] == 1 and full["pd_transfers"] == 2
    assert warm["pd_decode_steps"] == 4 and full["pd_decode_steps"] == 8
