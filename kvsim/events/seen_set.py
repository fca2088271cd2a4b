"""The content hashes seen so far in an event stream, as a growing open-addressing set
(linear probing, load <= 3/4, compiled): :meth:`SeenSet.mark` gives each hash of a batch its
``seen`` flag in stream order (seen in an earlier batch, or earlier in this one).  The
replay's pre-pass keeps one such flag per ALLOCATE row (kvsim.replay.prepass), the
importers' prefix reuse counts its prompt blocks' flags (kvsim.events.prefix_reuse);
:func:`_grown` also grows the pre-pass's hash -> value tables (its next uses)."""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.core.schema import EventKind
from kvsim.jit.disk_cache import setup_func
from kvsim.jit.prefetch import prefetch

_EMPTY = 0  # content hash 0 = NO_HASH: never a key, so it marks an empty slot
EV_ALLOCATE = int(EventKind.ALLOCATE)
_MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4)

#: The home slot takes the product's bits from here up (``& mask`` keeps as many as the
#: table has): 32 bits, tables up to 2^32 slots.  It was 40 (24 bits): past 2^24 slots (a set
#: of over 8 M keys) every home fell in the table's first 2^24 slots and linear probing ran
#: through one ever-growing cluster.
HOME_SHIFT = np.uint64(32)


@njit(cache=True, inline="always")
def _home(h, mask):
    """Home slot of hash ``h`` in a table of ``mask + 1`` slots (a power of two)."""
    return np.int64((np.uint64(h) * _MULT) >> HOME_SHIFT) & mask


@njit(cache=True)
def _slot(keys, h):
    """Slot of ``h`` in the open-addressing table ``keys`` (linear probing), or of the
    empty slot where it would go."""
    mask = keys.shape[0] - 1
    i = _home(h, mask)
    while keys[i] != _EMPTY and keys[i] != h:
        i = (i + 1) & mask
    return i


#: How many hashes ahead :func:`_mark` prefetches the home slot of (a set of 5.6 M keys at
#: 16-token blocks is 64-128 MiB: every probe's first line is a cache miss).  Chosen, not
#: tuned; docs/benchmarks.md, "Speed: tiered replay of 16-token traces".
MARK_AHEAD = 16


@njit(cache=True, inline="always")
def _see(keys, h):
    """``(seen, added)`` for hash ``h``: (1, 0) when ``keys`` holds it, else (0, 1) with
    ``h`` inserted; (0, 0) for the empty hash (never inserted)."""
    if h == _EMPTY:
        return 0, 0
    i = _slot(keys, h)
    if keys[i] == h:
        return 1, 0
    keys[i] = h
    return 0, 1


@njit(cache=True)
def _mark(hashes, keys, n_used, seen):
    """``seen[k] = 1`` if ``hashes[k]`` (non-zero) is in the set or earlier in ``hashes``;
    inserts them.  Returns the new number of keys."""
    mask = keys.shape[0] - 1
    n = hashes.shape[0]
    for k in range(n):
        if k + MARK_AHEAD < n:  # a later hash's home slot, requested now (as _slot)
            prefetch(keys, _home(hashes[k + MARK_AHEAD], mask))
        seen[k], added = _see(keys, hashes[k])
        n_used += added
    return n_used


@njit(cache=True)
def _mark_rows(kind, hashes, keys, n_used, seen):
    """:func:`_mark` on the ALLOCATE rows of a batch, read from its ``kind`` and
    ``content_hash`` columns in one pass (no mask, no gathered copy of the hashes):
    ``seen[o]`` for the ``o``-th ALLOCATE row.  Returns the new number of keys."""
    mask = keys.shape[0] - 1
    n = kind.shape[0]
    o = 0
    for k in range(n):
        if k + MARK_AHEAD < n and kind[k + MARK_AHEAD] == EV_ALLOCATE:
            prefetch(keys, _home(hashes[k + MARK_AHEAD], mask))
        if kind[k] != EV_ALLOCATE:
            continue
        seen[o], added = _see(keys, np.int64(hashes[k]))
        n_used += added
        o += 1
    return n_used


