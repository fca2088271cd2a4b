"""``prefetch(a, i)``: ask the CPU to bring ``a[i]``'s cache line in ahead of use (LLVM's
``llvm.prefetch`` intrinsic: read, high locality, data cache; on x86 ``prefetcht0``).  It
has no effect on results; in plain Python it does nothing.

Why the single-tier loops use it: a loop's lookup ``table[key - lo]`` lands in a random
line of a table of one entry per possible key (4 MB for the 1 M-key Zipf range of
docs/benchmarks.md); the key of access ``t + AHEAD`` is known long before its turn, so its
line is requested then, and by the time access ``t + AHEAD`` runs the line is in the cache
(without it the loop's data-dependent branches keep the CPU from issuing that load early
by itself).  Measured: docs/benchmarks.md, "Single-tier policies vs libCacheSim".
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload


def prefetch(a, i) -> None:
    """Prefetch ``a[i]`` (no bounds check; an address outside ``a`` is harmless to a
    prefetch, but the loops only pass valid indices).  A no-op in plain Python."""


@intrinsic
def _prefetch(typingctx, arr, idx):
    """``llvm.prefetch`` of the line holding ``arr[idx]`` (``arr[idx, 0, ...]`` for an
    array of more dimensions: the start of that row): a read (rw 0), kept in all cache
    levels (locality 3), into the data cache (1)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty, idxty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        index = [args[1]] + [context.get_constant(idxty, 0)] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@overload(prefetch, inline="always")
def _prefetch_overload(a, i):
    if isinstance(a, types.Array) and isinstance(i, types.Integer):
        return lambda a, i: _prefetch(a, i)
    return None


def prefetch_row(a, i) -> None:
    """Prefetch the line holding ``a[i, 0]``, the start of row ``i`` of a 2-D array (a
    no-op in plain Python)."""


@overload(prefetch_row, inline="always")
def _prefetch_row_overload(a, i):
    if isinstance(a, types.Array) and a.ndim == 2 and isinstance(i, types.Integer):
        return lambda a, i: _prefetch(a, i)
    return None
