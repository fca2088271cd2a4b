"""Dedicated single-tier loops for the built-in policies (lru, fifo, lfu, sieve, s3fifo,
arc, belady), used by :func:`kvsim.cachesim.simulator.simulate_cache` in place of the generic
hook loop.

Each is the policy's hooks (``policies/<name>.py``) written inline in one loop: the same
lists in the same order with the same tie rules, so it evicts the SAME blocks in the same
order (tests/sim/test_cachesim_fast.py and test_cachesim_belady_fast.py compare the victim
sequences with the hook path on several streams and capacities; the hook path itself
matches libCacheSim's miss counts, tests/policies/test_vs_libcachesim.py).  What they save:
the hook calls, the per-access ``BlockView`` writes, the state tuple, and for lfu the heap
(here O(1) frequency buckets: LFU with LRU among equal frequencies is "smallest
(frequency, last touch)", and a block entering bucket ``f`` always has the newest touch,
so each bucket is a FIFO in touch order and the victim is the head of the lowest
non-empty bucket).

**Key domain, fused remap.**  The loops read the keys themselves, not dense ids made by a
separate remap pass: ``table[key - lo]`` (one entry per possible key, filled with -1 by
the caller) is the key's state, so the remap and the lookup are one random access:

* ``>= 0``: the key has a SLOT (resident, or in a ghost list for arc and s3fifo);
* ``-1``: never seen; the loop gives it the next dense id (order of first appearance, as
  :func:`kvsim.cachesim.simulator.remap_keys` does) and writes the key to ``uniq_out``;
* ``-2 - d``: seen before, dense id ``d``, no slot.

Everything else lives in slots: ``capacity`` of them for lru, fifo, sieve, lfu and belady
(plus the ghosts for arc and s3fifo), so a small cache's lists stay in the CPU cache,
whatever the key universe (the per-key arrays of the previous loops did not: see
docs/benchmarks.md).  A slot holds its key's offset ``kof`` (to reset ``table`` when the
slot is freed) and dense id ``did`` (what ``victims_out`` records), both in the table's
dtype (int32 unless the key span reaches 2^30: half the bytes of int64 in the CPU cache),
side by side in one ``(m, 2)`` array, as are a slot's two list links ``prev``/``nxt``: one
cache line per slot touched instead of two (arc on 10 M Zipf(1.0) accesses, best of 3
interleaved runs at load ~5 on 2 cores: 0.65 -> 0.37 CPU-s at 1,000 blocks, 0.97 -> 0.40
at 100,000).  Keys wider than a
direct table (see :func:`key_domain`) are remapped first and the loops then read the
dense ids as keys (``lo = 0``).

**Prefetch.**  Each loop asks the CPU for the table entry of the key it will read
``AHEAD`` accesses later (:mod:`kvsim.jit.prefetch`), so the one random access into the
big table is in the cache by its turn.  This, not a smaller table, is what fixed small
caches over wide key ranges: a hash table sized to the slots (open addressing keyed by
the key, with a bit map over the key range for first appearances, as libCacheSim sizes
its table by ``hashpower``) was measured and lost (arc, 10 M Zipf(1.0) accesses over 1 M
keys, 1,000 blocks, best of 3, load ~3.7 on 2 cores: direct table 0.24-0.36 CPU-s, hash
table 0.27-0.28, hash table with its home bucket prefetched 0.25-0.26, direct table
prefetched 16 ahead 0.178-0.180; at 100,000 blocks the hash table was slower than the
direct table, 0.33-0.50 vs 0.25-0.32).  The lookup chain is short either way; what the
direct table lost was the load latency, and a prefetch hides it without a hash's probe.

Every loop takes the prefetch distance last (``ahead``, :func:`prefetch_distance`: 0 =
no prefetch), returns ``(hits, misses, evictions, resident_at_end, unique_keys)`` and writes
the evicted dense ids into ``victims_out`` when it is not empty.  Lists are doubly linked
through ``prev``/``nxt`` arrays of slots, head = oldest (next to evict), ``-1`` = none;
``E[q] = [head, tail, size]`` of list ``q``.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

from kvsim.jit.disk_cache import SINGLE_TIER, seal
from kvsim.jit.prefetch import prefetch

NIL = -1

#: Largest key span read through a direct table: this many entries per access plus a
#: constant (4 M entries = 16 MiB of int32); wider keys are sorted first (np.unique).
DIRECT_FACTOR = 4
DIRECT_SLACK = 1 << 22

#: How many accesses ahead each loop prefetches the table entry of the key it will read
#: (:mod:`kvsim.jit.prefetch`).  Measured (10 M Zipf(1.0) accesses over 1 M keys, arc at
#: 1,000 blocks, best of 3 CPU-s, load ~3.7 on 2 cores): no prefetch 0.24-0.42 (it swings
#: with other jobs' use of the shared L3), 4 ahead 0.253, 8 ahead 0.200, 16 ahead 0.178,
#: 32 ahead 0.182; at 100,000 blocks 0.253 / 0.199 / 0.178 / 0.200 / 0.231.
AHEAD = 16
#: Prefetch only when the table has at least this many entries (1 MiB of int32, this
#: machine's L2 per core; docs/benchmarks.md): a smaller table mostly stays in the L2.
#: Measured (best of 5-30 interleaved runs, CPU time, load ~6.4 on 2 cores; no prefetch ->
#: prefetch 16 ahead), arc / lru at 1,000 blocks: Zipf(1.0) 3 M accesses over 100 k keys
#: 44.9 -> 44.0 / 30.7 -> 30.8 ms, over 250 k keys 50.8 -> 47.5 / 33.7 -> 31.8 ms, over
#: 500 k keys 57.4 -> 50.5 / 38.9 -> 34.7 ms; the Mooncake block stream (288,500 accesses
#: over 182,790 keys, mostly first accesses, in increasing key order) 4.71 -> 4.86 / 1.90 ->
#: 2.17 ms.  ``bench/bench_prefetch.py`` (every loop, end to end, load ~7.5): prefetch /
#: no prefetch 0.88-1.06 over 100 k keys, 0.85-0.99 over 250 k, 0.67-0.92 over 500 k,
#: 0.58-0.92 over 1 M, 0.90-1.10 on Mooncake.  The threshold stays above Mooncake's span:
#: a real trace's dense ids come in order of first appearance, as Mooncake's keys do, and
#: there the prefetch mostly costs; a random 250 k-key range would gain 1-15 %.
PREFETCH_MIN_SPAN = 1 << 18


def prefetch_distance(span: int) -> int:
    """The ``ahead`` argument of the loops for a table of ``span`` entries: ``AHEAD``, or 0
    (no prefetch) below ``PREFETCH_MIN_SPAN``."""
    return AHEAD if span >= PREFETCH_MIN_SPAN else 0


@njit(cache=True)
def _min_max(keys):
    lo = keys[0]
    hi = keys[0]
    for i in range(1, keys.shape[0]):
        x = keys[i]
        if x < lo:
            lo = x
        elif x > hi:
            hi = x
    return lo, hi


def key_domain(keys: np.ndarray, remap):
    """``(arr, lo, span, keys_by_id)`` for the loops: the keys themselves with their
    minimum and span when the span is small enough for a direct table (``keys_by_id`` is
    then None: the loop fills it), else the dense ids of ``remap(keys)`` (lo 0)."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if keys.shape[0] == 0:
        return keys, 0, 1, keys.copy()
    lo, hi = _min_max(keys)
    lo, hi = int(lo), int(hi)
    span = hi - lo + 1
    if 0 < span <= DIRECT_FACTOR * keys.shape[0] + DIRECT_SLACK:
        return keys, lo, span, None
    ids, keys_by_id = remap(keys)
    return ids, 0, max(int(keys_by_id.shape[0]), 1), keys_by_id


