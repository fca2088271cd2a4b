"""Dedicated single-tier loops for the built-in policies with ghost lists, s3fifo and arc
(the rest, and the key-domain conventions these share, are in :mod:`kvsim.sim.cachesim_fast`).

A ghost entry keeps its block's slot (``table[key]`` points to it, ``where[slot]`` names the
list); a ghost hit re-enters the cache in the same slot; freed slots are chained through
``nxt`` (``free``).  The slot arrays are sized to the bound of resident + ghost entries
(each loop states why; the arrays are never reallocated: a reassigned array inside the loop
cost arc 40 % more time).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.sim.cachesim_fast import NIL, _push_head, _push_tail, _unlink


@njit(cache=True)
def replay_s3fifo(keys, lo, table, capacity, small_cap, ghost_cap, move_to_main,
                  victims_out, uniq_out):
    """S3-FIFO (policies/s3fifo.py, libCacheSim S3FIFO): SMALL, MAIN and GHOST FIFOs of
    slots.  A ghost entry keeps its slot (``table`` points to it); a ghost hit re-enters
    MAIN in the same slot; freed slots are chained through ``nxt`` (``free``)."""
    SMALL, MAIN, GHOST = 1, 2, 3
    main_cap = capacity - small_cap
    # slots: resident <= capacity, ghosts <= ghost_cap, and a victim's slot is freed before
    # the new block takes one
    m = max(min(capacity + max(ghost_cap, 0) + 1, keys.shape[0] + 1), 4)
    kof = np.empty(m, np.int64)
    did = np.empty(m, np.int64)
    prev = np.empty(m, np.int32)
    nxt = np.empty(m, np.int32)
    where = np.zeros(m, np.int8)
    freq = np.zeros(m, np.int64)
    E = np.full((4, 3), NIL, np.int64)  # rows SMALL, MAIN, GHOST
    E[:, 2] = 0
    record = victims_out.shape[0] > 0
    free = NIL
    ns = 0
    nu = 0
    hits = 0
    misses = 0
    ev = 0
    has_evicted = False
    for t in range(keys.shape[0]):
        x = keys[t]
        k = x - lo
        s = table[k]
        if s >= 0 and where[s] != GHOST:
            hits += 1
            freq[s] += 1
            continue
        misses += 1
        ghost_hit = s >= 0
        d = 0
        b = NIL
        if ghost_hit:
            b = s
            _unlink(prev, nxt, E, GHOST, b)
            where[b] = 0
        elif s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if E[SMALL, 2] + E[MAIN, 2] >= capacity:
            has_evicted = True
            v = NIL
            q = MAIN
            if not (E[MAIN, 2] > main_cap or E[SMALL, 2] == 0):
                while E[SMALL, 2] > 0:
                    h = E[SMALL, 0]
                    _unlink(prev, nxt, E, SMALL, h)
                    if freq[h] >= move_to_main:
                        _push_tail(prev, nxt, E, MAIN, h)
                        where[h] = MAIN
                        freq[h] = 0
                    else:
                        _push_head(prev, nxt, E, SMALL, h)
                        v = h
                        q = SMALL
                        break
            if v == NIL:
                while True:
                    h = E[MAIN, 0]
                    if freq[h] >= 1:
                        _unlink(prev, nxt, E, MAIN, h)
                        _push_tail(prev, nxt, E, MAIN, h)
                        freq[h] = min(freq[h], 3) - 1
                    else:
                        v = h
                        break
            _unlink(prev, nxt, E, where[v], v)
            where[v] = 0
            freq[v] = 0
            if record:
                victims_out[ev] = did[v]
            ev += 1
            if q == SMALL and ghost_cap > 0:
                while E[GHOST, 2] >= ghost_cap:
                    g = E[GHOST, 0]
                    _unlink(prev, nxt, E, GHOST, g)
                    where[g] = 0
                    table[kof[g]] = -2 - did[g]
                    nxt[g] = free
                    free = g
                _push_tail(prev, nxt, E, GHOST, v)
                where[v] = GHOST
            else:
                table[kof[v]] = -2 - did[v]
                nxt[v] = free
                free = v
        if b == NIL:  # a slot for the new block
            if free != NIL:
                b = free
                free = nxt[b]
            else:
                if ns == kof.shape[0]:
                    raise ValueError("s3fifo: more slots than capacity + ghost_cap + 1")
                b = ns
                ns += 1
            kof[b] = k
            did[b] = d
            table[k] = b
        if ghost_hit:
            _push_tail(prev, nxt, E, MAIN, b)
            where[b] = MAIN
        elif not has_evicted and E[SMALL, 2] >= small_cap:
            _push_tail(prev, nxt, E, MAIN, b)
            where[b] = MAIN
        else:
            _push_tail(prev, nxt, E, SMALL, b)
            where[b] = SMALL
        freq[b] = 0
    return hits, misses, ev, E[SMALL, 2] + E[MAIN, 2], nu


@njit(cache=True)
def replay_arc(keys, lo, table, capacity, victims_out, uniq_out):
    """ARC (policies/arc.py, libCacheSim ARC): T1, T2 and their ghosts B1, B2, all in
    slots (a ghost keeps its block's slot; a ghost hit re-enters T2 in the same slot;
    freed slots are chained through ``nxt``)."""
    T1, T2, B1, B2 = 1, 2, 3, 4
    c = capacity
    # slots: |T1| + |T2| + |B1| + |B2| <= 2c after every access (the new block is given a
    # slot after the victim's ghost, if any, is dropped), so 2c suffice
    m = max(min(2 * c + 2, keys.shape[0] + 1), 4)
    kof = np.empty(m, np.int64)
    did = np.empty(m, np.int64)
    prev = np.empty(m, np.int32)
    nxt = np.empty(m, np.int32)
    where = np.zeros(m, np.int8)
    E = np.full((5, 3), NIL, np.int64)
    E[:, 2] = 0
    record = victims_out.shape[0] > 0
    free = NIL
    ns = 0
    nu = 0
    hits = 0
    misses = 0
    ev = 0
    p = 0.0
    for t in range(keys.shape[0]):
        x = keys[t]
        k = x - lo
        s = table[k]
        w = 0
        if s >= 0:
            w = where[s]
            if w == T1:
                hits += 1
                _unlink(prev, nxt, E, T1, s)
                _push_tail(prev, nxt, E, T2, s)
                where[s] = T2
                continue
            if w == T2:
                hits += 1
                if E[T2, 1] != s:
                    _unlink(prev, nxt, E, T2, s)
                    _push_tail(prev, nxt, E, T2, s)
                continue
        misses += 1
        hit_b1 = False
        hit_b2 = False
        d = 0
        b = NIL
        if w == B1:
            p = min(p + max(E[B2, 2] / E[B1, 2], 1.0), float(c))
            _unlink(prev, nxt, E, B1, s)
            where[s] = 0
            hit_b1 = True
            b = s
        elif w == B2:
            p = max(p - max(E[B1, 2] / E[B2, 2], 1.0), 0.0)
            _unlink(prev, nxt, E, B2, s)
            where[s] = 0
            hit_b2 = True
            b = s
        elif s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if E[T1, 2] + E[T2, 2] >= c:
            drop_b1 = False
            drop_b2 = False
            no_ghost = False
            # REPLACE (arc._replace_from_t1): T1's LRU if |T1| > 0 and (|T1| > p or
            # (|T1| == p and the miss hit B2)), or if T2 is empty
            n1 = float(E[T1, 2])
            replace_t1 = (E[T1, 2] > 0 and (n1 > p or (n1 == p and hit_b2))) or E[T2, 2] == 0
            if hit_b1 or hit_b2:
                from_t1 = replace_t1
            elif E[T1, 2] + E[B1, 2] + 1 > c:
                if E[B1, 2] > 0:
                    drop_b1 = True
                    from_t1 = replace_t1
                else:  # evict T1's LRU with no ghost
                    from_t1 = True
                    no_ghost = True
            else:
                if E[T1, 2] + E[B1, 2] + E[T2, 2] + E[B2, 2] >= 2 * c and E[B2, 2] > 0:
                    drop_b2 = True
                from_t1 = replace_t1
            ghost = 0 if no_ghost else (B1 if from_t1 else B2)
            v = E[T1, 0] if from_t1 else E[T2, 0]
            _unlink(prev, nxt, E, where[v], v)
            where[v] = 0
            if drop_b1 or drop_b2:
                g = E[B1, 0] if drop_b1 else E[B2, 0]
                _unlink(prev, nxt, E, B1 if drop_b1 else B2, g)
                where[g] = 0
                table[kof[g]] = -2 - did[g]
                nxt[g] = free
                free = g
            if ghost != 0:
                _push_tail(prev, nxt, E, ghost, v)
                where[v] = ghost
            else:
                table[kof[v]] = -2 - did[v]
                nxt[v] = free
                free = v
            if record:
                victims_out[ev] = did[v]
            ev += 1
        if b == NIL:  # a slot for the new block
            if free != NIL:
                b = free
                free = nxt[b]
            else:
                if ns == kof.shape[0]:
                    raise ValueError("arc: more slots than 2 * capacity")
                b = ns
                ns += 1
            kof[b] = k
            did[b] = d
            table[k] = b
        if hit_b1 or hit_b2:
            _push_tail(prev, nxt, E, T2, b)
            where[b] = T2
        else:
            _push_tail(prev, nxt, E, T1, b)
            where[b] = T1
    return hits, misses, ev, E[T1, 2] + E[T2, 2], nu
