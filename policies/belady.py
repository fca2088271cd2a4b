"""Belady's MIN (offline): evict the candidate whose next use is farthest in the future.

OFFLINE: reads ``view.next_use`` (the ordinal of the block's next access, ``NEVER`` if
none), which only a replay of a known trace can fill in.  Its result is a BOUND on every
online policy for a single tier (uniform block size), never an achievable number.
Order: indexed heap keyed by ``-next_use`` (ties among never-used-again blocks broken by
insertion/access order; ties do not change miss counts).  The core refreshes
``next_use`` before ``on_insert``/``on_hit``.  Matches libCacheSim ``Belady`` miss counts.
Score: ``-next_use`` (sooner = higher = keep).
"""

import numpy as np
from numba import njit

from kvsim.policy_api import (NEVER, heap_new, heap_peek, heap_push, heap_remove,
                              heap_smallest, heap_update)

NAME = "belady"
DESCRIPTION = "Belady's MIN (offline bound): evict the candidate used farthest in the future."
OFFLINE = True
REASONS = ("offline MIN: its next use is the farthest in the future",
           "offline MIN: it is never used again")


def init(capacity_blocks, num_slots, params):
    return heap_new(num_slots) + (np.zeros(1, np.int64),)


@njit(cache=True)
def _key(view, b):
    nu = view.next_use[b]
    if nu == NEVER:
        return -np.inf
    return -float(nu)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    seq = state[5]
    seq[0] += 1
    heap_push(state[:5], b, _key(view, b), seq[0])


@njit(cache=True)
def on_hit(state, view, b, now_us):
    seq = state[5]
    seq[0] += 1
    heap_update(state[:5], b, _key(view, b), seq[0])


@njit(cache=True)
def on_remove(state, view, b):
    heap_remove(state[:5], b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    b = heap_peek(state[:5])
    if b < 0:
        return -1, 0, 0
    n_alt = heap_smallest(state[:5], alt_blocks, alt_scores)
    return b, (1 if view.next_use[b] == NEVER else 0), n_alt
