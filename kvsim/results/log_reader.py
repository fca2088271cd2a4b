"""Opening a decision log: validation, block identity, and streamed, filtered scans.

A :class:`DecisionLog` never loads the log whole.  Opening reads only the Parquet footer
(schema, metadata, row-group statistics); :meth:`DecisionLog.scan` streams record batches
with a column projection and a filter that pyarrow pushes down to row groups (a group whose
``step`` / ``seq`` / ``request_id`` statistics exclude the filter is never read).  Every
analysis in ``kvsim.results.log_*`` is built on :meth:`scan`.

Invariants the readers rely on (checked where they are used):

- rows are in ``seq`` order and ``step`` never decreases along ``seq``;
- a block's identity is its ``content_hash`` when non-zero, else (``request_id``,
  ``block_index``) of the request that allocated it (``kvsim.results.log_schema``).  In
  numpy it is the triple of columns returned by :func:`identity_columns`; as text it is the
  hash (``"1234"``) or ``"<request>:<index>"`` (:func:`format_block` / :func:`parse_block`).

Any problem with the file (not Parquet, truncated, wrong schema version, missing or
mistyped column, corrupt page) raises :class:`kvsim.core.errors.KvsimInputError` in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import Tier
from kvsim.results.log_schema import (
    LOG_COLUMNS,
    LOG_METADATA_KEY,
    LOG_SCHEMA_VERSION,
    REQUIRED_CANDIDATE_FIELDS,
    Action,
)

#: Rows per streamed batch: large enough to amortise per-batch numpy/pandas overhead,
#: small enough that the two or three batches in flight (~30 MB each with the candidates
#: column) stay far below 1 GiB.
BATCH_ROWS = 131_072

#: Actions that take a block out of a tier ("evictions" for regret and diff).
EVICTING = (int(Action.EVICT), int(Action.DEMOTE))
#: Actions that mean "this block's content was needed again and was not in HBM": the
#: requester paid a transfer (PROMOTE / PREFETCH) or recomputation (RECOMPUTE), or a new
#: block with the same content had to be allocated (ALLOCATE with a content hash).
NEEDING = (int(Action.PROMOTE), int(Action.PREFETCH), int(Action.RECOMPUTE))
#: Actions that use a block (a need, or a hit on a resident copy): "the next use" of a block.
USING = NEEDING + (int(Action.ALLOCATE), int(Action.HIT), int(Action.REVIVE))


def action_name(code: int) -> str:
    try:
        return Action(int(code)).name
    except ValueError:
        return f"ACTION_{int(code)}"


def tier_name(code: int) -> str:
    """``HBM``/``DRAM``/``CXL``/``NVME``; ``-`` for -1 (none)."""
    code = int(code)
    if code < 0:
        return "-"
    try:
        return Tier(code).name
    except ValueError:
        return f"TIER_{code}"


def parse_action(text: str) -> int:
    """Action name (case-insensitive) -> code, else KvsimInputError."""
    try:
        return int(Action[text.strip().upper()])
    except KeyError:
        names = ", ".join(a.name for a in Action)
        raise KvsimInputError(f"expected one of {names}, got {text!r}", field="action") from None


def parse_tier(text: str) -> int:
    try:
        return int(Tier[text.strip().upper()])
    except KeyError:
        names = ", ".join(t.name for t in Tier if t >= 0)
        raise KvsimInputError(f"expected one of {names}, got {text!r}", field="tier") from None


# --- block identity --------------------------------------------------------------------

BlockKey = tuple[int, int, int]  # (content_hash, request_id, block_index), normalised


def parse_block(text: str | int) -> BlockKey:
    """``"1234"`` (a non-zero content hash) or ``"7:3"`` (request 7, block index 3)."""
    raw = str(text).strip()
    try:
        if ":" in raw:
            req, idx = raw.split(":", 1)
            return (0, int(req), int(idx))
        value = int(raw)
    except ValueError:
        raise KvsimInputError("expected a content hash (integer) or <request>:<block_index>, "
                              f"got {raw!r}", field="block") from None
    if value == 0:
        raise KvsimInputError("expected a non-zero content hash (a block without one is "
                              "named <request>:<block_index>), got '0'", field="block")
    return (value, -1, -1)


def format_block(content_hash: int, request_id: int, block_index: int) -> str:
    if int(content_hash) != 0:
        return str(int(content_hash))
    return f"{int(request_id)}:{int(block_index)}"


def identity_columns(content_hash: np.ndarray, request_id: np.ndarray,
                     block_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The normalised identity triple: (hash, -1, -1) for hashed blocks, (0, r, i) else."""
    hashed = content_hash != 0
    return (content_hash.astype(np.int64, copy=False),
            np.where(hashed, -1, request_id).astype(np.int64),
            np.where(hashed, -1, block_index).astype(np.int64))


