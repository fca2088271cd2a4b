"""FIFO: evict the candidate whose content entered the tier first; hits do not reorder.

Order: the admission ordinal ``seq[b]`` given by ``on_insert`` (1, 2, ...), kept while
the block is resident, held or cached.  Candidates sit in an indexed min-heap keyed by it:
a held HBM block leaves the heap (``on_hold``) and returns with its *original* ordinal
(``on_release``), so a block reused by many requests keeps its place in the queue.
O(log n) per hold, release and eviction (a plain list cannot re-insert in the middle).
Matches libCacheSim ``FIFO`` miss for miss.  Score: the admission ordinal (higher =
newer = keep).
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (heap_in, heap_new, heap_peek, heap_push, heap_remove, heap_slots,
    heap_smallest, policy_state)

NAME = "fifo"
DESCRIPTION = "First in, first out: evict the candidate that entered the tier first."
OFFLINE = False
REASONS = ("first in, first out: entered the tier before every other candidate",)


# state slots: the candidates' heap (key f64[KEY], tie..meta i64[HEAP..HEAP+3]), each
# block's admission ordinal, the ordinal counter
KEY = 0
HEAP, SEQ, COUNTER = 0, 4, 5


def init(capacity_blocks, num_slots, params):
    f, i = heap_slots(heap_new(num_slots))
    return policy_state(i64=i + (np.zeros(num_slots, np.int64), np.zeros(1, np.int64)), f64=f)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    counter = state.i64[COUNTER]
    counter[0] += 1
    state.i64[SEQ][b] = counter[0]
    heap_push(heap_in(state, KEY, HEAP), b, float(counter[0]), counter[0])


@njit(cache=True)
def on_hit(state, view, b, now_us):
    return None


@njit(cache=True)
def on_hold(state, view, b):
    heap_remove(heap_in(state, KEY, HEAP), b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    seq = state.i64[SEQ][b]
    heap_push(heap_in(state, KEY, HEAP), b, float(seq), seq)


@njit(cache=True)
def on_remove(state, view, b):
    heap_remove(heap_in(state, KEY, HEAP), b)


@njit(cache=True)  # heap_smallest allocates its frontier
def victim(state, view, now_us, alt_blocks, alt_scores):
    b = heap_peek(heap_in(state, KEY, HEAP))
    if b < 0:
        return -1, 0, 0
    return b, 0, heap_smallest(heap_in(state, KEY, HEAP), alt_blocks, alt_scores)
