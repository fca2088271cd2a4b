"""Pending evictions: blocks evicted and not yet needed again, keyed by block identity.

The eviction ledger (:mod:`kvsim.results.log_ledger`) walks a log's evictions and needs in
``seq`` order; this table remembers every eviction until the next need of the same block
identity matches it.  It is an open-addressing hash table (linear probing, tombstones) in
numpy arrays, driven by one ``numba`` kernel, because a log of tens of millions of rows
holds millions of such evictions and a Python dict of tuples costs ~1 us and ~300 bytes
each.

Layout and invariants:

- slots ``kh, kr, ki`` hold the identity triple (see ``log_reader.identity_columns``),
  ``state`` is 0 empty / 1 live / 2 tombstone, ``head`` the newest pending record of the
  key.  Live plus tombstone slots stay at most :data:`MAX_LOAD` of the capacity:
  :meth:`PendingEvictions.reserve` rebuilds the table before a batch could break that, so
  probing always ends at an empty slot.
- records ``rec[r] = (seq, step, action, from_tier, reason, request_id, prev)`` chain a
  key's pending evictions newest first through ``prev`` (-1 ends); freed records go on a
  free stack and are reused.
- memory: 41 bytes per slot (1.25 to 1.8 slots per live key) plus 56 bytes per pending
  eviction record.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Columns of ``PendingEvictions.rec`` and of the kernel's match rows (first six).
REC_SEQ, REC_STEP, REC_ACTION, REC_FROM, REC_REASON, REC_REQ, REC_PREV = range(7)
#: Extra columns of a match row: the need's event index and whether this eviction is the
#: need's cause (the newest pending eviction of the key).
OUT_NEED, OUT_CAUSE = 6, 7

#: Rebuild a table before live + tombstone slots exceed this fraction of its capacity;
#: rebuild it to :data:`REBUILT_LOAD`.  Linear probing (Knuth, TAOCP vol. 3, 6.4) expects
#: (1 + 1/(1-a)^2)/2 probes for an unsuccessful search: 13 at a = 0.8, 3.0 at 0.55; 0.8
#: trades those probes for memory (35M-row log: 1.07 GB -> 866 MB peak, 42 -> 51 s CPU,
#: docs/benchmarks.md).  A capacity that is not a power of two keeps growth at ~1.45x.
MAX_LOAD = 0.8
REBUILT_LOAD = 0.55


def table_capacity(keys: int) -> int:
    """Slots for ``keys`` live keys right after a rebuild (load REBUILT_LOAD)."""
    return max(4096, int(keys / REBUILT_LOAD) + 1)


_M1 = np.uint64(0x9E3779B97F4A7C15)  # golden-ratio constant of splitmix64 (Steele et al.)
_M2 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finaliser constants
_M3 = np.uint64(0x94D049BB133111EB)


@njit(cache=True)
def _slot(skh, skr, ski, state, key_h, key_r, key_i):
    """Slot of the key if live, else -(first free slot) - 1 (a tombstone or empty)."""
    x = np.uint64(key_h) * _M1 ^ np.uint64(key_r) * _M2 ^ np.uint64(key_i) * _M3
    x ^= x >> np.uint64(31)
    x *= _M2
    x ^= x >> np.uint64(29)
    cap = state.size
    i = np.int64(x % np.uint64(cap))
    first_free = -1
    while True:
        s = state[i]
        if s == 0:
            return -(first_free if first_free >= 0 else i) - 1
        if s == 1:
            if skh[i] == key_h and skr[i] == key_r and ski[i] == key_i:
                return i
        elif first_free < 0:
            first_free = i
        i += 1
        if i == cap:
            i = 0


@njit(cache=True)
def _match(is_need, kh, kr, ki, seq, step, action, from_tier, reason, req,
           skh, skr, ski, state, head, rec, free, meta, out, orphan):
    """Process events in order; returns the number of match rows written to ``out``.

    ``meta`` = [record high-water mark, free-stack size, live keys, tombstones].
    """
    n_out = 0
    for e in range(is_need.size):
        s = _slot(skh, skr, ski, state, kh[e], kr[e], ki[e])
        if not is_need[e]:
            if meta[1] > 0:
                meta[1] -= 1
                r = free[meta[1]]
            else:
                r = meta[0]
                meta[0] += 1
            rec[r, 0] = seq[e]
            rec[r, 1] = step[e]
            rec[r, 2] = action[e]
            rec[r, 3] = from_tier[e]
            rec[r, 4] = reason[e]
            rec[r, 5] = req[e]
            if s >= 0:
                rec[r, 6] = head[s]
                head[s] = r
            else:
                slot = -s - 1
                if state[slot] == 2:
                    meta[3] -= 1
                state[slot] = 1
                skh[slot] = kh[e]
                skr[slot] = kr[e]
                ski[slot] = ki[e]
                rec[r, 6] = -1
                head[slot] = r
                meta[2] += 1
        else:
            if s < 0:
                orphan[e] = True
                continue
            r = head[s]
            cause = 1
            while r >= 0:
                for c in range(6):
                    out[n_out, c] = rec[r, c]
                out[n_out, 6] = e
                out[n_out, 7] = cause
                cause = 0
                n_out += 1
                free[meta[1]] = r
                meta[1] += 1
                r = rec[r, 6]
            state[s] = 2
            meta[2] -= 1
            meta[3] += 1
    return n_out


@njit(cache=True)
def _rehash(okh, okr, oki, ostate, ohead, skh, skr, ski, state, head):
    for i in range(ostate.size):
        if ostate[i] == 1:
            s = -_slot(skh, skr, ski, state, okh[i], okr[i], oki[i]) - 1
            state[s] = 1
            skh[s] = okh[i]
            skr[s] = okr[i]
            ski[s] = oki[i]
            head[s] = ohead[i]


class PendingEvictions:
    """Evictions not yet matched by a need, with :meth:`match` over one batch of events."""

    def __init__(self, capacity_keys: int = 1 << 12) -> None:
        self._alloc_slots(capacity_keys)
        self.rec = np.zeros((1 << 10, 7), np.int64)
        self.free = np.zeros(1 << 10, np.int64)
        self.meta = np.zeros(4, np.int64)

    def _alloc_slots(self, cap: int) -> None:
        self.skh = np.zeros(cap, np.int64)
        self.skr = np.zeros(cap, np.int64)
        self.ski = np.zeros(cap, np.int64)
        self.state = np.zeros(cap, np.int8)
        self.head = np.zeros(cap, np.int64)

    @property
    def pending(self) -> int:
        """Evictions currently pending (records in use)."""
        return int(self.meta[0] - self.meta[1])

    @property
    def live_keys(self) -> int:
        return int(self.meta[2])

    def reserve(self, new_evictions: int) -> None:
        """Grow or rebuild so ``new_evictions`` more can be inserted (keeps load <= 1/2)."""
        need_keys = int(self.meta[2] + self.meta[3]) + new_evictions
        if need_keys > MAX_LOAD * self.state.size:
            cap = table_capacity(int(self.meta[2]) + new_evictions)
            old = (self.skh, self.skr, self.ski, self.state, self.head)
            self._alloc_slots(cap)
            _rehash(*old, self.skh, self.skr, self.ski, self.state, self.head)
            self.meta[3] = 0
        need_recs = int(self.meta[0]) + new_evictions
        if need_recs > self.rec.shape[0]:
            size = max(self.rec.shape[0] * 3 // 2, need_recs)
            rec = np.zeros((size, 7), np.int64)
            rec[: self.rec.shape[0]] = self.rec
            free = np.zeros(size, np.int64)
            free[: self.free.size] = self.free
            self.rec, self.free = rec, free

    def match(self, is_need, kh, kr, ki, seq, step, action, from_tier, reason, req
              ) -> tuple[np.ndarray, np.ndarray]:
        """Feed events (in ``seq`` order).  Returns (match rows ``[n, 8]``: the matched
        eviction's ``REC_*`` fields then ``OUT_NEED``/``OUT_CAUSE``; ``orphan`` flags: needs
        with no pending eviction)."""
        n_ev = int(np.count_nonzero(~is_need))
        self.reserve(n_ev)
        out = np.empty((self.pending + n_ev, 8), np.int64)
        orphan = np.zeros(is_need.size, np.bool_)
        n = _match(is_need, kh, kr, ki, seq, step, action, from_tier, reason, req,
                   self.skh, self.skr, self.ski, self.state, self.head, self.rec, self.free,
                   self.meta, out, orphan)
        return out[:n], orphan
