"""One sweep cell: replay a (trace, policy, config) and reduce the result to what a sweep
stores per cell, its summary row with latency / TTFT quantiles and a downsampled occupancy
series.  :mod:`kvsim.analysis.sweep` (the grid, keys, cache and executors) and ``kvsim compare``
(:mod:`kvsim.modes.comparison`) both use it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvsim.core.errors import bad_value
from kvsim.spec.sim_config import SimConfig

#: Quantiles (fractions) of step latency and TTFT stored per cell: every percent, plus the
#: tail in 0.1 % steps to 99.9 % and 99.99 %.
LATENCY_QUANTILES: tuple[float, ...] = tuple(sorted(set(
    [round(q / 100, 4) for q in range(0, 101)]
    + [round(0.99 + k / 1000, 4) for k in range(1, 10)] + [0.9999])))

#: Most points of a cell's occupancy series.  A report panel is about 1,000-1,500 pixels
#: wide, so 2,000 points draw every pixel column while a cell's series stays ~100 KB
#: (a Mooncake replay has ~10^5-10^6 steps; one row per step would be 10-100x larger).
OCCUPANCY_MAX_POINTS = 2000


def _quantiles(values: np.ndarray) -> list[float]:
    v = values[~np.isnan(values)]
    if len(v) == 0:
        return [float("nan")] * len(LATENCY_QUANTILES)
    return [float(x) for x in np.quantile(v, LATENCY_QUANTILES)]


def latency_quantiles(res) -> dict[str, list[float]]:
    """A replay's (:class:`kvsim.api.SimResult`) step-latency and TTFT quantiles at
    :data:`LATENCY_QUANTILES`: ``step_latency_q_us``, ``ttft_q_us`` (for latency CDFs
    without the per-step tables; sweep cells and compare rows both carry them)."""
    empty = np.zeros(0, np.float64)
    # cache mode and optimal have no step latencies / TTFTs: NaN quantiles
    lat = res.steps["latency_us"].to_numpy(np.float64) if "latency_us" in res.steps else empty
    ttft = res.requests["ttft_us"].to_numpy(np.float64) if "ttft_us" in res.requests \
        else empty
    return {"step_latency_q_us": _quantiles(lat), "ttft_q_us": _quantiles(ttft)}


def occupancy_series(steps: pd.DataFrame,
                     max_points: int = OCCUPANCY_MAX_POINTS) -> pd.DataFrame:
    """A replay's per-step occupancy (``SimResult.steps``) downsampled to at most
    ``max_points`` rows: windows of ``ceil(steps / max_points)`` consecutive steps, each
    occupancy column the MAXIMUM over its window (a spike to capacity survives any
    downsampling; a mean would hide it).  Columns: ``step_first``, ``step_last``,
    ``start_us`` (start of the window's first step), ``end_us`` (end of its last step:
    start + latency), then the ``*_blocks`` occupancy columns the steps table has
    (:data:`kvsim.replay.metrics.OCCUPANCY_COLUMNS`), int64.  With at most ``max_points``
    steps every row is one step."""
    from kvsim.replay.metrics import OCCUPANCY_COLUMNS

    if max_points < 1:
        raise bad_value(None, None, "max_points", "an integer >= 1", max_points)
    occ = [c for c in OCCUPANCY_COLUMNS if c in steps]
    n = len(steps)
    width = max(1, math.ceil(n / max_points))
    starts = np.arange(0, n, width)
    step = steps["step"].to_numpy(np.int64)
    start_us = steps["start_us"].to_numpy(np.float64)
    end_us = start_us + steps["latency_us"].to_numpy(np.float64)
    last = np.minimum(starts + width, n) - 1
    out = {"step_first": step[starts], "step_last": step[last],
           "start_us": start_us[starts], "end_us": end_us[last]}
    for c in occ:
        v = steps[c].to_numpy(np.int64)
        out[c] = np.maximum.reduceat(v, starts) if n else v[:0]
    return pd.DataFrame(out)


def _run_cell_full(trace: str, policy: str, config: SimConfig, facts=None
                   ) -> tuple[dict, pd.DataFrame]:
    """Replay one cell: its row (summary + quantiles; no key or coordinates) and its
    occupancy series (:func:`occupancy_series`)."""
    from kvsim.modes.dispatch import simulate

    res = simulate(trace, policy, config, facts=facts)
    row = {**res.summary, **latency_quantiles(res)}
    row["block_bytes"] = int(res.config.get("block_bytes", 0))
    occ = occupancy_series(res.steps) if "step" in res.steps and len(res.steps) else \
        pd.DataFrame({"step_first": np.zeros(0, np.int64)})
    return row, occ


def run_cell(trace: str, policy: str, config: SimConfig, facts=None) -> dict:
    """Replay one cell; returns its row (summary + quantiles; no key or coordinates)."""
    return _run_cell_full(trace, policy, config, facts)[0]


def cell_label(policy: str, config) -> str:
    """A sweep cell as a user names it: ``policy lru, HBM 1 GB, DRAM 4 GB``."""
    dram = "" if config.dram_gb is None else f", DRAM {config.dram_gb:g} GB"
    return f"policy {policy}, HBM {config.hbm_gb:g} GB{dram}"
