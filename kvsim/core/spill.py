"""Tables that grow with a trace's length, kept in bounded memory, and exact statistics
over them (issue 38, "Memory grows with what is resident, not with the trace").

:class:`SpilledRows` holds float64 rows appended chunk by chunk: the first
``mem_rows`` rows in memory, the rest in an anonymous temporary file (removed by the
operating system when it is closed or the process ends, however it ends).  A replay's
per-step table (12 float64 a step, ~1.2 M steps for 10x the Mooncake conversation trace)
lives in one, so that the peak resident set no longer grows with the number of steps.

:func:`exact_stats` gives the count, mean and percentiles of one column of such a table
(rows filtered by a predicate, NaNs dropped) in bounded memory and **exactly** equal to
``np.percentile`` (linear interpolation, numpy's default) and ``np.mean`` of the filtered
column held in memory, bit for bit:

* a percentile needs two order statistics; they are found by a radix select over the
  float64 values' bits (4 passes of 16 bits over the spilled values, 65,536 counters per
  wanted rank), then interpolated by the same formula as numpy's ``_lerp``
  (:func:`percentile_of`);
* the mean repeats numpy's pairwise summation (``pairwise_sum`` in numpy's
  ``loops_utils.h``: halves rounded down to a multiple of 8, blocks of at most 128 summed
  with 8 accumulators): a range of up to :data:`SUM_LEAF_ROWS` values is summed by
  ``np.add.reduce`` itself, a longer one split where numpy splits it, so the float64
  additions are the same ones in the same order.

``tests/sim/test_spill.py`` checks both against numpy on random data, spilled and not.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Callable, Iterator

import numpy as np

#: Rows kept in memory before a :class:`SpilledRows` writes to its temporary file: 2^17
#: rows (12 MiB at 12 columns) holds the per-step table of the whole Mooncake
#: conversation trace (121,960 steps at 512-token blocks), so a replay of that size never
#: touches the disk.
MEM_ROWS = 1 << 17

#: Values read from a temporary file at a time (1 MiB of float64): the radix select's
#: temporaries are a few times that (~50 MB at 2^20 values; the peak RSS of 10x the
#: Mooncake trace is reached earlier, in the replay, and did not change either way).
CHUNK_VALUES = 1 << 17

#: The longest range the replica of numpy's pairwise sum hands to ``np.add.reduce``
#: whole.  Any length works (numpy's split points depend only on the length); 2^17 keeps
#: each read at 1 MiB.
SUM_LEAF_ROWS = 1 << 17


def _tmpdir() -> str | None:
    """Where temporary files go: ``KVSIM_TMPDIR`` when set (an existing folder, else a
    one-line error naming it, exit 2: :func:`kvsim.core.options.spill_dir`), else Python's
    default (``TMPDIR``, then /tmp)."""
    from kvsim.core.options import spill_dir

    return spill_dir()


class SpillFile(io.FileIO):
    """An anonymous temporary file (unbuffered: a write reaches the disk when it is made)
    whose every failed write or creation is one line naming the folder and the cause
    (disk full, quota, ``ulimit -f``): :class:`kvsim.core.errors.KvsimResourceError`, exit
    1 (an anonymous file has no name for the CLI to print)."""

    @classmethod
    def new(cls, prefix: str) -> SpillFile:
        try:
            with tempfile.TemporaryFile(prefix=prefix, dir=_tmpdir(), buffering=0) as f:
                return cls(os.dup(f.fileno()), "r+b")
        except OSError as exc:
            raise _spill_error(exc) from None

    def write(self, b) -> int:  # type: ignore[override]
        view, done = memoryview(b).cast("B"), 0
        while done < len(view):  # a raw write may take part of it (2 GiB at most on Linux)
            try:
                done += super().write(view[done:])
            except OSError as exc:
                raise _spill_error(exc) from None
        return done


def _spill_error(exc: OSError) -> Exception:
    from kvsim.core.errors import KvsimResourceError
    from kvsim.core.fsutil import disk_full_cause, is_disk_full

    folder = os.environ.get("KVSIM_TMPDIR") or tempfile.gettempdir()
    cause = disk_full_cause(exc) if is_disk_full(exc) else exc.strerror or str(exc)
    return KvsimResourceError(f"{folder}: cannot write a temporary file (a table kept out "
                              f"of memory): {cause}; partial outputs removed (KVSIM_TMPDIR "
                              "names another folder)")


class SpilledRows:
    """Rows of ``ncols`` columns (float64, or ``dtype``), appended in chunks; at most
    ``mem_rows`` in memory, the rest in an anonymous temporary file, read back in row
    order."""

    def __init__(self, ncols: int, mem_rows: int | None = None,
                 dtype: type = np.float64) -> None:
        self.ncols = int(ncols)
        self.dtype = np.dtype(dtype)
        self.mem_rows = MEM_ROWS if mem_rows is None else int(mem_rows)
        self.chunks: list[np.ndarray] = []
        self.mem_count = 0
        self.file = None
        self.file_rows = 0

    def __len__(self) -> int:
        return self.mem_count + self.file_rows

    @property
    def spilled(self) -> bool:
        return self.file_rows > 0

    def append(self, rows: np.ndarray) -> None:
        """Append ``rows`` (k x ncols of the rows' dtype; copied)."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype).reshape(-1, self.ncols)
        room = max(self.mem_rows - self.mem_count, 0) if self.file is None else 0
        if room:
            head = rows[:room].copy()
            self.chunks.append(head)
            self.mem_count += len(head)
            rows = rows[room:]
        if len(rows):
            if self.file is None:
                self.file = SpillFile.new("kvsim-rows-")
            self.file.write(rows.data)  # C-contiguous rows: no copy (tobytes)
            self.file_rows += len(rows)

    def iter_chunks(self, rows: int = CHUNK_VALUES // 16) -> Iterator[np.ndarray]:
        """The rows in order, as arrays of at most ``rows`` rows (the in-memory chunks as
        they are)."""
        yield from self.chunks
        if self.file is None:
            return
        self.file.flush()
        self.file.seek(0)
        left = self.file_rows
        while left:
            k = min(rows, left)
            yield np.fromfile(self.file, dtype=self.dtype, count=k * self.ncols).reshape(
                k, self.ncols)
            left -= k

    def to_array(self) -> np.ndarray:
        """Every row as one array (what the whole table costs in memory)."""
        if not len(self):
            return np.zeros((0, self.ncols), self.dtype)
        return np.concatenate(list(self.iter_chunks()))

    def __getstate__(self) -> dict:
        """Pickled (a result sent from a worker process) with every row in memory."""
        state = dict(self.__dict__)
        state.update(chunks=[self.to_array()] if len(self) else [], mem_count=len(self),
                     file=None, file_rows=0)
        return state

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
            self.file_rows = 0


#: Bytes of a :class:`PackedBits` kept in memory before it moves to its temporary file
#: (2 Mi flags: the ``seen`` flags of the Mooncake conversation trace's 4.1 M ALLOCATE rows
#: at 512-token blocks are 0.5 MB, in memory; 100x that trace, 52 MB, go to the file).
BITS_MEM_BYTES = 1 << 18


class PackedBits:
    """0/1 flags appended in order and packed (flag ``o`` is bit ``o & 7`` of byte
    ``o >> 3``): the first ``mem_bytes`` bytes in memory, then all of them in an anonymous
    temporary file; :meth:`get` reads any range back.  Call :meth:`finish` after the last
    :meth:`append`."""

    def __init__(self, mem_bytes: int | None = None) -> None:
        self.mem_bytes = BITS_MEM_BYTES if mem_bytes is None else int(mem_bytes)
        self.mem = bytearray()
        self.file = None
        self.nbytes = 0  # whole bytes written (memory or file)
        self.tail = np.zeros(0, dtype=np.uint8)  # flags after the last whole byte (< 8)
        self.n = 0  # flags appended

    def __len__(self) -> int:
        """Bytes holding the flags."""
        return (self.n + 7) // 8

    def append(self, flags: np.ndarray) -> None:
        f = np.concatenate([self.tail, np.asarray(flags, dtype=np.uint8) != 0])
        whole = len(f) & ~7
        self._write(np.packbits(f[:whole], bitorder="little").tobytes())
        self.tail = f[whole:].astype(np.uint8)
        self.n += len(flags)

    def finish(self) -> None:
        if len(self.tail):
            self._write(np.packbits(self.tail, bitorder="little").tobytes())
            self.tail = np.zeros(0, dtype=np.uint8)
        if self.file is not None:
            self.file.flush()

    def _write(self, b: bytes) -> None:
        if self.file is None and len(self.mem) + len(b) > self.mem_bytes:
            self.file = SpillFile.new("kvsim-bits-")
            self.file.write(bytes(self.mem))
            self.mem = bytearray()
        if self.file is None:
            self.mem += b
        else:
            self.file.write(b)
        self.nbytes += len(b)

    def get(self, base: int, m: int) -> np.ndarray:
        """Flags ``base .. base + m - 1`` (int8)."""
        if m <= 0:
            return np.zeros(0, dtype=np.int8)
        lo, hi = base >> 3, (base + m + 7) >> 3
        if self.file is None:
            raw = bytes(self.mem[lo:hi])
        else:
            raw = os.pread(self.file.fileno(), hi - lo, lo)
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
        return bits[base & 7:(base & 7) + m].astype(np.int8)

    def to_array(self) -> np.ndarray:
        """Every packed byte (uint8, ``len(self)`` of them), after :meth:`finish`."""
        if self.file is None:
            return np.frombuffer(bytes(self.mem), dtype=np.uint8)
        return np.frombuffer(os.pread(self.file.fileno(), self.nbytes, 0), dtype=np.uint8)

    @classmethod
    def from_array(cls, packed: np.ndarray, n: int, mem_bytes: int | None = None):
        """The flags ``n`` flags long that :meth:`to_array` gave as ``packed``, finished
        (in memory up to ``mem_bytes``, else in a temporary file, as when appended)."""
        bits = cls(mem_bytes)
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        if len(packed) != (int(n) + 7) // 8:
            raise ValueError(f"PackedBits: {len(packed)} bytes cannot hold {n} flags")
        bits._write(packed.tobytes())
        bits.n = int(n)
        bits.finish()
        return bits

    def __getstate__(self) -> dict:
        """Pickled (facts sent to a worker process) with every byte in memory."""
        state = dict(self.__dict__)
        if self.file is not None:
            state["mem"] = bytearray(os.pread(self.file.fileno(), self.nbytes, 0))
        state.update(file=None, mem_bytes=max(self.mem_bytes, self.nbytes))
        return state


class IntsFile:
    """A 1-D integer array moved to an anonymous temporary file, read back on use:
    ``len``, an element (``a[k]``) or a slice (``a[lo:]``, as an array)."""

    def __init__(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        self.dtype, self.n = a.dtype, len(a)
        self.file = SpillFile.new("kvsim-ints-")
        self.file.write(a.tobytes())
        self.file.flush()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k):
        lo, hi, step = (k.indices(self.n) if isinstance(k, slice) else
                        (range(self.n)[k], range(self.n)[k] + 1, 1))
        if step != 1:
            raise IndexError("IntsFile: slices with a step are not supported")
        w = self.dtype.itemsize
        out = np.frombuffer(os.pread(self.file.fileno(), max(hi - lo, 0) * w, lo * w),
                            dtype=self.dtype).copy()
        return out if isinstance(k, slice) else out[0]

    def __getstate__(self) -> dict:
        """Pickled (facts sent to a worker process) in memory: an array."""
        return {"a": self[:]}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["a"])


class _Values:
    """One float64 column in a temporary file (or in memory when small): what
    :func:`exact_stats` selects and sums over."""

    def __init__(self) -> None:
        self.file = SpillFile.new("kvsim-col-")
        self.n = 0

    def append(self, v: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(v, dtype=np.float64).tobytes())
        self.n += len(v)

    def read(self, lo: int, count: int) -> np.ndarray:
        self.file.flush()
        self.file.seek(8 * lo)
        return np.fromfile(self.file, dtype=np.float64, count=count)

    def chunks(self) -> Iterator[np.ndarray]:
        for lo in range(0, self.n, CHUNK_VALUES):
            yield self.read(lo, min(CHUNK_VALUES, self.n - lo))


def _keys(v: np.ndarray) -> np.ndarray:
    """float64 -> uint64 keys in the same order (NaN-free input): the sign bit flipped for
    a positive value, every bit for a negative one."""
    u = v.view(np.uint64)
    return np.where(u >> np.uint64(63), ~u, u | np.uint64(1 << 63))


def _values(keys: np.ndarray) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.uint64)
    u = np.where(keys >> np.uint64(63), keys & np.uint64((1 << 63) - 1), ~keys)
    return u.view(np.float64)


