"""Per-step tier occupancy in ``SimResult.steps``: exact counts on a hand-made trace, and
never above capacity on seeded random traces.

Interpreted engine (no compile); tests/sim/test_compiled.py checks the compiled engine
gives the same step table.  Blocks are 4 tokens / 100 bytes (tests/sim/conftest.py).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.core import layout as L
from kvsim.core.schema import Phase
from kvsim.replay.kernel import core
from kvsim.replay.metrics import OCCUPANCY_COLUMNS, step_table
from kvsim.spec.sim_config import SimConfig

_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_occ",
                                               Path(__file__).with_name("conftest.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)

#: 3 blocks of 100 bytes: 3e-7 GB x 1e9 bytes/GB = 300 bytes.
DRAM_3_BLOCKS_GB = 3e-7
#: 4 blocks of 100 bytes.
CXL_4_BLOCKS_GB = 4e-7


def cfg(hw, **kw) -> SimConfig:
    kw.setdefault("engine", "interpreted")
    kw.setdefault("check_invariants", True)
    return SimConfig(hardware=hw, **kw)


def _core_passes_pool_scalars() -> bool:
    """True once kvsim.replay.kernel.core hands ``st.sc`` to ``_finalize_step`` (both call sites)."""
    src = inspect.getsource(core)
    return src.count("_finalize_step(C, R_i, R_f, S, P, st.sc)") == 2


@pytest.fixture
def pool_scalars(monkeypatch):
    """``enable(policy)``: the interpreted replay of ``policy`` (lower tiers lru) with
    ``_finalize_step`` given the pool's scalars ``st.sc`` -- the change requested in
    kvsim.replay.kernel.core (pass ``st.sc`` at its two call sites).  Until the core does it, the
    call is wrapped here: the caller's frame (``run`` or ``finish`` of the interpreted
    twin) holds ``st``."""
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.variants import interpreted

    def enable(policy: str = "lru") -> None:
        if _core_passes_pool_scalars():
            return
        lru = resolve_policy("lru")
        tw = interpreted(resolve_policy(policy), [lru, lru, lru])
        inner = tw._finalize_step

        def with_scalars(C, R_i, R_f, S, P, sc=None):
            return inner(C, R_i, R_f, S, P, sys._getframe(1).f_locals["st"].sc)

        monkeypatch.setattr(tw, "_finalize_step", with_scalars)

    return enable


def lru_churn(builder):
    """HBM 3 blocks, DRAM 3 blocks, lru everywhere, write_back.  Each request: 2 full
    blocks + 1 partial (unhashed) block, one prefill step then one decode step and FREE.

    step 0: r0 [11, 12, p] takes the 3 empty blocks               held 3 cached 0 DRAM 0
    step 1: r0 frees tail-first: p -> empty, 12, 11 -> cached       held 0 cached 2 DRAM 0
    step 2: r1 [21, 22, p]: 1 empty + evicts 12, 11 -> DRAM         held 3 cached 0 DRAM 2
    step 3: r1 frees                                                held 0 cached 2 DRAM 2
    step 4: r2 [11, 12, p]: promoted from DRAM (inclusive: copies stay); 1 empty + evicts
            22, 21 -> demoted: one fills DRAM's free slot, one evicts DRAM's lru block
                                                                    held 3 cached 0 DRAM 3
    step 5: r2 frees                                                held 0 cached 2 DRAM 3
    step 6: r3 [11, p] (prompt 5): revives cached 11 (hit), p from the empty block
                                                                    held 2 cached 1 DRAM 3
    step 7: r3 frees: p -> empty, 11 -> cached                      held 0 cached 2 DRAM 3
    """
    tb = builder()
    for k, (r, hashes, prompt) in enumerate([(0, [11, 12, 0], 9), (1, [21, 22, 0], 9),
                                             (2, [11, 12, 0], 9), (3, [11, 0], 5)]):
        tb.STEP(2000 * k, 1000); tb.ARRIVE(r, prompt)
        tb.prompt(r, hashes, last_tokens=1); tb.ACCESS(r, prompt)
        tb.STEP(2000 * k + 1000, 100); tb.ACCESS(r, 1, Phase.DECODE); tb.FREE(r)
    return tb


HELD = [3, 0, 3, 0, 3, 0, 2, 0]
CACHED = [0, 2, 0, 2, 0, 2, 1, 2]
DRAM = [0, 0, 2, 2, 3, 3, 3, 3]


def test_lru_per_step_hbm_and_dram_blocks(builder, tiny_hw, tmp_path):
    trace = lru_churn(builder).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, dram_gb=DRAM_3_BLOCKS_GB))
    s = res.summary
    assert (s["hbm_capacity_blocks"], s["dram_capacity_blocks"]) == (3, 3)
    assert (s["cxl_capacity_blocks"], s["nvme_capacity_blocks"]) == (0, 0)
    st = res.steps
    assert st["step"].tolist() == list(range(8))
    assert st["hbm_used_blocks"].tolist() == HELD
    assert st["dram_used_blocks"].tolist() == DRAM
    assert st["cxl_used_blocks"].tolist() == [0] * 8
    assert st["nvme_used_blocks"].tolist() == [0] * 8
    # bytes = blocks x 100 (4 tokens x 25 bytes)
    assert st["hbm_used_bytes"].tolist() == [100 * b for b in HELD]
    assert st["dram_used_bytes"].tolist() == [100 * b for b in DRAM]
    for c in ("hbm_used_blocks", "dram_used_blocks", "hbm_used_bytes"):
        assert st[c].dtype == np.int64
    # the same moves the summary counts: 2 + 2 HBM spills, 1 DRAM eviction, 2 promotions
    assert s["spills_hbm"] == 4 and s["evictions_dram"] == 1 and s["promotions"] == 2
    assert (s["peak_hbm_blocks"], s["peak_dram_blocks"]) == (3, 3)


def test_lru_per_step_hbm_cached_blocks(builder, tiny_hw, tmp_path, pool_scalars):
    pool_scalars("lru")
    trace = lru_churn(builder).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, dram_gb=DRAM_3_BLOCKS_GB))
    st = res.steps
    assert st["hbm_cached_blocks"].tolist() == CACHED
    assert st["hbm_cached_bytes"].tolist() == [100 * b for b in CACHED]
    assert st["hbm_used_blocks"].tolist() == HELD
    assert list(st.columns[7:12]) == list(OCCUPANCY_COLUMNS)


def test_cached_column_left_out_when_not_recorded():
    S = np.zeros((2, L.NS))
    S[:, L.S_HBM_CACHED] = -1.0
    S[:, L.S_USED] = [2, 1]
    df = step_table(S, 100)
    assert "hbm_cached_blocks" not in df and "hbm_cached_bytes" not in df
    assert df["hbm_used_blocks"].tolist() == [2, 1]
    assert df["hbm_used_bytes"].tolist() == [200, 100]
    assert "hbm_used_bytes" not in step_table(S)  # no block size: no bytes columns


def test_finalize_step_copies_counters_and_pool_scalars():
    from kvsim.memory import fast
    from kvsim.replay.kernel.bookkeeping import _finalize_step

    fin = getattr(_finalize_step, "py_func", _finalize_step)
    C = np.zeros(L.NC)
    C[L.C_USED:L.C_USED + 4] = [5, 6, 7, 8]
    R_i, R_f = L.new_request_tables(1)
    S = np.zeros((2, L.NS))
    P = np.zeros((4, 3), dtype=np.int64)
    fin(C, R_i, R_f, S, P)
    assert S[0, L.S_USED:L.S_USED + 4].tolist() == [5, 6, 7, 8]
    assert S[0, L.S_HBM_CACHED] == -1.0
    sc = np.zeros(4, dtype=np.int64)
    sc[fast.S_N_HELD] = 9
    sc[fast.S_N_CAND] = 4
    sc[fast.S_N_EMPTY] = 1
    fin(C, R_i, R_f, S, P, sc)
    assert S[1, L.S_USED:L.S_USED + 4].tolist() == [9, 6, 7, 8]
    assert S[1, L.S_HBM_CACHED] == 4.0


@pytest.mark.parametrize("policy", ["lru", "s3fifo", "belady"])
@pytest.mark.parametrize("seed", [0, 1])
def test_occupancy_never_exceeds_capacity(builder, tiny_hw, tmp_path, policy, seed,
                                          pool_scalars):
    """HBM 6 blocks, DRAM 3, CXL 4: pressure on every tier; at every step held + cached
    fits HBM, every lower tier fits its capacity, and no step-end value passes the peak."""
    pool_scalars(policy)
    trace = _helpers.random_trace(builder, seed).write(tmp_path / "r.parquet")
    res = simulate(trace, policy, cfg(tiny_hw, hbm_blocks=6, dram_gb=DRAM_3_BLOCKS_GB,
                                      cxl_gb=CXL_4_BLOCKS_GB))
    s, st = res.summary, res.steps
    assert (s["hbm_capacity_blocks"], s["dram_capacity_blocks"],
            s["cxl_capacity_blocks"]) == (6, 3, 4)
    resident = st["hbm_used_blocks"] + st["hbm_cached_blocks"]
    assert resident.max() <= 6 and st["hbm_cached_blocks"].min() >= 0
    for tier in ("hbm", "dram", "cxl", "nvme"):
        col = st[f"{tier}_used_blocks"]
        assert col.min() >= 0
        assert col.max() <= s[f"{tier}_capacity_blocks"]
        assert col.max() <= s[f"peak_{tier}_blocks"]
    # the pressure is real: both lower tiers filled up at some step end
    assert st["dram_used_blocks"].max() == 3 and st["cxl_used_blocks"].max() == 4
    assert res.checks["pool_ok"] and res.checks["peak_within_capacity"]
