"""Named policy state (kvsim.policy.api.StateSpec): ``state = STATE.of(state)`` then
``state.t1`` reads and writes the same arrays as ``state.i64[k]``, compiled (StateRef, or a
PolicyState passed directly) and interpreted; a store into an array nothing reads later
is kept (numba's dead-code elimination sees ``STATE.of``'s result as its argument)."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_the_interpreted_view_keeps_its_numba_type_across_processes():
    """numba keys its disk cache by argument types, and a namedtuple's type by its class:
    the interpreted hooks' view class must come back from the cache's pickle as the live
    class (found by module and name), else every interpreted run compiles the policy's
    njit helpers again and grows their cache index (a class made anew in each process
    did: ~20 CPU-s a run for deadline's)."""
    import pickle

    from numba import typeof

    view = STATE.of(_new())
    cls = type(view)
    assert getattr(__import__(cls.__module__, fromlist=["_"]), cls.__qualname__) is cls
    ty = typeof(view)
    assert pickle.loads(pickle.dumps(ty)) == ty
    # every built-in policy's spec names its class the same way
    from kvsim.policy.registry import list_policies

    named = 0
    for pol in list_policies():
        spec = getattr(pol.module, "STATE", None)
        if isinstance(spec, StateSpec):
            c = spec._cls
            assert getattr(__import__(c.__module__, fromlist=["_"]), c.__qualname__) is c
            named += 1
    assert named >= 2  # deadline and s3fifo at least


def test_spec_refuses_bad_declarations():
    with pytest.raises(ValueError, match="twice"):
        StateSpec(i64=("a", "a"))
    with pytest.raises(ValueError, match="at most"):
        StateSpec(f64=tuple(f"x{k}" for k in range(7)))
    with pytest.raises(ValueError, match="missing"):
        STATE.new(a=np.zeros(1, np.int64))


# ---- every built-in reads its state by name ----------------------------------------------

_GROUP_ATTRS = {"i64", "f64", "i8", "i64_2d"}
_SLOT_HELPERS = {"heap_in", "ghost_in"}  # heap_in(state, 0, 4): slots by number, too


def _is_int_literal(node) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _is_slot(node) -> bool:
    """An integer literal, or an upper-case name (a slot constant such as ``PREV = 0``)."""
    return _is_int_literal(node) or (isinstance(node, ast.Name) and node.id.isupper())


def numbered_state_accesses(source: str) -> list[str]:
    """``line: text`` of every ``<x>.i64[3]`` or ``<x>.i64[PREV]`` (any group, an integer
    literal or a slot constant) and every ``heap_in``/``ghost_in`` call given a literal
    slot, in ``source``, in line order."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in _GROUP_ATTRS and _is_slot(node.slice):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _SLOT_HELPERS and any(map(_is_slot, node.args[1:])):
            out.append((node.lineno, ast.unparse(node)))
    return [f"{line}: {text}" for line, text in sorted(out)]


POLICY_FILES = sorted(Path(__file__).resolve().parents[2].joinpath("policies").glob("*.py"))


def test_the_scan_finds_numbered_slots():
    old = ("x = state.i64[3][b]\nstate.i8[-1][b] = 1\nh = heap_in(state, KEY, HEAP)\n"
           "y = state.i64[PREV]\nok = state.ints[0]\nok2 = state.i64[k]\n")
    assert [s.split(":")[0] for s in numbered_state_accesses(old)] == ["1", "2", "3", "4"]


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: p.name)
def test_no_policy_indexes_its_state_by_number(path):
    found = numbered_state_accesses(path.read_text())
    assert not found, (f"{path.name} indexes its state by number; declare STATE = "
                       f"StateSpec(...) and use names (docs/policies.md, Named state): {found}")
