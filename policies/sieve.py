"""SIEVE (Zhang et al., NSDI'24): a FIFO queue with a visited bit and a moving hand.

Order: one list of the resident blocks in insertion order, head = oldest.  A hit (on a
cached or a held block) sets ``visited``.  To find a victim the hand walks from its
position toward newer blocks (wrapping to the oldest), clearing visited bits, and stops at
the first unvisited block.  After the eviction the hand rests on the evicted block's newer
neighbour (or restarts at the oldest).  This is libCacheSim ``Sieve`` exactly (its tail is
our head; its ``prev`` our ``next``).

Held HBM blocks stay at their place in the queue with their visited bit (``on_hold`` /
``on_release`` only mark them); the hand walks over a held block as if it were absent
(neither evicts it nor clears its bit).  A block's own request reading it at every step is
not a reuse: only ``on_hit`` (another request's prefix hit) sets the bit.
Amortised O(1) per eviction, plus the held blocks the hand passes.  Score: the visited bit
(1 = keep).
"""

import numpy as np

from kvsim.policy.api import (NIL, dll_ends, dll_links, dll_push_tail, dll_remove, njit_hook,
    policy_state)

NAME = "sieve"
DESCRIPTION = "SIEVE: FIFO with a visited bit; a hand sweeps and spares visited blocks once."
OFFLINE = False
REASONS = ("SIEVE: the hand reached it and it was not visited since the last sweep",)


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    visited = np.zeros(num_slots, np.int8)
    held = np.zeros(num_slots, np.int8)
    ints = np.array([NIL, 0], np.int64)  # [hand, number of held blocks]
    # i64: prev, nxt, ends, ints; i8: visited, held
    return policy_state(i64=(prev, nxt, dll_ends(), ints), i8=(visited, held))


@njit_hook
def on_insert(state, view, b, now_us):
    dll_push_tail(state.i64[0], state.i64[1], state.i64[2], b)
    state.i8[0][b] = 0
    state.i8[1][b] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    state.i8[0][b] = 1


@njit_hook
def on_hold(state, view, b):
    state.i8[1][b] = 1
    state.i64[3][1] += 1


@njit_hook
def on_release(state, view, b, now_us):
    state.i8[1][b] = 0
    state.i64[3][1] -= 1


@njit_hook
def on_remove(state, view, b):
    prev, nxt, ends, visited, ints, held = (state.i64[0], state.i64[1], state.i64[2], state.i8[0], state.i64[3], state.i8[1])
    if ints[0] == b:
        ints[0] = nxt[b]
    dll_remove(prev, nxt, ends, b)
    visited[b] = 0


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    prev, nxt, ends, visited, ints, held = (state.i64[0], state.i64[1], state.i64[2], state.i8[0], state.i64[3], state.i8[1])
    if ends[2] - ints[1] <= 0:
        return -1, 0, 0
    b = ints[0]
    if b == NIL:
        b = ends[0]
    while held[b] != 0 or visited[b] != 0:
        if held[b] == 0:
            visited[b] = 0
        b = nxt[b]
        if b == NIL:
            b = ends[0]
    ints[0] = b  # on_remove moves it to the newer neighbour
    n_alt = 0
    c = b
    while c != NIL and n_alt < alt_blocks.shape[0]:
        if held[c] == 0:
            alt_blocks[n_alt] = c
            alt_scores[n_alt] = visited[c]
            n_alt += 1
        c = nxt[c]
    return b, 0, n_alt
