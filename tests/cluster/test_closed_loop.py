"""Checks of the closed-loop engine model itself, with exact or analytic values.

Every run uses the interpreted engine (the same code as the compiled core, no compile)
on hand-built Request tables: llama-3-8b on h100-sxm, 16-token blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.engine.engine_model import build_cost_model
from kvsim.engine.lowering import lower_requests
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig

B = 16
CONFIG = SimConfig(engine="interpreted")
COST = build_cost_model("llama-3-8b", "h100-sxm", block_size_tokens=B, timing="roofline")
ROOFLINE = EngineOptions(timing="roofline")


def table(arrival, prompt, output, ids=None, **cols):
    """A Request table; ``ids[i]`` = native 16-token block ids of request i (None: no
    content identity at all, so nothing can ever be shared)."""
    n = len(arrival)
    c = {"arrival_us": arrival, "prompt_tokens": prompt, "output_tokens": output, **cols}
    if ids is not None:
        c["block_ids"] = ids
        c["hashed_tokens"] = [min(len(x) * B, p) for x, p in zip(ids, prompt)]
    else:
        c["block_ids"] = [[] for _ in range(n)]
    return build_request_table(c, block_size_tokens=B)


def unique_ids(prompt, start=1):
    out, k = [], start
    for p in prompt:
        nb = (p + B - 1) // B
        out.append(list(range(k, k + nb)))
        k += nb
    return out


def test_one_request_at_a_time_ttft_is_the_roofline_prefill():
    prompts = [1000, 17, 4096, 8192]
    # 1 s apart: each request runs alone; no content ids: nothing is ever cached
    t = table([i * 1_000_000 for i in range(4)], prompts, [1] * 4)
    res = serve(t, "lru", CONFIG, engine=ROOFLINE)
    assert res.summary["schedule"] == "closed" and res.summary["timing_model"] == "roofline"
    got = res.requests.sort_values("request_id")["ttft_us"].to_numpy()
    want = [COST.step_us(p, p * (p + 1) / 2.0, p) for p in prompts]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert res.summary["prefill_tokens_saved"] == 0


def test_one_request_at_a_time_ttft_is_the_measured_prefill():
    """The default timing (auto -> measured for llama-3-8b on h100-sxm): a lone prompt's
    TTFT is MeasuredStepTime's prefill step."""
    from kvsim.engine.timing.measured import MeasuredStepTime

    m = MeasuredStepTime.bundled("h100-sxm", "llama-3.1-8b", 1)
    prompts = [1000, 17, 4096, 8192]
    t = table([i * 1_000_000 for i in range(4)], prompts, [1] * 4)
    res = serve(t, "lru", CONFIG)
    assert res.summary["timing_model"] == "measured:aiconfigurator-0.12.0/vllm-0.24.0"
    got = res.requests.sort_values("request_id")["ttft_us"].to_numpy()
    # 8192 = the step budget: one chunk; the 1000-token one is the 21.6 ms
    want = [1000 * m.prefill_ms(p) for p in prompts]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert abs(got[0] / 21_600 - 1) < 0.01


def test_repeated_prompt_second_ttft_is_the_single_token_step():
    p = 40 * B + 1  # 40 full blocks cached, the last token always computed (vLLM)
    ids = [list(range(1, 43))] * 2
    t = table([0, 1_000_000], [p, p], [1, 1], ids)
    res = serve(t, "lru", CONFIG, engine=ROOFLINE)
    ttft = res.requests.sort_values("request_id")["ttft_us"].to_numpy()
    assert ttft[0] == pytest.approx(COST.step_us(p, p * (p + 1) / 2.0, p), abs=1e-6)
    # one token at position p-1: attends p positions, reads p tokens of KV
    assert ttft[1] == pytest.approx(COST.step_us(1, float(p), p), abs=1e-6)
    # measured: a 1-token chunk after 640 cached tokens
    from kvsim.engine.timing.measured import MeasuredStepTime

    m = MeasuredStepTime.bundled("h100-sxm", "llama-3.1-8b", 1)
    ttft = serve(t, "lru", CONFIG).requests.sort_values("request_id")["ttft_us"].to_numpy()
    assert ttft.tolist() == pytest.approx([1000 * m.step_ms([(p, 0)]),
                                           1000 * m.step_ms([(1, p - 1)])], rel=1e-9)
    assert res.summary["prefill_tokens_saved"] == 40 * B
    assert res.summary["hbm_hit_rate"] == pytest.approx(40 * B / (2 * p))


def test_next_turn_hits_the_blocks_decode_filled():
    """Turn 1: a 40-token prompt and 30 output tokens write 69 tokens of KV: blocks 0, 1
    (prompt), 2 (8 prompt tokens, then filled by decode), 3 (decode), 4 (partial at the
    end).  Its trace knows 64 tokens of content (4 full blocks).  Turn 2 (1 s later) sends
    those 80 tokens: the lookup covers (80 - 1) // 16 = 4 blocks and hits all four (64
    tokens), as in vLLM, which caches every block once full; block 4 was never full."""
    ids = [1, 2, 3, 4, 5]
    t = build_request_table({"arrival_us": [0, 1_000_000], "prompt_tokens": [40, 80],
                             "output_tokens": [30, 1], "block_ids": [ids, ids],
                             "hashed_tokens": [64, 80], "session": [1, 1]},
                            block_size_tokens=B)
    for policy in ("lru", "belady"):
        res = serve(t, policy, CONFIG)
        assert res.summary["prefill_tokens_saved"] == 4 * B
        assert res.summary["hbm_hit_rate"] == pytest.approx(4 * B / (40 + 80))


