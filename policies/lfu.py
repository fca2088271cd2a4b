"""LFU with LRU tie-break, libCacheSim's ``LFU`` exactly.

libCacheSim's LFU (cache/eviction/LFU.c) is *in-cache* LFU: a block's count starts at 1
when it enters the tier and is forgotten when it leaves (no history of evicted blocks).
It keeps one FIFO list per frequency, appends a block to the list of its new frequency on
every hit and evicts the head of the lowest non-empty frequency.  A block enters its
frequency list at its latest access, so among equal frequencies the least recently used
goes first.  Here: an indexed heap keyed by ``(frequency, access sequence number)``,
O(log n) per hook.  Score: frequency (higher = keep).
"""

import numpy as np
from numba import njit

from kvsim.policy_api import (heap_new, heap_peek, heap_push, heap_remove, heap_smallest,
                              heap_update, njit_hook)

NAME = "lfu"
DESCRIPTION = "Least frequently used since entering the tier; least recently used among ties."
OFFLINE = False
REASONS = ("least frequently used since it entered the tier (oldest access among ties)",)


def init(capacity_blocks, num_slots, params):
    return heap_new(num_slots) + (np.zeros(1, np.int64),)


@njit_hook
def on_insert(state, view, b, now_us):
    seq = state[5]
    seq[0] += 1
    heap_push(state[:5], b, 1.0, seq[0])


@njit_hook
def on_hit(state, view, b, now_us):
    seq = state[5]
    seq[0] += 1
    heap_update(state[:5], b, state[0][b] + 1.0, seq[0])


@njit_hook
def on_remove(state, view, b):
    heap_remove(state[:5], b)


@njit(cache=True)  # not njit_hook: heap_smallest allocates its frontier
def victim(state, view, now_us, alt_blocks, alt_scores):
    b = heap_peek(state[:5])
    if b < 0:
        return -1, 0, 0
    return b, 0, heap_smallest(state[:5], alt_blocks, alt_scores)
