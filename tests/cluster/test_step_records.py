"""The closed loop's per-step records (kvsim/results/step_records.py, issues 34 and 38): the
engine's ``in_system`` buffer is emptied in place instead of doubling with the steps, and
a run that prints only the summary (``serve(step_table=False)``: ``kvsim simulate`` /
``compare`` on a request trace) keeps only the measured steps' latencies, in bounded
memory, with the same summary to the last bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsim.modes.closed.cluster import serve
from kvsim.results import step_records
from kvsim.results.step_records import Float64Values, StepRecords, latency_stats
from kvsim.spec.sim_config import SimConfig
from tests.helpers import small_closed_engine

B = 16


def _table(n: int):
    """``n`` requests, some sharing one of two prefixes, arriving every 4-20 ms."""
    from kvsim.ingest.requests import build_request_table

    rng = np.random.default_rng(11)
    ids = [[50 + k % 2] * int(rng.integers(0, 6)) + list(range(100 * k, 100 * k + 3))
           for k in range(n)]
    ids = [[h + 1000 * j for j, h in enumerate(x)] for x in ids]
    prompt = [len(x) * B for x in ids]
    return build_request_table({
        "arrival_us": np.cumsum(rng.integers(4_000, 20_000, n)).tolist(),
        "prompt_tokens": prompt, "output_tokens": rng.integers(2, 40, n).tolist(),
        "block_ids": ids, "hashed_tokens": prompt}, block_size_tokens=B)


def _dump(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True, default=str)


def test_in_system_buffer_is_emptied_not_grown() -> None:
    """The engine's ``in_system`` buffer keeps its size however many steps run (main
    doubled it: 8 bytes a step per replica, 194 MB for 8 replicas on 10x the Mooncake
    trace), and ``in_system`` / ``steps`` read the same as with a buffer that never fills."""
    ref = small_closed_engine("interpreted")
    ref.advance(-1.0)
    ref.finish()
    e = small_closed_engine("interpreted")
    e.insys = np.zeros(4, dtype=np.int64)  # fills every 4 steps
    e.advance(-1.0)
    e.finish()
    assert ref.steps > 4 * len(e.insys)
    assert len(e.insys) == 4
    assert e.steps == ref.steps
    np.testing.assert_array_equal(e.in_system, ref.in_system)
    assert len(e.in_system) == e.steps


@pytest.mark.parametrize("replicas,warmup,spill", [(1, None, False), (3, 7, True),
                                                    (1, 12, True)])
def test_summary_only_records_give_the_same_summary(monkeypatch, replicas, warmup,
                                                    spill) -> None:
    """``step_table=False`` keeps 8 bytes a measured step (not a 12-column row and an
    ``in_system`` count) and gives the same summary, byte for byte: in memory, and with
    the latencies spilled to a file and streamed (``spill``)."""
    cfg = SimConfig(engine="interpreted", warmup_requests=warmup)
    full = serve(_table(30), "lru", cfg, replicas=replicas, router="prefix")
    if spill:
        monkeypatch.setattr(step_records, "MEM_VALUES", 5)
        monkeypatch.setattr(step_records, "LOAD_VALUES", 11)
    lean = serve(_table(30), "lru", cfg, replicas=replicas, router="prefix",
                 step_table=False)
    assert _dump(lean.summary) == _dump(full.summary)
    steps = lean.steps  # no table kept: its columns, no row
    assert len(steps) == 0 and list(steps.columns) == list(full.steps.columns)
    assert len(full.steps) == full.summary["steps"]


def test_records_hold_bounded_memory_and_spill_the_rest() -> None:
    """A summary-only replica holds at most ``mem_values`` latencies in memory whatever
    the number of steps; the measured ones (from ``K_WARMUP_STEP`` on, none while it is
    unset during a warm-up) come back in order."""
    K = np.full(8, -1, dtype=np.int64)
    from kvsim.core import layout as L

    rec = StepRecords(table=False, K=K, warmup=True, mem_values=100)
    rows = np.zeros((1000, L.NS))
    rows[:, L.S_STEP] = np.arange(1000)
    rows[:, L.S_LATENCY_US] = np.random.default_rng(1).random(1000)
    rec.append(rows[:300])  # before the warm-up ended: not measured
    K[L.K_WARMUP_STEP] = 350
    for lo in range(300, 1000, 70):
        rec.append(rows[lo:lo + 70])
    assert len(rec) == 1000 and rec.latency.mem_count == 100 and rec.spilled
    got = np.concatenate(list(rec.measured_latencies()))
    np.testing.assert_array_equal(got, rows[350:, L.S_LATENCY_US])
    rec.close()


@pytest.mark.parametrize("n", [0, 1, 9, 1000])
def test_latency_stats_streamed_equal_in_memory(monkeypatch, n) -> None:
    x = np.random.default_rng(n).lognormal(8.0, 1.5, n)
    if n > 5:
        x[3] = np.nan
    v = Float64Values(mem_values=7)
    for lo in range(0, n, 13):
        v.append(x[lo:lo + 13])
    held = latency_stats(v.chunks(5), (50, 95, 99, 99.9))
    monkeypatch.setattr(step_records, "LOAD_VALUES", 4)
    streamed = latency_stats(v.chunks(5), (50, 95, 99, 99.9))
    assert json.dumps(held) == json.dumps(streamed)
    y = x[~np.isnan(x)]
    assert held[0] == n
    if len(y):
        assert held[2] == [float(np.percentile(y, q)) for q in (50, 95, 99, 99.9)]
