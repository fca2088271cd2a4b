"""ARC (Megiddo & Modha, FAST'03), following libCacheSim ``ARC`` (cache/eviction/ARC.c).

Four lists share one set of links: T1 (seen once recently), T2 (seen at least twice),
and their ghosts B1, B2 (ids of blocks evicted from T1/T2, no data).  ``p`` is the
adaptive target size of T1 (a float, as in libCacheSim).  Head = LRU end everywhere.

- hit in T1 -> MRU of T2; hit in T2 -> MRU of T2.
- ``on_miss`` (a request for a non-candidate): ghost hit in B1 -> p += max(|B2|/|B1|, 1)
  (capped at c); in B2 -> p -= max(|B1|/|B2|, 1) (floored at 0); the ghost entry is
  dropped and the block will enter T2.  Otherwise it will enter T1.
- ``victim`` after a ghost hit = REPLACE: T1's LRU if |T1| > 0 and (|T1| > p or
  (|T1| == p and the hit was in B2)) or T2 is empty; else T2's LRU.  After a plain miss
  (case IV): if |T1| + |B1| + 1 > c: drop B1's LRU and REPLACE if B1 is non-empty, else
  evict T1's LRU with no ghost; otherwise drop B2's LRU when |T1|+|B1|+|T2|+|B2| >= 2c,
  then REPLACE.  The ghost bookkeeping happens in ``on_remove`` of the named victim.

Ghosts are keyed by block id: exact in the single-tier simulator (id = content); in a
tier whose ids are physical slots a ghost hit means "the same slot", an approximation.
"""

import numpy as np
from numba import njit

from kvsim.policy_api import (NIL, dll_ends, dll_links, dll_move_to_tail, dll_push_tail,
                              dll_remove, njit_hook)

NAME = "arc"
DESCRIPTION = "Adaptive Replacement Cache: recency vs frequency lists with ghost-tuned split."
OFFLINE = False
REASONS = ("ARC: least recently used of T1 (seen once), T1 above its adaptive target",
           "ARC: least recently used of T2 (seen twice or more), T1 within its target")

T1, T2, B1, B2 = 1, 2, 3, 4
# ints: [capacity, hit_in_b1, hit_in_b2, pending_victim, pending_ghost(0 none,3 B1,4 B2),
#        drop_b1_lru, drop_b2_lru]


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    where = np.zeros(num_slots, np.int8)
    ints = np.array([capacity_blocks, 0, 0, NIL, 0, 0, 0], np.int64)
    p = np.zeros(1, np.float64)
    return (prev, nxt, dll_ends(), dll_ends(), dll_ends(), dll_ends(), where, ints, p)


@njit(cache=True, inline="always")
def _ghost_hit(prev, nxt, b1, b2, where, ints, p, b):
    c = ints[0]
    if where[b] == B1:
        delta = max(b2[2] / b1[2], 1.0)
        p[0] = min(p[0] + delta, float(c))
        dll_remove(prev, nxt, b1, b)
        where[b] = 0
        ints[1] = 1
    elif where[b] == B2:
        delta = max(b1[2] / b2[2], 1.0)
        p[0] = max(p[0] - delta, 0.0)
        dll_remove(prev, nxt, b2, b)
        where[b] = 0
        ints[2] = 1


@njit_hook
def on_miss(state, view, b, now_us):
    ints = state[7]
    ints[1] = 0
    ints[2] = 0
    where = state[6]
    if where[b] >= B1:
        _ghost_hit(state[0], state[1], state[4], state[5], where, ints, state[8], b)


@njit_hook
def on_insert(state, view, b, now_us):
    prev, nxt, t1, t2, where, ints = state[0], state[1], state[2], state[3], state[6], state[7]
    if where[b] >= B1:  # the core did not call on_miss: detect the ghost hit now
        _ghost_hit(prev, nxt, state[4], state[5], where, ints, state[8], b)
    if ints[1] == 1 or ints[2] == 1:
        dll_push_tail(prev, nxt, t2, b)
        where[b] = T2
    else:
        dll_push_tail(prev, nxt, t1, b)
        where[b] = T1
    ints[1] = 0
    ints[2] = 0


@njit_hook
def on_hit(state, view, b, now_us):
    prev, nxt, t1, t2, where = state[0], state[1], state[2], state[3], state[6]
    if where[b] == T1:
        dll_remove(prev, nxt, t1, b)
        dll_push_tail(prev, nxt, t2, b)
        where[b] = T2
    else:
        dll_move_to_tail(prev, nxt, t2, b)


@njit(cache=True, inline="always")
def _replace_from_t1(t1, t2, ints, p):
    n1 = float(t1[2])
    return (t1[2] > 0 and (n1 > p[0] or (n1 == p[0] and ints[2] == 1))) or t2[2] == 0


@njit_hook
def victim(state, view, now_us, alt_blocks, alt_scores):
    nxt, t1, t2, b1, b2, ints, p = state[1], state[2], state[3], state[4], state[5], state[7], state[8]
    if t1[2] + t2[2] == 0:
        return -1, 0, 0
    c = ints[0]
    ints[5] = 0
    ints[6] = 0
    if ints[1] == 1 or ints[2] == 1:
        from_t1 = _replace_from_t1(t1, t2, ints, p)
        ghost = B1 if from_t1 else B2
    elif t1[2] + b1[2] + 1 > c:
        if b1[2] > 0:
            ints[5] = 1
            from_t1 = _replace_from_t1(t1, t2, ints, p)
            ghost = B1 if from_t1 else B2
        else:
            from_t1 = True
            ghost = 0
    else:
        if t1[2] + b1[2] + t2[2] + b2[2] >= 2 * c and b2[2] > 0:
            ints[6] = 1
        from_t1 = _replace_from_t1(t1, t2, ints, p)
        ghost = B1 if from_t1 else B2
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


@njit_hook
def on_remove(state, view, b):
    prev, nxt, t1, t2, b1, b2, where, ints, p = state
    if where[b] == T1:
        dll_remove(prev, nxt, t1, b)
    else:
        dll_remove(prev, nxt, t2, b)
    where[b] = 0
    if ints[3] != b:  # held again or invalidated: no ghost
        return
    ints[3] = NIL
    if ints[5] == 1:
        g = b1[0]
        dll_remove(prev, nxt, b1, g)
        where[g] = 0
    if ints[6] == 1:
        g = b2[0]
        dll_remove(prev, nxt, b2, g)
        where[g] = 0
    if ints[4] == B1:
        dll_push_tail(prev, nxt, b1, b)
        where[b] = B1
    elif ints[4] == B2:
        dll_push_tail(prev, nxt, b2, b)
        where[b] = B2
