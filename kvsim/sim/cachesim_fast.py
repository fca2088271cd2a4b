"""Dedicated single-tier loops for the simple built-in policies (lru, fifo, lfu, sieve,
s3fifo, arc), used by :func:`kvsim.sim.cachesim.simulate_cache` in place of the generic
hook loop.

Each is the policy's hooks (``policies/<name>.py``) written inline in one loop: the same
lists in the same order with the same tie rules, so it evicts the SAME blocks in the same
order (tests/sim/test_cachesim_fast.py compares the victim sequences with the hook path on
several streams and capacities; the hook path itself matches libCacheSim's miss counts,
tests/policies/test_vs_libcachesim.py).  What they save: the hook calls, the per-access
``BlockView`` writes (three random stores per access into arrays of one entry per key), the
state tuple, and for lfu the heap (here O(1) frequency buckets: LFU with LRU among equal
frequencies is "smallest (frequency, last touch)", and a block entering bucket ``f`` always
has the newest touch, so each bucket is a FIFO in touch order and the victim is the head of
the lowest non-empty bucket).

Every loop returns ``(hits, misses, evictions, resident_at_end)`` and writes the evicted
dense ids into ``victims_out`` when it is not empty.  Lists are doubly linked through
``prev``/``nxt`` arrays of one entry per dense id, head = oldest (next to evict), ``-1`` =
none; ``E[q] = [head, tail, size]`` of list ``q``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NIL = -1


@njit(cache=True, inline="always")
def _push_tail(prev, nxt, E, q, b):
    t = E[q, 1]
    prev[b] = t
    nxt[b] = NIL
    if t == NIL:
        E[q, 0] = b
    else:
        nxt[t] = b
    E[q, 1] = b
    E[q, 2] += 1


@njit(cache=True, inline="always")
def _push_head(prev, nxt, E, q, b):
    h = E[q, 0]
    nxt[b] = h
    prev[b] = NIL
    if h == NIL:
        E[q, 1] = b
    else:
        prev[h] = b
    E[q, 0] = b
    E[q, 2] += 1


@njit(cache=True, inline="always")
def _unlink(prev, nxt, E, q, b):
    p = prev[b]
    n = nxt[b]
    if p == NIL:
        E[q, 0] = n
    else:
        nxt[p] = n
    if n == NIL:
        E[q, 1] = p
    else:
        prev[n] = p
    E[q, 2] -= 1


@njit(cache=True)
def replay_lru(ids, capacity, n_ids, victims_out):
    """LRU (policies/lru.py): a hit moves the block to the tail, the head is evicted.
    The list links live in ``capacity`` slots (``slot_of[id]``, -1 = not resident), so a
    small cache's list stays in the CPU cache: one random access per access (``slot_of``)."""
    slot_of = np.full(n_ids, -1, np.int32)
    key = np.empty(capacity, np.int64)
    prev = np.empty(capacity, np.int32)
    nxt = np.empty(capacity, np.int32)
    record = victims_out.shape[0] > 0
    head = -1
    tail = -1
    n = 0
    hits = 0
    misses = 0
    ev = 0
    for t in range(ids.shape[0]):
        b = ids[t]
        s = slot_of[b]
        if s >= 0:
            hits += 1
            if s != tail:  # unlink s (it has a newer neighbour), append it
                p = prev[s]
                q = nxt[s]
                if p < 0:
                    head = q
                else:
                    nxt[p] = q
                prev[q] = p
                prev[s] = tail
                nxt[s] = -1
                nxt[tail] = s
                tail = s
            continue
        misses += 1
        if n >= capacity:  # evict the head; its slot takes the new block
            s = head
            v = key[s]
            head = nxt[s]
            if head < 0:
                tail = -1
            else:
                prev[head] = -1
            slot_of[v] = -1
            if record:
                victims_out[ev] = v
            ev += 1
        else:
            s = n
            n += 1
        key[s] = b
        slot_of[b] = s
        prev[s] = tail
        nxt[s] = -1
        if tail < 0:
            head = s
        else:
            nxt[tail] = s
        tail = s
    return hits, misses, ev, n


