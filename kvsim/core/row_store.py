"""Per-request arrays of a closed-loop run kept out of the resident set once the run has
passed them (issue 38, "Memory grows with what is resident, not with the trace").

The closed loop reads its per-request arrays (the Request table's columns, vLLM's request
constants, the slot map, the block facts, ...) by table row, in about arrival order: a
request's entries are read while it is queued or running, and rarely after.  A
:class:`RowStore` makes such an array a plain writable C-contiguous numpy array (the same
numba type as ``np.zeros``'s: no new compile) whose memory is an unlinked temporary file
mapped shared (``mmap`` + ``np.frombuffer``); :meth:`RowStore.release_below` gives the
whole pages below a row back (``madvise(MADV_DONTNEED)``): the data stays in the file, the
pages leave the process's resident set, and a later read of them maps them again from the
file (correct whatever the row: the release only decides what is resident).  The driver
(:func:`kvsim.modes.closed.cluster.serve`) releases below the oldest request the run still
reads, every :data:`kvsim.modes.closed.closed_loop.YIELD_STEPS` steps.

An array smaller than :data:`MIN_BYTES` stays in ordinary memory (small runs and tests
touch no file).  The files go to ``KVSIM_TMPDIR`` (else ``TMPDIR``, /tmp); their space is
reserved when made (``posix_fallocate``), so a full disk is one line naming the folder
(:class:`kvsim.core.errors.KvsimResourceError`, as :class:`kvsim.core.spill.SpillFile`
words it), never a fault when a page is first written.

Arrays are made through the store that :func:`active` makes current (``zeros``, ``full``,
``copy``): the closed loop's set-up makes them in the modules that own them (the block
facts, vLLM's request constants, the scheduler's, the slot map) without passing a store
through each constructor.  Outside :func:`active` they are ordinary numpy arrays.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import tempfile
import weakref
from collections.abc import Iterator

import numpy as np

#: arrays of fewer bytes stay in memory: 1 MiB (a chosen bound: ~130 k int64; the
#: Mooncake conversation trace's 12,031 requests keep their 8-byte columns in memory, its
#: 9.06 M-block facts go to a file)
MIN_BYTES = 1 << 20
#: the page the kernel gives back (Linux: 4 KiB on x86-64 and most arm64; read once)
PAGE = mmap.PAGESIZE


class RowStore:
    """Arrays indexed by request row, each in its own unlinked temporary file mapped shared
    once it holds :data:`MIN_BYTES` or more (module docstring)."""

    def __init__(self, min_bytes: int | None = None) -> None:
        self.min_bytes = MIN_BYTES if min_bytes is None else int(min_bytes)
        # (weakref to the flat array, bytes a row or None, row -> first index or None, bits)
        self._held: list[tuple] = []
        self.released_to = 0

    def __len__(self) -> int:
        """Arrays held in files (and alive)."""
        return sum(1 for _ in self._live())

    def zeros(self, shape, dtype, *, index: np.ndarray | None = None,
              bits: bool = False) -> np.ndarray:
        """An array of zeros (in a file: a new file reads as zeros).  Row ``r`` of
        a per-request array is ``a[r]``; with ``index`` (offsets, N + 1), request ``r``'s
        entries start at ``a[index[r]]`` (per block arrays), with ``bits`` at bit
        ``index[r]`` of a little-order bit array."""
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if nbytes < self.min_bytes or nbytes == 0:
            return np.zeros(shape, dt)
        m = _mapped(nbytes)
        flat = np.frombuffer(m, dtype=dt, count=nbytes // dt.itemsize)
        row = None if index is not None else dt.itemsize * int(np.prod(shape[1:],
                                                                       dtype=np.int64))
        # held weakly: an array dropped by the run (a released column) is not kept alive
        # here, nor what is cached on it (its mapping goes with it)
        self._held.append((weakref.ref(flat), row, index, bits))
        return flat.reshape(shape)

    def full(self, shape, fill, dtype, **kw) -> np.ndarray:
        a = self.zeros(shape, dtype, **kw)
        a[...] = fill
        return a

    def copy(self, x: np.ndarray, *, drop: bool = False, **kw) -> np.ndarray:
        """``x`` (contiguous, its dtype) in the store; ``x`` itself when it is small.
        ``drop``: its pages given back once written (the run maps back what it reads)."""
        x = np.asarray(x)
        if x.nbytes < self.min_bytes or x.dtype.hasobject or self.holds(x):
            return x
        a = self.zeros(x.shape, x.dtype, **kw)
        np.copyto(a, x)
        if drop:
            m = _root(a).base.obj
            m.madvise(mmap.MADV_DONTNEED, 0, len(m))
        return a

    def _live(self) -> Iterator[tuple]:
        """(mapping, flat array, bytes a row, index, bits) of each array still alive."""
        for ref, row, index, bits in self._held:
            a = ref()
            if a is not None:
                yield a.base.obj, a, row, index, bits

    def holds(self, a: np.ndarray) -> bool:
        a = _root(a)
        return any(h[1] is a for h in self._live())

    def release_below(self, row: int) -> int:
        """Give back the whole pages of every array that lie below request ``row`` (the
        data stays in the files); returns the bytes advised."""
        row = max(int(row), 0)
        done = 0
        for m, a, per_row, index, bits in self._live():
            if per_row is not None:
                end = row * per_row
            else:
                at = int(index[min(row, index.shape[0] - 1)])
                end = (at >> 3) if bits else at * a.dtype.itemsize
            end = min(end, len(m)) // PAGE * PAGE
            if end > 0:
                m.madvise(mmap.MADV_DONTNEED, 0, end)
                done += end
        self.released_to = row
        return done

    def release_all(self) -> int:
        """Give back every page (after the set-up wrote them: the run maps back what it
        reads); returns the bytes advised."""
        done = 0
        for m, *_ in self._live():
            m.madvise(mmap.MADV_DONTNEED, 0, len(m))
            done += len(m)
        return done

    def resident_bytes(self) -> int:
        """Bytes of the store's arrays mapped in this process now (Linux
        ``/proc/self/pagemap``; 0 where it cannot be read)."""
        total = 0
        try:
            with open("/proc/self/pagemap", "rb", buffering=0) as pm:
                for _m, a, *_ in self._live():
                    addr = a.__array_interface__["data"][0]
                    p0, p1 = addr // PAGE, (addr + a.nbytes - 1) // PAGE
                    pm.seek(p0 * 8)
                    e = np.frombuffer(pm.read((p1 - p0 + 1) * 8), dtype=np.uint64)
                    total += int(np.count_nonzero(e & np.uint64(1 << 63))) * PAGE
        except OSError:
            return 0
        return total


def _root(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s memory (a file array's: its base is the mapping's view)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _mapped(nbytes: int) -> mmap.mmap:
    """A shared mapping of ``nbytes`` of an unlinked temporary file, its blocks reserved."""
    from kvsim.core.spill import _spill_error, _tmpdir

    size = -(-nbytes // PAGE) * PAGE
    try:
        with tempfile.TemporaryFile(prefix="kvsim-rows-", dir=_tmpdir(), buffering=0) as f:
            try:
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as exc:  # not supported by the file system: a sparse file
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(f.fileno(), size)
            return mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as exc:
        raise _spill_error(exc) from None


_ACTIVE: list[RowStore] = []


@contextlib.contextmanager
def active(store: RowStore | None) -> Iterator[RowStore | None]:
    """Make ``store`` the one :func:`zeros`, :func:`full` and :func:`copy` use meanwhile
    (None: ordinary arrays)."""
    _ACTIVE.append(store)
    try:
        yield store
    finally:
        _ACTIVE.pop()


def current() -> RowStore | None:
    return _ACTIVE[-1] if _ACTIVE else None


def zeros(shape, dtype, **kw) -> np.ndarray:
    """``np.zeros`` in the current store (:func:`active`), else in memory."""
    s = current()
    return np.zeros(shape, dtype) if s is None else s.zeros(shape, dtype, **kw)


def full(shape, fill, dtype, **kw) -> np.ndarray:
    """``np.full`` in the current store, else in memory."""
    s = current()
    return np.full(shape, fill, dtype) if s is None else s.full(shape, fill, dtype, **kw)


def copy(x: np.ndarray, **kw) -> np.ndarray:
    """``x`` in the current store (``x`` itself when small or no store is current)."""
    s = current()
    return x if s is None else s.copy(x, **kw)


def release_below(row: int) -> int:
    """:meth:`RowStore.release_below` of the current store (0 when none)."""
    s = current()
    return 0 if s is None else s.release_below(row)