def select_ranks(chunks: Callable[[], Iterator[np.ndarray]], ranks) -> dict[int, float]:
    """The order statistics ``ranks`` (0-based, of the sorted values) of the NaN-free
    float64 values that ``chunks()`` yields (called once per pass; 4 passes): an exact
    radix select, 65,536 counters per rank."""
    want = sorted({int(r) for r in ranks})
    prefix = {r: 0 for r in want}  # the key's bits found so far
    left = {r: r for r in want}  # the rank within the values sharing that prefix
    for shift in (48, 32, 16, 0):
        groups: dict[int, list[int]] = {}
        for r in want:
            groups.setdefault(prefix[r], []).append(r)
        hist = {p: np.zeros(1 << 16, dtype=np.int64) for p in groups}
        for v in chunks():
            k = _keys(v)
            top = k >> np.uint64(shift + 16) if shift < 48 else None
            digit = ((k >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64)
            for p, h in hist.items():
                d = digit if top is None else digit[top == np.uint64(p)]
                h += np.bincount(d, minlength=1 << 16)
        for p, rs in groups.items():
            cum = np.cumsum(hist[p])
            for r in rs:
                d = int(np.searchsorted(cum, left[r], side="right"))
                left[r] -= int(cum[d - 1]) if d else 0
                prefix[r] = (prefix[r] << 16) | d
    return {r: float(_values(np.uint64(prefix[r]))) for r in want}


def _percentile_ranks(n: int, q: float) -> tuple[int, int, float]:
    """numpy's linear method: the two ranks and the weight of ``q`` percent of ``n``
    values (numpy's ``_quantile``, ``_get_indexes``, ``_get_gamma``)."""
    vi = (n - 1) * np.true_divide(q, 100)
    prev = float(np.floor(vi))
    if vi >= n - 1:
        return n - 1, n - 1, float(vi - (-1))
    if vi < 0:
        return 0, 0, float(vi - prev)
    return int(prev), int(prev) + 1, float(vi - prev)


def percentile_of(n: int, q: float, order: Callable[[int], float]) -> float:
    """``np.percentile(x, q)`` of ``n`` values whose k-th smallest is ``order(k)``, bit for
    bit (numpy's ``_lerp``)."""
    i, j, t = _percentile_ranks(n, q)
    a = np.float64(order(i))
    b = np.float64(order(j))
    t = np.float64(t)
    diff = np.subtract(b, a)
    if t >= 0.5:
        return float(np.subtract(b, diff * (1 - t)))
    return float(np.add(a, diff * t))


def pairwise_sum(n: int, read: Callable[[int, int], np.ndarray], lo: int = 0) -> float:
    """``np.add.reduce`` of ``n`` float64 values read by ``read(lo, count)``, bit for bit:
    numpy's pairwise summation split where numpy splits it (ranges of at most
    :data:`SUM_LEAF_ROWS` summed by numpy)."""
    if n <= SUM_LEAF_ROWS:
        return float(np.add.reduce(read(lo, n))) if n else 0.0
    n2 = n // 2
    n2 -= n2 % 8
    return float(np.float64(pairwise_sum(n2, read, lo)) +
                 np.float64(pairwise_sum(n - n2, read, lo + n2)))


def exact_stats(rows: SpilledRows, col: int, qs, keep: Callable[[np.ndarray], np.ndarray]
                | None = None) -> tuple[int, float, list[float]]:
    """(count, mean, percentiles ``qs``) of column ``col`` of ``rows`` over the rows that
    ``keep(chunk)`` (a boolean mask) keeps: exactly ``len(x)``, ``x.mean()`` (NaN when a
    value is NaN) and ``np.percentile(x[~np.isnan(x)], q)`` (NaN when none is left) of
    that column held in memory as ``x``."""
    def kept(chunk: np.ndarray) -> np.ndarray:
        return chunk[:, col] if keep is None else chunk[keep(chunk), col]

    if not rows.spilled:
        x = np.concatenate([kept(c) for c in rows.chunks]) if rows.chunks else np.zeros(0)
        y = x[~np.isnan(x)]
        if not len(y):
            return len(x), math.nan, [math.nan for _ in qs]
        return len(x), float(x.mean()), [float(np.percentile(y, q)) for q in qs]
    return streamed_stats((kept(chunk) for chunk in rows.iter_chunks()), qs)


def streamed_stats(values: Iterator[np.ndarray], qs) -> tuple[int, float, list[float]]:
    """(count, mean, percentiles ``qs``) of the float64 values ``values`` yields, in
    bounded memory (a temporary file, one chunk at a time): exactly ``len(x)``,
    ``x.mean()`` (NaN when a value is NaN) and ``np.percentile(x[~np.isnan(x)], q)`` of
    their concatenation ``x`` (:func:`exact_stats`)."""
    vals = _Values()
    count = 0
    try:
        for v in values:
            count += len(v)
            vals.append(v[~np.isnan(v)])
        n = vals.n
        if not n:
            return count, math.nan, [math.nan for _ in qs]
        plan = [_percentile_ranks(n, q) for q in qs]
        got = select_ranks(vals.chunks, [r for i, j, _ in plan for r in (i, j)])
        pcts = [percentile_of(n, q, got.__getitem__) for q in qs]
        mean = math.nan if count > n else \
            float(np.float64(pairwise_sum(n, vals.read)) / np.float64(n))
        return count, mean, pcts
    finally:
        vals.file.close()
