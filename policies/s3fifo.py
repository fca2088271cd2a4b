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

**Amortised O(1) sweeps under holds** (issue #33).  A sweep that reaches a held block it
must walk over *parks* it: the block leaves the queue's list for the queue's parked set,
numbered in parking order (``pseq``).  Every parked block sat at the head when parked and
nothing is ever inserted before the head, so the queue's order is: its parked blocks in
``pseq`` order, then its list.  A parked block matters to a sweep again only once it is
released (or, in SMALL, once its hits reach the move-to-MAIN threshold): it then moves to
the queue's *returned* list, kept in ``pseq`` order, which the sweeps read before the
list.  So a held block is walked over once per hold, not once per victim; a return costs
the returned blocks with a larger ``pseq`` it is inserted before (none when blocks come
back in queue order, as a request's chain does).  The decisions are those of the plain
walk (tests/policies/test_s3fifo_storm.py checks them against a Python walk on random
hold / release / hit sequences).
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (
    NIL,
    StateSpec,
    dll_ends,
    dll_links,
    dll_push_head,
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
#: evicted yet, the decision in progress between ``victim`` and ``on_remove``, the held
#: blocks in SMALL and in MAIN, the last parking number, and the blocks the sweeps have
#: examined (a work counter: tests check the sweeps stay amortised O(1)).
(SMALL_CAP, MAIN_CAP, GHOST_CAP, N_HELD, HAS_EVICTED, PENDING_VICTIM, PENDING_QUEUE,
 HELD_SMALL, HELD_MAIN, PARK_SEQ, WALKED) = range(11)
#: per block ``park``: in its queue's list, parked (held, walked over), returned
IN_LIST, PARKED, RETURNED = 0, 1, 2

STATE = StateSpec(
    i64=("prev", "nxt",  # the links of small and main (one block is in at most one)
         "small", "main",  # [head, tail, size] of the queues' lists, head = oldest
         "psmall", "pmain",  # parked blocks of each queue (held; any order)
         "rsmall", "rmain",  # returned parked blocks of each queue, in pseq order
         "freq",  # per block
         "pseq",  # per block: parking number (queue order of the parked and returned)
         "ints",  # see SMALL_CAP, ..., PENDING_QUEUE
         ("ghosts", 7),  # the ghost pool (kvsim.policy.structs.ghost_new)
         "ghost", "pend"),  # ghost lists: GHOST, and ghosts hit by on_miss
    i8=("where",  # per block: SMALL or MAIN (0 = not resident)
        "glist",  # per ghost node: GHOST or PEND (0 = free)
        "held",  # per block: 1 while held
        "park"))  # per block: IN_LIST, PARKED or RETURNED


def init(capacity_blocks, num_slots, params):
    small_ratio = float(params.get("small_size_ratio", SMALL_SIZE_RATIO))
    ghost_ratio = float(params.get("ghost_size_ratio", GHOST_SIZE_RATIO))
    small_cap = int(capacity_blocks * small_ratio)
    ghost_cap = int(capacity_blocks * ghost_ratio)
    prev, nxt = dll_links(num_slots)
    ints = np.array([small_cap, capacity_blocks - small_cap, ghost_cap, 0, 0, NIL, 0, 0, 0,
                     0, 0], np.int64)
    n_ghosts = ghost_cap + capacity_blocks + 2  # + the pending ghost hits of one allocation
    # a ghost is a distinct content (one node per hash): never more than reach the tier
    n_ghosts = min(n_ghosts, int(params.get("max_contents", n_ghosts)) + 2)
    return STATE.new(prev=prev, nxt=nxt, small=dll_ends(), main=dll_ends(),
                     psmall=dll_ends(), pmain=dll_ends(), rsmall=dll_ends(),
                     rmain=dll_ends(), freq=np.zeros(num_slots, np.int64),
                     pseq=np.zeros(num_slots, np.int64), ints=ints,
                     ghosts=ghost_new(n_ghosts), ghost=dll_ends(), pend=dll_ends(),
                     where=np.zeros(num_slots, np.int8), glist=np.zeros(n_ghosts, np.int8),
                     held=np.zeros(num_slots, np.int8), park=np.zeros(num_slots, np.int8))


@njit(cache=True)
def _size(state, q):
    """Blocks in queue ``q`` (SMALL or MAIN): its list, parked and returned blocks."""
    if q == SMALL:
        return state.small[2] + state.psmall[2] + state.rsmall[2]
    return state.main[2] + state.pmain[2] + state.rmain[2]


@njit(cache=True)
def _unlink(state, b):
    """Take ``b`` out of whichever list of its queue holds it."""
    prev, nxt = state.prev, state.nxt
    small = state.where[b] == SMALL
    k = state.park[b]
    if k == PARKED:
        dll_remove(prev, nxt, state.psmall if small else state.pmain, b)
    elif k == RETURNED:
        dll_remove(prev, nxt, state.rsmall if small else state.rmain, b)
    else:
        dll_remove(prev, nxt, state.small if small else state.main, b)
    state.park[b] = IN_LIST


@njit(cache=True)
def _park(state, b):
    """A sweep walks over held ``b`` (at its queue's head): park it, numbered in queue
    order when it comes from the list (a returned block keeps its number)."""
    small = state.where[b] == SMALL
    if state.park[b] == IN_LIST:
        state.ints[PARK_SEQ] += 1
        state.pseq[b] = state.ints[PARK_SEQ]
    _unlink(state, b)
    dll_push_tail(state.prev, state.nxt, state.psmall if small else state.pmain, b)
    state.park[b] = PARKED


@njit(cache=True)
def _return(state, b):
    """Parked ``b`` matters to the sweeps again: into its queue's returned list, in pseq
    order (walking back from the tail over the returned blocks parked after it)."""
    prev, nxt, pseq = state.prev, state.nxt, state.pseq
    small = state.where[b] == SMALL
    dll_remove(prev, nxt, state.psmall if small else state.pmain, b)
    ends = state.rsmall if small else state.rmain
    c = ends[1]
    while c != NIL and pseq[c] > pseq[b]:
        c = prev[c]
    if c == NIL:
        dll_push_head(prev, nxt, ends, b)
    else:
        n = nxt[c]
        prev[b] = c
        nxt[b] = n
        nxt[c] = b
        if n == NIL:
            ends[1] = b
        else:
            prev[n] = b
        ends[2] += 1
    state.park[b] = RETURNED


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
    elif ints[HAS_EVICTED] == 0 and _size(state, SMALL) >= ints[SMALL_CAP]:
        q = MAIN
    else:
        q = SMALL
    dll_push_tail(prev, nxt, main if q == MAIN else small, b)
    where[b] = q
    freq[b] = 0
    state.held[b] = 0
    state.park[b] = IN_LIST


@njit_hook
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    state.freq[b] += 1
    if (state.park[b] == PARKED and state.where[b] == SMALL
            and state.freq[b] >= MOVE_TO_MAIN_THRESHOLD):
        _return(state, b)  # the SMALL sweep now moves it to MAIN, held or not


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
        if state.park[b] == PARKED:
            _return(state, b)


@njit(cache=True)
def _sweep_small(state):
    """SMALL's sweep: the first head (returned blocks first, then the list) with freq <
    2 that is not held; heads with freq >= 2 move to MAIN's tail, held ones are parked.
    NIL when SMALL has none."""
    prev, nxt, small, main, rsmall = state.prev, state.nxt, state.small, state.main, state.rsmall
    where, freq, ints, held = state.where, state.freq, state.ints, state.held
    while True:
        if rsmall[2] > 0:
            c = rsmall[0]
        elif small[2] > 0:
            c = small[0]
        else:
            return NIL
        ints[WALKED] += 1
        if freq[c] >= MOVE_TO_MAIN_THRESHOLD:
            _unlink(state, c)
            dll_push_tail(prev, nxt, main, c)
            where[c] = MAIN
            freq[c] = 0
            if held[c] != 0:
                ints[HELD_SMALL] -= 1
                ints[HELD_MAIN] += 1
        elif held[c] == 0:
            return c
        else:
            _park(state, c)


@njit(cache=True)
def _sweep_main(state):
    """MAIN's sweep (2-bit CLOCK): the first head (returned blocks first, then the list)
    with freq 0 that is not held; heads with freq >= 1 go to the tail with one credit
    less, held ones are parked.  NIL when every block of MAIN is held."""
    prev, nxt, main, rmain = state.prev, state.nxt, state.main, state.rmain
    freq, ints, held = state.freq, state.ints, state.held
    while True:
        if rmain[2] > 0:
            c = rmain[0]
        elif main[2] > 0:
            c = main[0]
        else:
            return NIL
        ints[WALKED] += 1
        if held[c] != 0:
            _park(state, c)
        elif freq[c] >= 1:
            _unlink(state, c)
            dll_push_tail(prev, nxt, main, c)
            freq[c] = min(freq[c], 3) - 1
        else:
            return c


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    freq, ints = state.freq, state.ints
    n_small = _size(state, SMALL)
    if n_small + _size(state, MAIN) - ints[N_HELD] <= 0:
        return -1, 0, 0
    ints[HAS_EVICTED] = 1
    b = NIL
    queue = 0
    sweep_small = not (_size(state, MAIN) > ints[MAIN_CAP] or n_small == 0)
    while b == NIL:
        if sweep_small:
            b = _sweep_small(state)
            if b != NIL:
                queue = SMALL
                break
        if _size(state, MAIN) - ints[HELD_MAIN] <= 0:
            # every block of MAIN is held: the victim is in SMALL (the sweep of MAIN
            # walked over held blocks forever: issue #33's hung s3fifo cells)
            if sweep_small:
                return -1, 0, 0
            sweep_small = True
            continue
        b = _sweep_main(state)
        if b != NIL:
            queue = MAIN
        elif sweep_small:
            return -1, 0, 0  # nothing evictable (the held counts disagree)
        else:
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
    where, freq, ints = state.where, state.freq, state.ints
    glist, ghost = state.glist, state.ghost
    _unlink(state, b)
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
