"""kvsim's first-class function values are typed once, not at every call (issue 34).

numba's generic rule for a ``WrapperAddressProtocol`` value calls ``signature()`` and
builds ``FunctionType`` at every call of a compiled function taking it; for ``core.run``
(the closed loop's ``closed_step.advance`` takes it at every call) that hashed the core's
whole state type each time.  kvsim registers its own rule (kvsim.policy.hooks,
kvsim.replay.variants): the type is made once per value, the wrapper address looked up once.
"""

from __future__ import annotations

import numba
from numba import typeof, types

from kvsim.policy.hooks import CompiledHook
from kvsim.replay.variants import RunValue


@numba.njit(cache=False)
def _plus_one(x):
    return x + 1


@numba.njit(cache=False)
def _call_twice(f, x):
    return f(f(x))


def _counting(value):
    calls = []
    original = value.signature

    def signature():
        calls.append(1)
        return original()

    value.signature = signature
    return calls


def test_compiled_hook_typed_once_and_callable():
    h = CompiledHook(_plus_one, types.int64(types.int64))
    calls = _counting(h)
    t1, t2 = typeof(h), typeof(h)
    assert t1 is t2 and isinstance(t1, types.FunctionType)
    assert len(calls) == 1  # numba's generic rule: one call per typeof
    assert _call_twice(h, 1) == 3 and _call_twice(h, 5) == 7
    assert len(calls) == 1
    assert h.__wrapper_address__() == h.__wrapper_address__() != 0


def test_run_value_typed_once():
    v = RunValue(_plus_one, (types.int64,))
    calls = _counting(v)
    assert typeof(v) is typeof(v)
    assert len(calls) == 1
