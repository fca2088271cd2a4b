"""Trace summary: what an event file contains, computed in one streaming pass.

:func:`summarize_trace` reads an event file batch by batch (never whole) and returns a
:class:`TraceSummary`.  Resident state is bounded by what the trace names, not by its
length: the set of distinct request ids and the sorted array of distinct content hashes.

Definitions (the exact numbers ``kvsim inspect`` prints; docs/cli.md):

- ``requests``: distinct ``request_id`` of ``ARRIVE`` rows; if the file has no ``ARRIVE``
  row, distinct ``request_id >= 0`` of any row.
- ``unique_blocks``: distinct non-zero ``content_hash`` of ``ALLOCATE`` rows, plus every
  ``ALLOCATE`` row with ``content_hash == 0`` (a block without content identity is its own
  block).
- ``bytes``: sum of ``size_bytes`` over ``ALLOCATE`` rows, split by ``phase`` and
  ``priority`` of those rows, and by tier of initial placement (always HBM: the replay
  allocates every block in HBM).
- ``prefix_reuse_fraction``: among prompt-block references (``ALLOCATE`` rows with phase
  ``PREFILL``), the share whose ``content_hash`` is non-zero and already appeared on an
  earlier ``ALLOCATE`` row of the file: the block hit rate of an infinite prefix cache.
  0.0 when the file has no prompt blocks.
- ``steps``: distinct ``step`` values (steps never decrease, so a count of changes);
  ``time``: min / max ``time_us`` over all rows.
- tokens: ``prompt_tokens`` = sum of ``num_tokens`` on ``ARRIVE`` rows;
  ``prefill_tokens_computed`` / ``decode_tokens`` = sum of ``num_tokens`` on ``ACCESS`` rows
  in phase ``PREFILL`` / ``DECODE``.

- ``chunk_reuse``: copied from the header's ``source.chunk_reuse`` when the reader knew
  chunk identity (ragpulse, kvsim.ingest.ragpulse.chunk_reuse): the share of chunk tokens
  an infinite cache reuses by prefix, position-independently (a chunk's KV reused wherever
  it recurs, CacheBlend-style), and the extra the latter finds.  None for other traces.

The summary never depends on the file format: the same events as Parquet and JSONL give
an identical summary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.core.schema import COLUMN_NAMES, ENUM_COLUMNS, EventKind, Phase, Priority, Tier
from kvsim.events import DTYPES, header_dict, open_events
from kvsim.events.prefix_reuse import PrefixReuse

__all__ = ["TraceSummary", "summarize_trace", "head_events"]


@dataclass(frozen=True)
class TraceSummary:
    """Counts and totals of one event file (see the module docstring for definitions)."""

    header: dict[str, Any] = field(metadata={"help": "the file's EventHeader as a dict"})
    requests: int = field(metadata={"help": "distinct requests (ARRIVE rows, else any row)"})
    events: int = field(metadata={"help": "rows in the file"})
    events_by_kind: dict[str, int] = field(metadata={"help": "rows per EventKind name"})
    unique_blocks: int = field(metadata={"help": "distinct hashed blocks + unhashed blocks"})
    allocated_blocks: int = field(metadata={"help": "ALLOCATE rows"})
    bytes: dict[str, Any] = field(metadata={"help": "allocated bytes: total, by_phase, "
                                            "by_priority, by_tier (initial placement)"})
    steps: int = field(metadata={"help": "distinct engine steps"})
    first_step: int | None = field(metadata={"help": "first step (None if empty)"})
    last_step: int | None = field(metadata={"help": "last step (None if empty)"})
    first_time_us: int | None = field(metadata={"help": "smallest time_us"})
    last_time_us: int | None = field(metadata={"help": "largest time_us"})
    time_span_us: int = field(metadata={"help": "last_time_us - first_time_us"})
    step_compute_us: float = field(metadata={"help": "sum of STEP duration_us"})
    prompt_tokens: int = field(metadata={"help": "sum of num_tokens on ARRIVE rows"})
    prefill_tokens_computed: int = field(metadata={"help": "num_tokens on PREFILL ACCESS rows"})
    decode_tokens: int = field(metadata={"help": "num_tokens on DECODE ACCESS rows"})
    prompt_block_refs: int = field(metadata={"help": "ALLOCATE rows in phase PREFILL"})
    prompt_block_reuses: int = field(metadata={"help": "of those, hash seen before"})
    prefix_reuse_fraction: float = field(metadata={"help": "prompt_block_reuses / "
                                                   "prompt_block_refs (infinite-cache hit rate)"})
    chunk_reuse: dict[str, Any] | None = field(default=None, metadata={
        "help": "traces with chunk identity (ragpulse): token reuse of an infinite cache by "
                "prefix vs position-independent (CacheBlend-style) at chunk granularity, "
                "from the header's source.chunk_reuse; None otherwise"})


def _unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort-based: numpy 2.4's hash-based np.unique is much slower
    on large int64 arrays)."""
    s = np.sort(values)
    if s.size == 0:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def _python_while_cold(num_rows: int | None) -> bool:
    """The prefix reuse's hash set as Python (:class:`kvsim.events.seen_set.SeenSet`) when
    THE engine rule (:func:`kvsim.spec.sim_config.resolve_engine`) would not compile for a
    file of ``num_rows`` rows (a small file, its pass not in numba's disk cache); a file whose
    length is unknown until read (JSONL) compiles it."""
    from kvsim.events import seen_set
    from kvsim.jit.disk_cache import cold
    from kvsim.spec.sim_config import resolve_engine

    return num_rows is not None and resolve_engine(
        "auto", num_rows, 1, lambda: not cold(seen_set._mark)) == "interpreted"


