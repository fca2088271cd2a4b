"""A small sweep shared by the sweep/report tests (computed once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.analysis.sweep import SweepSpec, run_sweep
from kvsim.spec.sim_config import SimConfig

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "sample_chat.parquet"
#: sample_chat blocks are 2 MiB (Llama-3.1-8B, 16 tokens): 0.06 GB = 28 blocks,
#: 0.2 GB = 95 blocks (the trace has 408 distinct blocks).
HBM_GB = (0.06, 0.2)


#: The interpreted engine: no numba compile of the replay core (the sweep machinery, not
#: the core's speed, is under test here; tests/sim covers the compiled engine).
BASE = SimConfig(engine="interpreted")


def small_spec(policies=("lru",), hbm=HBM_GB) -> SweepSpec:
    return SweepSpec(str(SAMPLE), tuple(policies), tuple(hbm), (None,), BASE, True)


@pytest.fixture(scope="session")
def small_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    res = run_sweep(small_spec(), out, jobs=1, curves=True)
    return res