def new_table(span: int) -> np.ndarray:
    """The key-state table of the loops (all -1 = never seen), int32 when it fits."""
    return np.full(span, -1, np.int32 if span < (1 << 30) else np.int64)


def next_use_table(n: int, span: int) -> np.ndarray:
    """The ``last`` argument of :func:`next_use_keys` for ``n`` accesses over ``span``
    keys: int32 filled with int32's max (its NEVER) when every index fits, else int64
    with ``NEVER`` (int64 max).  int32 halves what the pass writes and the random table
    it touches (10 M Zipf(1.0) accesses over 1 M keys, best of 4, load ~4.7 on 2 cores:
    0.087 -> 0.045 CPU-s); Belady's victims are the same, since only the order of next
    uses matters and NEVER stays above every index."""
    if n < np.iinfo(np.int32).max:
        return np.full(span, np.iinfo(np.int32).max, np.int32)
    return np.full(span, np.iinfo(np.int64).max, np.int64)


@njit(cache=True)
def next_use_keys(keys, lo, last, ahead):
    """``out[i]`` = index of the next access to ``keys[i]`` after ``i``, NEVER if none:
    :func:`kvsim.cachesim.simulator.next_use_of` on keys, no remap.  ``last`` (one entry per
    key, from :func:`next_use_table`) holds NEVER on entry and sets the dtype of ``out``
    and its NEVER.  ``ahead``: prefetch distance (:func:`prefetch_distance`; 0 = none)."""
    out = np.empty(keys.shape[0], last.dtype)
    for i in range(keys.shape[0] - 1, -1, -1):
        if ahead > 0 and i >= ahead:
            prefetch(last, keys[i - ahead] - lo)
        k = keys[i] - lo
        out[i] = last[k]
        last[k] = i
    return out


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
def _grown(a):
    out = np.empty(2 * a.shape[0] + 4, a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True)