def _busy_table(n=24, seed=3, ids=True):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.integers(0, 400_000, n))
    prompt = rng.integers(50, 3000, n)
    output = rng.integers(1, 60, n)
    return table(list(arrival), list(prompt), list(output),
                 unique_ids(prompt) if ids else None)


def test_large_hbm_closed_loop_equals_open_loop_on_the_same_schedule(tmp_path):
    """No content shared and an HBM that holds everything: the memory never changes the
    schedule, so the closed loop must reproduce the lowered (open-loop) run exactly."""
    t = _busy_table()
    ev = tmp_path / "ev.parquet"
    lower_requests(t, ev, block_size_tokens=B)
    open_ = simulate(ev, "lru", CONFIG)
    closed = serve(t, "lru", CONFIG)
    assert open_.summary["schedule"] == "recorded"
    a = open_.requests.sort_values("request_id")
    b = closed.requests.sort_values("request_id")
    assert len(a) == len(b) == 24
    np.testing.assert_allclose((b["arrival_us"] + b["ttft_us"]).to_numpy(),
                               (a["arrival_us"] + a["ttft_us"]).to_numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose((b["arrival_us"] + b["e2e_us"]).to_numpy(),
                               (a["arrival_us"] + a["e2e_us"]).to_numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(closed.steps["latency_us"].to_numpy(),
                               open_.steps["latency_us"].to_numpy(), rtol=0, atol=1e-6)
    assert closed.summary["steps"] == open_.summary["steps"]
    assert closed.summary["preemptions"] == open_.summary["preemptions"] == 0


def test_littles_law_on_the_measured_window():
    """sum over steps of (requests in the system x step latency) + each request's wait
    from its arrival to the start of the first step after it == sum of E2E latencies
    (L x T = lambda x T x W with every request inside the window)."""
    t = _busy_table(n=40, seed=7)
    res = serve(t, "lru", CONFIG)
    st = res.steps
    rq = res.requests
    area = float((st["in_system"] * st["latency_us"]).sum())
    starts = st["start_us"].to_numpy()
    first_step = starts[np.searchsorted(starts, rq["arrival_us"].to_numpy(), side="left")]
    wait = float((first_step - rq["arrival_us"].to_numpy()).sum())
    e2e = float(rq["e2e_us"].sum())
    assert area + wait == pytest.approx(e2e, rel=1e-9)
    span = float(st["start_us"].iloc[-1] + st["latency_us"].iloc[-1])
    L_mean = (area + wait) / span
    lam = len(rq) / span
    assert L_mean == pytest.approx(lam * rq["e2e_us"].mean(), rel=1e-9)
    assert wait > 0  # arrivals do fall inside steps: the check is not vacuous


@pytest.mark.parametrize("replicas", [2, 3])
def test_round_robin_equals_independent_replicas_of_the_split_trace(replicas):
    t = _busy_table(n=30, seed=11)
    res = serve(t, "lru", CONFIG, replicas=replicas, router="round_robin")
    rq = res.requests.sort_values("request_id")
    assert sorted(set(rq["replica"])) == list(range(replicas))
    df = t.df
    for k in range(replicas):
        part = df.iloc[k::replicas]
        cols = {c: list(part[c]) for c in df.columns if c not in ("request_id",)}
        sub = build_request_table(cols, block_size_tokens=B)
        one = serve(sub, "lru", CONFIG)
        mine = rq[rq["replica"] == k]
        np.testing.assert_array_equal(mine["request_id"].to_numpy() // replicas,
                                      one.requests["request_id"].to_numpy())
        for col in ("ttft_us", "e2e_us", "hbm_hit_tokens", "output_tokens"):
            np.testing.assert_allclose(mine[col].to_numpy(), one.requests[col].to_numpy(),
                                       rtol=0, atol=1e-6)
        row = res.summary["replica_rows"][k]
        assert row["steps"] == one.summary["steps"]


def test_warmup_window_measures_the_requests_after_it():
    t = _busy_table(n=30, seed=5)
    full = serve(t, "lru", CONFIG)
    warm = serve(t, "lru", SimConfig(engine="interpreted", warmup_requests=10))
    # the schedule is the same: same per-request times
    a = full.requests.sort_values("request_id")
    b = warm.requests.sort_values("request_id")
    np.testing.assert_allclose(a["ttft_us"].to_numpy(), b["ttft_us"].to_numpy(), atol=1e-6)
    measured = a[a["request_id"] >= 10]
    assert warm.summary["requests"] == 20
    assert warm.summary["ttft_p99_us"] == pytest.approx(
        float(np.percentile(measured["ttft_us"].to_numpy(), 99)))
    # only steps from the first one at or after request 10's arrival are measured
    t10 = float(t.df["arrival_us"].iat[10])
    assert warm.summary["steps"] == int((full.steps["start_us"] >= t10).sum())
