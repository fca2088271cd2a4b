"""The compiled closed loop's quiet steps (:mod:`kvsim.replay.kernel.closed_ffwd`) change no
output: the compiled engine (which runs steps where only time moves in one go) against the
interpreted twin (which runs every step through vLLM's ``schedule()`` and the core), every
step record, every request column and every summary figure equal.

Hand-built Request tables (llama-3-8b on h100-sxm, 16-token blocks): long decodes that
cross block boundaries, overlapping and spaced arrivals, shared prefixes, TTFT and TPOT
deadlines (the decode rows' deadlines), so most steps are quiet and every way a step stops
being quiet (an arrival, a new block, a cached block, a finish) happens."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig

B = 16


def _table(seed: int, n: int = 14):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(20, 150, n)
    output = rng.integers(1, 200, n)
    arrival = np.cumsum(rng.integers(0, 60_000, n))
    shared = list(range(1, 5))  # a 4-block prefix every third request shares
    ids, k = [], 100
    for i, p in enumerate(prompt):
        nb = (int(p) + B - 1) // B
        own = list(range(k, k + nb))
        k += nb
        ids.append((shared + own)[:nb] if i % 3 == 0 else own)
    ttft = np.where(np.arange(n) % 4 == 1, 200_000, -1)
    tpot = np.where(np.arange(n) % 5 == 2, 30_000, -1)
    return build_request_table(
        {"arrival_us": arrival, "prompt_tokens": prompt, "output_tokens": output,
         "block_ids": ids, "hashed_tokens": [min(len(x) * B, int(p)) for x, p in zip(ids, prompt)],
         "ttft_deadline_us": ttft, "tpot_deadline_us": tpot},
        block_size_tokens=B)


def _same(a, b):
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    sa = {k: v for k, v in a.summary.items() if k not in ("engine", "wall_s")}
    sb = {k: v for k, v in b.summary.items() if k not in ("engine", "wall_s")}
    assert repr(sa) == repr(sb)


@pytest.mark.parametrize("replicas,router,hbm", [(1, "round_robin", 40), (1, "round_robin", 400),
                                                  (3, "prefix", 60)])
def test_quiet_steps_change_no_output(replicas, router, hbm):
    t = _table(replicas * 7 + hbm)
    vllm = EngineOptions(scheduler="vllm")
    runs = [serve(t, "lru", SimConfig(mode="engine", hbm_blocks=hbm, engine=e),
                  replicas=replicas, router=router, engine=vllm)
            for e in ("compiled", "interpreted")]
    assert len(runs[0].steps) > 150
    _same(*runs)


def test_quiet_steps_use_the_step_drivers_aux_columns():
    """closed_ffwd cannot import closed_step (closed_step imports it): its copies of the
    aux column numbers must stay closed_step's."""
    from kvsim.replay.kernel import closed_ffwd, closed_step

    assert (closed_ffwd._X_NINSYS, closed_ffwd._X_ROWS, closed_ffwd._X_QUIET,
            closed_ffwd._X_QCACHE, closed_ffwd._X_QHEAD) == (
        closed_step.X_NINSYS, closed_step.X_ROWS, closed_step.X_QUIET, closed_step.X_QCACHE,
        closed_step.X_QHEAD)