def replay_lru(keys, lo, table, capacity, victims_out, uniq_out, ahead):
    """LRU (policies/lru.py): a hit moves the block to the tail, the head is evicted; the
    evicted block's slot takes the new block."""
    m = max(min(capacity, keys.shape[0]), 1)
    kd = np.empty((m, 2), table.dtype)  # a slot's key offset and dense id side by side
    kof = kd[:, 0]
    did = kd[:, 1]
    link = np.empty((m, 2), np.int32)  # a slot's two list links side by side
    prev = link[:, 0]
    nxt = link[:, 1]
    record = victims_out.shape[0] > 0
    head = -1
    tail = -1
    n = 0
    nu = 0
    hits = 0
    misses = 0
    ev = 0
    nk = keys.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, keys[t + ahead] - lo)
        x = keys[t]
        k = x - lo
        s = table[k]
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
        if s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if n >= capacity:  # evict the head; its slot takes the new block
            s = head
            head = nxt[s]
            if head < 0:
                tail = -1
            else:
                prev[head] = -1
            table[kof[s]] = -2 - did[s]
            if record:
                victims_out[ev] = did[s]
            ev += 1
        else:
            s = n
            n += 1
        kof[s] = k
        did[s] = d
        table[k] = s
        prev[s] = tail
        nxt[s] = -1
        if tail < 0:
            head = s
        else:
            nxt[tail] = s
        tail = s
    return hits, misses, ev, n, nu


@njit(cache=True)
def replay_fifo(ids, lo, table, capacity, victims_out, uniq_out, ahead):
    """FIFO (policies/fifo.py): evict in insertion order; a ring of ``capacity`` slots."""
    m = max(min(capacity, ids.shape[0]), 1)
    kd = np.empty((m, 2), table.dtype)  # a slot's key offset and dense id side by side
    kof = kd[:, 0]
    did = kd[:, 1]
    record = victims_out.shape[0] > 0
    hits = 0
    misses = 0
    ev = 0
    n = 0
    nu = 0
    w = 0  # next slot to write = the oldest entry once the ring is full
    nk = ids.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, ids[t + ahead] - lo)
        x = ids[t]
        k = x - lo
        s = table[k]
        if s >= 0:
            hits += 1
            continue
        misses += 1
        if s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if n >= capacity:
            table[kof[w]] = -2 - did[w]
            if record:
                victims_out[ev] = did[w]
            ev += 1
        else:
            n += 1
        kof[w] = k
        did[w] = d
        table[k] = w
        w += 1
        if w == capacity:
            w = 0
    return hits, misses, ev, n, nu


@njit(cache=True)
def replay_lfu(keys, lo, table, capacity, victims_out, uniq_out, ahead):
    """LFU, LRU among ties (policies/lfu.py: smallest (frequency, last touch)), with O(1)
    frequency buckets: ``B[f]`` = [head, tail, size] of the slots of frequency ``f``.  The
    victim's slot takes the new block."""
    m = max(min(capacity, keys.shape[0]), 1)
    kd = np.empty((m, 2), table.dtype)  # a slot's key offset and dense id side by side
    kof = kd[:, 0]
    did = kd[:, 1]
    link = np.empty((m, 2), np.int32)  # a slot's two list links side by side
    prev = link[:, 0]
    nxt = link[:, 1]
    freq = np.zeros(m, np.int64)
    B = np.full((64, 3), NIL, np.int64)
    B[:, 2] = 0
    record = victims_out.shape[0] > 0
    hits = 0
    misses = 0
    ev = 0
    n = 0
    nu = 0
    minf = 1
    nk = keys.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, keys[t + ahead] - lo)
        x = keys[t]
        k = x - lo
        s = table[k]
        if s >= 0:
            hits += 1
            f = freq[s]
            _unlink(prev, nxt, B, f, s)
            if B[f, 2] == 0 and minf == f:
                minf = f + 1
            if f + 1 >= B.shape[0]:
                grown = np.full((2 * B.shape[0], 3), NIL, np.int64)
                grown[:, 2] = 0
                grown[: B.shape[0]] = B
                B = grown
            _push_tail(prev, nxt, B, f + 1, s)
            freq[s] = f + 1
            continue
        misses += 1
        if s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
        if n >= capacity:
            s = B[minf, 0]
            _unlink(prev, nxt, B, minf, s)
            table[kof[s]] = -2 - did[s]
            if record:
                victims_out[ev] = did[s]
            ev += 1
        else:
            s = n
            n += 1
        kof[s] = k
        did[s] = d
        table[k] = s
        _push_tail(prev, nxt, B, 1, s)
        freq[s] = 1
        minf = 1
    return hits, misses, ev, n, nu


