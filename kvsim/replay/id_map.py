"""Request id -> int64 value for the ids mapped now (:class:`IdMap`): the request slots of
:mod:`kvsim.replay.slots`.  Open addressing over the pre-pass's hash-set scheme
(:mod:`kvsim.replay.prepass`: linear probing, Fibonacci hashing), key id + 1, deletion by
backward shift."""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.events.seen_set import _EMPTY, _grown, _home, _slot
from kvsim.jit.disk_cache import setup_func


@njit(cache=True)
def _ids_get(keys, vals, ids, out):
    """``out[k]`` = the value of key ``ids[k] + 1``, -1 when absent or ``ids[k] < 0``."""
    for k in range(ids.shape[0]):
        out[k] = -1
        if ids[k] >= 0:
            i = _slot(keys, ids[k] + 1)
            if keys[i] != _EMPTY:
                out[k] = vals[i]


@njit(cache=True)
def _ids_map(keys, vals, ids, out):
    """``out[k]`` = the value of key ``ids[k] + 1`` (-1 when absent), or ``ids[k]`` itself
    when it is < 0; a run of equal ids (a request's rows) is looked up once.  Returns how
    many ids >= 0 were absent."""
    miss = 0
    last = np.int64(-1)
    v = np.int64(-1)
    for k in range(ids.shape[0]):
        x = ids[k]
        if x < 0:
            out[k] = x
            continue
        if x != last:
            last = x
            i = _slot(keys, x + 1)
            v = vals[i] if keys[i] != _EMPTY else np.int64(-1)
        out[k] = v
        if v < 0:
            miss += 1
    return miss


@njit(cache=True)
def _ids_put(keys, vals, ids, v):
    for k in range(ids.shape[0]):
        i = _slot(keys, ids[k] + 1)
        keys[i] = ids[k] + 1
        vals[i] = v[k]


@njit(cache=True)
def _ids_drop(keys, vals, ids):
    """Remove keys ``ids + 1`` (present), each by backward-shift deletion (linear probing
    stays valid without tombstones).  Returns how many were removed."""
    mask = keys.shape[0] - 1
    gone = 0
    for k in range(ids.shape[0]):
        i = _slot(keys, ids[k] + 1)
        if keys[i] == _EMPTY:
            continue
        gone += 1
        j = i
        while True:
            j = (j + 1) & mask
            if keys[j] == _EMPTY:
                break
            home = _home(keys[j], mask)
            # keys[j] may move to the hole at i unless its home lies cyclically in (i, j]
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            keys[i] = keys[j]
            vals[i] = vals[j]
            i = j
        keys[i] = _EMPTY
        vals[i] = 0
    return gone


class IdMap:
    """Request id (>= 0) -> int64 value for the ids mapped now: open addressing (key id + 1,
    linear probing, load <= 1/2, deletion by backward shift), so that its memory follows
    the most ids mapped at once, not the largest id (the request slots of
    :mod:`kvsim.replay.slots`: 4 bytes per request id of the trace before, 4.8 MB for 100x
    the Mooncake conversation trace)."""

    def __init__(self) -> None:
        self.keys = np.zeros(1 << 10, np.int64)
        self.vals = np.zeros(1 << 10, np.int64)
        self.n = 0

    def get(self, ids: np.ndarray) -> np.ndarray:
        out = np.empty(len(ids), np.int64)
        setup_func(_ids_get)(self.keys, self.vals, np.ascontiguousarray(ids, np.int64), out)
        return out

    def map_into(self, ids: np.ndarray, out: np.ndarray) -> int:
        """``out`` (int64, as long as ``ids``): each id's value, -1 for an id >= 0 not
        mapped, a negative id as it is.  Returns how many ids >= 0 were not mapped."""
        return int(setup_func(_ids_map)(self.keys, self.vals, ids, out))

    def put(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Map the ids (absent, distinct) to ``values``."""
        self.keys, self.vals = _grown(self.keys, self.vals, self.n + len(ids))
        setup_func(_ids_put)(self.keys, self.vals, np.ascontiguousarray(ids, np.int64),
                 np.ascontiguousarray(values, np.int64))
        self.n += len(ids)

    def drop(self, ids: np.ndarray) -> None:
        self.n -= int(setup_func(_ids_drop)(self.keys, self.vals, np.ascontiguousarray(ids, np.int64)))