def summarize_trace(path: str | Path, batch_rows: int = 1 << 20,
                    on_progress: Callable[[int, int | None], None] | None = None
                    ) -> TraceSummary:
    """Stream the event file at ``path`` once and return its :class:`TraceSummary`.

    ``on_progress(rows_done, total_rows)`` is called after each batch (``total_rows`` is
    None for JSONL, whose length is unknown until the end).  Raises
    :class:`kvsim.core.errors.KvsimInputError` on any invalid row (see kvsim.events).
    """
    n_kinds = max(int(k) for k in EventKind) + 1
    n_phases = max(int(p) for p in Phase) + 1
    n_prios = max(int(p) for p in Priority) + 1
    kind_counts = np.zeros(n_kinds, dtype=np.int64)
    bytes_by_phase = np.zeros(n_phases, dtype=np.int64)
    bytes_by_prio = np.zeros(n_prios, dtype=np.int64)
    arrive_ids: set[int] = set()
    any_ids: set[int] = set()
    unhashed_blocks = 0
    allocated = 0
    events = 0
    steps = 0
    first_step: int | None = None
    last_step: int | None = None
    tmin: int | None = None
    tmax: int | None = None
    step_compute_us = 0.0
    prompt_tokens = prefill_computed = decode_tokens = 0
    alloc_code, arrive_code = int(EventKind.ALLOCATE), int(EventKind.ARRIVE)
    access_code, step_code = int(EventKind.ACCESS), int(EventKind.STEP)
    prefill_code, decode_code = int(Phase.PREFILL), int(Phase.DECODE)

    with open_events(path) as reader:
        header = header_dict(reader.header)
        reuse = PrefixReuse(_python_while_cold(reader.num_rows))
        for b in reader.batches(batch_rows):
            n = len(b["step"])
            if n == 0:
                continue
            events += n
            if on_progress is not None:
                on_progress(events, reader.num_rows)
            kind = b["kind"]
            kind_counts += np.bincount(kind, minlength=n_kinds)[:n_kinds]
            # steps: non-decreasing, so distinct = number of changes
            step = b["step"]
            changes = int(np.count_nonzero(step[1:] != step[:-1]))
            steps += changes + (1 if last_step is None or step[0] != last_step else 0)
            if first_step is None:
                first_step = int(step[0])
            last_step = int(step[-1])
            t = b["time_us"]
            tmin = int(t.min()) if tmin is None else min(tmin, int(t.min()))
            tmax = int(t.max()) if tmax is None else max(tmax, int(t.max()))
            step_compute_us += float(b["duration_us"][kind == step_code].sum())
            # requests
            rid = b["request_id"]
            arrive = kind == arrive_code
            if arrive.any():
                arrive_ids.update(_unique(rid[arrive]).tolist())
            if not arrive_ids:
                any_ids.update(_unique(rid[rid >= 0]).tolist())
            # tokens
            ntok = b["num_tokens"].astype(np.int64)
            phase = b["phase"]
            prompt_tokens += int(ntok[arrive].sum())
            access = kind == access_code
            prefill_computed += int(ntok[access & (phase == prefill_code)].sum())
            decode_tokens += int(ntok[access & (phase == decode_code)].sum())
            # blocks and bytes
            alloc = kind == alloc_code
            n_alloc = int(np.count_nonzero(alloc))
            if n_alloc == 0:
                continue
            allocated += n_alloc
            size = b["size_bytes"][alloc]
            bytes_by_phase += np.bincount(phase[alloc], weights=size,
                                          minlength=n_phases)[:n_phases].astype(np.int64)
            bytes_by_prio += np.bincount(b["priority"][alloc], weights=size,
                                         minlength=n_prios)[:n_prios].astype(np.int64)
            h = b["content_hash"][alloc]
            unhashed_blocks += int(np.count_nonzero(h == 0))
            reuse.add(h, phase[alloc] == prefill_code)

    requests = len(arrive_ids) if arrive_ids else len(any_ids)
    total_bytes = int(bytes_by_phase.sum())
    by_tier = {tier.name: (total_bytes if tier == Tier.HBM else 0)
               for tier in Tier if tier != Tier.NONE}
    return TraceSummary(
        header=header,
        requests=requests,
        events=events,
        events_by_kind={k.name: int(kind_counts[int(k)]) for k in EventKind},
        unique_blocks=reuse.distinct_hashes + unhashed_blocks,
        allocated_blocks=allocated,
        bytes={
            "total": total_bytes,
            "by_phase": {p.name: int(bytes_by_phase[int(p)]) for p in Phase},
            "by_priority": {p.name: int(bytes_by_prio[int(p)]) for p in Priority},
            "by_tier": by_tier,
        },
        steps=steps,
        first_step=first_step,
        last_step=last_step,
        first_time_us=tmin,
        last_time_us=tmax,
        time_span_us=(tmax - tmin) if tmin is not None and tmax is not None else 0,
        step_compute_us=step_compute_us,
        prompt_tokens=prompt_tokens,
        prefill_tokens_computed=prefill_computed,
        decode_tokens=decode_tokens,
        prompt_block_refs=reuse.refs,
        prompt_block_reuses=reuse.reuses,
        prefix_reuse_fraction=reuse.fraction,
        chunk_reuse=(header.get("source") or {}).get("chunk_reuse"),
    )


def head_events(path: str | Path, n: int) -> pd.DataFrame:
    """The first ``n`` events of a file (validated), enum columns as their names."""
    if n < 0:
        raise ValueError("n must be >= 0")
    parts: list[pd.DataFrame] = []
    got = 0
    if n > 0:
        with open_events(path) as reader:
            for b in reader.batches(batch_rows=min(max(n, 1), 1 << 16)):
                take = min(n - got, len(b["step"]))
                parts.append(pd.DataFrame({k: v[:take] for k, v in b.items()}))
                got += take
                if got >= n:
                    break
    if parts:
        df = pd.concat(parts, ignore_index=True)
    else:
        df = pd.DataFrame({name: np.empty(0, dtype=DTYPES[name]) for name in COLUMN_NAMES})
    for col, enum_cls in ENUM_COLUMNS.items():
        names = {int(m): m.name for m in enum_cls}
        df[col] = [names[int(v)] for v in df[col]]
    return df
