"""Per-block totals of a streamed log: evictions, regretted evictions, regret cost.

Keyed by block identity (the triple of ``log_reader.identity_columns``) in the same
open-addressing table layout as :mod:`kvsim.results.log_pending` (linear probing, load at
most ``MAX_LOAD``, no deletions here), with numba kernels, so a log with millions of
distinct evicted blocks costs 41 bytes per slot (~80 bytes per block) instead of a pandas
MultiIndex per batch.  Counts are int32 (a block evicted more than 2**31 times would
overflow: not a real log).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numba import njit

from kvsim.results.log_pending import MAX_LOAD, _slot, table_capacity

#: Column names of :meth:`BlockTotals.frame`'s index and values.
KEY_COLUMNS = ["k_hash", "k_req", "k_idx"]


@njit(cache=True)
def _add(kh, kr, ki, evictions, regretted, cost, skh, skr, ski, state, counts, costs, meta):
    for e in range(kh.size):
        s = _slot(skh, skr, ski, state, kh[e], kr[e], ki[e])
        if s < 0:
            s = -s - 1
            state[s] = 1
            skh[s] = kh[e]
            skr[s] = kr[e]
            ski[s] = ki[e]
            counts[s, 0] = 0
            counts[s, 1] = 0
            costs[s] = 0.0
            meta[0] += 1
        counts[s, 0] += evictions[e]
        counts[s, 1] += regretted[e]
        costs[s] += cost[e]


@njit(cache=True)
def _move(okh, okr, oki, ostate, ocounts, ocosts, skh, skr, ski, state, counts, costs):
    for i in range(ostate.size):
        if ostate[i] == 1:
            s = -_slot(skh, skr, ski, state, okh[i], okr[i], oki[i]) - 1
            state[s] = 1
            skh[s] = okh[i]
            skr[s] = okr[i]
            ski[s] = oki[i]
            counts[s, 0] = ocounts[i, 0]
            counts[s, 1] = ocounts[i, 1]
            costs[s] = ocosts[i]


class BlockTotals:
    """Totals per block identity; :meth:`add` rows, read with :meth:`frame`."""

    def __init__(self, capacity: int = 1 << 12) -> None:
        self._alloc(capacity)
        self.meta = np.zeros(1, np.int64)  # live keys

    def _alloc(self, cap: int) -> None:
        self.skh = np.zeros(cap, np.int64)
        self.skr = np.zeros(cap, np.int64)
        self.ski = np.zeros(cap, np.int64)
        self.state = np.zeros(cap, np.int8)
        self.counts = np.zeros((cap, 2), np.int32)  # evictions, regretted per block
        self.costs = np.zeros(cap, np.float64)

    def __len__(self) -> int:
        return int(self.meta[0])

    def add(self, kh, kr, ki, evictions, regretted, cost) -> None:
        """Add per-row ``evictions``, ``regretted`` (ints) and ``cost`` (us) to each key."""
        if len(self) + len(kh) > MAX_LOAD * self.state.size:
            old = (self.skh, self.skr, self.ski, self.state, self.counts, self.costs)
            self._alloc(table_capacity(len(self) + len(kh)))
            _move(*old, self.skh, self.skr, self.ski, self.state, self.counts, self.costs)
        _add(np.ascontiguousarray(kh, np.int64), np.ascontiguousarray(kr, np.int64),
             np.ascontiguousarray(ki, np.int64), np.ascontiguousarray(evictions, np.int64),
             np.ascontiguousarray(regretted, np.int64), np.ascontiguousarray(cost, np.float64),
             self.skh, self.skr, self.ski, self.state, self.counts, self.costs, self.meta)

    def frame(self) -> pd.DataFrame:
        """Columns ``k_hash, k_req, k_idx, evictions, regretted, cost_us``; one row per
        block, in no particular order (callers sort)."""
        live = self.state == 1
        return pd.DataFrame({"k_hash": self.skh[live], "k_req": self.skr[live],
                             "k_idx": self.ski[live], "evictions": self.counts[live, 0].astype(np.int64),
                             "regretted": self.counts[live, 1].astype(np.int64), "cost_us": self.costs[live]})

    def top(self, n: int) -> pd.DataFrame:
        """The ``n`` blocks evicted most (evictions desc, cost desc, then key asc), same
        columns as :meth:`frame`, computed on the arrays (no full DataFrame)."""
        live = np.flatnonzero(self.state == 1)
        if not live.size:
            return self.frame().head(0)
        ev = self.counts[live, 0]
        if live.size > n:
            kth = np.partition(ev, live.size - n)[live.size - n]
            live = live[ev >= kth]  # ties at the threshold are all kept, then ordered
        order = np.lexsort((self.ski[live], self.skr[live], self.skh[live],
                            -self.costs[live], -self.counts[live, 0].astype(np.int64)))
        pick = live[order[:n]]
        return pd.DataFrame({"k_hash": self.skh[pick], "k_req": self.skr[pick],
                             "k_idx": self.ski[pick],
                             "evictions": self.counts[pick, 0].astype(np.int64),
                             "regretted": self.counts[pick, 1].astype(np.int64),
                             "cost_us": self.costs[pick]})
