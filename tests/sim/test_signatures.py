"""One compiled signature per function where kvsim can have it without patching numba.

* ``core.run``'s event columns came read-only (Parquet columns read without a copy) or
  writable (the boolean columns, JSONL traces, the closed loop), two numba types:
  :func:`kvsim.replay.variants.run_cols` passes them read-only always.
* A constant argument at a call site from compiled code is typed as a literal, and numba
  compiles the callee once per distinct set of constants (``scheduler._row`` 17 times,
  ``tiers.log_row`` 13 in the README job).  kvsim used to retype such calls by replacing
  each dispatcher's ``get_call_template`` (``plain_calls``); since #31 it writes nothing
  into numba, and numba's own behaviour (the control below) holds; the row writers are
  declared with ``kvsim.jit.decorators.helper`` (numba's ``register_jitable``), typed once
  at non-literal types: docs/jit.md.

The functions here are tiny and compile in well under a second; nothing of the replay
core compiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit, typeof


def _callees():
    """Fresh dispatchers (no signature compiled yet) and callers of them that pass
    constants: ``add(x, 0)``, ``add(x, 1)``, ``add(x, k)``, and ``pick(t, 1)`` on a
    heterogeneous tuple (only a literal index can type it)."""

    @njit
    def add(x, k):
        return x + k

    @njit
    def pick(t, k):
        return t[k]

    @njit
    def callers(x):
        k = x * 2
        return add(x, 0) + add(x, 1) + add(x, k)

    @njit
    def picker(x):
        return pick((x, 2.5), 1)

    return add, pick, callers, picker


def test_each_constant_at_a_call_site_is_a_signature():
    """numba's own behaviour, which kvsim no longer changes: one compile per literal."""
    add, _, callers, _ = _callees()
    assert callers(3) == 16
    assert len(add.signatures) == 3
    assert sorted(str(s) for s in add.signatures) == [
        "(int64, Literal[int](0))", "(int64, Literal[int](1))", "(int64, int64)"]


def test_a_helper_is_typed_once_whatever_constants_its_callers_pass():
    """kvsim.jit.decorators.helper (numba's register_jitable): the same three call sites
    compile the callee once, at its non-literal types; the control above compiles it three
    times.  The row writers the engine calls with constant codes are helpers."""
    from numba.core import event

    from kvsim.engine import scheduler, vllm_step
    from kvsim.jit.decorators import helper
    from kvsim.replay.kernel import tiers

    def add(x, k):
        return x + k

    add = helper()(add)

    @njit
    def callers(x):
        k = x * 2
        return add(x, 0) + add(x, 1) + add(x, k)

    compiled = []

    class Listener(event.Listener):
        def on_start(self, ev):
            compiled.append(getattr(ev.data["dispatcher"].py_func, "__name__", "?"))

        def on_end(self, ev):
            pass

    with event.install_listener("numba:compile", Listener()):
        assert callers(3) == 16
    assert compiled.count("add") == 1, compiled
    assert add(3, 0) == 3  # from Python: plain Python
    for f in (scheduler._row, tiers.log_row, vllm_step._event):
        assert f.jit_options.get("_nrt") is False, f


def test_event_columns_have_one_type_whatever_their_source(tmp_path):
    """The columns of a Parquet trace as the replay reads them (read-only, but the
    boolean ones writable) and the closed loop's writable columns type the same once
    through ``run_cols``: one signature of ``core.run`` for both."""
    from kvsim.modes.closed.closed_loop import _new_cols
    from kvsim.replay.kernel import core
    from kvsim.replay.prepass import _open
    from kvsim.replay.variants import run_cols
    from tests.sim.conftest import TraceBuilder, random_trace

    path = random_trace(TraceBuilder, 3).write(tmp_path / "r.parquet")
    with _open(path) as reader:
        cols = next(iter(reader.batches(1 << 16)))
    parquet = tuple(cols[name] for name in core.COLS)
    closed = _new_cols(16)
    assert typeof(parquet) != typeof(closed)  # as they come: two types
    assert any(a.flags.writeable for a in parquet) and not all(a.flags.writeable
                                                              for a in parquet)
    a, b = run_cols(parquet), run_cols(closed)
    assert typeof(a) == typeof(b)
    assert not any(x.flags.writeable for x in a + b)
    # views, not copies: the closed loop keeps filling the arrays run reads
    closed[0][3] = 41
    assert b[0][3] == 41 and b[0].base is closed[0]
    for x, y in zip(parquet, a):
        assert np.shares_memory(x, y) or x.size == 0


# --- the C wrapper only where a function is a value (kvsim.jit.decorators.FIRST_CLASS) ---


def test_the_decorator_drops_the_c_wrapper_of_functions_that_are_never_values():
    from kvsim.memory import fast, fifo_order
    from kvsim.replay.kernel import core, placement

    assert placement._place.targetoptions.get("no_cfunc_wrapper") is True
    assert fast.pool_check.targetoptions.get("no_cfunc_wrapper") is True
    assert not core.run.targetoptions.get("no_cfunc_wrapper")
    assert not fifo_order.victim.targetoptions.get("no_cfunc_wrapper")


def test_every_builtin_hook_keeps_its_c_wrapper():
    """Every hook of every built-in policy (lower tiers' and vLLM's order included) can be
    a first-class value: CompiledHook refuses a dispatcher compiled without the wrapper.
    Building the values compiles nothing (they compile when first called)."""
    from kvsim.memory import fifo_order
    from kvsim.policy.hooks import CompiledHook, compiled_hooks
    from kvsim.policy.registry import list_policies

    n = 0
    for pol in [*list_policies(), fifo_order]:
        if not getattr(pol, "compiled", True):
            continue
        for hook in compiled_hooks(pol):
            assert not hook.dispatcher.targetoptions.get("no_cfunc_wrapper"), hook
            # lazy: a new value compiles nothing (compiled_hooks is memoised per process,
            # so other tests may have called these)
            assert CompiledHook(hook.dispatcher, hook.sig)._cres is None
            n += 1
    assert n >= 8 * 10


def test_a_function_without_the_wrapper_is_refused_as_a_value():
    import pytest

    from kvsim.policy.hooks import CompiledHook, hook_signatures
    from kvsim.replay.kernel import placement

    with pytest.raises(RuntimeError, match="FIRST_CLASS"):
        CompiledHook(placement._release_all, hook_signatures()[0])
