"""Every registered policy in the tiered replay: capacity never exceeded, invariants hold,
deterministic, and Belady's offline bound is never beaten on HBM hit rate.

Runs on the interpreted engine (same source as the compiled core; no compile per policy,
so the suite stays within its time budget whatever the number of policies)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvsim.api import simulate
from kvsim.policy.registry import list_policies
from kvsim.spec.sim_config import SimConfig

_CONFTEST = Path(__file__).with_name("conftest.py")
_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest", _CONFTEST)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)

POLICIES = [p.name for p in list_policies()]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    return [_helpers.random_trace(_helpers.TraceBuilder, seed).write(d / f"r{seed}.parquet")
            for seed in (1, 2)]


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_contract(policy, traces, tiny_hw):
    config = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="interpreted",
                       check_invariants=True, tier_policies=(("dram", policy),))
    for trace in traces[:1]:
        a = simulate(trace, policy, config)
        b = simulate(trace, policy, config)
        assert a.summary == b.summary, "same inputs must give identical results"
        assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
        assert a.checks["pool_ok"], a.checks
        assert a.checks["peak_within_capacity"]
        assert a.checks["held_blocks"] == 0 and a.checks["running"] == 0  # all freed
        s = a.summary
        assert s["peak_hbm_blocks"] <= s["hbm_capacity_blocks"]
        assert s["peak_dram_blocks"] <= s["dram_capacity_blocks"]
        assert s["requests"] == 40 and s["overflow_blocks"] == 0
        assert s["evictions_hbm"] + s["spills_hbm"] > 0  # the trace does put pressure on


def test_belady_never_beaten_on_hbm_hit_rate(traces, tiny_hw):
    online = [p for p in POLICIES if p != "belady"]
    for trace in traces:
        config = SimConfig(hardware=tiny_hw, hbm_blocks=10, dram_gb=0,
                           engine="interpreted")
        bound = simulate(trace, "belady", config).summary["hbm_hit_rate"]
        for name in online:
            rate = simulate(trace, name, config).summary["hbm_hit_rate"]
            assert rate <= bound + 1e-12, (name, rate, bound)
