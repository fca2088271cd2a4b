"""Whole-trace columns built a batch at a time without a transient copy, and the freed heap
given back (issue 38, "Memory": the request-trace read's peak bounded by its batch).

:class:`GrowingArray` appends batches to one numpy buffer that grows in place
(``ndarray.resize``, C ``realloc``): glibc serves a block of 128 KiB or more (its
``M_MMAP_THRESHOLD``; the dynamic threshold stops at 32 MiB, ``DEFAULT_MMAP_THRESHOLD_MAX``
on 64-bit, mallopt(3)) by ``mmap`` and grows it with ``mremap``, which moves page tables,
not bytes: a column of N values costs N values resident at every moment, where keeping the
batches and concatenating them at the end held each value twice.  Elsewhere (another
allocator, a small block on the heap) ``realloc`` copies, which is the concatenation's
cost again, once per growth step; steps are geometric (:data:`GROWTH_DIV`), so the bytes
copied stay linear in the column.

:func:`trim_heap` calls glibc's ``malloc_trim(0)``: the Python objects of a parsed batch
are freed into the heap, which glibc keeps for reuse; after the read nothing reuses them
(docs/benchmarks.md, "Request-trace read in bounded memory").
"""

from __future__ import annotations

import numpy as np

#: A full buffer grows by 1/GROWTH_DIV of its size (at least what the batch needs): at most
#: 12.5 % of a column allocated and not yet filled; where ``realloc`` copies, each value
#: is copied ~GROWTH_DIV times over the column's growth (sum of a geometric series).
GROWTH_DIV = 8
#: The first allocation, values (64 KiB of int64).
MIN_CAPACITY = 1 << 13


class GrowingArray:
    """A 1-D numpy column appended a batch at a time; :meth:`take` returns it, exact size."""

    def __init__(self, dtype) -> None:
        self._buf = np.empty(0, dtype=dtype)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def append(self, values) -> None:
        """Append ``values`` (converted to the column's dtype as ``ndarray.__setitem__``
        does: an integer beyond int64 raises ``OverflowError``)."""
        n = len(values)
        need = self.size + n
        if need > self._buf.size:
            cap = max(need, self._buf.size + self._buf.size // GROWTH_DIV, MIN_CAPACITY)
            self._buf.resize(cap, refcheck=False)  # nothing else holds the buffer
        self._buf[self.size:need] = values
        self.size = need

    def take(self) -> np.ndarray:
        """The column (its capacity beyond the size given back); the builder is spent."""
        buf, self._buf = self._buf, None
        buf.resize(self.size, refcheck=False)
        return buf


def trim_heap() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim(0)``; nothing
    elsewhere).  Costs milliseconds."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    """glibc (for ``malloc_trim``), or None elsewhere.  The process's own symbols
    (``dlopen(NULL)``: the C library is already loaded), not ``ctypes.util.find_library``,
    which runs ``ldconfig -p`` in a child process on Linux (~15 ms a process at every
    import of this module, measured 2026-12-01)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()
