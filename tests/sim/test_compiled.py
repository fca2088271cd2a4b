"""The compiled engine (numba: ONE core for every policy, the hooks passed to it as
first-class functions) gives exactly the interpreted engine's results: same source, two
executions; and the core is compiled once, whatever the policy.

The comparison runs in the default test run: the open-loop core compiles once (~40-45
CPU-s from an empty numba cache, docs/benchmarks.md "One core"; tests/sim/
test_compiled_reference.py compiles the same core and checks it against the independent
reference), each policy's hooks ~0.5 CPU-s.  The check that every core function compiles
for one signature runs in the slow step (tests/run_suite.sh step 2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvsim.sim import SimConfig, simulate

_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_c",
                                               Path(__file__).with_name("conftest.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)


def _builtins():
    from kvsim.policy_registry import list_policies

    return [p.name for p in list_policies()]


@pytest.mark.parametrize("policy", _builtins())
def test_compiled_equals_interpreted(tiny_hw, tmp_path, policy):
    """Every built-in, in HBM and in DRAM, through the one compiled core (a new policy
    compiles only its hooks: ~12 x a few CPU-s once the core is cached)."""
    trace = _helpers.random_trace(_helpers.TraceBuilder, 3).write(tmp_path / "r.parquet")
    logs = {}
    results = {}
    for engine in ("interpreted", "compiled"):
        cfg = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine=engine,
                        check_invariants=True, tier_policies=(("dram", policy),))
        logs[engine] = tmp_path / f"{engine}.parquet"
        results[engine] = simulate(trace, policy, cfg, decision_log=logs[engine])
    a, b = results["interpreted"], results["compiled"]
    assert a.summary == b.summary
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert b.checks["pool_ok"] and b.checks["peak_within_capacity"]
    # same rows (the file metadata differs: it records the engine in the config)
    import pandas as pd

    assert pd.read_parquet(logs["interpreted"]).equals(pd.read_parquet(logs["compiled"]))


@pytest.mark.slow
def test_one_compilation_per_core_function(tiny_hw, tmp_path):
    """Every jitted function of the core modules (core, spill, pool ops, tier ops) is
    compiled for ONE signature, for every policy: the policies' hooks are values of one
    type (kvsim.memory.hooks).  A constant argument at a call site (``f(x, 0)``) would make
    numba specialise the callee on the literal: a second full compilation of it, and of
    everything that calls it (``_place`` was compiled three times per policy)."""
    from kvsim.memory import pool_ops
    from kvsim.sim import core, spill, tier_ops

    trace = _helpers.random_trace(_helpers.TraceBuilder, 3).write(tmp_path / "r.parquet")
    for policy, prio, swap in (("lru", False, False), ("fifo", True, True),
                               ("s3fifo", False, True)):
        cfg = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="compiled",
                        priority_scheduling=prio, preemption="swap" if swap else "recompute",
                        write_policy="write_through", check_invariants=True,
                        tier_policies=(("dram", policy),))
        simulate(trace, policy, cfg, decision_log=tmp_path / f"log{policy}.parquet")
    for mod in (core, spill, pool_ops, tier_ops):
        for name, fn in vars(mod).items():
            py = getattr(fn, "py_func", None)
            if py is None or py.__module__ != mod.__name__:
                continue
            assert len(fn.signatures) <= 1, (mod.__name__, name, fn.signatures)
    assert len(core.run.signatures) == 1
