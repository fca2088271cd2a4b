"""ARC (Megiddo & Modha, FAST'03), following libCacheSim ``ARC`` (cache/eviction/ARC.c).

T1 (seen once while resident) and T2 (seen at least twice) hold the resident blocks;
their ghosts B1, B2 remember the *content* (``view.content_hash``) of blocks evicted from
T1/T2, no data.  ``p`` is the adaptive target size of T1 (a float, as in libCacheSim).
Head = LRU end everywhere.

- hit in T1 -> MRU of T2; hit in T2 -> MRU of T2.
- ``on_miss(h)`` (content ``h`` requested, not resident): ghost hit in B1 -> p +=
  max(|B2|/|B1|, 1) (capped at c); in B2 -> p -= max(|B1|/|B2|, 1) (floored at 0); the
  ghost entry leaves B1/B2 and the content will enter T2.  Otherwise it will enter T1.
- ``victim`` after a ghost hit = REPLACE: T1's LRU if |T1| > 0 and (|T1| > p or
  (|T1| == p and the hit was in B2)) or T2 is empty; else T2's LRU.  After a plain miss
  (case IV): if |T1| + |B1| + 1 > c: drop B1's LRU and REPLACE if B1 is non-empty, else
  evict T1's LRU with no ghost; otherwise drop B2's LRU when |T1|+|B1|+|T2|+|B2| >= 2c,
  then REPLACE.  The ghost bookkeeping happens in ``on_remove`` of the named victim.

Holds (HBM): a held block stays in T1/T2 (it counts in |T1|, |T2|: it occupies the
cache) and gets its hits, but leaves its list's LRU order (``on_hold``) and re-enters at
the MRU end on ``on_release`` (a running request read it at every step).  When the list
REPLACE picks has no candidate, the other list's LRU candidate goes.  Ghosts are keyed by
content, so a slot reused at once for new content is not mistaken for a ghost hit.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (
    NIL,
    StateSpec,
    dll_contains,
    dll_ends,
    dll_links,
    dll_move_to_tail,
    dll_push_tail,
    dll_remove,
    ghost_find,
    ghost_new,
    ghost_pop_head,
    ghost_push_tail,
    ghost_remove,
    njit_hook,
)

NAME = "arc"
DESCRIPTION = "Adaptive Replacement Cache: recency vs frequency lists with ghost-tuned split."
OFFLINE = False
REASONS = ("ARC: least recently used of T1 (seen once), T1 above its adaptive target",
           "ARC: least recently used of T2 (seen twice or more), T1 within its target")

T1, T2, B1, B2, PEND = 1, 2, 3, 4, 5  # values of ``where`` (resident) and ``glist`` (ghosts)

#: ``state.ints``: the capacity and the decision in progress between ``on_miss``,
#: ``victim`` and ``on_remove``; ``N1``/``N2`` count the resident blocks of T1/T2 (held
#: ones included), ``t1``/``t2`` list only the candidates.
C, HIT_B1, HIT_B2, PENDING_VICTIM, PENDING_GHOST, DROP_B1_LRU, DROP_B2_LRU, N1, N2 = range(9)

STATE = StateSpec(
    i64=("prev", "nxt",  # the links of t1 and t2 (one block is in at most one list)
         "t1", "t2",  # [head, tail, size] of the candidate lists, head = LRU
         "ints",  # see C, ..., N2
         ("ghosts", 7),  # the ghost pool (kvsim.policy.structs.ghost_new)
         "b1", "b2", "pend"),  # ghost lists: B1, B2, and ghosts hit by on_miss
    f64=("p",),  # [p], T1's adaptive target
    i8=("where",  # per block: T1 or T2 (0 = not resident)
        "glist"))  # per ghost node: B1, B2 or PEND (0 = free)


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    ints = np.array([capacity_blocks, 0, 0, NIL, 0, 0, 0, 0, 0], np.int64)
    n_ghosts = 3 * max(int(capacity_blocks), 1) + 2  # |B1| + |B2| <= 2c, + pending <= c
    # a ghost is a distinct content (one node per hash): never more than reach the tier
    n_ghosts = min(n_ghosts, int(params.get("max_contents", n_ghosts)) + 2)
    return STATE.new(prev=prev, nxt=nxt, t1=dll_ends(), t2=dll_ends(), ints=ints,
                     ghosts=ghost_new(n_ghosts), b1=dll_ends(), b2=dll_ends(), pend=dll_ends(),
                     p=np.zeros(1, np.float64), where=np.zeros(num_slots, np.int8),
                     glist=np.zeros(n_ghosts, np.int8))


@njit(cache=True)
def _ghost_hit(state, h):
    """If content ``h`` is in B1/B2: adapt p, flag the hit, park the ghost as pending."""
    ints, p, glist, b1, b2 = state.ints, state.p, state.glist, state.b1, state.b2
    g = state.ghosts
    node = ghost_find(g, h)
    if node == NIL or glist[node] == PEND:
        return
    c = ints[C]
    gprev, gnext = g[3], g[4]
    if glist[node] == B1:
        delta = max(b2[2] / b1[2], 1.0)
        p[0] = min(p[0] + delta, float(c))
        dll_remove(gprev, gnext, b1, node)
        ints[HIT_B1] = 1
    else:
        delta = max(b1[2] / b2[2], 1.0)
        p[0] = max(p[0] - delta, 0.0)
        dll_remove(gprev, gnext, b2, node)
        ints[HIT_B2] = 1
    dll_push_tail(gprev, gnext, state.pend, node)
    glist[node] = PEND


@njit(cache=True)
def on_miss(state, view, h, now_us):
    state = STATE.of(state)
    ints = state.ints
    ints[HIT_B1] = 0
    ints[HIT_B2] = 0
    _ghost_hit(state, h)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    prev, nxt, where, ints = state.prev, state.nxt, state.where, state.ints
    h = view.content_hash[b]
    _ghost_hit(state, h)  # no-op when on_miss already took the ghost
    g = state.ghosts
    node = ghost_find(g, h)
    if node != NIL:  # pending ghost hit: enters T2
        ghost_remove(g, state.pend, node)
        state.glist[node] = 0
        dll_push_tail(prev, nxt, state.t2, b)
        where[b] = T2
        ints[N2] += 1
    else:
        dll_push_tail(prev, nxt, state.t1, b)
        where[b] = T1
        ints[N1] += 1
    ints[HIT_B1] = 0
    ints[HIT_B2] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    prev, nxt, t2, where, ints = state.prev, state.nxt, state.t2, state.where, state.ints
    cand = dll_contains(prev, b)
    if where[b] == T1:
        if cand:
            dll_remove(prev, nxt, state.t1, b)
            dll_push_tail(prev, nxt, t2, b)
        where[b] = T2
        ints[N1] -= 1
        ints[N2] += 1
    elif cand:
        dll_move_to_tail(prev, nxt, t2, b)


@njit_hook
def on_hold(state, view, b):
    state = STATE.of(state)
    dll_remove(state.prev, state.nxt, state.t1 if state.where[b] == T1 else state.t2, b)


@njit_hook
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    dll_push_tail(state.prev, state.nxt, state.t1 if state.where[b] == T1 else state.t2, b)


@njit(cache=True, inline="always")
def _replace_from_t1(ints, p):
    n1 = float(ints[N1])
    return (ints[N1] > 0 and (n1 > p[0] or (n1 == p[0] and ints[HIT_B2] == 1))) or ints[N2] == 0


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    nxt, t1, t2, ints, p = state.nxt, state.t1, state.t2, state.ints, state.p
    b1, b2 = state.b1, state.b2
    if t1[2] + t2[2] == 0:
        return -1, 0, 0
    c = ints[C]
    n1 = ints[N1]
    n2 = ints[N2]
    ints[DROP_B1_LRU] = 0
    ints[DROP_B2_LRU] = 0
    if ints[HIT_B1] == 1 or ints[HIT_B2] == 1:
        from_t1 = _replace_from_t1(ints, p)
        ghost = B1 if from_t1 else B2
    elif n1 + b1[2] + 1 > c:
        if b1[2] > 0:
            ints[DROP_B1_LRU] = 1
            from_t1 = _replace_from_t1(ints, p)
            ghost = B1 if from_t1 else B2
        else:
            from_t1 = True
            ghost = 0
    else:
        if n1 + b1[2] + n2 + b2[2] >= 2 * c and b2[2] > 0:
            ints[DROP_B2_LRU] = 1
        from_t1 = _replace_from_t1(ints, p)
        ghost = B1 if from_t1 else B2
    if from_t1 and t1[2] == 0:  # T1's blocks are all held
        from_t1 = False
        ghost = B2 if ghost != 0 else 0
    elif not from_t1 and t2[2] == 0:
        from_t1 = True
        ghost = B1 if ghost != 0 else 0
    b = t1[0] if from_t1 else t2[0]
    ints[PENDING_VICTIM] = b
    ints[PENDING_GHOST] = ghost
    n_alt = 0
    if alt_blocks.shape[0] > 0:
        alt_blocks[0] = b
        alt_scores[0] = 1.0 if from_t1 else 2.0
        n_alt = 1
        c2 = nxt[b]
        while c2 != NIL and n_alt < alt_blocks.shape[0]:
            alt_blocks[n_alt] = c2
            alt_scores[n_alt] = alt_scores[0]
            n_alt += 1
            c2 = nxt[c2]
    return b, (0 if from_t1 else 1), n_alt


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    prev, nxt, where, ints = state.prev, state.nxt, state.where, state.ints
    glist, b1, b2 = state.glist, state.b1, state.b2
    if where[b] == T1:
        dll_remove(prev, nxt, state.t1, b)
        ints[N1] -= 1
    else:
        dll_remove(prev, nxt, state.t2, b)
        ints[N2] -= 1
    where[b] = 0
    if ints[PENDING_VICTIM] != b:  # invalidated: no ghost
        return
    ints[PENDING_VICTIM] = NIL
    g = state.ghosts
    if ints[DROP_B1_LRU] == 1:
        glist[b1[0]] = 0
        ghost_pop_head(g, b1)
    if ints[DROP_B2_LRU] == 1:
        glist[b2[0]] = 0
        ghost_pop_head(g, b2)
    h = view.content_hash[b]
    if h == 0 or ints[PENDING_GHOST] == 0 or ghost_find(g, h) != NIL:
        return
    lst = b1 if ints[PENDING_GHOST] == B1 else b2
    if ghost_push_tail(g, lst, h):  # never full within ARC's bounds
        glist[lst[1]] = ints[PENDING_GHOST]
