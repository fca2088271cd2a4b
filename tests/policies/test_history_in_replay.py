"""Block history across reuse in the tiered replay itself (kvsim.api.simulate, the
interpreted engine: same source as the compiled core), read from the decision log, and
the candidates' ``phase`` / ``pinned`` fields.

The trace (blocks of 4 tokens, HBM of 3 blocks, no lower tier): r0 = [11, partial] and
r1 = [21, partial] run and finish, so 11 then 21 enter HBM and are released in that order;
r2 = [11, partial] revives 11 (a prefix hit) and releases it, now after 21; r3 = [31, 32,
partial] needs 3 blocks: the empty one plus both cached blocks, evicted in policy order.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from kvsim.api import simulate
from kvsim.core.schema import Phase
from kvsim.spec.sim_config import SimConfig
from tests.sim.conftest import TINY_PROFILE, TraceBuilder


@pytest.fixture(scope="module")
def reuse_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("reuse")
    hw = d / "tiny.toml"
    hw.write_text(TINY_PROFILE)
    tb = TraceBuilder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 5); tb.prompt(0, [11, 0], last_tokens=1); tb.ACCESS(0, 5)
    tb.STEP(1000, 100); tb.FREE(0)
    tb.STEP(2000, 1000); tb.ARRIVE(1, 5); tb.prompt(1, [21, 0], last_tokens=1); tb.ACCESS(1, 5)
    tb.STEP(3000, 100); tb.FREE(1)
    tb.STEP(4000, 1000); tb.ARRIVE(2, 5)
    tb.prompt(2, [11, 0], last_tokens=1, phase=Phase.IDLE, pin_requested=True)
    tb.ACCESS(2, 5)
    tb.STEP(5000, 100); tb.FREE(2)
    tb.STEP(6000, 1000); tb.ARRIVE(3, 9); tb.prompt(3, [31, 32, 0], last_tokens=1)
    tb.ACCESS(3, 9)
    tb.STEP(7000, 100); tb.FREE(3)
    return tb.write(d / "t.parquet"), str(hw), d


def _evictions(reuse_trace, policy):
    trace, hw, d = reuse_trace
    log = d / f"{policy}.parquet"
    res = simulate(trace, policy, SimConfig(hardware=hw, hbm_blocks=3, dram_gb=0,
                                            engine="interpreted", check_invariants=True),
                   decision_log=log)
    # 24 prompt tokens, 4 of them hit (r2's block 11)
    assert res.summary["hbm_hit_rate"] == pytest.approx(4 / 24)
    rows = [r for r in pq.read_table(log).to_pylist() if r["action"] == 0]  # EVICT
    return rows


@pytest.mark.parametrize("policy, order", [
    ("fifo", [11, 21]),  # first admitted: 11, however recently it was reused
    ("lru", [21, 11]),  # last access = release: 21 (r1) before 11 (r2)
    ("vllm", [21, 11]),  # free queue: release order
    ("lfu", [21, 11]),  # 11 was accessed twice, 21 once
    ("sieve", [21, 11]),  # 11 visited by r2's hit: the hand spares it once
])
def test_eviction_order_keeps_history_across_reuse(reuse_trace, policy, order):
    # Before block history survived reuse, fifo evicted in release order: [21, 11].
    assert [r["content_hash"] for r in _evictions(reuse_trace, policy)] == order


def test_candidates_carry_phase_and_pinned(reuse_trace):
    # lru's first eviction: victim 21 (r1's prefill: phase PREFILL, no pin), runner-up 11
    # (last touched by r2, whose records say IDLE and pin requested).
    first = _evictions(reuse_trace, "lru")[0]
    cands = [(c["content_hash"], c["phase"], c["pinned"]) for c in first["candidates"]]
    assert cands == [(21, int(Phase.PREFILL), False), (11, int(Phase.IDLE), True)]
