"""Dedicated single-tier loops for the built-in policies with ghost lists, s3fifo and arc
(the rest, and the key-domain conventions these share, are in :mod:`kvsim.cachesim.fast_loops`).

A ghost entry keeps its block's slot (``table[key]`` points to it, ``where[slot]`` names the
list); a ghost hit re-enters the cache in the same slot; freed slots are chained through
``nxt`` (``free``).  The slot arrays are sized to the bound of resident + ghost entries
(each loop states why; the arrays are never reallocated: a reassigned array inside the loop
cost arc 40 % more time).  Each list's head, tail and size are local scalars (registers),
not rows of a small array (``E[q] = [head, tail, size]``, as lfu's buckets in
:mod:`kvsim.cachesim.fast_loops` are), whose stores each next list operation reloads: best
of 4 interleaved runs, 10 M Zipf(1.0) accesses, 1,000 blocks, load 5.7 on 2 cores: arc
0.67 -> 0.60 CPU-s, s3fifo 0.55 -> 0.41.  Both prefetch the table entry ``AHEAD``
accesses ahead, as the loops of :mod:`kvsim.cachesim.fast_loops` do (why: its docstring).
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

from kvsim.cachesim.fast_loops import NIL
from kvsim.jit.disk_cache import SINGLE_TIER, seal
from kvsim.jit.prefetch import prefetch


@njit(cache=True, inline="always")
def _s_unlink(prev, nxt, head, tail, b):
    """Unlink slot ``b`` from the list ``(head, tail)``; returns the new ``(head, tail)``."""
    p = prev[b]
    n = nxt[b]
    if p == NIL:
        head = n
    else:
        nxt[p] = n
    if n == NIL:
        tail = p
    else:
        prev[n] = p
    return head, tail


@njit(cache=True, inline="always")
def _s_push_tail(prev, nxt, head, tail, b):
    """Append slot ``b`` to the list ``(head, tail)``; returns the new ``(head, tail)``."""
    prev[b] = tail
    nxt[b] = NIL
    if tail == NIL:
        head = b
    else:
        nxt[tail] = b
    return head, b


@njit(cache=True)
def replay_s3fifo(keys, lo, table, capacity, small_cap, ghost_cap, move_to_main,
                  victims_out, uniq_out, ahead):
    """S3-FIFO (policies/s3fifo.py, libCacheSim S3FIFO): SMALL, MAIN and GHOST FIFOs of
    slots, their heads, tails and sizes in local scalars (as :func:`replay_arc`).  A ghost
    entry keeps its slot (``table`` points to it); a ghost hit re-enters MAIN in the same
    slot; freed slots are chained through ``nxt`` (``free``)."""
    SMALL, MAIN, GHOST = 1, 2, 3
    main_cap = capacity - small_cap
    # slots: resident <= capacity, ghosts <= ghost_cap, and a victim's slot is freed before
    # the new block takes one
    m = max(min(capacity + max(ghost_cap, 0) + 1, keys.shape[0] + 1), 4)
    kd = np.empty((m, 2), table.dtype)  # a slot's key offset and dense id side by side
    kof = kd[:, 0]
    did = kd[:, 1]
    link = np.empty((m, 2), np.int32)  # a slot's two list links side by side
    prev = link[:, 0]
    nxt = link[:, 1]
    where = np.zeros(m, np.int8)
    freq = np.zeros(m, np.int64)
    hs = ts = hm = tm = hg = tg = NIL
    n_s = n_m = n_g = 0
    record = victims_out.shape[0] > 0
    free = NIL
    ns = 0
    nu = 0
    hits = 0
    misses = 0
    ev = 0
    has_evicted = False
    nk = keys.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, keys[t + ahead] - lo)
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
            hg, tg = _s_unlink(prev, nxt, hg, tg, b)
            n_g -= 1
            where[b] = 0
        elif s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if n_s + n_m >= capacity:
            has_evicted = True
            v = NIL
            from_small = False
            if not (n_m > main_cap or n_s == 0):
                while n_s > 0:  # SMALL's head: to MAIN if reused enough, else the victim
                    h = hs
                    hs, ts = _s_unlink(prev, nxt, hs, ts, h)
                    n_s -= 1
                    if freq[h] >= move_to_main:
                        hm, tm = _s_push_tail(prev, nxt, hm, tm, h)
                        n_m += 1
                        where[h] = MAIN
                        freq[h] = 0
                    else:
                        v = h
                        from_small = True
                        break
            if v == NIL:
                while True:  # MAIN's head: reinserted while its frequency lasts
                    h = hm
                    hm, tm = _s_unlink(prev, nxt, hm, tm, h)
                    if freq[h] >= 1:
                        hm, tm = _s_push_tail(prev, nxt, hm, tm, h)
                        freq[h] = min(freq[h], 3) - 1
                    else:
                        n_m -= 1
                        v = h
                        break
            where[v] = 0
            freq[v] = 0
            if record:
                victims_out[ev] = did[v]
            ev += 1
            if from_small and ghost_cap > 0:
                while n_g >= ghost_cap:
                    g = hg
                    hg, tg = _s_unlink(prev, nxt, hg, tg, g)
                    n_g -= 1
                    where[g] = 0
                    table[kof[g]] = -2 - did[g]
                    nxt[g] = free
                    free = g
                hg, tg = _s_push_tail(prev, nxt, hg, tg, v)
                n_g += 1
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
        if ghost_hit or (not has_evicted and n_s >= small_cap):
            hm, tm = _s_push_tail(prev, nxt, hm, tm, b)
            n_m += 1
            where[b] = MAIN
        else:
            hs, ts = _s_push_tail(prev, nxt, hs, ts, b)
            n_s += 1
            where[b] = SMALL
        freq[b] = 0
    return hits, misses, ev, n_s + n_m, nu


@njit(cache=True)
def replay_arc(keys, lo, table, capacity, victims_out, uniq_out, ahead):
    """ARC (policies/arc.py, libCacheSim ARC): T1, T2 and their ghosts B1, B2, all in
    slots (a ghost keeps its block's slot; a ghost hit re-enters T2 in the same slot;
    freed slots are chained through ``nxt``).  The four lists' heads, tails and sizes are
    local scalars, not rows of an array (see the module docstring)."""
    T1, T2, B1, B2 = 1, 2, 3, 4
    c = capacity
    # slots: |T1| + |T2| + |B1| + |B2| <= 2c after every access (the new block is given a
    # slot after the victim's ghost, if any, is dropped), so 2c suffice
    m = max(min(2 * c + 2, keys.shape[0] + 1), 4)
    kd = np.empty((m, 2), table.dtype)  # a slot's key offset and dense id side by side
    kof = kd[:, 0]
    did = kd[:, 1]
    link = np.empty((m, 2), np.int32)  # a slot's two list links side by side
    prev = link[:, 0]
    nxt = link[:, 1]
    where = np.zeros(m, np.int8)
    h1 = t1 = h2 = t2 = hb1 = tb1 = hb2 = tb2 = NIL
    n1 = n2 = nb1 = nb2 = 0
    record = victims_out.shape[0] > 0
    free = NIL
    ns = 0
    nu = 0
    hits = 0
    misses = 0
    ev = 0
    p = 0.0
    nk = keys.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, keys[t + ahead] - lo)
        x = keys[t]
        k = x - lo
        s = table[k]
        w = 0
        if s >= 0:
            w = where[s]
            if w == T1:
                hits += 1
                h1, t1 = _s_unlink(prev, nxt, h1, t1, s)
                n1 -= 1
                h2, t2 = _s_push_tail(prev, nxt, h2, t2, s)
                n2 += 1
                where[s] = T2
                continue
            if w == T2:
                hits += 1
                if t2 != s:
                    h2, t2 = _s_unlink(prev, nxt, h2, t2, s)
                    h2, t2 = _s_push_tail(prev, nxt, h2, t2, s)
                continue
        misses += 1
        hit_b1 = False
        hit_b2 = False
        d = 0
        b = NIL
        if w == B1:
            p = min(p + max(nb2 / nb1, 1.0), float(c))
            hb1, tb1 = _s_unlink(prev, nxt, hb1, tb1, s)
            nb1 -= 1
            where[s] = 0
            hit_b1 = True
            b = s
        elif w == B2:
            p = max(p - max(nb1 / nb2, 1.0), 0.0)
            hb2, tb2 = _s_unlink(prev, nxt, hb2, tb2, s)
            nb2 -= 1
            where[s] = 0
            hit_b2 = True
            b = s
        elif s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if n1 + n2 >= c:
            drop_b1 = False
            drop_b2 = False
            no_ghost = False
            # REPLACE (arc._replace_from_t1): T1's LRU if |T1| > 0 and (|T1| > p or
            # (|T1| == p and the miss hit B2)), or if T2 is empty
            f1 = float(n1)
            replace_t1 = (n1 > 0 and (f1 > p or (f1 == p and hit_b2))) or n2 == 0
            if hit_b1 or hit_b2:
                from_t1 = replace_t1
            elif n1 + nb1 + 1 > c:
                if nb1 > 0:
                    drop_b1 = True
                    from_t1 = replace_t1
                else:  # evict T1's LRU with no ghost
                    from_t1 = True
                    no_ghost = True
            else:
                if n1 + nb1 + n2 + nb2 >= 2 * c and nb2 > 0:
                    drop_b2 = True
                from_t1 = replace_t1
            if from_t1:  # the victim is the head (LRU end) of T1 or T2
                v = h1
                h1, t1 = _s_unlink(prev, nxt, h1, t1, v)
                n1 -= 1
            else:
                v = h2
                h2, t2 = _s_unlink(prev, nxt, h2, t2, v)
                n2 -= 1
            where[v] = 0
            if drop_b1 or drop_b2:
                if drop_b1:
                    g = hb1
                    hb1, tb1 = _s_unlink(prev, nxt, hb1, tb1, g)
                    nb1 -= 1
                else:
                    g = hb2
                    hb2, tb2 = _s_unlink(prev, nxt, hb2, tb2, g)
                    nb2 -= 1
                where[g] = 0
                table[kof[g]] = -2 - did[g]
                nxt[g] = free
                free = g
            if no_ghost:
                table[kof[v]] = -2 - did[v]
                nxt[v] = free
                free = v
            elif from_t1:
                hb1, tb1 = _s_push_tail(prev, nxt, hb1, tb1, v)
                nb1 += 1
                where[v] = B1
            else:
                hb2, tb2 = _s_push_tail(prev, nxt, hb2, tb2, v)
                nb2 += 1
                where[v] = B2
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
            h2, t2 = _s_push_tail(prev, nxt, h2, t2, b)
            n2 += 1
            where[b] = T2
        else:
            h1, t1 = _s_push_tail(prev, nxt, h1, t1, b)
            n1 += 1
            where[b] = T1
    return hits, misses, ev, n1 + n2, nu


# An edit of prefetch.py or of cachesim_fast's constants recompiles these loops too
# (kvsim.jit.disk_cache.SINGLE_TIER); their calls keep numba's own typing (plain=False).
seal(sys.modules[__name__], SINGLE_TIER, plain=False)
