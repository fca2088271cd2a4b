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

from kvsim.policy_api import heap_new, heap_peek, heap_push, heap_remove, heap_smallest

NAME = "fifo"
DESCRIPTION = "First in, first out: evict the candidate that entered the tier first."
OFFLINE = False
REASONS = ("first in, first out: entered the tier before every other candidate",)


def init(capacity_blocks, num_slots, params):
    return heap_new(num_slots) + (np.zeros(num_slots, np.int64), np.zeros(1, np.int64))


@njit(cache=True)
def on_insert(state, view, b, now_us):
    counter = state[6]
    counter[0] += 1
    state[5][b] = counter[0]
    heap_push(state[:5], b, float(counter[0]), counter[0])


@njit(cache=True)
def on_hit(state, view, b, now_us):
    return None


@njit(cache=True)
def on_hold(state, view, b):
    heap_remove(state[:5], b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    seq = state[5][b]
    heap_push(state[:5], b, float(seq), seq)


@njit(cache=True)
def on_remove(state, view, b):
    heap_remove(state[:5], b)


@njit(cache=True)  # heap_smallest allocates its frontier
def victim(state, view, now_us, alt_blocks, alt_scores):
    b = heap_peek(state[:5])
    if b < 0:
        return -1, 0, 0
    return b, 0, heap_smallest(state[:5], alt_blocks, alt_scores)
