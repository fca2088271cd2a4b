"""The replay core's fixed state as one value in compiled code: :class:`CoreRef`.

:func:`kvsim.replay.kernel.core.run` and the functions it calls (:mod:`kvsim.replay.kernel.placement`,
:mod:`kvsim.replay.kernel.spill`, :mod:`kvsim.replay.kernel.tier_ops`) used to take the core's state as ~29
separate arguments (the counters ``C``, the request and block-record tables, the HBM pool
and view, the three tiers, the scratch and log buffers, ...).  numba passes each array as
its whole struct (7 words) and reference-counts each one a compiled function receives, on
entry and on exit (``NRT_incref`` / ``NRT_decref``, ~10 % of the core's samples on the
Mooncake 16-token import before this module; docs/benchmarks.md, "Speed: tiered replay of
16-token traces").  A :class:`CoreRef` is one pointer to a struct holding the same arrays
(a numba structref, as :class:`kvsim.memory.pool_ref.PoolRef` is for the pool and
:class:`kvsim.policy.hooks.TierRef` for a tier): ``run(cols, i0, n, cr)``, and a callee
reads the members it needs once into locals (``C = cr.C``).

The members are :data:`CORE_FIELDS`.  Python keeps a :class:`CoreState` (a plain object
with the same attributes, the same arrays): the interpreted engine runs the same source
on it, and the compiled engine takes :func:`core_ref` of it.  Buffers the driver grows or
replaces (``ST_NEED_*``: request tables, block-record arena, log, step and pending
buffers; the batch's ``next_use`` / ``seen``) are replaced in the :class:`CoreState`,
and the driver makes a new :class:`CoreRef` of it before the next call (one call of a
cached constructor; the core never keeps a member across calls of ``run``).

Measured on the Mooncake 16-token import (docs/benchmarks.md, "Speed: tiered replay of
16-token traces"): by itself no change of the core's CPU (the reference counts left are
paid per block and per hook call, in the pool operations and the policies' hooks, not per
core call); it carries the record views' rows (``H_rows``, ``TMP_rows``, ``L1_rows`` ..
``L3_rows``, :func:`kvsim.replay.kernel.tiers.record_rows`) that a tier fill copies whole
(:func:`kvsim.replay.kernel.tiers.copy_row`): -10 % core CPU with it.

Members are read one per statement (``view = cr.H_view``), never several in one
tuple-unpacking statement: ``st, out, hbuf, scr, pst, view, G = cr.st, ..., cr.G`` in
:func:`kvsim.replay.kernel.placement._place` compiled (numba 0.68.1, llvmlite 0.50.0) to
code whose stores into the HBM view's arrays were lost (a store, then a load of the same
element, read the old value), and the replay diverged from the reference
(tests/sim/test_compiled_reference.py).  Traced with every patch of numba gone (#31): it
still reproduces, at ``NUMBA_OPT`` 0, 1 and 3 and without numba's reference-count pruning
pass, so kvsim's patches were not its cause; not yet reduced to a standalone numba
reproducer.  kvsim's one workaround: one read per line.  Reproducer:
bench/numba_repro/core_ref_unpack.sh; findings: docs/jit.md, "The one workaround".
"""

from __future__ import annotations

from numba import typeof, types
from numba.experimental import structref

from kvsim.jit.decorators import njit
from kvsim.jit.disk_cache import seal_all
from kvsim.jit.struct_type import StructType
from kvsim.memory.pool_ref import POOL_REF
from kvsim.policy.hooks import TIER_REF, VIEW_REF, policy_value_type
from kvsim.policy.state_access import register_borrowed_members

#: The members of the core's state, in order (what ``core.run`` took as arguments before;
#: the HBM view is ``H_view``: numba rejects an attribute named ``view`` on a non-array).
CORE_FIELDS = ("K", "X", "C", "Cw", "R_i", "R_f", "A_i", "A_f", "H_i", "st", "out", "hbuf",
               "scr", "pst", "H_view", "T1", "T2", "T3", "TMP", "TMP_i", "G", "S", "P",
               "running", "next_use", "seen", "alt_b", "alt_s", "vo", "H_rows", "TMP_rows",
               "L1_rows", "L2_rows", "L3_rows")


@structref.register
class CoreRefType(StructType):
    """The numba type of :class:`CoreRef`: the members of :data:`CORE_FIELDS`, in order."""


class CoreRef(structref.StructRefProxy):
    """A :class:`CoreState` as the compiled core takes it (same arrays).  Build it with
    :func:`core_ref`."""


structref.define_boxing(CoreRefType, CoreRef)
#: ``cr.<member>`` also in code compiled ``_nrt=False`` (core.run and what it calls)
register_borrowed_members(CoreRefType, CORE_FIELDS)


