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
``on_release`` mark it and count the held blocks of each queue.  When every block of MAIN
is held (a preemption storm: the running requests hold HBM) the victim comes from SMALL
even when MAIN is over its size; before issue #33 the MAIN sweep then walked over the
held blocks forever (sweeps that hung for 17 and 29 minutes).  Without holds the
decisions are libCacheSim's exactly (tests/policies/test_vs_libcachesim.py).
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (
    NIL,
    StateSpec,
    dll_ends,
    dll_links,
    dll_push_tail,
    dll_remove,
    ghost_find,
    ghost_new,
    ghost_pop_head,
    ghost_push_tail,
    ghost_remove,
    njit_hook,
)

NAME = "s3fifo"
DESCRIPTION = "S3-FIFO: small probationary FIFO, main FIFO with 2-bit clock, ghost FIFO."
OFFLINE = False
REASONS = ("S3-FIFO: oldest in the small queue and not reused while there",
           "S3-FIFO: oldest in the main queue with its reuse credit used up")

SMALL, MAIN, GHOST, PEND = 1, 2, 3, 4
SMALL_SIZE_RATIO = 0.10  # libCacheSim S3FIFO default (DEFAULT_CACHE_PARAMS)
GHOST_SIZE_RATIO = 0.90  # libCacheSim S3FIFO default
MOVE_TO_MAIN_THRESHOLD = 2  # libCacheSim S3FIFO default
#: ``state.ints``: the three capacities, the number of held blocks, whether anything was
#: evicted yet, the decision in progress between ``victim`` and ``on_remove``, and the
#: held blocks in SMALL and in MAIN.
(SMALL_CAP, MAIN_CAP, GHOST_CAP, N_HELD, HAS_EVICTED, PENDING_VICTIM, PENDING_QUEUE,
 HELD_SMALL, HELD_MAIN) = range(9)

STATE = StateSpec(
    i64=("prev", "nxt",  # the links of small and main (one block is in at most one)
         "small", "main",  # [head, tail, size] of the queues, head = oldest
         "freq",  # per block
         "ints",  # see SMALL_CAP, ..., PENDING_QUEUE
         ("ghosts", 7),  # the ghost pool (kvsim.policy.structs.ghost_new)
         "ghost", "pend"),  # ghost lists: GHOST, and ghosts hit by on_miss
    i8=("where",  # per block: SMALL or MAIN (0 = not resident)
        "glist",  # per ghost node: GHOST or PEND (0 = free)
        "held"))  # per block: 1 while held


def init(capacity_blocks, num_slots, params):
    small_ratio = float(params.get("small_size_ratio", SMALL_SIZE_RATIO))
    ghost_ratio = float(params.get("ghost_size_ratio", GHOST_SIZE_RATIO))
    small_cap = int(capacity_blocks * small_ratio)
    ghost_cap = int(capacity_blocks * ghost_ratio)
    prev, nxt = dll_links(num_slots)
    ints = np.array([small_cap, capacity_blocks - small_cap, ghost_cap, 0, 0, NIL, 0, 0, 0],
                    np.int64)
    n_ghosts = ghost_cap + capacity_blocks + 2  # + the pending ghost hits of one allocation
    return STATE.new(prev=prev, nxt=nxt, small=dll_ends(), main=dll_ends(),
                     freq=np.zeros(num_slots, np.int64), ints=ints, ghosts=ghost_new(n_ghosts),
                     ghost=dll_ends(), pend=dll_ends(), where=np.zeros(num_slots, np.int8),
                     glist=np.zeros(n_ghosts, np.int8), held=np.zeros(num_slots, np.int8))


@njit(cache=True)
def _take_ghost(state, h):
    """Content ``h`` in GHOST: park it as a pending ghost hit."""
    glist, ghost, pend = state.glist, state.ghost, state.pend
    g = state.ghosts
    node = ghost_find(g, h)
    if node != NIL and glist[node] == GHOST:
        dll_remove(g[3], g[4], ghost, node)
        dll_push_tail(g[3], g[4], pend, node)
        glist[node] = PEND