@njit(cache=True)
def _rehash(old_keys, new_keys, old_vals, new_vals):
    """Move every key (and its value, when ``old_vals`` is not empty) to the new table
    (the home slot of the key MARK_AHEAD places on requested first, as :func:`_mark`)."""
    with_vals = old_vals.shape[0] > 0
    mask = new_keys.shape[0] - 1
    n = old_keys.shape[0]
    for j in range(n):
        if j + MARK_AHEAD < n and old_keys[j + MARK_AHEAD] != _EMPTY:
            prefetch(new_keys, _home(old_keys[j + MARK_AHEAD], mask))
        h = old_keys[j]
        if h != _EMPTY:
            i = _slot(new_keys, h)
            new_keys[i] = h
            if with_vals:
                new_vals[i] = old_vals[j]


def _grown(keys: np.ndarray, vals: np.ndarray, need: int,
           load: tuple[int, int] = (1, 2),
           python: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tables with room for ``need`` keys at load <= ``load[0] / load[1]`` (the same ones
    if they have it).  ``vals`` is empty for a set, else as long as ``keys``.  ``python``:
    as :func:`kvsim.jit.disk_cache.setup_func` takes it."""
    size = keys.shape[0]
    num, den = load
    if den * need <= num * size:
        return keys, vals
    while den * need > num * size:
        size *= 2
    new_keys = np.zeros(size, np.int64)
    new_vals = np.zeros(size if vals.shape[0] else 0, np.int64)
    setup_func(_rehash, python)(keys, new_keys, vals, new_vals)
    return new_keys, new_vals


class SeenSet:
    """The content hashes allocated so far; ``mark(hashes)`` gives each ALLOCATE row's
    ``seen`` flag (int8) in stream order and remembers the hashes.

    Load <= 3/4 (linear probing: ~8.5 probes per absent key, in one or two cache lines,
    against 2.5 at 1/2): 11 to 21 bytes per distinct hash (load 3/4 down to 3/8 after a
    doubling) instead of 16 to 32, and 1.5x less at each doubling, when the old and new
    tables coexist.  It is the one structure of the
    replay that grows with the trace's distinct contents (5.6 M at 16-token blocks on the
    Mooncake conversation trace)."""

    LOAD = (3, 4)

    def __init__(self, initial_slots: int = 1 << 12, python: bool | None = None) -> None:
        """``python``: run the passes as their Python twins while they are cold (as
        :func:`kvsim.jit.disk_cache.setup_func` takes it; None: as the caller's
        ``python_while_cold`` says)."""
        self.keys = np.zeros(initial_slots, np.int64)
        self.vals = np.zeros(0, np.int64)
        self.n = 0
        self.python = python

    def mark(self, hashes: np.ndarray) -> np.ndarray:
        self.keys, self.vals = _grown(self.keys, self.vals, self.n + hashes.shape[0],
                                      self.LOAD, self.python)
        seen = np.zeros(hashes.shape[0], np.int8)
        self.n = int(setup_func(_mark, self.python)(np.ascontiguousarray(hashes, np.int64),
                                                    self.keys, self.n, seen))
        return seen

    def mark_rows(self, kind: np.ndarray, content_hash: np.ndarray) -> np.ndarray:
        """:meth:`mark` of the ALLOCATE rows of a batch (its ``kind`` and ``content_hash``
        columns), in one compiled pass over the rows (:func:`_mark_rows`)."""
        m = int(np.count_nonzero(kind == EV_ALLOCATE))
        self.keys, self.vals = _grown(self.keys, self.vals, self.n + m, self.LOAD)
        seen = np.zeros(m, np.int8)
        self.n = int(setup_func(_mark_rows)(kind, content_hash, self.keys, self.n, seen))
        return seen