@njit(cache=True)
def replay_fifo(ids, capacity, n_ids, victims_out):
    """FIFO (policies/fifo.py): evict in insertion order; a ring of ``capacity`` slots."""
    ring = np.empty(capacity, np.int64)
    res = np.zeros(n_ids, np.bool_)
    record = victims_out.shape[0] > 0
    hits = 0
    misses = 0
    ev = 0
    n = 0
    w = 0  # next slot to write = the oldest entry once the ring is full
    for t in range(ids.shape[0]):
        b = ids[t]
        if res[b]:
            hits += 1
            continue
        misses += 1
        if n >= capacity:
            v = ring[w]
            res[v] = False
            if record:
                victims_out[ev] = v
            ev += 1
        else:
            n += 1
        ring[w] = b
        w += 1
        if w == capacity:
            w = 0
        res[b] = True
    return hits, misses, ev, n


@njit(cache=True)
def replay_lfu(ids, capacity, n_ids, victims_out):
    """LFU, LRU among ties (policies/lfu.py: smallest (frequency, last touch)), with O(1)
    frequency buckets: ``B[f]`` = [head, tail, size] of the blocks of frequency ``f``."""
    prev = np.empty(n_ids, np.int64)
    nxt = np.empty(n_ids, np.int64)
    freq = np.zeros(n_ids, np.int64)  # 0 = not resident
    B = np.full((64, 3), NIL, np.int64)
    B[:, 2] = 0
    record = victims_out.shape[0] > 0
    hits = 0
    misses = 0
    ev = 0
    n = 0
    minf = 1
    for t in range(ids.shape[0]):
        b = ids[t]
        f = freq[b]
        if f > 0:
            hits += 1
            _unlink(prev, nxt, B, f, b)
            if B[f, 2] == 0 and minf == f:
                minf = f + 1
            if f + 1 >= B.shape[0]:
                grown = np.full((2 * B.shape[0], 3), NIL, np.int64)
                grown[:, 2] = 0
                grown[: B.shape[0]] = B
                B = grown
            _push_tail(prev, nxt, B, f + 1, b)
            freq[b] = f + 1
            continue
        misses += 1
        if n >= capacity:
            v = B[minf, 0]
            _unlink(prev, nxt, B, minf, v)
            freq[v] = 0
            n -= 1
            if record:
                victims_out[ev] = v
            ev += 1
        _push_tail(prev, nxt, B, 1, b)
        freq[b] = 1
        minf = 1
        n += 1
    return hits, misses, ev, n


@njit(cache=True)
def replay_sieve(ids, capacity, n_ids, victims_out):
    """SIEVE (policies/sieve.py): the hand walks from old to new, clearing visited bits.
    Slots as in :func:`replay_lru`: the evicted block's slot is unlinked and re-appended
    at the tail for the new block."""
    slot_of = np.full(n_ids, -1, np.int32)
    key = np.empty(capacity, np.int64)
    prev = np.empty(capacity, np.int32)
    nxt = np.empty(capacity, np.int32)
    visited = np.zeros(capacity, np.bool_)
    record = victims_out.shape[0] > 0
    head = -1
    tail = -1
    hand = -1
    n = 0
    hits = 0
    misses = 0
    ev = 0
    for t in range(ids.shape[0]):
        b = ids[t]
        s = slot_of[b]
        if s >= 0:
            hits += 1
            visited[s] = True
            continue
        misses += 1
        if n >= capacity:
            s = hand if hand >= 0 else head
            while visited[s]:
                visited[s] = False
                s = nxt[s]
                if s < 0:
                    s = head
            hand = nxt[s]  # on_remove: the hand rests on the newer neighbour
            p = prev[s]
            q = nxt[s]
            if p < 0:
                head = q
            else:
                nxt[p] = q
            if q < 0:
                tail = p
            else:
                prev[q] = p
            v = key[s]
            slot_of[v] = -1
            if record:
                victims_out[ev] = v
            ev += 1
        else:
            s = n
            n += 1
        key[s] = b
        slot_of[b] = s
        visited[s] = False
        prev[s] = tail
        nxt[s] = -1
        if tail < 0:
            head = s
        else:
            nxt[tail] = s
        tail = s
    return hits, misses, ev, n


