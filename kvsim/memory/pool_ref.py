"""The HBM pool's state as one value in compiled code: :class:`PoolRef`.

:class:`kvsim.memory.fast.PoolState` is a named tuple of 23 arrays, and every compiled
pool operation takes it (``pool_ops.allocate(st, ...)``, and the replay core, which passes
it on).  numba passes a tuple as its members: each call spells a 23-array aggregate in the
LLVM IR and counts a reference for each array on entry and exit.  In the README job those
aggregates were 4.6 of the 50 MB of IR the compile lowers and parses (``core.run`` 0.8 MB,
``advance`` 0.6, the pool operations the rest), and at 16-token blocks the reference
counts are paid on every allocation (24 arrays before the prefix index's keys and
values became one array).  A :class:`PoolRef` is one pointer to a struct
holding the same arrays (a numba structref, as :class:`kvsim.policy.hooks.TierRef` is for
a lower tier): the compiled code reads ``st.ref_cnt`` as before, one reference count per
call.  Python code keeps the named tuple it was made from (same arrays, not copies); the
interpreted engine runs the same source on the named tuple.
"""

from __future__ import annotations

from numba import typeof
from numba.experimental import structref

from kvsim.jit.decorators import njit
from kvsim.jit.disk_cache import seal_all
from kvsim.jit.struct_type import StructType
from kvsim.memory.fast import PoolConfig, PoolState, new_state
from kvsim.policy.state_access import register_borrowed_members


@structref.register
class PoolRefType(StructType):
    """The numba type of :class:`PoolRef`: the fields of :class:`PoolState`, in order."""


class PoolRef(structref.StructRefProxy):
    """A :class:`PoolState` as the compiled pool operations and core take it (same arrays).
    Build it with :func:`pool_ref`."""


structref.define_boxing(PoolRefType, PoolRef)
# ``st.ref_cnt`` also in functions compiled without reference counting (vLLM's compiled
# scheduler step, kvsim.engine.vllm_step): the member read as numba's own, with no NRT call
register_borrowed_members(PoolRefType, PoolState._fields)


def _pool_ref_type() -> PoolRefType:
    """The one numba type of every :class:`PoolRef` (field types from a tiny pool: the
    dtypes and dimensions do not depend on the pool's size)."""
    st = new_state(PoolConfig(2, 1, max_seqs=1, max_blocks_per_seq=1))
    return PoolRefType([(name, typeof(getattr(st, name))) for name in PoolState._fields])


POOL_REF = _pool_ref_type()


@njit(cache=True)
def _new_pool_ref(st):
    """Every field of ``st`` (a PoolState), one by one (tests/memory/test_pool_ref.py
    checks that this lists every field of PoolState)."""
    r = structref.new(POOL_REF)
    r.cfg = st.cfg
    r.sc = st.sc
    r.counters = st.counters
    r.ref_cnt = st.ref_cnt
    r.block_hash = st.block_hash
    r.in_empty = st.in_empty
    r.in_cand = st.in_cand
    r.e_next = st.e_next
    r.e_prev = st.e_prev
    r.hidx = st.hidx
    r.h_next = st.h_next
    r.h_prev = st.h_prev
    r.tables = st.tables
    r.seq_len = st.seq_len
    r.seq_is_open = st.seq_is_open
    r.seq_tenant = st.seq_tenant
    r.seq_rerun = st.seq_rerun
    r.seq_free = st.seq_free
    r.seq_query_tokens = st.seq_query_tokens
    r.seq_hit_tokens = st.seq_hit_tokens
    r.tenant_query_tokens = st.tenant_query_tokens
    r.tenant_hit_tokens = st.tenant_hit_tokens
    r.block_hits = st.block_hits
    return r


def pool_ref(st: PoolState) -> PoolRef:
    """``st`` as a :class:`PoolRef` (the same arrays): what the compiled pool operations
    and replay core take."""
    seal_all()
    return _new_pool_ref(st)


def pool_arg(st: PoolState, compiled: bool):
    """What a replay passes its pool as: :func:`pool_ref` compiled, ``st`` interpreted."""
    return pool_ref(st) if compiled else st
