"""The closed loop's joined results (kvsim.modes.closed.serving_metrics.cluster_summary):
the per-step table built only when read, the requests joined in numpy, and the summary's
step figures equal to those computed from the joined DataFrame, bit for bit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.cluster import serve
from kvsim.modes.closed.serving_metrics import ClusterSteps, percentiles
from kvsim.replay.metrics import STEP_PERCENTILES, _pct
from kvsim.spec.sim_config import SimConfig

B = 16


def _table(n: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    prefixes = [list(range(1000 * k, 1000 * k + 10)) for k in range(3)]
    ids = [prefixes[int(rng.integers(0, 3))][:int(rng.integers(0, 10))]
           + list(rng.integers(10**6, 10**7, 4)) for _ in range(n)]
    prompt = [len(x) * B - int(rng.integers(0, B)) for x in ids]
    return build_request_table({
        "arrival_us": np.cumsum(rng.integers(1_000, 30_000, n)).tolist(),
        "prompt_tokens": prompt, "output_tokens": rng.integers(1, 30, n).tolist(),
        "block_ids": ids, "hashed_tokens": [min(len(x) * B, p) for x, p in zip(ids, prompt)],
    }, block_size_tokens=B)


@pytest.mark.parametrize("warmup", [None, 7])
def test_summary_step_figures_equal_the_joined_tables(warmup):
    cfg = SimConfig(engine="interpreted", warmup_requests=warmup)
    res = serve(_table(30), "lru", cfg, replicas=3, router="prefix")
    lazy = res.__dict__["_steps"]
    assert isinstance(lazy, ClusterSteps)  # not built by the run
    steps = res.steps
    assert list(steps.columns[:2]) == ["replica", "step"] and "in_system" in steps
    assert len(lazy) == len(steps) == res.summary["steps"]
    lat = steps["latency_us"].to_numpy()
    s = res.summary
    assert s["mean_step_us"] == float(lat.mean())
    assert [s["p50_step_us"], s["p95_step_us"], s["p99_step_us"], s["p999_step_us"]] == \
        [_pct(lat, q) for q in STEP_PERCENTILES]
    for w, row in enumerate(s["replica_rows"]):
        assert row["steps"] == int((steps["replica"] == w).sum())
    rq = res.requests
    assert list(rq.columns[:2]) == ["replica", "request_id"]
    assert rq["request_id"].is_monotonic_increasing
    assert rq.index.equals(pd.RangeIndex(len(rq)))
    assert rq["ttft_missed"].dtype == bool and rq["replica"].dtype == np.int64


def test_percentiles_in_one_call_equal_one_call_each():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 7, 1000, 4097):
        x = rng.lognormal(3.0, 2.0, n)
        if n > 3:
            x[rng.integers(0, n, 3)] = np.nan
        got = percentiles(x, STEP_PERCENTILES)
        want = [_pct(x, q) for q in STEP_PERCENTILES]
        assert np.array_equal(got, want, equal_nan=True)
        assert [v.hex() for v in got if v == v] == [v.hex() for v in want if v == v]