@njit(cache=True)
def replay_s3fifo(ids, capacity, n_ids, small_cap, ghost_cap, move_to_main, victims_out):
    """S3-FIFO (policies/s3fifo.py, libCacheSim S3FIFO): SMALL, MAIN and GHOST FIFOs."""
    SMALL, MAIN, GHOST = 1, 2, 3
    main_cap = capacity - small_cap
    prev = np.empty(n_ids, np.int64)
    nxt = np.empty(n_ids, np.int64)
    where = np.zeros(n_ids, np.int8)
    freq = np.zeros(n_ids, np.int64)
    E = np.full((4, 3), NIL, np.int64)  # rows SMALL, MAIN, GHOST
    E[:, 2] = 0
    record = victims_out.shape[0] > 0
    hits = 0
    misses = 0
    ev = 0
    has_evicted = False
    for t in range(ids.shape[0]):
        b = ids[t]
        w = where[b]
        if w == SMALL or w == MAIN:
            hits += 1
            freq[b] += 1
            continue
        misses += 1
        ghost_hit = w == GHOST
        if ghost_hit:
            _unlink(prev, nxt, E, GHOST, b)
            where[b] = 0
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
            if q == SMALL and ghost_cap > 0:
                while E[GHOST, 2] >= ghost_cap:
                    g = E[GHOST, 0]
                    _unlink(prev, nxt, E, GHOST, g)
                    where[g] = 0
                _push_tail(prev, nxt, E, GHOST, v)
                where[v] = GHOST
            if record:
                victims_out[ev] = v
            ev += 1
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
    return hits, misses, ev, E[SMALL, 2] + E[MAIN, 2]


@njit(cache=True)
def replay_arc(ids, capacity, n_ids, victims_out):
    """ARC (policies/arc.py, libCacheSim ARC): T1, T2 and their ghosts B1, B2."""
    T1, T2, B1, B2 = 1, 2, 3, 4
    c = capacity
    prev = np.empty(n_ids, np.int64)
    nxt = np.empty(n_ids, np.int64)
    where = np.zeros(n_ids, np.int8)
    E = np.full((5, 3), NIL, np.int64)
    E[:, 2] = 0
    record = victims_out.shape[0] > 0
    hits = 0
    misses = 0
    ev = 0
    p = 0.0
    for t in range(ids.shape[0]):
        b = ids[t]
        w = where[b]
        if w == T1:
            hits += 1
            _unlink(prev, nxt, E, T1, b)
            _push_tail(prev, nxt, E, T2, b)
            where[b] = T2
            continue
        if w == T2:
            hits += 1
            if E[T2, 1] != b:
                _unlink(prev, nxt, E, T2, b)
                _push_tail(prev, nxt, E, T2, b)
            continue
        misses += 1
        hit_b1 = False
        hit_b2 = False
        if w == B1:
            p = min(p + max(E[B2, 2] / E[B1, 2], 1.0), float(c))
            _unlink(prev, nxt, E, B1, b)
            where[b] = 0
            hit_b1 = True
        elif w == B2:
            p = max(p - max(E[B1, 2] / E[B2, 2], 1.0), 0.0)
            _unlink(prev, nxt, E, B2, b)
            where[b] = 0
            hit_b2 = True
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
            if drop_b1:
                g = E[B1, 0]
                _unlink(prev, nxt, E, B1, g)
                where[g] = 0
            if drop_b2:
                g = E[B2, 0]
                _unlink(prev, nxt, E, B2, g)
                where[g] = 0
            if ghost != 0:
                _push_tail(prev, nxt, E, ghost, v)
                where[v] = ghost
            if record:
                victims_out[ev] = v
            ev += 1
        if hit_b1 or hit_b2:
            _push_tail(prev, nxt, E, T2, b)
            where[b] = T2
        else:
            _push_tail(prev, nxt, E, T1, b)
            where[b] = T1
    return hits, misses, ev, E[T1, 2] + E[T2, 2]
