"""``core.run`` as the closed loop's step driver takes it: one pointer, :class:`RunRef`.

:func:`kvsim.replay.kernel.closed_step.advance` calls :func:`kvsim.replay.kernel.core.run`
through a first-class function value (:class:`kvsim.replay.variants.RunValue`), so that
compiling ``advance`` does not link and re-optimise all of ``run``.  numba unboxes a
first-class function argument at every call of a compiled function by calling back into
Python (``numba.experimental.function_type._get_wrapper_address`` and ``_get_jit_address``,
with the signature unpickled each time): ~9 us of the ~18 us one call of ``advance`` costs
before it runs a step, paid at each of the ~9,500 calls of an 8-replica closed loop of the
Mooncake trace (docs/benchmarks.md, "8 replicas: the per-call cost of advance").

A :class:`RunRef` is a numba structref holding that function value, unboxed ONCE, when
the ref is made (:func:`new_run_ref`, a cached constructor): a call of ``advance`` then
unboxes one pointer (~0.2 us) and ``advance`` reads ``rr.run`` once.  The value's
``py_addr`` is borrowed: the :class:`~kvsim.replay.variants.RunValue` must outlive the ref
(both are kept per signature for the process, :func:`kvsim.replay.variants.core_run_ref`).
"""

from __future__ import annotations

from numba import types
from numba.experimental import structref
from numba.extending import overload

from kvsim.jit.decorators import njit
from kvsim.jit.struct_type import StructType


@structref.register
class RunRefType(StructType):
    """The numba type of :class:`RunRef`: one member, ``run`` (a ``FunctionType``), named
    short as kvsim's other struct types (:mod:`kvsim.jit.struct_type`)."""


class RunRef(structref.StructRefProxy):
    """``core.run`` as one first-class function value, unboxed once (module docstring)."""


structref.define_boxing(RunRefType, RunRef)


def run_ref_type(function_type: types.FunctionType) -> RunRefType:
    """The type of a :class:`RunRef` holding a value of ``function_type`` (known from the
    signature alone: ``advance`` can be typed and compiled before ``run`` exists)."""
    return RunRefType([("run", function_type)])


def _empty_ref(run):
    """A new :class:`RunRef` for ``run``'s type (compiled code only: :func:`_empty_ref_impl`)."""
    raise NotImplementedError("compiled code only")


@overload(_empty_ref)
def _empty_ref_impl(run):
    t = run_ref_type(run)

    def impl(run):
        return structref.new(t)

    return impl


@njit(cache=True)
def _new_run_ref(run):
    r = _empty_ref(run)
    r.run = run
    return r


def new_run_ref(value) -> RunRef:
    """A :class:`RunRef` of the first-class function value ``value`` (its C wrapper is
    looked up now: ``run`` is compiled or loaded first)."""
    return _new_run_ref(value)


__all__ = ["RunRef", "RunRefType", "new_run_ref", "run_ref_type"]
