"""The per-step table in bounded memory (issue 38, "Memory grows with what is resident, not
with the trace"; kvsim/core/spill.py): exact statistics over spilled rows equal numpy's on
the same values held in memory, bit for bit, and a replay's retained per-step state does
not grow with its number of steps."""

from __future__ import annotations

import gc
import math
import pickle
import tracemalloc

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.core import spill
from kvsim.core.schema import Phase
from kvsim.spec.sim_config import SimConfig


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("seed", range(3))
def test_exact_stats_equal_numpy_bit_for_bit(monkeypatch, seed: int) -> None:
    """Count, mean and percentiles of a filtered column, spilled to a file and read back
    in small pieces, equal ``len``, ``mean`` and ``np.percentile`` of it in memory
    exactly (==), for heavy-tailed, rounded, tied and signed values and some NaNs."""
    monkeypatch.setattr(spill, "SUM_LEAF_ROWS", 1000)  # the pairwise split exercised
    monkeypatch.setattr(spill, "CHUNK_VALUES", 777)  # reads across chunk edges
    rng = np.random.default_rng(seed)
    qs = (50, 95, 99, 99.9, 0, 100, 33.3)
    for trial in range(12):
        n = int(rng.integers(1, 12000))
        x = [rng.exponential(1000, n), np.round(rng.exponential(1000, n), 1),
             rng.integers(0, 5, n) * 100.0, rng.normal(0, 1e6, n)][trial % 4]
        if trial % 5 == 0:
            x[::7] = np.nan
        table = np.stack([np.arange(n, dtype=np.float64), x], axis=1)
        warm = int(rng.integers(0, n))
        for mem_rows in (0, int(rng.integers(1, 50)), 1 << 20):  # spilled, partly, not
            rows = spill.SpilledRows(2, mem_rows=mem_rows)
            for lo in range(0, n, 333):
                rows.append(table[lo:lo + 333])
            assert rows.spilled == (mem_rows < n)
            count, mean, pcts = spill.exact_stats(rows, 1, qs, lambda c, w=warm: c[:, 0] >= w)
            want = x[warm:]
            finite = want[~np.isnan(want)]
            assert count == len(want)
            assert _same(mean, float(want.mean()))
            assert pcts == [float(np.percentile(finite, q)) for q in qs]
            assert np.array_equal(rows.to_array(), table, equal_nan=True)
            rows.close()


def test_radix_select_orders_signs_and_zeros() -> None:
    x = np.array([3.5, -1.0, 0.0, -7.25, 1e300, -1e-300, 2.0, 2.0])
    got = spill.select_ranks(lambda: iter([x[:3], x[3:]]), range(len(x)))
    assert [got[k] for k in range(len(x))] == sorted(x.tolist())


def _decode_trace(builder, requests: int, steps_each: int):
    """``requests`` requests one after another, each a prompt of 2 blocks then
    ``steps_each`` decode steps: one engine step per decode token."""
    tb = builder()
    t = 0
    for r in range(requests):
        tb.STEP(t, 1000)
        t += 1000
        tb.ARRIVE(r, 8)
        tb.prompt(r, [100 + 2 * r, 101 + 2 * r])
        tb.ACCESS(r, 8)
        for k in range(steps_each):
            tb.STEP(t, 100 + (k * 37 + r) % 50)
            t += 1000
            tb.ACCESS(r, 1, Phase.DECODE)
        tb.FREE(r)
    return tb


def _retained(trace, config) -> tuple[int, dict, object]:
    """Bytes still allocated (tracemalloc: numpy's arrays included) while the result is
    held, minus before the call."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        res = simulate(trace, "lru", config)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before, res.summary, res


def test_retained_step_state_does_not_grow_with_steps(builder, tiny_hw, tmp_path,
                                                      monkeypatch) -> None:
    """The same requests with 4x the engine steps: what a finished replay's result holds
    does not grow (the per-step table is spilled past ``MEM_ROWS`` rows and its DataFrame
    built only when ``SimResult.steps`` is read).  Before: 96 + 136 bytes per step held
    (the step chunks and the 17-column DataFrame), ~+0.2 MB here."""
    monkeypatch.setattr(spill, "MEM_ROWS", 256)
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=64, engine="interpreted")
    short = _decode_trace(builder, 4, 100).write(tmp_path / "short.parquet")
    long = _decode_trace(builder, 4, 400).write(tmp_path / "long.parquet")
    _retained(short, cfg)  # imports and first-call caches, not measured
    small, s_short, _ = _retained(short, cfg)
    big, s_long, res = _retained(long, cfg)
    assert s_long["steps"] - s_short["steps"] == 4 * 300
    assert big - small < 64 * 1024, (small, big)
    # the summary's step statistics are the exact ones of the table, once it is built
    lat = res.steps["latency_us"].to_numpy()
    assert len(res.steps) == s_long["steps"]
    assert s_long["mean_step_us"] == float(lat.mean())
    assert [s_long[k] for k in ("p50_step_us", "p95_step_us", "p99_step_us",
                                "p999_step_us")] == \
        [float(np.percentile(lat, q)) for q in (50, 95, 99, 99.9)]


def test_spilled_result_pickles_with_its_steps(builder, tiny_hw, tmp_path,
                                               monkeypatch) -> None:
    """A result sent from a worker process (pickled) carries its spilled steps."""
    monkeypatch.setattr(spill, "MEM_ROWS", 16)
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=64, engine="interpreted")
    trace = _decode_trace(builder, 2, 50).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg)
    again = pickle.loads(pickle.dumps(res))
    assert again.steps.equals(simulate(trace, "lru", cfg).steps)
    assert len(again.steps) == res.summary["steps"]