def _core_ref_type() -> CoreRefType:
    """The one numba type of every :class:`CoreRef` (the dtypes and dimensions of the
    driver's arrays, kvsim.replay.driver._Run; a replay of any size has this type)."""
    from kvsim.memory.fast import PoolConfig, new_out

    def a(dtype, ndim):
        return types.Array(dtype, ndim, "C")

    i8, f8 = types.int64, types.float64
    out = typeof(new_out(PoolConfig(2, 1, max_seqs=1, max_blocks_per_seq=1)))
    G = types.Tuple((a(i8, 2), a(f8, 2), a(i8, 3), a(f8, 3)))
    kinds = {"K": a(i8, 1), "X": a(f8, 2), "C": a(f8, 1), "Cw": a(f8, 1), "R_i": a(i8, 2),
             "R_f": a(f8, 2), "A_i": a(i8, 2), "A_f": a(f8, 1), "H_i": a(i8, 2),
             "st": POOL_REF, "out": out, "hbuf": a(i8, 1), "scr": a(i8, 2),
             "pst": policy_value_type(), "H_view": VIEW_REF, "T1": TIER_REF, "T2": TIER_REF,
             "T3": TIER_REF, "TMP": VIEW_REF, "TMP_i": a(i8, 2), "G": G, "S": a(f8, 2),
             "P": a(i8, 2), "running": a(i8, 1), "next_use": a(i8, 1),
             "seen": a(types.int8, 1), "alt_b": a(i8, 1), "alt_s": a(f8, 1), "vo": a(i8, 1),
             "H_rows": a(i8, 2), "TMP_rows": a(i8, 2), "L1_rows": a(i8, 2),
             "L2_rows": a(i8, 2), "L3_rows": a(i8, 2)}
    assert tuple(kinds) == CORE_FIELDS
    return CoreRefType(list(kinds.items()))


CORE_REF = _core_ref_type()


@njit(cache=True)
def _new_core_ref(K, X, C, Cw, R_i, R_f, A_i, A_f, H_i, st, out, hbuf, scr, pst, H_view, T1,
                  T2, T3, TMP, TMP_i, G, S, P, running, next_use, seen, alt_b, alt_s, vo,
                  H_rows, TMP_rows, L1_rows, L2_rows, L3_rows):
    """Every member, one by one (tests/sim/test_core_ref.py checks that this sets every
    field of CORE_FIELDS to the argument's own array)."""
    r = structref.new(CORE_REF)
    r.K = K
    r.X = X
    r.C = C
    r.Cw = Cw
    r.R_i = R_i
    r.R_f = R_f
    r.A_i = A_i
    r.A_f = A_f
    r.H_i = H_i
    r.st = st
    r.out = out
    r.hbuf = hbuf
    r.scr = scr
    r.pst = pst
    r.H_view = H_view
    r.T1 = T1
    r.T2 = T2
    r.T3 = T3
    r.TMP = TMP
    r.TMP_i = TMP_i
    r.G = G
    r.S = S
    r.P = P
    r.running = running
    r.next_use = next_use
    r.seen = seen
    r.alt_b = alt_b
    r.alt_s = alt_s
    r.vo = vo
    r.H_rows = H_rows
    r.TMP_rows = TMP_rows
    r.L1_rows = L1_rows
    r.L2_rows = L2_rows
    r.L3_rows = L3_rows
    return r


class CoreState:
    """The core's state on the Python side: one attribute per member of
    :data:`CORE_FIELDS` (the arrays themselves).  The interpreted engine's ``run`` takes it
    as it is; the compiled one takes :func:`core_ref` of it.  Replace a member by
    assignment (``cs.A_i = bigger``), then make a new :class:`CoreRef`."""

    __slots__ = CORE_FIELDS

    def __init__(self, **members):
        missing = set(CORE_FIELDS) - set(members)
        extra = set(members) - set(CORE_FIELDS)
        if missing or extra:
            raise TypeError(f"CoreState: missing {sorted(missing)}, unknown {sorted(extra)}")
        for name in CORE_FIELDS:
            setattr(self, name, members[name])

    def members(self) -> tuple:
        """The members in :data:`CORE_FIELDS` order."""
        return tuple(getattr(self, name) for name in CORE_FIELDS)


def core_ref(cs: CoreState) -> CoreRef:
    """``cs`` as a :class:`CoreRef` (the same arrays): what the compiled core takes.  Its
    members must have the types of :data:`CORE_REF` (the batch's ``seen`` flags int8,
    ``next_use`` int64): nothing is converted."""
    seal_all()
    return _new_core_ref(*cs.members())


def core_arg(cs: CoreState, compiled: bool):
    """What a replay passes its core state as: :func:`core_ref` compiled, ``cs``
    interpreted."""
    return core_ref(cs) if compiled else cs


__all__ = ["CORE_FIELDS", "CORE_REF", "CoreRef", "CoreState", "core_arg", "core_ref"]
