"""S3-FIFO (Yang et al., SOSP'23), following libCacheSim ``S3FIFO`` (cache/eviction/S3FIFO.c).

Three FIFO queues share one set of links: SMALL (10% of capacity), MAIN (the rest) and
GHOST (ids only, 90% of capacity), all with libCacheSim's defaults
``small-size-ratio=0.10, ghost-size-ratio=0.90, move-to-main-threshold=2``; sizes are
``small = int(c * 0.1)``, ``main = c - small``, ``ghost = int(c * 0.9)``.  Head = oldest.

- hit: ``freq += 1`` (in SMALL or MAIN).
- ``on_miss``: a block found in GHOST is dropped from it and will enter MAIN.
- insert: into MAIN after a ghost hit; else into SMALL -- except before the first
  eviction, when SMALL is already full, into MAIN (libCacheSim's current variant).
  ``freq = 0``.
- ``victim``: if |MAIN| > main size or SMALL is empty, sweep MAIN: a head with freq >= 1
  is reinserted at the tail with ``freq = min(freq, 3) - 1`` (2-bit CLOCK), the first
  head with freq 0 is the victim.  Otherwise sweep SMALL: a head with
  freq >= 2 moves to MAIN's tail (freq 0); the first other head is the victim and its id
  goes to GHOST (FIFO, oldest ghost dropped when full) in ``on_remove``.
Ghosts are keyed by block id (exact in the single-tier simulator, see arc.py).
"""

import numpy as np

from kvsim.policy_api import (NIL, dll_ends, dll_links, dll_pop_head, dll_push_head,
                              dll_push_tail, dll_remove, njit_hook)

NAME = "s3fifo"
DESCRIPTION = "S3-FIFO: small probationary FIFO, main FIFO with 2-bit clock, ghost FIFO."
OFFLINE = False
REASONS = ("S3-FIFO: oldest in the small queue and not reused while there",
           "S3-FIFO: oldest in the main queue with its reuse credit used up")

SMALL, MAIN, GHOST = 1, 2, 3
SMALL_SIZE_RATIO = 0.10  # libCacheSim S3FIFO default (DEFAULT_CACHE_PARAMS)
GHOST_SIZE_RATIO = 0.90  # libCacheSim S3FIFO default
MOVE_TO_MAIN_THRESHOLD = 2  # libCacheSim S3FIFO default
# ints: [small_cap, main_cap, ghost_cap, hit_on_ghost, has_evicted, pending, pending_queue]


def init(capacity_blocks, num_slots, params):
    small_ratio = float(params.get("small_size_ratio", SMALL_SIZE_RATIO))
    ghost_ratio = float(params.get("ghost_size_ratio", GHOST_SIZE_RATIO))
    small_cap = int(capacity_blocks * small_ratio)
    prev, nxt = dll_links(num_slots)
    ints = np.array([small_cap, capacity_blocks - small_cap, int(capacity_blocks * ghost_ratio),
                     0, 0, NIL, 0], np.int64)
    return (prev, nxt, dll_ends(), dll_ends(), dll_ends(), np.zeros(num_slots, np.int8),
            np.zeros(num_slots, np.int64), ints)


@njit_hook
def on_miss(state, view, b, now_us):
    prev, nxt, small, main, ghost, where, freq, ints = state
    ints[3] = 0
    if where[b] == GHOST:
        dll_remove(prev, nxt, ghost, b)
        where[b] = 0
        ints[3] = 1


@njit_hook
def on_insert(state, view, b, now_us):
    prev, nxt, small, main, ghost, where, freq, ints = state
    if where[b] == GHOST:  # the core did not call on_miss
        on_miss(state, view, b, now_us)
    if ints[3] == 1:
        ints[3] = 0
        dll_push_tail(prev, nxt, main, b)
        where[b] = MAIN
    elif ints[4] == 0 and small[2] >= ints[0]:
        dll_push_tail(prev, nxt, main, b)
        where[b] = MAIN
    else:
        dll_push_tail(prev, nxt, small, b)
        where[b] = SMALL
    freq[b] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    state[6][b] += 1


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    prev, nxt, small, main, ghost, where, freq, ints = state
    if small[2] + main[2] == 0:
        return -1, 0, 0
    ints[4] = 1
    b = NIL
    queue = 0
    if not (main[2] > ints[1] or small[2] == 0):
        while small[2] > 0:
            h = dll_pop_head(prev, nxt, small)
            if freq[h] >= MOVE_TO_MAIN_THRESHOLD:
                dll_push_tail(prev, nxt, main, h)
                where[h] = MAIN
                freq[h] = 0
            else:
                dll_push_head(prev, nxt, small, h)  # put it back: on_remove unlinks it
                b = h
                queue = SMALL
                break
    if b == NIL:
        while True:
            h = main[0]
            if freq[h] >= 1:
                dll_remove(prev, nxt, main, h)
                dll_push_tail(prev, nxt, main, h)
                freq[h] = min(freq[h], 3) - 1
            else:
                b = h
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


@njit_hook
def on_remove(state, view, b):
    prev, nxt, small, main, ghost, where, freq, ints = state
    if where[b] == SMALL:
        dll_remove(prev, nxt, small, b)
    else:
        dll_remove(prev, nxt, main, b)
    where[b] = 0
    freq[b] = 0
    if ints[5] != b:
        return
    ints[5] = NIL
    if ints[6] == SMALL and ints[2] > 0:
        while ghost[2] >= ints[2]:
            g = dll_pop_head(prev, nxt, ghost)
            where[g] = 0
        dll_push_tail(prev, nxt, ghost, b)
        where[b] = GHOST
