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

State: an intrusive circular doubly linked list over block ids ``0 .. num_slots-1`` with a
sentinel at index ``num_slots``.  Invariant: a block is linked iff it is a candidate.
"""

from __future__ import annotations

import numpy as np

from kvsim.jit.decorators import njit
from kvsim.policy.api import policy_state

NAME = "fifo-release"
DESCRIPTION = "vLLM v1's free-queue order: the cached block released longest ago goes first"
OFFLINE = False
REASONS = ("released longest ago (vLLM free-queue head)",)


# state slots: i64 next and prev links, i8 linked flags
NXT, PRV = 0, 1
LINKED = 0


def init(capacity_blocks: int, num_slots: int, params: dict):
    """An empty list with its sentinel at ``num_slots``: ``state.i64[NXT]``,
    ``state.i64[PRV]``, ``state.i8[LINKED]``."""
    nxt = np.full(num_slots + 1, num_slots, dtype=np.int64)
    prv = np.full(num_slots + 1, num_slots, dtype=np.int64)
    linked = np.zeros(num_slots + 1, dtype=np.int8)
    return policy_state(i64=(nxt, prv), i8=(linked,))


@njit(cache=True)
def on_insert(state, view, b, now_us):
    nxt, prv, linked = state.i64[NXT], state.i64[PRV], state.i8[LINKED]
    s = nxt.shape[0] - 1
    last = prv[s]
    nxt[last] = b
    prv[b] = last
    nxt[b] = s
    prv[s] = b
    linked[b] = 1


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
    nxt, prv, linked = state.i64[NXT], state.i64[PRV], state.i8[LINKED]
    p = prv[b]
    n = nxt[b]
    nxt[p] = n
    prv[n] = p
    linked[b] = 0


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    """The head of the list; runners-up are the next blocks, scored by rank (0, 1, ...)."""
    nxt = state.i64[NXT]
    s = nxt.shape[0] - 1
    b = nxt[s]
    if b == s:
        return -1, 0, 0
    n_alt = 0
    cur = b
    while cur != s and n_alt < alt_blocks.shape[0]:
        alt_blocks[n_alt] = cur
        alt_scores[n_alt] = float(n_alt)
        n_alt += 1
        cur = nxt[cur]
    return b, 0, n_alt


def order(state) -> list[int]:
    """Candidates from first to last evicted (plain Python, for tests and docs)."""
    nxt = state.i64[NXT]
    s = nxt.shape[0] - 1
    out = []
    cur = int(nxt[s])
    while cur != s:
        out.append(cur)
        cur = int(nxt[cur])
    return out
