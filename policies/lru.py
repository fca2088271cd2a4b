"""LRU: evict the candidate idle for the longest time.

Order: one intrusive list of the candidates, head = least recently used.  ``on_insert``
and ``on_hit`` append/move the block to the tail.  A held HBM block leaves the list
(``on_hold``) and is appended again when released (``on_release``): its last access is
its release, since a running request reads every block of its context at each step.
``victim`` names the head.  All hooks O(1).
Matches libCacheSim ``LRU`` miss for miss (tests/policies/test_vs_libcachesim.py).
Score in the decision log: ``last_access_us`` (higher = used more recently = keep).
"""

from numba import njit

from kvsim.policy.api import (
    StateSpec,
    dll_contains,
    dll_ends,
    dll_links,
    dll_move_to_tail,
    dll_push_tail,
    dll_remove,
    list_walk,
)

NAME = "lru"
DESCRIPTION = "Least recently used: evict the candidate idle for the longest time."
OFFLINE = False
REASONS = ("least recently used: idle for the longest time",)

STATE = StateSpec(i64=("prev", "nxt",  # list links
                        "lru"))  # the list's [head, tail, size], head = least recent


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    return STATE.new(prev=prev, nxt=nxt, lru=dll_ends())


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    dll_push_tail(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    if dll_contains(state.prev, b):  # a held block is reordered at its release
        dll_move_to_tail(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_hold(state, view, b):
    state = STATE.of(state)
    dll_remove(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    dll_push_tail(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    dll_remove(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    b = state.lru[0]
    if b < 0:
        return -1, 0, 0
    n_alt = list_walk(state.prev, state.nxt, state.lru, alt_blocks, alt_scores,
                      view.last_access_us)
    return b, 0, n_alt
