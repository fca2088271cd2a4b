"""Belady's MIN (offline): evict the candidate whose next use is farthest in the future.

OFFLINE: reads ``view.next_use`` (the ordinal of the block's next access, ``NEVER`` if
none), which only a replay of a known trace can fill in.  Its result is a BOUND on every
online policy for a single tier (uniform block size), never an achievable number.

Order: a binary max-heap on ``next_use`` over arrays (``heap``: position -> block,
``pos``: block -> position, ``key``: the block's next use when filed).  The core refreshes
``next_use`` before ``on_insert``/``on_hit``.  A hit moves a block's next use later, so
``on_hit`` only sifts up.  The sift loops are written inside the hooks (no helper calls):
this is the hottest offline loop and numba does not inline across compiled functions.
Ties exist only among never-used-again blocks and do not change miss counts.  Matches
libCacheSim ``Belady`` miss for miss.  Score: ``-next_use`` (sooner = higher = keep).

These hooks are what the tiered replay runs.  The single-tier cache simulator runs a twin
of them, ``kvsim.cachesim.simulator._replay_belady`` (same heap, same sift comparisons, keys
stored beside the blocks, no view): a change to the heap discipline here must be made
there too, or tests/sim/test_cachesim_belady_fast.py (victim sequences of both) fails.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import NEVER, StateSpec

NAME = "belady"
DESCRIPTION = "Belady's MIN (offline bound): evict the candidate used farthest in the future."
OFFLINE = True
REASONS = ("offline MIN: its next use is the farthest in the future",
           "offline MIN: it is never used again")

STATE = StateSpec(i64=("key",  # per block: its next use when filed
                        "heap",  # position -> block
                        "pos",  # block -> position
                        "meta"))  # [size]


def init(capacity_blocks, num_slots, params):
    return STATE.new(key=np.zeros(num_slots, np.int64), heap=np.full(num_slots, -1, np.int64),
                     pos=np.full(num_slots, -1, np.int64), meta=np.zeros(1, np.int64))


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    key, heap, pos, meta = state.key, state.heap, state.pos, state.meta
    k = view.next_use[b]
    key[b] = k
    i = meta[0]
    meta[0] = i + 1
    while i > 0:  # sift up: larger next use toward the root
        parent = (i - 1) >> 1
        pb = heap[parent]
        if key[pb] >= k:
            break
        heap[i] = pb
        pos[pb] = i
        i = parent
    heap[i] = b
    pos[b] = i


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    key, heap, pos = state.key, state.heap, state.pos
    k = view.next_use[b]
    key[b] = k  # the next use only moves later: sift up
    i = pos[b]
    while i > 0:
        parent = (i - 1) >> 1
        pb = heap[parent]
        if key[pb] >= k:
            break
        heap[i] = pb
        pos[pb] = i
        i = parent
    heap[i] = b
    pos[b] = i


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    key, heap, pos, meta = state.key, state.heap, state.pos, state.meta
    i = pos[b]
    n = meta[0] - 1
    meta[0] = n
    pos[b] = -1
    last = heap[n]
    heap[n] = -1
    if i == n:
        return
    k = key[last]
    while i > 0:  # the moved block may belong above ...
        parent = (i - 1) >> 1
        pb = heap[parent]
        if key[pb] >= k:
            break
        heap[i] = pb
        pos[pb] = i
        i = parent
    while True:  # ... or below
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and key[heap[c + 1]] > key[heap[c]]:
            c += 1
        cb = heap[c]
        if key[cb] <= k:
            break
        heap[i] = cb
        pos[cb] = i
        i = c
    heap[i] = last
    pos[last] = i


@njit(cache=True)
def _top(key, heap, n, out_blocks, out_scores):
    """The len(out_blocks) largest keys in order, best-first over a small frontier."""
    k = out_blocks.shape[0]
    frontier = np.empty(2 * k + 2, np.int64)
    frontier[0] = 0
    nf = 1
    written = 0
    while written < k and nf > 0:
        best = 0
        for j in range(1, nf):
            if key[heap[frontier[j]]] > key[heap[frontier[best]]]:
                best = j
        i = frontier[best]
        frontier[best] = frontier[nf - 1]
        nf -= 1
        out_blocks[written] = heap[i]
        out_scores[written] = -float(key[heap[i]])
        written += 1
        for c in (2 * i + 1, 2 * i + 2):
            if c < n:
                frontier[nf] = c
                nf += 1
    return written


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    key, heap, meta = state.key, state.heap, state.meta
    if meta[0] == 0:
        return -1, 0, 0
    b = heap[0]
    n_alt = 0
    if alt_blocks.shape[0] > 0:
        n_alt = _top(key, heap, meta[0], alt_blocks, alt_scores)
    return b, (1 if key[b] == NEVER else 0), n_alt
