"""``state.<group>[k]`` on a compiled StateRef (kvsim.policy.state_access): one array loaded
from the struct, the PolicyState's own; indices checked as for a tuple; unsupported uses
refused with a typing error that says what to do."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from numba import errors, njit

from kvsim.policy import hooks
from kvsim.policy.api import STATE_F64, STATE_I8, STATE_I64, STATE_I64_2D, policy_state
from kvsim.policy.state_access import StateGroup


def _state():
    return policy_state(i64=[np.arange(4, dtype=np.int64) + 10 * i for i in range(5)],
                        f64=[np.full(3, 0.5), np.full(3, 2.25)],
                        i8=[np.zeros(3, np.int8), np.ones(3, np.int8)],
                        i64_2d=[np.zeros((2, 3), np.int64)])


@njit
def _read_write(state, k):
    a = state.i64[2]  # constant index
    b = state.i64[k + 2]  # computed index (as kvsim.policy.structs.heap_in)
    flags = state.i8[-1]  # constant, from the end: i8[3], an unused (empty) slot
    first = state.i8[1]
    table = state.i64_2d[0]
    keys = state.f64[k]
    a[0] = 111
    b[3] = 222
    first[2] = 7
    table[1, 2] = 333
    return a[1] + b[2] + keys[0] + flags.shape[0] + first[0]


def test_loads_the_policystate_arrays_and_writes_land_in_them():
    st = _state()
    ref = hooks.state_ref(st)
    # a = i64[2] = [20, 21, 22, 23]; b = i64[3] = [30, 31, 32, 33]; f64[1][0] = 2.25;
    # i8[3] is empty; i8[1][0] = 1
    assert _read_write(ref, 1) == 21 + 32 + 2.25 + 0 + 1
    assert st.i64[2].tolist() == [111, 21, 22, 23]
    assert st.i64[3].tolist() == [30, 31, 32, 222]
    assert st.i8[1].tolist() == [1, 1, 7]
    assert st.i64_2d[0].tolist() == [[0, 0, 0], [0, 0, 333]]
    assert st.i64[0].tolist() == [0, 1, 2, 3] and st.i64[4].tolist() == [40, 41, 42, 43]
    # k = 0: b = i64[2] (= a), keys = f64[0]
    assert _read_write(ref, 0) == 21 + 22 + 0.5 + 0 + 1
    assert st.i64[2].tolist() == [111, 21, 22, 222]


def test_the_group_is_the_proxy_not_the_tuple():
    """What makes the compile cheaper: ``state.i64`` is typed as the proxy."""
    ref = hooks.state_ref(_state())
    _read_write(ref, 0)
    (cres,) = _read_write.overloads.values()
    groups = {t.group for t in cres.type_annotation.typemap.values()
              if isinstance(t, StateGroup)}
    assert groups == {"i64", "i8", "i64_2d", "f64"}


@njit
def _at(state, k):
    return state.i64[k][0]


@njit
def _at_f64(state, k):
    return state.f64[k].shape[0]


def test_run_time_index_is_checked_as_for_a_tuple():
    st = _state()
    ref = hooks.state_ref(st)
    assert [_at(ref, k) for k in range(5)] == [0, 10, 20, 30, 40]
    assert _at_f64(ref, -STATE_F64) == 3  # f64[0]
    assert _at_f64(ref, -1) == 0  # f64[5], unused
    for k in (STATE_I64, 10 ** 6, -STATE_I64 - 1):
        with pytest.raises(IndexError, match="tuple index out of range"):
            _at(ref, k)


def test_len_and_passing_a_group_whole():
    @njit
    def second(group):
        return group[1][0] + len(group)

    @njit
    def f(state):
        return (second(state.i64), len(state.i64), len(state.f64), len(state.i8),
                len(state.i64_2d))

    assert f(hooks.state_ref(_state())) == (10 + STATE_I64, STATE_I64, STATE_F64, STATE_I8,
                                            STATE_I64_2D)


def test_constant_index_out_of_range_fails_to_compile():
    @njit
    def f(state):
        return state.i64[24][0]

    with pytest.raises(errors.TypingError, match=r"state.i64\[24\]: index out of range"):
        f(hooks.state_ref(_state()))


@pytest.mark.parametrize("body", ["iterate", "slice"])
def test_iteration_and_slices_are_refused_with_a_clear_error(body):
    @njit
    def iterate(state):
        n = 0
        for a in state.i64:
            n += a.shape[0]
        return n

    @njit
    def slice_(state):
        return state.i64[1:3]

    f = iterate if body == "iterate" else slice_
    what = "iteration" if body == "iterate" else "a slice"
    with pytest.raises(errors.TypingError, match=f"{what} of StateRef.i64.* is not supported "
                                                 r"in compiled code: index it"):
        f(hooks.state_ref(_state()))


def test_unpacking_a_group_whole_is_refused():
    @njit
    def unpack(state):
        a, b, c, d = state.i8
        return a.shape[0]

    with pytest.raises(errors.TypingError, match=r"failed to unpack StateRef.i8\[4 x "):
        unpack(hooks.state_ref(_state()))


def test_no_reference_leaks():
    """Each access increfs the structref once and the array once, and releases both: the
    arrays' Python reference counts are the same after many calls."""
    st = _state()
    ref = hooks.state_ref(st)
    _read_write(ref, 1)
    before = [sys.getrefcount(a) for a in st.i64[:5] + st.f64[:2] + st.i8[:2] + st.i64_2d]
    for _ in range(200):
        _read_write(ref, 1)
        _at(ref, 3)
    after = [sys.getrefcount(a) for a in st.i64[:5] + st.f64[:2] + st.i8[:2] + st.i64_2d]
    assert after == before


def test_setting_a_group_still_takes_the_tuple():
    """Assigning a group (``hooks._new_ref`` does, for all four) is numba's structref
    setattr, typed with the field's tuple type; later reads see the new arrays."""

    @njit
    def replace_i64(state, arrays):
        state.i64 = arrays

    st, other = _state(), policy_state(i64=[np.full(2, 7, np.int64)] * 3)
    ref = hooks.state_ref(st)
    assert _at(ref, 1) == 10
    replace_i64(ref, other.i64)
    assert [_at(ref, k) for k in range(3)] == [7, 7, 7]
    assert _at_f64(ref, 0) == 3  # the other groups are untouched
