"""FIFO: evict the candidate that entered first; hits do not reorder.

Order: one intrusive list in insertion order, head = oldest.  All hooks O(1).
Matches libCacheSim ``FIFO`` miss for miss.  Score: ``insert_us`` (higher = newer = keep).
"""

from numba import njit

from kvsim.policy_api import dll_ends, dll_links, dll_push_tail, dll_remove, list_walk

NAME = "fifo"
DESCRIPTION = "First in, first out: evict the candidate that entered the tier first."
OFFLINE = False
REASONS = ("first in, first out: entered the tier before every other candidate",)


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    return (prev, nxt, dll_ends())


@njit(cache=True)
def on_insert(state, view, b, now_us):
    dll_push_tail(state[0], state[1], state[2], b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    return None


@njit(cache=True)
def on_remove(state, view, b):
    dll_remove(state[0], state[1], state[2], b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    b = state[2][0]
    if b < 0:
        return -1, 0, 0
    n_alt = list_walk(state[0], state[1], state[2], alt_blocks, alt_scores, view.insert_us)
    return b, 0, n_alt
