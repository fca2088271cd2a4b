"""Named policy state (kvsim.policy.api.StateSpec): ``state = STATE.of(state)`` then
``state.t1`` reads and writes the same arrays as ``state.i64[k]``, compiled (StateRef, or a
PolicyState passed directly) and interpreted; a store into an array nothing reads later
is kept (numba's dead-code elimination sees ``STATE.of``'s result as its argument)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from kvsim.policy import hooks
from kvsim.policy.api import StateSpec

STATE = StateSpec(i64=("a", ("pair", 2), "b"), f64=("x",), i8=("flags",))


@njit(cache=False)
def _helper(state, k):
    state.b[k] += 10  # a helper receives the named view


@njit(cache=False)
def _write(state, k):
    state = STATE.of(state)
    flags = state.flags
    p0, p1 = state.pair
    p1[k] = p0[k] + 1
    state.x[0] += 0.5
    _helper(state, k)
    flags[k] = 7  # never read again in this function: must not be dropped
    return state.a[k] + state.i64[0][k]


def _new():
    return STATE.new(a=np.arange(4, dtype=np.int64), pair=(np.full(4, 5, np.int64),
                     np.zeros(4, np.int64)), b=np.zeros(4, np.int64),
                     x=np.zeros(1), flags=np.zeros(4, np.int8))


@pytest.mark.parametrize("how", ["stateref", "policystate", "python"])
def test_named_fields_are_the_declared_arrays(how):
    st = _new()
    assert STATE.index("b") == ("i64", 3) and STATE.index("x") == ("f64", 0)
    if how == "stateref":
        got = _write(hooks.state_ref(st), 2)
    elif how == "policystate":
        got = _write(st, 2)
    else:
        got = _write.py_func(st, 2)
    assert got == 4
    assert st.i64[2].tolist() == [0, 0, 6, 0] and st.i64[3].tolist() == [0, 0, 10, 0]
    assert st.f64[0][0] == 0.5 and st.i8[0].tolist() == [0, 0, 7, 0]


def test_spec_refuses_bad_declarations():
    with pytest.raises(ValueError, match="twice"):
        StateSpec(i64=("a", "a"))
    with pytest.raises(ValueError, match="at most"):
        StateSpec(f64=tuple(f"x{k}" for k in range(7)))
    with pytest.raises(ValueError, match="missing"):
        STATE.new(a=np.zeros(1, np.int64))
