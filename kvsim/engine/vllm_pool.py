"""The pool vLLM's compiled scheduler step (:mod:`kvsim.engine.vllm_step`) allocates from, as
one value: a structref holding the compiled pool, its free-queue order, its view and the
allocation scratch.  Unboxing the policy value (eight first-class functions) costs ~0.3 ms a
call from Python; a structref holding it is one pointer."""
from __future__ import annotations

from numba import typeof
from numba.experimental import structref

from kvsim.jit.decorators import njit
from kvsim.jit.struct_type import StructType
from kvsim.policy.state_access import register_borrowed_members


@structref.register
class VllmPoolType(StructType):
    """numba type of :class:`VllmPool`: the pool ``st``, its order ``pst``, ``pview`` (numba rejects ``view``),
    the allocation scratch ``out``."""


class VllmPool(structref.StructRefProxy):
    """The pool the step function allocates from (build with :func:`vllm_pool`)."""


structref.define_boxing(VllmPoolType, VllmPool)
# ``pl.st`` ... also in functions compiled without reference counting (vllm_step.schedule)
register_borrowed_members(VllmPoolType, ("st", "pst", "pview", "out"))


def _vllm_pool_type() -> VllmPoolType:
    from kvsim.memory.fast import PoolConfig, new_out
    from kvsim.memory.pool_ref import POOL_REF
    from kvsim.policy.hooks import VIEW_REF, policy_value_type

    out = typeof(new_out(PoolConfig(2, 1, max_seqs=1, max_blocks_per_seq=1), 0))
    return VllmPoolType([("st", POOL_REF), ("pst", policy_value_type()), ("pview", VIEW_REF),
                         ("out", out)])


VLLM_POOL = _vllm_pool_type()


@njit(cache=True)
def _new_vllm_pool(st, pst, view, out):
    r = structref.new(VLLM_POOL)
    r.st, r.pst, r.pview, r.out = st, pst, view, out
    return r


def vllm_pool(st, pst, view, out) -> VllmPool:
    """The compiled pool ``st`` (a PoolRef), its order value, view (a ViewRef) and scratch
    (``new_out(config, 0)``) as one value."""
    return _new_vllm_pool(st, pst, view, out)
