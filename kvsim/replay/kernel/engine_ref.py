"""The closed loop's step driver's arguments as one value: :class:`EngineRef` (and the
``prefix`` router's, :class:`RouteRef`).

:func:`kvsim.replay.kernel.closed_step.advance` runs one replica's engine steps on ~65 arrays
(the scheduler's state, request and slot tables, the core's event columns, the block facts,
the slot map, vLLM's scheduler value, the core's state).  Passed one by one, every call of
the compiled ``advance`` unboxed each of them in numba's C wrapper (an array's unboxing
reads its buffer and takes a reference: ~9.5 us a call, ~102 reference counts), at each of
the ~9,500 calls of an 8-replica closed loop of the Mooncake trace.  An :class:`EngineRef`
holds them, made ONCE per argument set (:func:`new_engine_ref`: when a buffer is grown or
replaced, the closed loop's :class:`kvsim.modes.closed.closed_loop.Engine` makes a new one),
so a call of ``advance`` unboxes one pointer and reads the members in compiled code.

:data:`FIELDS` are the members, in ``advance``'s order; ``req``, ``slot``, ``lookup``,
``cols`` and ``sl`` are the tuples the scheduler state (:mod:`kvsim.engine.scheduler_state`),
the core's columns and the slot map already are.  ``ks`` / ``vs`` / ``vo`` / ``rs`` may be
None (:func:`kvsim.replay.kernel.closed_step.scheduler_args`): a None member is typed
``none``, and ``advance`` passes it to the step loop as an argument, where numba drops its
branch before typing, as before.  Interpreted (the twin of :mod:`kvsim.replay.variants`),
the same members in a namespace.
"""

from __future__ import annotations

from types import SimpleNamespace

from numba.experimental import structref
from numba.extending import overload

from kvsim.engine.scheduler_blocks import _route_prefix
from kvsim.jit.decorators import njit
from kvsim.jit.struct_type import StructType

#: the members, in the order :func:`kvsim.replay.kernel.closed_step.advance` passes them on
FIELDS = ("aux", "insys", "ip", "fp", "st", "stf", "req", "slot", "order", "lookup", "hitk",
          "adm", "I", "F", "cols", "rprio_tab", "tenant_tab", "block_bytes", "pb_off",
          "pb_next", "pb_seen", "sl", "ks", "vs", "vo", "rs", "cr")


@structref.register
class EngineRefType(StructType):
    """The numba type of :class:`EngineRef` (named short, :mod:`kvsim.jit.struct_type`)."""


class EngineRef(structref.StructRefProxy):
    """``advance``'s arguments as one value (module docstring)."""


structref.define_boxing(EngineRefType, EngineRef)


def _empty_ref(values):
    """A new :class:`EngineRef` typed by the tuple ``values`` (compiled code only)."""
    raise NotImplementedError("compiled code only")


@overload(_empty_ref)
def _empty_ref_impl(values):
    t = EngineRefType(list(zip(FIELDS, values.types, strict=True)))

    def impl(values):
        return structref.new(t)

    return impl


@njit(cache=True)
def _new_engine_ref(aux, insys, ip, fp, st, stf, req, slot, order, lookup, hitk, adm, I, F,
                    cols, rprio_tab, tenant_tab, block_bytes, pb_off, pb_next, pb_seen, sl,
                    ks, vs, vo, rs, cr):
    r = _empty_ref((aux, insys, ip, fp, st, stf, req, slot, order, lookup, hitk, adm, I, F,
                    cols, rprio_tab, tenant_tab, block_bytes, pb_off, pb_next, pb_seen, sl,
                    ks, vs, vo, rs, cr))
    r.aux = aux
    r.insys = insys
    r.ip = ip
    r.fp = fp
    r.st = st
    r.stf = stf
    r.req = req
    r.slot = slot
    r.order = order
    r.lookup = lookup
    r.hitk = hitk
    r.adm = adm
    r.I = I
    r.F = F
    r.cols = cols
    r.rprio_tab = rprio_tab
    r.tenant_tab = tenant_tab
    r.block_bytes = block_bytes
    r.pb_off = pb_off
    r.pb_next = pb_next
    r.pb_seen = pb_seen
    r.sl = sl
    r.ks = ks
    r.vs = vs
    r.vo = vo
    r.rs = rs
    r.cr = cr
    return r


def new_engine_ref(compiled: bool, values: tuple):
    """``values`` (one per :data:`FIELDS`) as ``advance`` takes them: compiled, an
    :class:`EngineRef` (one compiled call; ``block_bytes`` as an int64); interpreted, a
    namespace with the same members."""
    if len(values) != len(FIELDS):
        raise ValueError(f"expected {len(FIELDS)} values, got {len(values)}")
    if not compiled:
        return SimpleNamespace(**dict(zip(FIELDS, values, strict=True)))
    return _new_engine_ref(*values)


#: the prefix router's state, made once per run (:func:`new_route_ref`): per replica (a tuple
#: each, in replica order) its scheduler state, held-block table, the pool's prefix index
#: keys and values and the lower tiers' table; and the array of each replica's waiting
#: prompt blocks, which the caller updates in place
ROUTE_FIELDS = ("sts", "rks", "phks", "phvs", "tks", "waiting")


@structref.register
class RouteRefType(StructType):
    """The numba type of :class:`RouteRef`."""


class RouteRef(structref.StructRefProxy):
    """The ``prefix`` router's arrays as one value (:data:`ROUTE_FIELDS`): a call of
    :func:`route_prefix` unboxes one pointer, not five tuples of one array per replica."""


structref.define_boxing(RouteRefType, RouteRef)


def _empty_route(values):
    """A new :class:`RouteRef` typed by the tuple ``values`` (compiled code only)."""
    raise NotImplementedError("compiled code only")


@overload(_empty_route)
def _empty_route_impl(values):
    t = RouteRefType(list(zip(ROUTE_FIELDS, values.types, strict=True)))

    def impl(values):
        return structref.new(t)

    return impl


@njit(cache=True)
def new_route_ref(sts, rks, phks, phvs, tks, waiting):
    """A :class:`RouteRef` of these arrays (:data:`ROUTE_FIELDS`)."""
    r = _empty_route((sts, rks, phks, phvs, tks, waiting))
    r.sts = sts
    r.rks = rks
    r.phks = phks
    r.phvs = phvs
    r.tks = tks
    r.waiting = waiting
    return r


@njit(cache=True)
def route_prefix(hb, nb, prompt_c, B, weight, rr, i_qn, i_done):
    """:func:`kvsim.engine.scheduler_blocks._route_prefix` on the arrays of ``rr``."""
    return _route_prefix(hb, nb, prompt_c, B, weight, rr.waiting, rr.sts, rr.rks, rr.phks,
                         rr.phvs, rr.tks, i_qn, i_done)


__all__ = ["FIELDS", "ROUTE_FIELDS", "EngineRef", "EngineRefType", "RouteRef", "RouteRefType",
           "new_engine_ref", "new_route_ref", "route_prefix"]