@njit(cache=True)
def on_miss(state, view, h, now_us):
    state = STATE.of(state)
    _take_ghost(state, h)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    prev, nxt, small, main = state.prev, state.nxt, state.small, state.main
    where, freq, ints = state.where, state.freq, state.ints
    h = view.content_hash[b]
    _take_ghost(state, h)  # no-op when on_miss already took it
    g = state.ghosts
    node = ghost_find(g, h)
    if node != NIL:
        ghost_remove(g, state.pend, node)
        state.glist[node] = 0
        q = MAIN
    elif ints[HAS_EVICTED] == 0 and small[2] >= ints[SMALL_CAP]:
        q = MAIN
    else:
        q = SMALL
    dll_push_tail(prev, nxt, main if q == MAIN else small, b)
    where[b] = q
    freq[b] = 0
    state.held[b] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    state.freq[b] += 1


@njit_hook
def on_hold(state, view, b):
    state = STATE.of(state)
    state.held[b] = 1
    state.ints[N_HELD] += 1
    if state.where[b] != 0:
        state.ints[HELD_SMALL if state.where[b] == SMALL else HELD_MAIN] += 1


@njit_hook
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    state.held[b] = 0
    state.ints[N_HELD] -= 1
    if state.where[b] != 0:
        state.ints[HELD_SMALL if state.where[b] == SMALL else HELD_MAIN] -= 1


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    prev, nxt, small, main = state.prev, state.nxt, state.small, state.main
    where, freq, ints = state.where, state.freq, state.ints
    held = state.held
    if small[2] + main[2] - ints[N_HELD] <= 0:
        return -1, 0, 0
    ints[HAS_EVICTED] = 1
    b = NIL
    queue = 0
    sweep_small = not (main[2] > ints[MAIN_CAP] or small[2] == 0)
    while b == NIL:
        if sweep_small:
            c = small[0]
            while c != NIL:
                nx = nxt[c]
                if freq[c] >= MOVE_TO_MAIN_THRESHOLD:
                    dll_remove(prev, nxt, small, c)
                    dll_push_tail(prev, nxt, main, c)
                    where[c] = MAIN
                    freq[c] = 0
                    if held[c] != 0:
                        ints[HELD_SMALL] -= 1
                        ints[HELD_MAIN] += 1
                elif held[c] == 0:
                    b = c
                    queue = SMALL
                    break
                c = nx
            if b != NIL:
                break
        if main[2] - ints[HELD_MAIN] <= 0:
            # every block of MAIN is held: the victim is in SMALL (the sweep of MAIN
            # walked over held blocks forever: issue #33's hung s3fifo cells)
            if sweep_small:
                return -1, 0, 0
            sweep_small = True
            continue
        c = main[0]
        run = 0  # held blocks walked over in a row: a whole lap means none is evictable
        while run < main[2]:
            if c == NIL:
                c = main[0]
            nx = nxt[c]
            if held[c] != 0:
                run += 1
                c = nx
            elif freq[c] >= 1:
                run = 0
                dll_remove(prev, nxt, main, c)
                dll_push_tail(prev, nxt, main, c)
                freq[c] = min(freq[c], 3) - 1
                c = nx
            else:
                b = c
                queue = MAIN
                break
        if b == NIL:
            if sweep_small:
                return -1, 0, 0  # nothing evictable (the held counts disagree)
            sweep_small = True
    ints[PENDING_VICTIM] = b
    ints[PENDING_QUEUE] = queue
    n_alt = 0
    if alt_blocks.shape[0] > 0:
        alt_blocks[0] = b
        alt_scores[0] = freq[b]
        n_alt = 1
    return b, (0 if queue == SMALL else 1), n_alt


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    prev, nxt, small, main = state.prev, state.nxt, state.small, state.main
    where, freq, ints = state.where, state.freq, state.ints
    glist, ghost = state.glist, state.ghost
    if where[b] == SMALL:
        dll_remove(prev, nxt, small, b)
    else:
        dll_remove(prev, nxt, main, b)
    if state.held[b] != 0 and where[b] != 0:
        ints[HELD_SMALL if where[b] == SMALL else HELD_MAIN] -= 1
    where[b] = 0
    freq[b] = 0
    if ints[PENDING_VICTIM] != b:
        return
    ints[PENDING_VICTIM] = NIL
    h = view.content_hash[b]
    if ints[PENDING_QUEUE] == SMALL and ints[GHOST_CAP] > 0 and h != 0:
        g = state.ghosts
        if ghost_find(g, h) != NIL:
            return
        while ghost[2] >= ints[GHOST_CAP]:
            glist[ghost[0]] = 0
            ghost_pop_head(g, ghost)
        if ghost_push_tail(g, ghost, h):
            glist[ghost[1]] = GHOST
