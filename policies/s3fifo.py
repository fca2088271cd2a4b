"""S3-FIFO (Yang et al., SOSP'23), following libCacheSim ``S3FIFO`` (cache/eviction/S3FIFO.c).

Two FIFO queues of resident blocks, SMALL (10% of capacity) and MAIN (the rest), and a
GHOST FIFO of evicted *content* (``view.content_hash``, no data, 90% of capacity), all
with libCacheSim's defaults ``small-size-ratio=0.10, ghost-size-ratio=0.90,
move-to-main-threshold=2``; sizes are ``small = int(c * 0.1)``, ``main = c - small``,
``ghost = int(c * 0.9)``.  Head = oldest.

- hit: ``freq += 1`` (in SMALL or MAIN, held or not).
- ``on_miss(h)``: content found in GHOST is dropped from it and will enter MAIN.
- insert: into MAIN after a ghost hit; else into SMALL -- except before the first
  eviction, when SMALL is already full, into MAIN (libCacheSim's current variant).
  ``freq = 0``.
- ``victim``: if |MAIN| > main size or SMALL is empty, sweep MAIN: a head with
  freq >= 1 is reinserted at the tail with ``freq = min(freq, 3) - 1`` (2-bit CLOCK), the
  first head with freq 0 is the victim.  Otherwise sweep SMALL: a head with freq >= 2
  moves to MAIN's tail (freq 0); the first other head is the victim and its content goes
  to GHOST (FIFO, oldest ghost dropped when full) in ``on_remove``.

Holds (HBM): a held block stays at its place in its queue with its ``freq`` (and still
gets hits); the sweeps walk over it as if it were absent (a held block in SMALL with
freq >= 2 still moves to MAIN: that is a promotion, not an eviction).  ``on_hold`` /
``on_release`` only mark it.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (NIL, dll_ends, dll_links, dll_push_tail, dll_remove, ghost_find,
    ghost_new, ghost_pop_head, ghost_push_tail, ghost_remove, njit_hook, policy_state)

NAME = "s3fifo"
DESCRIPTION = "S3-FIFO: small probationary FIFO, main FIFO with 2-bit clock, ghost FIFO."
OFFLINE = False
REASONS = ("S3-FIFO: oldest in the small queue and not reused while there",
           "S3-FIFO: oldest in the main queue with its reuse credit used up")

SMALL, MAIN, GHOST, PEND = 1, 2, 3, 4
SMALL_SIZE_RATIO = 0.10  # libCacheSim S3FIFO default (DEFAULT_CACHE_PARAMS)
GHOST_SIZE_RATIO = 0.90  # libCacheSim S3FIFO default
MOVE_TO_MAIN_THRESHOLD = 2  # libCacheSim S3FIFO default
# ints: [small_cap, main_cap, ghost_cap, held blocks, has_evicted, pending, pending_queue]
# state (kvsim.policy.api.PolicyState): i64 = prev, nxt, small, main, freq, ints, g0..g6
# (ghost pool), ghost, pend; i8 = where, glist, held


def init(capacity_blocks, num_slots, params):
    small_ratio = float(params.get("small_size_ratio", SMALL_SIZE_RATIO))
    ghost_ratio = float(params.get("ghost_size_ratio", GHOST_SIZE_RATIO))
    small_cap = int(capacity_blocks * small_ratio)
    ghost_cap = int(capacity_blocks * ghost_ratio)
    prev, nxt = dll_links(num_slots)
    ints = np.array([small_cap, capacity_blocks - small_cap, ghost_cap, 0, 0, NIL, 0], np.int64)
    n_ghosts = ghost_cap + capacity_blocks + 2  # + the pending ghost hits of one allocation
    # i64: prev, nxt, small, main, freq, ints, ghost pool (6..12), ghost, pend;
    # i8: where, glist, held
    return policy_state(i64=(prev, nxt, dll_ends(), dll_ends(), np.zeros(num_slots, np.int64),
                              ints) + ghost_new(n_ghosts) + (dll_ends(), dll_ends()),
                        i8=(np.zeros(num_slots, np.int8), np.zeros(n_ghosts, np.int8),
                            np.zeros(num_slots, np.int8)))


@njit(cache=True)
def _ghosts(state):
    return state.i64[6], state.i64[7], state.i64[8], state.i64[9], state.i64[10], state.i64[11], state.i64[12]


@njit(cache=True)
def _take_ghost(state, h):
    """Content ``h`` in GHOST: park it as a pending ghost hit."""
    glist, ghost, pend = state.i8[1], state.i64[13], state.i64[14]
    g = _ghosts(state)
    node = ghost_find(g, h)
    if node != NIL and glist[node] == GHOST:
        dll_remove(g[3], g[4], ghost, node)
        dll_push_tail(g[3], g[4], pend, node)
        glist[node] = PEND


@njit(cache=True)
def on_miss(state, view, h, now_us):
    _take_ghost(state, h)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    prev, nxt, small, main, where, freq, ints = (state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i8[0], state.i64[4], state.i64[5])
    h = view.content_hash[b]
    _take_ghost(state, h)  # no-op when on_miss already took it
    g = _ghosts(state)
    node = ghost_find(g, h)
    if node != NIL:
        ghost_remove(g, state.i64[14], node)
        state.i8[1][node] = 0
        q = MAIN
    elif ints[4] == 0 and small[2] >= ints[0]:
        q = MAIN
    else:
        q = SMALL
    dll_push_tail(prev, nxt, main if q == MAIN else small, b)
    where[b] = q
    freq[b] = 0
    state.i8[2][b] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    state.i64[4][b] += 1


@njit_hook
def on_hold(state, view, b):
    state.i8[2][b] = 1
    state.i64[5][3] += 1


@njit_hook
def on_release(state, view, b, now_us):
    state.i8[2][b] = 0
    state.i64[5][3] -= 1


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    prev, nxt, small, main, where, freq, ints = (state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i8[0], state.i64[4], state.i64[5])
    held = state.i8[2]
    if small[2] + main[2] - ints[3] <= 0:
        return -1, 0, 0
    ints[4] = 1
    b = NIL
    queue = 0
    if not (main[2] > ints[1] or small[2] == 0):
        c = small[0]
        while c != NIL:
            nx = nxt[c]
            if freq[c] >= MOVE_TO_MAIN_THRESHOLD:
                dll_remove(prev, nxt, small, c)
                dll_push_tail(prev, nxt, main, c)
                where[c] = MAIN
                freq[c] = 0
            elif held[c] == 0:
                b = c
                queue = SMALL
                break
            c = nx
    if b == NIL:
        c = main[0]
        while True:
            if c == NIL:
                c = main[0]
            nx = nxt[c]
            if held[c] != 0:
                c = nx
            elif freq[c] >= 1:
                dll_remove(prev, nxt, main, c)
                dll_push_tail(prev, nxt, main, c)
                freq[c] = min(freq[c], 3) - 1
                c = nx
            else:
                b = c
                queue = MAIN
                break
    ints[5] = b
    ints[6] = queue
    n_alt = 0
    if alt_blocks.shape[0] > 0:
        alt_blocks[0] = b
        alt_scores[0] = freq[b]
        n_alt = 1
    return b, (0 if queue == SMALL else 1), n_alt


@njit(cache=True)
def on_remove(state, view, b):
    prev, nxt, small, main, where, freq, ints = (state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i8[0], state.i64[4], state.i64[5])
    glist, ghost = state.i8[1], state.i64[13]
    if where[b] == SMALL:
        dll_remove(prev, nxt, small, b)
    else:
        dll_remove(prev, nxt, main, b)
    where[b] = 0
    freq[b] = 0
    if ints[5] != b:
        return
    ints[5] = NIL
    h = view.content_hash[b]
    if ints[6] == SMALL and ints[2] > 0 and h != 0:
        g = _ghosts(state)
        if ghost_find(g, h) != NIL:
            return
        while ghost[2] >= ints[2]:
            glist[ghost[0]] = 0
            ghost_pop_head(g, ghost)
        if ghost_push_tail(g, ghost, h):
            glist[ghost[1]] = GHOST
