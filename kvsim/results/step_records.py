"""A closed-loop replica's per-step records, kept as its outputs read them (issues 34 and
38: cheaper, and memory that grows with what is resident, not with the trace).

The compiled step writes one row per engine step into the core's step buffer (12 float64:
:data:`kvsim.core.layout.NS`, ``S_STEP`` ... ``S_HBM_CACHED``) and one ``in_system`` count
(requests arrived and not finished) into the engine's ``insys`` buffer; Python empties
both when they fill (``_Run._flush_steps``, :meth:`StepRecords.take_in_system`).  What
reads them:

* the summary's step figures (``steps``, ``mean_step_us``, ``p50_step_us`` ...
  ``p999_step_us``): the latency of the measured steps only (a replica's from the step the
  warm-up ended at, ``K_WARMUP_STEP``, on; the cluster's are every replica's, in replica
  order), and a replica's row (``SimResult.summary["replica_rows"]``) their count;
* ``SimResult.steps`` (the Python API: tests, sweep cells, notebooks): every column of
  :func:`kvsim.replay.metrics.step_table` and ``in_system``, one row per step.

So a :class:`StepRecords` is made in one of two modes:

* ``table=True`` (the API's default): the rows as the core wrote them, in a
  :class:`kvsim.core.spill.SpilledRows` (in memory up to ``MEM_ROWS`` steps, then in a
  temporary file), and ``in_system`` as int64 in another (8 bytes a step, in memory up to
  :data:`INSYS_MEM_ROWS`): both bounded in memory;
* ``table=False`` (``kvsim simulate`` / ``compare`` on a request trace, which print the
  figures and never the table: :func:`kvsim.modes.closed.cluster.serve` ``step_table``):
  the latency (float64, its exact bits) of the measured steps only, 8 bytes a step
  instead of 104, at most :data:`MEM_VALUES` in memory then in a temporary file, and
  ``in_system`` dropped as it is emptied.  A step is measured when no warm-up is asked
  for, or when its step number is at least ``K_WARMUP_STEP`` as the warm-up ended: a
  replica's steps are numbered in increasing order and a row reaches Python only after
  its step was closed, so a row emptied while ``K_WARMUP_STEP`` is still unset (-1)
  belongs to a step scheduled before the warm-up ended and is never measured (the rule
  :class:`kvsim.modes.closed.serving_metrics.ClusterSteps` applies to a table).

The figures are the same bits either way (:func:`latency_stats`): the values are those
the table's latency column holds, in the same order, and up to :data:`LOAD_VALUES` of
them are read into one array and given to numpy (``mean``, ``percentile``) as the table's
column was; more are streamed, exact (:func:`kvsim.core.spill.streamed_stats`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from kvsim.core import layout as L
from kvsim.core.spill import SpilledRows, SpillFile, streamed_stats

#: Latencies a replica keeps in memory before its temporary file (512 KiB: the 8
#: replicas of the Mooncake conversation trace record ~300,000 steps each, so most of
#: their 2.42 M values go to the files, ~19 MB in all).
MEM_VALUES = 1 << 16

#: ``in_system`` values a table-mode replica keeps in memory (512 KiB) before its file.
INSYS_MEM_ROWS = 1 << 16

#: Measured steps (over every replica) whose latencies :func:`latency_stats` reads into
#: one array for numpy (32 MiB at most, while the summary is made); above this they are
#: streamed (exact, bounded memory, ~4 passes over a temporary file).  2^22 holds the
#: 2.42 M steps of 8 replicas on the Mooncake conversation trace; 10x that trace streams.
LOAD_VALUES = 1 << 22


class Float64Values:
    """float64 values appended in order: the first ``mem_values`` in memory, the rest in
    an anonymous temporary file (removed by the operating system however the process
    ends), read back in order (:meth:`chunks`)."""

    def __init__(self, mem_values: int | None = None) -> None:
        self.mem_values = MEM_VALUES if mem_values is None else int(mem_values)
        self.head: list[np.ndarray] = []
        self.mem_count = 0
        self.file = None
        self.file_count = 0

    def __len__(self) -> int:
        return self.mem_count + self.file_count

    @property
    def spilled(self) -> bool:
        return self.file_count > 0

    def append(self, v: np.ndarray) -> None:
        """Append the values ``v`` (copied)."""
        v = np.ascontiguousarray(v, dtype=np.float64)
        room = max(self.mem_values - self.mem_count, 0) if self.file is None else 0
        if room:
            head = v[:room].copy()
            self.head.append(head)
            self.mem_count += len(head)
            v = v[room:]
        if len(v):
            if self.file is None:
                self.file = SpillFile.new("kvsim-steps-")
            self.file.write(v.data)
            self.file_count += len(v)

    def chunks(self, values: int = 1 << 17) -> Iterator[np.ndarray]:
        """The values in order, as arrays of at most ``values`` (the in-memory ones as
        they are)."""
        yield from self.head
        if self.file is None:
            return
        self.file.flush()
        self.file.seek(0)
        left = self.file_count
        while left:
            k = min(values, left)
            yield np.fromfile(self.file, dtype=np.float64, count=k)
            left -= k

    def __getstate__(self) -> dict:
        """Pickled (a result sent from a worker process) with every value in memory."""
        state = dict(self.__dict__)
        every = list(self.chunks())
        state.update(head=[np.concatenate(every)] if every else [], mem_count=len(self),
                     file=None, file_count=0)
        return state

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
            self.file_count = 0


class StepRecords:
    """One replica's per-step records (module docstring): the core's step rows
    (:meth:`append`, ``_Run._flush_steps``) and the engine's ``in_system`` counts
    (:meth:`take_in_system`), as a table (``table``) or as the measured steps' latencies.
    ``K``: the core's ``K`` array (``K_WARMUP_STEP`` is read when rows arrive);
    ``warmup``: a warm-up was asked for (the steps before it are not measured)."""

    def __init__(self, table: bool = True, K: np.ndarray | None = None,
                 warmup: bool = False, mem_values: int | None = None) -> None:
        self.rows = SpilledRows(L.NS) if table else None
        self.insys = SpilledRows(1, INSYS_MEM_ROWS) if table else None  # int64 bits
        self.latency = None if table else Float64Values(mem_values)
        self.K = K
        self.warmup = bool(warmup)
        self.steps = 0  # rows appended (every step, measured or not)
        self.insys_taken = 0  # in_system values taken from the engine's buffer

    @property
    def table(self) -> bool:
        return self.rows is not None

    def __len__(self) -> int:
        return self.steps

    @property
    def spilled(self) -> bool:
        return (self.rows if self.table else self.latency).spilled

    def append(self, rows: np.ndarray) -> None:
        """The step rows ``rows`` (k x NS float64, the core's step buffer; copied)."""
        self.steps += len(rows)
        if self.table:
            self.rows.append(rows)
            return
        if self.warmup:
            w = int(self.K[L.K_WARMUP_STEP])
            if w < 0:  # closed before the warm-up ended: not measured
                return
            rows = rows[rows[:, L.S_STEP].astype(np.int64) >= w]
        self.latency.append(rows[:, L.S_LATENCY_US])

    def take_in_system(self, insys: np.ndarray, aux: np.ndarray, col: int,
                       last: bool = False) -> None:
        """The engine's ``in_system`` buffer holds ``aux[col]`` values: when it is half
        full or more, or at the ``last`` step, keep them (a table) or drop them, and empty
        the buffer in place (its count set to 0; the engine counts its steps as
        :attr:`insys_taken` + ``aux[col]``)."""
        n = int(aux[col])
        if n < len(insys) // 2 and not last:
            return
        if self.table and n:
            self.insys.append(np.ascontiguousarray(insys[:n]).view(np.float64))
        self.insys_taken += n
        aux[col] = 0

    def in_system(self, tail: np.ndarray | None = None) -> np.ndarray:
        """Every step's ``in_system`` (int64): the values taken, then ``tail`` (the ones
        still in the engine's buffer, if any).  A table only (empty otherwise)."""
        if not self.table:
            return np.zeros(0, dtype=np.int64)
        taken = self.insys.to_array().reshape(-1).view(np.int64)
        if tail is None or not len(tail):
            return taken
        return np.concatenate([taken, np.asarray(tail, dtype=np.int64)])

    def to_array(self) -> np.ndarray:
        """The step rows as one array (a table only)."""
        if not self.table:
            raise ValueError("step rows not kept (StepRecords(table=False))")
        return self.rows.to_array()

    def measured_latencies(self) -> Iterator[np.ndarray]:
        """The measured steps' latencies, in step order (``table=False`` only)."""
        return self.latency.chunks()

    def close(self) -> None:
        for v in (self.rows, self.insys, self.latency):
            if v is not None:
                v.close()


def latency_stats(values: Iterator[np.ndarray], qs) -> tuple[int, float, list[float]]:
    """(count, mean, percentiles ``qs``) of the float64 values the chunks ``values``
    yields, exactly as numpy gives them for their concatenation ``x`` held in memory
    (``len(x)``, ``x.mean()``, and ``np.percentile`` of the values that are not NaN, NaN
    for none): read into one array while they are at most :data:`LOAD_VALUES`, else
    streamed (:func:`kvsim.core.spill.streamed_stats`, bounded memory)."""
    held, n = [], 0
    for v in values:
        held.append(v)
        n += len(v)
        if n > LOAD_VALUES:
            return streamed_stats(itertools.chain(held, values), qs)
    x = np.concatenate(held) if held else np.zeros(0)
    mean = float(x.mean()) if len(x) else float("nan")
    y = x[~np.isnan(x)]
    if not len(y):
        return len(x), mean, [float("nan")] * len(qs)
    return len(x), mean, [float(v) for v in np.percentile(y, list(qs))]
