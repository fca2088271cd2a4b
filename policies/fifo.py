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

from kvsim.policy.api import (
    StateSpec,
    heap_new,
    heap_of,
    heap_peek,
    heap_push,
    heap_remove,
    heap_smallest,
)

NAME = "fifo"
DESCRIPTION = "First in, first out: evict the candidate that entered the tier first."
OFFLINE = False
REASONS = ("first in, first out: entered the tier before every other candidate",)


STATE = StateSpec(i64=(("heap", 4),  # the candidates' heap: tie, heap, pos, meta
                        "seq",  # each block's admission ordinal
                        "counter"),  # [the last ordinal given]
                   f64=("key",))  # the heap's keys (the ordinals)


def init(capacity_blocks, num_slots, params):
    key, tie, heap, pos, meta = heap_new(num_slots)
    return STATE.new(heap=(tie, heap, pos, meta), seq=np.zeros(num_slots, np.int64),
                     counter=np.zeros(1, np.int64), key=key)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    counter = state.counter
    counter[0] += 1
    state.seq[b] = counter[0]
    heap_push(heap_of(state.key, state.heap), b, float(counter[0]), counter[0])


@njit(cache=True)
def on_hit(state, view, b, now_us):
    return None


@njit(cache=True)
def on_hold(state, view, b):
    state = STATE.of(state)
    heap_remove(heap_of(state.key, state.heap), b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    seq = state.seq[b]
    heap_push(heap_of(state.key, state.heap), b, float(seq), seq)


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    heap_remove(heap_of(state.key, state.heap), b)


@njit(cache=True)  # heap_smallest allocates its frontier
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    h = heap_of(state.key, state.heap)
    b = heap_peek(h)
    if b < 0:
        return -1, 0, 0
    return b, 0, heap_smallest(h, alt_blocks, alt_scores)