@njit(cache=True)
def replay_sieve(keys, lo, table, capacity, victims_out, uniq_out, ahead):
    """SIEVE (policies/sieve.py): the hand walks from old to new, clearing visited bits.
    The evicted block's slot is unlinked and re-appended at the tail for the new block."""
    m = max(min(capacity, keys.shape[0]), 1)
    kd = np.empty((m, 2), table.dtype)  # a slot's key offset and dense id side by side
    kof = kd[:, 0]
    did = kd[:, 1]
    link = np.empty((m, 2), np.int32)  # a slot's two list links side by side
    prev = link[:, 0]
    nxt = link[:, 1]
    visited = np.zeros(m, np.bool_)
    record = victims_out.shape[0] > 0
    head = -1
    tail = -1
    hand = -1
    n = 0
    nu = 0
    hits = 0
    misses = 0
    ev = 0
    nk = keys.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, keys[t + ahead] - lo)
        x = keys[t]
        k = x - lo
        s = table[k]
        if s >= 0:
            hits += 1
            visited[s] = True
            continue
        misses += 1
        if s == -1:
            d = nu
            uniq_out[nu] = x
            nu += 1
        else:
            d = -2 - s
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
            table[kof[s]] = -2 - did[s]
            if record:
                victims_out[ev] = did[s]
            ev += 1
        else:
            s = n
            n += 1
        kof[s] = k
        did[s] = d
        table[k] = s
        visited[s] = False
        prev[s] = tail
        nxt[s] = -1
        if tail < 0:
            head = s
        else:
            nxt[tail] = s
        tail = s
    return hits, misses, ev, n, nu


@njit(cache=True)
def replay_belady(keys, lo, table, next_use, capacity, victims_out, uniq_out, ahead):
    """Belady's MIN, the hooks of ``policies/belady.py`` inlined (see kvsim.cachesim.simulator's
    docstring): a max-heap on next use; ``hk[i]``, ``hb[i]``, ``hd[i]``: next use, key
    offset and dense id at heap position ``i``; ``table[key]`` = the key's position.  A
    miss in a full cache removes the root exactly as ``belady.on_remove`` does (last entry
    to the root, sift down), then inserts as ``belady.on_insert`` does (append, sift up); a
    hit sifts up as ``belady.on_hit`` does.  Same comparisons (``>=`` stops a sift up,
    ``>`` picks the right child, ``<=`` stops a sift down), hence the same victims."""
    m = max(min(capacity, keys.shape[0]), 1) + 1
    hk = np.empty(m, np.int64)
    bd = np.empty((m, 2), table.dtype)  # key offset and dense id side by side
    hb = bd[:, 0]
    hd = bd[:, 1]
    record = victims_out.shape[0] > 0
    n = 0
    nu = 0
    hits = 0
    misses = 0
    evictions = 0
    nk = keys.shape[0]
    for t in range(nk):
        if ahead > 0 and t + ahead < nk:
            prefetch(table, keys[t + ahead] - lo)
        x = keys[t]
        b = x - lo
        key = next_use[t]
        i = table[b]
        if i >= 0:
            hits += 1
            d = hd[i]
        else:
            misses += 1
            if i == -1:
                d = nu
                uniq_out[nu] = x
                nu += 1
            else:
                d = -2 - i
            if n >= capacity:  # evict the root (capacity >= 1, so the heap is not empty)
                table[hb[0]] = -2 - hd[0]
                if record:
                    victims_out[evictions] = hd[0]
                evictions += 1
                n -= 1
                if n > 0:
                    lk = hk[n]
                    last = hb[n]
                    lastd = hd[n]
                    j = 0
                    while True:
                        c = 2 * j + 1
                        if c >= n:
                            break
                        if c + 1 < n and hk[c + 1] > hk[c]:
                            c += 1
                        ck = hk[c]
                        if ck <= lk:
                            break
                        cb = hb[c]
                        hk[j] = ck
                        hb[j] = cb
                        hd[j] = hd[c]
                        table[cb] = j
                        j = c
                    hk[j] = lk
                    hb[j] = last
                    hd[j] = lastd
                    table[last] = j
            i = n
            n += 1
        # sift up: on a hit the next use only moves later; on a miss the block is appended
        while i > 0:
            pa = (i - 1) >> 1
            pk = hk[pa]
            if pk >= key:
                break
            pb = hb[pa]
            hk[i] = pk
            hb[i] = pb
            hd[i] = hd[pa]
            table[pb] = i
            i = pa
        hk[i] = key
        hb[i] = b
        hd[i] = d
        table[b] = i
    return hits, misses, evictions, n, nu


# An edit of prefetch.py or of cachesim_fast's constants recompiles these loops too
# (kvsim.jit.disk_cache.SINGLE_TIER); their calls keep numba's own typing (plain=False).
seal(sys.modules[__name__], SINGLE_TIER, plain=False)
