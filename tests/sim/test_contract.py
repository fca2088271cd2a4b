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


def _policy_overloads() -> set:
    """(module, function, signature) of every compiled overload the policies' own modules'
    numba functions hold in this process (compiled or loaded from numba's disk cache)."""
    import sys

    from numba.core.dispatcher import Dispatcher

    return {(name, f, sig) for name, mod in list(sys.modules.items())
            if name.startswith("kvsim.policies.")
            for f, d in vars(mod).items() if isinstance(d, Dispatcher)
            for sig in d.overloads}


def test_the_interpreted_engine_compiles_none_of_a_policys_code(traces, tiny_hw):
    """The engine picked to compile nothing compiles nothing: a policy's hooks run as plain
    Python and so do the helpers they call (kvsim.jit.python_twin).  Before, deadline's
    ``_file`` / ``_expire``, s3fifo's sweeps, ... compiled for the types Python passes (~49
    CPU-s of the default test step from empty caches; a run of ``--policy deadline`` on a
    small trace compiled ~20 CPU-s of it)."""
    config = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="interpreted",
                       tier_policies=(("dram", "s3fifo"),))
    before = _policy_overloads()
    for name in POLICIES:
        simulate(traces[0], name, config)
    assert _policy_overloads() - before == set()


def test_the_interpreted_closed_loop_runs_vllms_scheduler_as_python(monkeypatch):
    """On the interpreted engine with vLLM's compiled step not compiled yet, the closed
    loop's step driver, vLLM's scheduler under it (``vllm_rows``, ``vllm_step``) and its
    pool value are plain Python: no module of that twin reads a compiled function by name,
    the pool is no structref, and the run gives the compiled engine's steps.  Before, the
    twin always called the compiled ``vllm_rows`` from Python, so a small first run with
    vLLM's scheduler (the default) compiled it: ~30 of its ~35 CPU-s (docs/simulate.md,
    "Engines").  Once ``vllm_rows`` is compiled (here: the compiled engine ran), the
    interpreted loop calls it again (``python_vllm``)."""
    import numpy as np
    from numba.core.dispatcher import Dispatcher
    from numba.experimental.structref import StructRefProxy

    from kvsim.engine.vllm_value import VS_POOL
    from kvsim.modes.closed import closed_loop
    from kvsim.replay import variants
    from tests.helpers import small_closed_engine

    tw = variants.closed_for(variants.interpreted(), True)
    rows = tw.vllm_rows.__globals__
    step = rows["V"]
    for name, space in (("closed_step", vars(tw)), ("vllm_rows", rows),
                        ("vllm_step", vars(step))):
        compiled = sorted(k for k, v in space.items() if isinstance(v, Dispatcher))
        assert compiled == [], (name, compiled)
    assert step.pool_ops is variants.interpreted().ops
    assert not isinstance(tw.CF.pool_members, Dispatcher)
    with monkeypatch.context() as m:  # as on a cold cache
        m.setattr(closed_loop, "python_vllm", lambda core: not variants.is_compiled(core))
        py = small_closed_engine("interpreted")
    jit = small_closed_engine("compiled")
    assert py.py_vllm and not isinstance(py.vs[VS_POOL], StructRefProxy)
    for e in (py, jit):
        e.advance()
        e.finish()
    assert py.steps == jit.steps > 20
    np.testing.assert_array_equal(py.sched.st, jit.sched.st)
    np.testing.assert_array_equal(py.run.C, jit.run.C)
    again = small_closed_engine("interpreted")  # vllm_rows compiled in this process now
    assert not again.py_vllm and isinstance(again.vs[VS_POOL], StructRefProxy)


def test_the_interpreted_closed_loop_runs_kvsims_scheduler_as_python(monkeypatch):
    """As vLLM's above, for kvsim's own scheduler (``--scheduler kvsim``): while its compiled
    ``run_steps`` is not compiled yet, the interpreted step driver reads a twin of
    :mod:`kvsim.engine.scheduler` in which no function is compiled, and the run gives the
    compiled engine's steps.  Before, the twin called the compiled ``run_steps`` (and
    ``_ensure``) from Python: the first run of the README's 65-request sample with
    ``--scheduler kvsim`` compiled them, 26.8 CPU-s of its 27 (7.5 after; docs/simulate.md,
    "Engines").  Once ``run_steps`` is compiled, the interpreted loop calls it again."""
    import numpy as np
    from numba.core.dispatcher import Dispatcher

    from kvsim.modes.closed import closed_loop
    from kvsim.replay import variants
    from tests.helpers import small_closed_engine

    tw = variants.closed_for(variants.interpreted(), False, True)
    compiled = sorted(k for k, v in vars(tw.S).items() if isinstance(v, Dispatcher))
    assert compiled == [], compiled
    assert variants.closed_for(variants.interpreted()).S is not tw.S  # compiled there
    with monkeypatch.context() as m:  # as on a cold cache
        m.setattr(closed_loop, "python_kvsim", lambda core: not variants.is_compiled(core))
        py = small_closed_engine("interpreted", "kvsim")
    jit = small_closed_engine("compiled", "kvsim")
    assert py.py_kvsim and py.step_mod.S is tw.S
    for e in (py, jit):
        e.advance()
        e.finish()
    assert py.steps == jit.steps > 20
    np.testing.assert_array_equal(py.sched.st, jit.sched.st)
    np.testing.assert_array_equal(py.run.C, jit.run.C)
    again = small_closed_engine("interpreted", "kvsim")  # run_steps compiled in this process
    assert not again.py_kvsim and again.step_mod.S is not tw.S


def test_python_twin_runs_no_compiled_code():
    """A twin calls its helpers' twins (by global name, nested code included) and leaves the
    dispatchers untouched; it gives what the compiled function gives."""
    import numba

    from kvsim.jit.python_twin import python_twin

    assert python_twin(_outer) is not _outer.py_func
    assert python_twin(_leaf) is _leaf.py_func  # reads no dispatcher: its own Python
    assert python_twin(_outer)(5) == 5 * 3 + sum(2 * i for i in range(5))
    assert (_outer.signatures, _mid.signatures, _leaf.signatures) == ([], [], [])
    assert _outer(5) == python_twin(_outer)(5)
    assert isinstance(_mid, numba.core.dispatcher.Dispatcher)


@__import__("numba").njit
def _leaf(x):
    return 2 * x


@__import__("numba").njit
def _mid(x):
    return [_leaf(i) for i in range(x)]


@__import__("numba").njit
def _outer(x):
    return 3 * x + sum(_mid(x))
