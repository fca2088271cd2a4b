"""kvsim's struct types have short names (kvsim.jit.struct_type): numba spells a type's name
into the symbol of every compiled function taking it, and the replay core's state spelled
out in full made ~85-105 KB symbols (``core.run``'s cached library: 10 MB, now ~1 MB).
Nothing here compiles."""

from __future__ import annotations

from numba import types
from numba.core.funcdesc import default_mangler
from numba.experimental import structref

from kvsim.engine.vllm_pool import VLLM_POOL
from kvsim.jit.struct_type import StructType, short_name
from kvsim.memory.pool_ref import POOL_REF
from kvsim.policy.hooks import STATE_REF, TIER_REF, VIEW_REF, hook_signatures, policy_value_type
from kvsim.replay.kernel.core_ref import CORE_REF


def _kvsim_struct_types():
    return {"StateRef": STATE_REF, "ViewRef": VIEW_REF, "TierRef": TIER_REF,
            "PoolRef": POOL_REF, "CoreRef": CORE_REF, "VllmPool": VLLM_POOL}


def test_each_struct_type_is_named_by_its_class_and_a_digest_of_numbas_name():
    for label, t in _kvsim_struct_types().items():
        assert isinstance(t, StructType), label
        assert t.name == short_name(type(t).__qualname__, t.full_name), label
        assert len(t.name) < 60, (label, t.name)
        # numba's full name is kept for messages: the field list, as numba spells it
        assert t.full_name.startswith(f"numba.{type(t).__qualname__}((")


def test_symbols_of_functions_taking_the_core_state_are_short():
    """The mangled name of a function taking the core's state and a policy value (the
    shape of ``core.run``'s callees): ~100 KB on numba's own names, ~1.4 KB now."""
    sym = default_mangler("kvsim.replay.kernel.placement._place",
                          (CORE_REF, types.int64, policy_value_type()))
    assert len(sym) < 2000, len(sym)
    for sig in hook_signatures():  # the hooks' first-class function types name the types too
        assert len(str(types.FunctionType(sig))) < 300


@structref.register
class _Probe(StructType):
    pass


def test_equal_fields_are_one_type_and_other_fields_another():
    a = _Probe([("x", types.int64), ("y", types.float64[:])])
    b = _Probe([("x", types.int64), ("y", types.float64[:])])
    c = _Probe([("x", types.int64), ("y", types.float32[:])])
    assert a is b and a == b and hash(a) == hash(b)  # numba interns types by name
    assert a != c and a.name != c.name
    # fields are stored without literal types, as every kvsim struct type did on its own
    lit = _Probe([("x", types.IntegerLiteral(3)), ("y", types.float64[:])])
    assert lit is a and a.field_dict["x"] == types.int64
