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

from kvsim.policy.api import (
    NIL,
    StateSpec,
    dll_ends,
    dll_links,
    dll_push_tail,
    dll_remove,
    njit_hook,
)

NAME = "sieve"
DESCRIPTION = "SIEVE: FIFO with a visited bit; a hand sweeps and spares visited blocks once."
OFFLINE = False
REASONS = ("SIEVE: the hand reached it and it was not visited since the last sweep",)

HAND, N_HELD = 0, 1  # ``ints``: the hand's block (NIL: the oldest), the number of held blocks

STATE = StateSpec(i64=("prev", "nxt", "queue",  # the queue, head = oldest
                        "ints"),  # see HAND, N_HELD
                   i8=("visited", "held"))  # per block


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    return STATE.new(prev=prev, nxt=nxt, queue=dll_ends(), ints=np.array([NIL, 0], np.int64),
                     visited=np.zeros(num_slots, np.int8), held=np.zeros(num_slots, np.int8))


@njit_hook
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    dll_push_tail(state.prev, state.nxt, state.queue, b)
    state.visited[b] = 0
    state.held[b] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    state.visited[b] = 1


@njit_hook
def on_hold(state, view, b):
    state = STATE.of(state)
    state.held[b] = 1
    state.ints[N_HELD] += 1


@njit_hook
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    state.held[b] = 0
    state.ints[N_HELD] -= 1


@njit_hook
def on_remove(state, view, b):
    state = STATE.of(state)
    prev, nxt, ends, visited, ints = (state.prev, state.nxt, state.queue, state.visited,
                                      state.ints)
    if ints[HAND] == b:
        ints[HAND] = nxt[b]
    dll_remove(prev, nxt, ends, b)
    visited[b] = 0


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    nxt, ends, visited, ints, held = (state.nxt, state.queue, state.visited, state.ints,
                                      state.held)
    if ends[2] - ints[N_HELD] <= 0:
        return -1, 0, 0
    b = ints[HAND]
    if b == NIL:
        b = ends[0]
    while held[b] != 0 or visited[b] != 0:
        if held[b] == 0:
            visited[b] = 0
        b = nxt[b]
        if b == NIL:
            b = ends[0]
    ints[HAND] = b  # on_remove moves it to the newer neighbour
    n_alt = 0
    c = b
    while c != NIL and n_alt < alt_blocks.shape[0]:
        if held[c] == 0:
            alt_blocks[n_alt] = c
            alt_scores[n_alt] = visited[c]
            n_alt += 1
        c = nxt[c]
    return b, 0, n_alt
