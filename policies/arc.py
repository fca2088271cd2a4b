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

from kvsim.policy.api import (NIL, dll_contains, dll_ends, dll_links, dll_move_to_tail,
    dll_push_tail, dll_remove, ghost_find, ghost_new, ghost_pop_head, ghost_push_tail,
    ghost_remove, njit_hook, policy_state)

NAME = "arc"
DESCRIPTION = "Adaptive Replacement Cache: recency vs frequency lists with ghost-tuned split."
OFFLINE = False
REASONS = ("ARC: least recently used of T1 (seen once), T1 above its adaptive target",
           "ARC: least recently used of T2 (seen twice or more), T1 within its target")

T1, T2, B1, B2, PEND = 1, 2, 3, 4, 5
# ints: [c, hit_in_b1, hit_in_b2, pending_victim, pending_ghost (0 none, B1, B2),
#        drop_b1_lru, drop_b2_lru, |T1| resident, |T2| resident]
# state (kvsim.policy.api.PolicyState, see init): i64 = prev, nxt, t1, t2, ints, g0..g6 (ghost
# pool), b1, b2, pend; f64 = p; i8 = where, glist


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    where = np.zeros(num_slots, np.int8)
    ints = np.array([capacity_blocks, 0, 0, NIL, 0, 0, 0, 0, 0], np.int64)
    n_ghosts = 3 * max(int(capacity_blocks), 1) + 2  # |B1| + |B2| <= 2c, + pending <= c
    # i64: prev, nxt, t1, t2, ints, ghost pool (5..11), b1, b2, pend; i8: where, glist;
    # f64: p
    return policy_state(i64=(prev, nxt, dll_ends(), dll_ends(), ints) + ghost_new(n_ghosts)
                        + (dll_ends(), dll_ends(), dll_ends()),
                        f64=(np.zeros(1, np.float64),),
                        i8=(where, np.zeros(n_ghosts, np.int8)))


@njit(cache=True)
def _ghosts(state):
    return state.i64[5], state.i64[6], state.i64[7], state.i64[8], state.i64[9], state.i64[10], state.i64[11]


@njit(cache=True)
def _ghost_hit(state, h):
    """If content ``h`` is in B1/B2: adapt p, flag the hit, park the ghost as pending."""
    ints, p, glist, b1, b2, pend = state.i64[4], state.f64[0], state.i8[1], state.i64[12], state.i64[13], state.i64[14]
    g = _ghosts(state)
    node = ghost_find(g, h)
    if node == NIL or glist[node] == PEND:
        return
    c = ints[0]
    gprev, gnext = g[3], g[4]
    if glist[node] == B1:
        delta = max(b2[2] / b1[2], 1.0)
        p[0] = min(p[0] + delta, float(c))
        dll_remove(gprev, gnext, b1, node)
        ints[1] = 1
    else:
        delta = max(b1[2] / b2[2], 1.0)
        p[0] = max(p[0] - delta, 0.0)
        dll_remove(gprev, gnext, b2, node)
        ints[2] = 1
    dll_push_tail(gprev, gnext, pend, node)
    glist[node] = PEND


@njit(cache=True)
def on_miss(state, view, h, now_us):
    ints = state.i64[4]
    ints[1] = 0
    ints[2] = 0
    _ghost_hit(state, h)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    prev, nxt, t1, t2, where, ints = state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i8[0], state.i64[4]
    h = view.content_hash[b]
    _ghost_hit(state, h)  # no-op when on_miss already took the ghost
    g = _ghosts(state)
    node = ghost_find(g, h)
    if node != NIL:  # pending ghost hit: enters T2
        ghost_remove(g, state.i64[14], node)
        state.i8[1][node] = 0
        dll_push_tail(prev, nxt, t2, b)
        where[b] = T2
        ints[8] += 1
    else:
        dll_push_tail(prev, nxt, t1, b)
        where[b] = T1
        ints[7] += 1
    ints[1] = 0
    ints[2] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    prev, nxt, t1, t2, where, ints = state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i8[0], state.i64[4]
    cand = dll_contains(prev, b)
    if where[b] == T1:
        if cand:
            dll_remove(prev, nxt, t1, b)
            dll_push_tail(prev, nxt, t2, b)
        where[b] = T2
        ints[7] -= 1
        ints[8] += 1
    elif cand:
        dll_move_to_tail(prev, nxt, t2, b)


@njit_hook
def on_hold(state, view, b):
    dll_remove(state.i64[0], state.i64[1], state.i64[2] if state.i8[0][b] == T1 else state.i64[3], b)


@njit_hook
def on_release(state, view, b, now_us):
    dll_push_tail(state.i64[0], state.i64[1], state.i64[2] if state.i8[0][b] == T1 else state.i64[3], b)


@njit(cache=True, inline="always")
def _replace_from_t1(ints, p):
    n1 = float(ints[7])
    return (ints[7] > 0 and (n1 > p[0] or (n1 == p[0] and ints[2] == 1))) or ints[8] == 0


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    nxt, t1, t2, ints, p = state.i64[1], state.i64[2], state.i64[3], state.i64[4], state.f64[0]
    b1, b2 = state.i64[12], state.i64[13]
    if t1[2] + t2[2] == 0:
        return -1, 0, 0
    c = ints[0]
    n1 = ints[7]
    n2 = ints[8]
    ints[5] = 0
    ints[6] = 0
    if ints[1] == 1 or ints[2] == 1:
        from_t1 = _replace_from_t1(ints, p)
        ghost = B1 if from_t1 else B2
    elif n1 + b1[2] + 1 > c:
        if b1[2] > 0:
            ints[5] = 1
            from_t1 = _replace_from_t1(ints, p)
            ghost = B1 if from_t1 else B2
        else:
            from_t1 = True
            ghost = 0
    else:
        if n1 + b1[2] + n2 + b2[2] >= 2 * c and b2[2] > 0:
            ints[6] = 1
        from_t1 = _replace_from_t1(ints, p)
        ghost = B1 if from_t1 else B2
    if from_t1 and t1[2] == 0:  # T1's blocks are all held
        from_t1 = False
        ghost = B2 if ghost != 0 else 0
    elif not from_t1 and t2[2] == 0:
        from_t1 = True
        ghost = B1 if ghost != 0 else 0
    b = t1[0] if from_t1 else t2[0]
    ints[3] = b
    ints[4] = ghost
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
    prev, nxt, t1, t2, where, ints = state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i8[0], state.i64[4]
    glist, b1, b2 = state.i8[1], state.i64[12], state.i64[13]
    if where[b] == T1:
        dll_remove(prev, nxt, t1, b)
        ints[7] -= 1
    else:
        dll_remove(prev, nxt, t2, b)
        ints[8] -= 1
    where[b] = 0
    if ints[3] != b:  # invalidated: no ghost
        return
    ints[3] = NIL
    g = _ghosts(state)
    if ints[5] == 1:
        glist[b1[0]] = 0
        ghost_pop_head(g, b1)
    if ints[6] == 1:
        glist[b2[0]] = 0
        ghost_pop_head(g, b2)
    h = view.content_hash[b]
    if h == 0 or ints[4] == 0 or ghost_find(g, h) != NIL:
        return
    lst = b1 if ints[4] == B1 else b2
    if ghost_push_tail(g, lst, h):  # never full within ARC's bounds
        glist[lst[1]] = ints[4]
