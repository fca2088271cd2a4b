"""Built-in lru lower tiers run their list operations inline in the demotion cascade
(kvsim.replay.kernel.spill, "Built-in lru tiers"; issue 34, the 16-token replay rate).

The driver marks each lower tier whose policy is the built-in lru (``K[K_LOWER_LRU]``),
and the HBM pool when its policy is (``st.cfg[F_LRU]``, kvsim.memory.pool_ops);
``_hbm_evicted_range`` and the pool then run lru's hooks as list operations on the policy's
arrays instead of calling them.  The results must not change: the same replay with the
marks cleared (every tier through its hooks) gives the same summary and the
same decision log, row for row, on the fixed cascade case of
tests/sim/test_compiled_reference.py (DRAM -> CXL -> NVMe -> dropped, tiers of 2 blocks),
with every tier lru and with lru mixed with other policies.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvsim.api import simulate
from kvsim.core import layout as L
from kvsim.policy.registry import resolve_policy
from kvsim.replay import driver
from tests.sim.test_compiled_reference import CASES
from tests.sim.test_reference_diff import (
    build_trace,
    config_from,
    hw_pair,  # noqa: F401  (hw_pair: a fixture)
    replay_log,
    same,
)


def test_lru_mask_marks_builtin_lru_tiers_only():
    lru, arc = resolve_policy("lru"), resolve_policy("arc")
    assert driver._lru_mask([lru, lru, lru]) == 0b1110
    assert driver._lru_mask([lru, arc, lru]) == 0b1010
    assert driver._lru_mask([arc, arc, arc]) == 0
    assert L.K_LOWER_LRU < L.NK


def _cascade_case():
    (name, reqs, max_running, c), = [x for x in CASES if x[3]["cxl"] and x[3]["nvme"]
                                     and x[3]["tier_policy"] == "lru"]
    return reqs, max_running, c


@pytest.mark.parametrize("tiers", [("lru", "lru", "lru"), ("lru", "arc", "lru"),
                                   ("fifo", "lru", "lru")])
def test_inline_lru_equals_hooks(tiers, hw_pair, tmp_path, monkeypatch):  # noqa: F811
    reqs, max_running, c = _cascade_case()
    tb = build_trace(reqs, max_running)
    trace = tb.write(tmp_path / "t.jsonl")
    n_requests = len({r["request_id"] for r in tb.rows if r["request_id"] >= 0})
    config = dataclasses.replace(config_from(c, hw_pair, n_requests), engine="compiled",
                                 tier_policies=tuple(zip(("dram", "cxl", "nvme"), tiers)))
    seen = []
    real = driver._lru_mask
    monkeypatch.setattr(driver, "_lru_mask", lambda lower: seen.append(real(lower)) or
                        seen[-1])
    fast = simulate(trace, "lru", config, decision_log=tmp_path / "fast.parquet")
    assert seen[-1] == sum(1 << t for t, p in enumerate(tiers, 1) if p == "lru")
    monkeypatch.setattr(driver, "_lru_mask", real)
    monkeypatch.setattr(driver, "_is_lru", lambda policy: False)  # HBM and tiers: hooks
    hooks = simulate(trace, "lru", config, decision_log=tmp_path / "hooks.parquet")
    assert fast.summary["spills_dram"] > 0 and fast.summary["spills_cxl"] > 0
    assert fast.summary.keys() == hooks.summary.keys()
    assert all(same(fast.summary[k], hooks.summary[k]) for k in fast.summary), \
        {k: (fast.summary[k], hooks.summary[k]) for k in fast.summary
         if not same(fast.summary[k], hooks.summary[k])}
    assert replay_log(tmp_path / "fast.parquet") == replay_log(tmp_path / "hooks.parquet")
