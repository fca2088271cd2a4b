"""The default eviction order of cached free blocks: first released, first evicted.

vLLM v1 appends a hashed block to the TAIL of its free queue when its last holder frees it
and pops new blocks from the HEAD, so among cached blocks the one released longest ago is
reused first (FIFO of release; a hit removes the block from the queue, and its next
release re-appends it, which is why people call it LRU).  This module is that order as a
:mod:`kvsim.policy.api` policy, compiled, so :class:`kvsim.memory.pool_handle.FastPool` with this
order reproduces vLLM's block ids exactly (tests/memory/test_vllm_golden.py).

Contract (kvsim.policy.api): ``on_insert`` (new content) and ``on_release`` append to the
tail, ``on_hold`` and ``on_remove`` unlink; a new HBM block is inserted and held at once,
so only releases order the queue, as in vLLM.

State: one list in the built-in lru's layout (``policies/lru.py``: ``i64`` = links
``prev``, ``nxt`` and ends ``[head, tail, size]``, the :mod:`kvsim.policy.api` ``dll_*``
operations).  Invariant: a block is linked iff it is a candidate.  The two orders differ only
in ``on_hit`` (lru moves a listed block to the tail; here a hit does not reorder), and
:mod:`kvsim.memory.pool_ops` calls ``on_hit`` only on a block it holds at once (``on_hold``
unlinks it) or on a held block (in no list): in a pool both keep the same list.  So vLLM's
compiled pools (kvsim.engine.vllm_value, kvsim.engine.vllm_compiled) run this order as the
pool's inline list operations (``cfg[F_LRU]``, :func:`use_inline`) instead of calling these
hooks as function values (~6 % of the 16-token closed loop's samples as calls).
"""

from __future__ import annotations

from kvsim.jit.decorators import njit
from kvsim.policy.api import (
    dll_ends,
    dll_links,
    dll_push_tail,
    dll_remove,
    policy_state,
)

NAME = "fifo-release"
DESCRIPTION = "vLLM v1's free-queue order: the cached block released longest ago goes first"
OFFLINE = False
REASONS = ("released longest ago (vLLM free-queue head)",)


# state slots: i64 prev and next links, the list's ends [head, tail, size] (lru's order)
PRV, NXT, ENDS = 0, 1, 2


def init(capacity_blocks: int, num_slots: int, params: dict):
    """An empty list: ``state.i64[PRV]``, ``state.i64[NXT]`` (no block linked),
    ``state.i64[ENDS]``."""
    prv, nxt = dll_links(num_slots)
    return policy_state(i64=(prv, nxt, dll_ends()))


def use_inline(pool_state) -> None:
    """Let :mod:`kvsim.memory.pool_ops` run this order inline on a pool's arrays
    (``pool_state``: :func:`kvsim.memory.fast.new_state`'s), as it runs the built-in lru:
    the same list in the same layout (the module's docstring)."""
    from kvsim.memory import fast, pool_ops

    assert (PRV, NXT, ENDS) == (pool_ops.LRU_PREV, pool_ops.LRU_NXT, pool_ops.LRU_ENDS)
    pool_state.cfg[fast.F_LRU] = 1


@njit(cache=True)
def on_insert(state, view, b, now_us):
    dll_push_tail(state.i64[PRV], state.i64[NXT], state.i64[ENDS], b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    # A hit does not reorder the free queue (a revived block leaves it: on_hold follows).
    pass


@njit(cache=True)
def on_hold(state, view, b):
    """``touch``: a cached block is held again, out of the middle of the queue."""
    on_remove(state, view, b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    """``free_blocks``: a hashed block whose last holder let go goes to the tail."""
    on_insert(state, view, b, now_us)


@njit(cache=True)
def on_remove(state, view, b):
    dll_remove(state.i64[PRV], state.i64[NXT], state.i64[ENDS], b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    """The head of the list; runners-up are the next blocks, scored by rank (0, 1, ...)."""
    nxt, ends = state.i64[NXT], state.i64[ENDS]
    b = ends[0]
    if b < 0:
        return -1, 0, 0
    n_alt = 0
    cur = b
    while cur >= 0 and n_alt < alt_blocks.shape[0]:
        alt_blocks[n_alt] = cur
        alt_scores[n_alt] = float(n_alt)
        n_alt += 1
        cur = nxt[cur]
    return b, 0, n_alt


def order(state) -> list[int]:
    """Candidates from first to last evicted (plain Python, for tests and docs)."""
    nxt, ends = state.i64[NXT], state.i64[ENDS]
    out = []
    cur = int(ends[0])
    while cur >= 0:
        out.append(cur)
        cur = int(nxt[cur])
    return out