def block_filter(key: BlockKey) -> ds.Expression:
    h, r, i = key
    if h != 0:
        return ds.field("content_hash") == h
    return ((ds.field("content_hash") == 0) & (ds.field("request_id") == r)
            & (ds.field("block_index") == i))


def blocks_filter(keys: Iterable[BlockKey]) -> ds.Expression | None:
    """A filter matching any of ``keys`` (``is_in`` on hashes, OR of unhashed triples)."""
    keys = list(keys)
    hashes = sorted({k[0] for k in keys if k[0] != 0})
    expr = ds.field("content_hash").isin(pa.array(hashes, pa.int64())) if hashes else None
    for key in sorted({k for k in keys if k[0] == 0}):
        part = block_filter(key)
        expr = part if expr is None else expr | part
    return expr


# --- schema validation -----------------------------------------------------------------

def _type_ok(name: str, expected: pa.DataType, got: pa.DataType) -> bool:
    if name == "reason":
        if pa.types.is_dictionary(got):
            got = got.value_type
        return pa.types.is_string(got) or pa.types.is_large_string(got)
    if name == "candidates":
        if not (pa.types.is_list(got) or pa.types.is_large_list(got)):
            return False
        item = got.value_type
        if not pa.types.is_struct(item):
            return False
        have = {item.field(i).name for i in range(item.num_fields)}
        return REQUIRED_CANDIDATE_FIELDS <= have
    if pa.types.is_integer(expected):
        return pa.types.is_integer(got)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(got) or pa.types.is_integer(got)
    return expected.equals(got)


