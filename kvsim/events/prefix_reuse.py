"""Prefix reuse of an event stream: the block hit rate of an infinite prefix cache, THE
definition ``kvsim inspect`` and the importers' summaries share."""

from __future__ import annotations

import numpy as np


class _SeenHashes:
    """Sorted, duplicate-free int64 array of the content hashes seen so far."""

    def __init__(self) -> None:
        self.values = np.empty(0, dtype=np.int64)

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        if self.values.size == 0:
            return np.zeros(hashes.shape, dtype=bool)
        pos = np.searchsorted(self.values, hashes)
        pos[pos == self.values.size] = 0
        return self.values[pos] == hashes

    def add(self, unique_sorted: np.ndarray) -> None:
        """Merge sorted, duplicate-free ``unique_sorted`` in (O(seen + new), no re-sort)."""
        new = unique_sorted[~self.contains(unique_sorted)]
        if new.size:
            self.values = np.insert(self.values, np.searchsorted(self.values, new), new)


class PrefixReuse:
    """THE definition of prefix reuse (``kvsim inspect`` and the importers' summaries both
    use it): fed the ``ALLOCATE`` rows of an event stream in file order, the share of prompt
    (``PREFILL``) block allocations whose non-zero ``content_hash`` already appeared on an
    EARLIER ``ALLOCATE`` row of any phase: the block hit rate of an infinite prefix cache.

    Any phase, because vLLM caches a full decode block too: a chat turn's prompt re-uses
    the blocks of the previous turn's answer, allocated during its decode.  (The importers
    once counted only earlier prompt blocks, which missed those hits: 0.8919 against
    inspect's 0.9574 on the same multi-turn file.)"""

    def __init__(self) -> None:
        self.seen = _SeenHashes()
        self.refs = 0  # prompt-block allocations
        self.reuses = 0  # ... whose hash was seen on an earlier ALLOCATE

    def add(self, hashes: np.ndarray, is_prompt: np.ndarray) -> None:
        """The next ``ALLOCATE`` rows in file order: their ``content_hash`` and whether each
        is a prompt (``PREFILL``) block."""
        hashed = hashes != 0
        hh = hashes[hashed]
        # Seen before = seen in an earlier call, or earlier in this one.
        order = np.argsort(hh, kind="stable")  # equal hashes keep file order
        sh = hh[order]
        first = np.ones(sh.size, dtype=bool)
        if sh.size:
            np.not_equal(sh[1:], sh[:-1], out=first[1:])
        earlier_in_batch = np.ones(hh.size, dtype=bool)
        earlier_in_batch[order[first]] = False  # first occurrence of each hash
        seen_before = earlier_in_batch | self.seen.contains(hh)
        self.refs += int(np.count_nonzero(is_prompt))
        self.reuses += int(np.count_nonzero(seen_before & is_prompt[hashed]))
        self.seen.add(sh[first])

    @property
    def fraction(self) -> float:
        return self.reuses / self.refs if self.refs else 0.0
