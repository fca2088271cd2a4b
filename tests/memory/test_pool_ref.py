"""The HBM pool's state as one value in compiled code (kvsim.memory.pool_ref)."""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.memory.fast import PoolConfig, PoolState, new_state
from kvsim.memory.pool_ref import POOL_REF, pool_arg, pool_ref


def _getter(name):
    namespace = {"njit": njit}
    exec(f"@njit\ndef get(r):\n    return r.{name}\n", namespace)
    return namespace["get"]


def test_every_field_of_the_pool_state_is_the_same_array():
    """The struct has PoolState's fields in order, and the constructor sets each to the
    named tuple's own array (no copy: compiled code and Python see one pool)."""
    assert [name for name, _ in POOL_REF.field_dict.items()] == list(PoolState._fields)
    st = new_state(PoolConfig(9, 4, max_seqs=3, max_blocks_per_seq=5))
    r = pool_ref(st)
    for name in PoolState._fields:
        got = _getter(name)(r)
        mine = getattr(st, name)
        assert got.shape == mine.shape and got.dtype == mine.dtype, name
        assert np.shares_memory(got, mine), name
    assert pool_arg(st, False) is st


def test_the_compiled_pool_writes_through_to_the_named_tuple():
    from kvsim.ingest.vllm_hashing import request_hashes
    from kvsim.memory.pool_handle import FastPool

    pool = FastPool(PoolConfig(9, 4, max_seqs=4, max_blocks_per_seq=8))
    seq = pool.open_seq()
    res = pool.allocate(seq, request_hashes([1] * 4 + [2] * 4, 4), 8)
    assert res.blocks == [1, 2]
    assert [int(pool.st.ref_cnt[b]) for b in (1, 2, 3)] == [1, 1, 0]
    assert int(pool.st.seq_len[seq]) == 2