class DecisionLog:
    """A decision log on disk, opened lazily (only the footer is read here).

    Attributes: ``path``; ``metadata`` (the JSON under ``LOG_METADATA_KEY``: keys
    ``log_schema_version``, ``policy``, ``trace``, ``config``); ``policy``; ``trace``;
    ``num_rows``; ``num_row_groups``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise KvsimInputError("no such file", self.path)
        if self.path.is_dir():
            raise KvsimInputError("expected a decision-log Parquet file, got a directory",
                                  self.path)
        try:
            parquet = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise KvsimInputError("not a readable Parquet decision log (not Parquet, or "
                                  f"truncated): {first}", self.path) from None
        self._parquet = parquet
        schema = parquet.schema_arrow
        raw = (schema.metadata or {}).get(LOG_METADATA_KEY)
        if raw is None:
            raise KvsimInputError(f"expected Parquet metadata key {LOG_METADATA_KEY.decode()!r} "
                                  "(a kvsim decision log), found none", self.path)
        try:
            meta = json.loads(raw)
            if not isinstance(meta, dict):
                raise ValueError("not an object")
        except ValueError:
            raise KvsimInputError("expected a JSON object, got unreadable metadata", self.path,
                                  None, LOG_METADATA_KEY.decode()) from None
        version = meta.get("log_schema_version")
        if version != LOG_SCHEMA_VERSION:
            raise KvsimInputError(f"expected decision-log schema version {LOG_SCHEMA_VERSION}, "
                                  f"got {version!r}", self.path, None, "log_schema_version")
        for name, typ, _ in LOG_COLUMNS:
            idx = schema.get_field_index(name)
            if idx < 0:
                raise KvsimInputError("expected this column of the decision-log schema, "
                                      "missing", self.path, None, name)
            got = schema.field(idx).type
            if not _type_ok(name, typ, got):
                raise KvsimInputError(f"expected type {typ}, got {got}", self.path, None, name)
        self.metadata: dict[str, Any] = meta
        self.policy: str = str(meta.get("policy", ""))
        self.trace: Any = meta.get("trace")
        #: SHA-256 of the trace's bytes (logs written since issue 38; None before)
        self.trace_sha256: str | None = meta.get("trace_sha256")
        self.num_rows: int = parquet.metadata.num_rows
        self.num_row_groups: int = parquet.metadata.num_row_groups
        # pre_buffer off: pyarrow would otherwise coalesce and hold whole column chunks of
        # several row groups at once (measured: 845 MB vs 437 MB peak on a 10 M-row scan)
        fmt = ds.ParquetFileFormat(
            default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False))
        self._dataset = ds.dataset(self.path, format=fmt)
        self._leaves = [parquet.schema.column(i).path for i in range(len(parquet.schema))]

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the file (with its metadata)."""
        return self._dataset.schema

    def __repr__(self) -> str:
        return f"DecisionLog({str(self.path)!r}, policy={self.policy!r}, rows={self.num_rows})"

    def candidate_leaf(self, name: str) -> str:
        """The Parquet path of one field of the candidates (e.g. ``request_id``), to read
        it alone: ``scan(["seq", log.candidate_leaf("request_id")])`` yields a
        ``candidates`` column of ``list<struct<request_id>>``."""
        for path in self._leaves:
            if path.startswith("candidates.") and path.endswith("." + name):
                return path
        raise KvsimInputError(f"expected candidate field {name!r}, missing", self.path, None,
                              "candidates")

    def scan(self, columns: list[str], filter: ds.Expression | None = None,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Stream ``columns`` of the rows matching ``filter``, in ``seq`` order.

        With a filter, row groups whose statistics exclude it are skipped without being
        read (pyarrow.dataset pushdown); one batch is read ahead at most.  Without one, row
        groups are read one by one (``ParquetFile.iter_batches``), which also accepts nested
        leaf paths (:meth:`candidate_leaf`).  A corrupt page raises KvsimInputError.
        """
        if filter is None:
            batches = pq.ParquetFile(self.path, pre_buffer=False).iter_batches(
                batch_size=batch_rows, columns=columns, use_threads=True)
        else:
            batches = self._dataset.scanner(
                columns=columns, filter=filter, batch_size=batch_rows, batch_readahead=1,
                fragment_readahead=1, use_threads=True).to_batches()
        try:
            for batch in batches:
                if batch.num_rows:
                    yield batch
        except (pa.ArrowException, OSError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise KvsimInputError(f"unreadable decision-log data (corrupt or truncated): "
                                  f"{first}", self.path) from None

    def table(self, filter: ds.Expression | None = None, columns: list[str] | None = None,
              limit: int | None = None) -> pa.Table:
        """The matching rows as one table (use only for selective filters or a ``limit``)."""
        names = columns or [n for n, _, _ in LOG_COLUMNS]
        parts: list[pa.RecordBatch] = []
        taken = 0
        for batch in self.scan(names, filter):
            if limit is not None and taken + batch.num_rows >= limit:
                parts.append(batch.slice(0, limit - taken))
                taken = limit
                break
            parts.append(batch)
            taken += batch.num_rows
        if not parts:
            return self.schema.empty_table().select(names)
        return pa.Table.from_batches(parts)


def step_aligned(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Regroup batches so that no engine step is split between two yielded tables.

    The rows of the last step of each batch are held back and prepended to the next batch,
    so a consumer sees every row of a step at once (memory: one batch plus one step).
    Requires a ``step`` column; rows are assumed in ``seq`` order.
    """
    held: pa.Table | None = None
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if held is not None:
            table = pa.concat_tables([held, table])
        steps = table.column("step").to_numpy()
        last = steps[-1]
        cut = int(np.searchsorted(steps, last, side="left")) if steps[0] <= last else 0
        if cut == 0:
            held = table
            continue
        held = table.slice(cut)
        yield table.slice(0, cut)
    if held is not None and held.num_rows:
        yield held


def check_order(seq: np.ndarray, step: np.ndarray, prev_seq: int, prev_step: int,
                path: Path) -> None:
    """Raise KvsimInputError if ``seq`` does not increase or ``step`` decreases."""
    if seq.size == 0:
        return
    if seq[0] <= prev_seq or (seq.size > 1 and np.any(np.diff(seq) <= 0)):
        bad = int(seq[0]) if seq[0] <= prev_seq else int(seq[1:][np.diff(seq) <= 0][0])
        raise KvsimInputError("expected rows in increasing seq order, got a repeat or a step "
                              "back", path, f"seq {bad}", "seq")
    if step[0] < prev_step or (step.size > 1 and np.any(np.diff(step) < 0)):
        raise KvsimInputError("expected step never to decrease along seq", path, None, "step")
