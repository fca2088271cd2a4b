"""Event files: write and read MemoryIntent event tables as Parquet or JSONL, with validation.

An event file (schema in :mod:`kvsim.schema`, documented in ``docs/trace-format.md``) is the
contract between import/generation and replay.  This module is the only code that touches
the bytes of such a file:

- :class:`EventWriter` writes column batches through :func:`kvsim.fsutil.atomic_output`, so
  nothing appears at ``path`` unless the ``with`` block exits cleanly.  Parquet row groups
  hold exactly ``row_group_rows`` rows (the last one fewer), whatever batch sizes the caller
  passes, so the same rows always give the same bytes.
- :class:`EventReader` streams a file in batches of numpy columns (Parquet one row group at
  a time, JSONL ``batch_rows`` lines at a time), never the whole file, and validates every
  batch.  Bad input raises :class:`kvsim.errors.KvsimInputError` naming the file, the
  location (``line N``, 1-based, for JSONL, where line 1 is the header; ``row N``, 0-based
  over the whole file, for Parquet), the field and what was expected.

Invariants of every batch a reader yields (and of everything a writer accepts):

- every column of :data:`kvsim.schema.COLUMNS` is present with exactly its numpy dtype
  (enums as ``int8``), no nulls;
- ``step >= 0`` and never decreasing, across batches too;
- enum columns hold valid values; block-level kinds (``ALLOCATE``, ``COMMIT``) have
  ``block_index >= 0``; request-level kinds (``STEP``, ``ARRIVE``, ``ACCESS``, ``FORK``) have
  ``block_index == -1``; non-``STEP`` rows have ``request_id >= 0``; ``FORK`` rows have
  ``parent_request_id >= 0``;
- ``num_tokens``, ``size_bytes``, ``time_us``, ``tenant`` >= 0; ``deadline_us``,
  ``target_decode_step``, ``parent_request_id``, ``block_index``, ``request_id`` >= -1;
  ``request_priority`` in 0..100; float columns finite and >= 0.

The writer raises ``ValueError`` (a programming error in the producer) where the reader
raises ``KvsimInputError`` (bad input from a user).
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.errors import KvsimInputError, bad_value
from kvsim.fsutil import atomic_output, strip_compression_suffix
from kvsim.schema import (COLUMN_NAMES, COLUMNS, DEFAULTS, ENUM_COLUMNS, HEADER_METADATA_KEY,
                          SCHEMA_VERSION, EventHeader, EventKind, event_schema)

__all__ = [
    "EventWriter",
    "EventReader",
    "open_events",
    "read_events",
    "write_events",
    "event_format",
    "JSONL_HEADER_KEY",
    "REQUIRED_JSONL_FIELDS",
    "DTYPES",
]

#: Key of the first JSONL line's object whose value is the schema version.
JSONL_HEADER_KEY = "kvsim_events"

#: numpy dtype of every column (the Arrow type's numpy equivalent; enums are int8).
DTYPES: dict[str, np.dtype] = {name: np.dtype(typ.to_pandas_dtype()) for name, typ, _ in COLUMNS}

#: Fields every JSONL event line must carry.  Besides these, ``request_id`` is required on
#: every line whose kind is not ``STEP`` and ``block_index`` on ``ALLOCATE`` and ``COMMIT``
#: lines.  Every other field defaults to :data:`kvsim.schema.DEFAULTS`.
REQUIRED_JSONL_FIELDS: tuple[str, ...] = ("step", "kind")

#: Kinds that always name one block (``block_index >= 0``).
BLOCK_LEVEL_KINDS = (EventKind.ALLOCATE, EventKind.COMMIT)
#: Kinds that always name a whole request (``block_index == -1``).
REQUEST_LEVEL_KINDS = (EventKind.STEP, EventKind.ARRIVE, EventKind.ACCESS, EventKind.FORK)

_INT, _FLOAT, _BOOL, _ENUM = 0, 1, 2, 3
_FLOAT_COLUMNS = tuple(n for n, t, _ in COLUMNS if pa.types.is_floating(t))
_BOOL_COLUMNS = tuple(n for n, t, _ in COLUMNS if pa.types.is_boolean(t))
_COLUMN_INDEX = {name: i for i, name in enumerate(COLUMN_NAMES)}
_ENUM_BY_NAME = {col: {m.name: int(m) for m in enum_cls} for col, enum_cls in ENUM_COLUMNS.items()}
_ENUM_BY_VALUE = {col: {int(m): m.name for m in enum_cls} for col, enum_cls in ENUM_COLUMNS.items()}


def _field_class(name: str) -> int:
    if name in ENUM_COLUMNS:
        return _ENUM
    if name in _FLOAT_COLUMNS:
        return _FLOAT
    if name in _BOOL_COLUMNS:
        return _BOOL
    return _INT


_FIELD_CLASS = {name: _field_class(name) for name in COLUMN_NAMES}


def event_format(path: str | Path) -> str:
    """``"jsonl"`` for ``*.jsonl`` (optionally ``.gz`` / ``.zst``), else ``"parquet"``."""
    return "jsonl" if strip_compression_suffix(path).endswith(".jsonl") else "parquet"


# --------------------------------------------------------------------------------------
# Validation shared by reader and writer (vectorised over a batch)
# --------------------------------------------------------------------------------------

#: Raise an error for batch row ``i``: (i, field, expected, got) -> exception.
_ErrorFactory = Callable[[int, str, str, Any], Exception]


def _check(mask_bad: np.ndarray, field: str, expected: str, values: np.ndarray,
           error: _ErrorFactory) -> None:
    if mask_bad.any():
        i = int(np.argmax(mask_bad))
        got = values[i].item() if hasattr(values[i], "item") else values[i]
        raise error(i, field, expected, got)


def _validate_columns(cols: Mapping[str, np.ndarray], prev_step: int, error: _ErrorFactory,
                      kind_names: bool = True) -> None:
    """Check the batch invariants listed in the module docstring; ``prev_step`` is the last
    step of the previous batch (-1 for the first)."""
    step = cols["step"]
    if step.size == 0:
        return
    _check(step < 0, "step", "a step >= 0", step, error)
    if step[0] < prev_step:
        raise error(0, "step", f"steps never decreasing (previous row has step {prev_step})",
                    step[0].item())
    if step.size > 1:
        dec = np.empty(step.size, dtype=bool)
        dec[0] = False
        np.less(step[1:], step[:-1], out=dec[1:])
        if dec.any():
            i = int(np.argmax(dec))
            raise error(i, "step", f"steps never decreasing (previous row has step "
                        f"{int(step[i - 1])})", step[i].item())
    for col, enum_cls in ENUM_COLUMNS.items():
        values = cols[col]
        valid = np.zeros(values.shape, dtype=bool)
        for member in enum_cls:
            valid |= values == int(member)
        names = ", ".join(m.name for m in enum_cls)
        _check(~valid, col, f"one of {names}", values, error)
    kind = cols["kind"]
    bidx = cols["block_index"]
    block_level = np.isin(kind, [int(k) for k in BLOCK_LEVEL_KINDS])
    request_level = np.isin(kind, [int(k) for k in REQUEST_LEVEL_KINDS])
    _check(bidx < -1, "block_index", "block_index >= 0, or -1 for request-level events",
           bidx, error)
    _check(block_level & (bidx < 0), "block_index",
           "block_index >= 0 on ALLOCATE and COMMIT events", bidx, error)
    _check(request_level & (bidx != -1), "block_index",
           "block_index -1 on STEP, ARRIVE, ACCESS and FORK events", bidx, error)
    rid = cols["request_id"]
    _check(rid < -1, "request_id", "request_id >= 0 (or -1 on STEP rows)", rid, error)
    _check((kind != int(EventKind.STEP)) & (rid < 0), "request_id",
           "request_id >= 0 on every event but STEP", rid, error)
    parent = cols["parent_request_id"]
    _check(parent < -1, "parent_request_id", "parent_request_id >= 0 or -1", parent, error)
    _check((kind == int(EventKind.FORK)) & (parent < 0), "parent_request_id",
           "parent_request_id >= 0 on FORK events", parent, error)
    for col in ("num_tokens", "size_bytes", "time_us", "tenant"):
        _check(cols[col] < 0, col, f"{col} >= 0", cols[col], error)
    for col in ("deadline_us", "target_decode_step"):
        _check(cols[col] < -1, col, f"{col} >= 0 or -1 (unset)", cols[col], error)
    rp = cols["request_priority"]
    _check((rp < 0) | (rp > 100), "request_priority", "request_priority in 0..100", rp, error)
    for col in _FLOAT_COLUMNS:
        values = cols[col]
        _check(~np.isfinite(values), col, "a finite number", values, error)
        _check(values < 0, col, f"{col} >= 0", values, error)


# --------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------


def _to_column(name: str, value: Any, n: int) -> np.ndarray:
    """Convert a caller's column to the exact dtype, raising ValueError on lossy input."""
    dtype = DTYPES[name]
    if isinstance(value, (pd.Series, pd.Index)):
        value = value.to_numpy()
    if name in ENUM_COLUMNS and isinstance(value, str):
        try:
            value = _ENUM_BY_NAME[name][value]
        except KeyError:
            raise ValueError(f"column {name!r}: unknown {name} name {value!r}") from None
    arr = np.asarray(value)
    if arr.dtype.kind in "US" or arr.dtype == object:
        if name in ENUM_COLUMNS:
            names = _ENUM_BY_NAME[name]
            try:
                arr = np.asarray([names[v] if isinstance(v, str) else int(v)
                                  for v in arr.ravel()]).reshape(arr.shape)
            except (KeyError, TypeError) as exc:
                raise ValueError(f"column {name!r}: bad {name} value {exc}") from None
        else:
            raise ValueError(f"column {name!r}: expected numbers, got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = np.full(n, arr.item())
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"column {name!r}: expected {n} values, got shape {arr.shape}")
    if arr.dtype == dtype:
        return arr
    if dtype.kind == "b":
        if arr.dtype.kind != "b":
            raise ValueError(f"column {name!r}: expected booleans, got dtype {arr.dtype}")
        return arr.astype(dtype)
    if dtype.kind == "f":
        if arr.dtype.kind not in "iufb":
            raise ValueError(f"column {name!r}: expected numbers, got dtype {arr.dtype}")
        return arr.astype(dtype)
    # integer target
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"column {name!r}: expected integers, got non-integral floats")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"column {name!r}: expected integers, got dtype {arr.dtype}")
    if arr.size:
        info = np.iinfo(dtype)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            raise ValueError(f"column {name!r}: values {lo}..{hi} do not fit {dtype}")
    return arr.astype(dtype)


def _normalise(columns: Mapping[str, Any]) -> dict[str, np.ndarray]:
    unknown = [k for k in columns if k not in _COLUMN_INDEX]
    if unknown:
        raise ValueError(f"unknown event column(s) {unknown}; known: {list(COLUMN_NAMES)}")
    n = None
    for value in columns.values():
        if np.ndim(value) >= 1 or isinstance(value, (list, tuple)):
            n = len(value)
            break
    if n is None:
        raise ValueError("at least one column must be an array (the others may be scalars)")
    out: dict[str, np.ndarray] = {}
    for name in COLUMN_NAMES:
        if name in columns:
            out[name] = _to_column(name, columns[name], n)
        else:
            out[name] = np.full(n, DEFAULTS[name], dtype=DTYPES[name])
    return out


def _writer_error(offset: int) -> _ErrorFactory:
    def make(i: int, field: str, expected: str, got: Any) -> Exception:
        return ValueError(f"event row {offset + i}: field {field!r}: expected {expected}, "
                          f"got {got!r}")
    return make


class EventWriter:
    """Write an event file batch by batch; a context manager.

    ``path`` ending in ``.jsonl`` (also ``.jsonl.gz`` / ``.jsonl.zst``) gives JSONL, any
    other name Parquet.  Output goes through :func:`kvsim.fsutil.atomic_output`: if the
    ``with`` body raises, no file appears at ``path`` (an existing one is untouched).
    ``rows_written`` counts the rows accepted so far.
    """

    def __init__(self, path: str | Path, header: EventHeader,
                 row_group_rows: int = 1 << 20) -> None:
        if row_group_rows <= 0:
            raise ValueError("row_group_rows must be positive")
        if header.schema_version != SCHEMA_VERSION:
            raise ValueError(f"header.schema_version {header.schema_version} != "
                             f"{SCHEMA_VERSION} (this kvsim writes version {SCHEMA_VERSION})")
        self.path = Path(path)
        self.header = header
        self.format = event_format(self.path)
        self.row_group_rows = int(row_group_rows)
        self.rows_written = 0
        self._last_step = -1
        self._atomic: Any = None
        self._raw: Any = None
        self._text: Any = None
        self._pq: pq.ParquetWriter | None = None
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> "EventWriter":
        self._atomic = atomic_output(self.path)
        tmp = self._atomic.__enter__()
        try:
            if self.format == "jsonl":
                self._open_jsonl(tmp)
            else:
                self._pq = pq.ParquetWriter(tmp, event_schema(self.header), compression="zstd")
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        atomic, self._atomic = self._atomic, None
        if exc_type is None:
            try:
                self._flush(final=True)
                self._close_handles()
            except BaseException as inner:
                self._close_handles_quietly()
                atomic.__exit__(type(inner), inner, inner.__traceback__)  # removes the temp
                raise
            atomic.__exit__(None, None, None)  # renames the temp onto path
            return False
        self._close_handles_quietly()
        atomic.__exit__(exc_type, exc, tb)  # removes the temp; the exception propagates
        return False

    def _open_jsonl(self, tmp: Path) -> None:
        name = self.path.name
        raw = open(tmp, "wb")
        self._raw = raw
        if name.endswith(".gz"):
            # mtime=0 and no file name: byte-identical output for identical rows.
            stream: Any = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)
        elif name.endswith(".zst"):
            import zstandard

            stream = zstandard.ZstdCompressor(level=3).stream_writer(raw, closefd=False)
        else:
            stream = raw
        self._stream = stream
        self._text = io.TextIOWrapper(stream, encoding="utf-8", newline="\n")
        header = {JSONL_HEADER_KEY: SCHEMA_VERSION, "header": json.loads(self.header.to_json())}
        self._text.write(json.dumps(header) + "\n")

    def _close_handles_quietly(self) -> None:
        try:
            self._close_handles()
        except Exception:  # already failing: the original exception matters
            self._pq = None
            self._text = None

    def _close_handles(self) -> None:
        if self._pq is not None:
            self._pq.close()
            self._pq = None
        if self._text is not None:
            self._text.flush()
            self._text.detach()
            if self._stream is not self._raw:
                self._stream.close()
            self._raw.close()
            self._text = None

    # -- writing -----------------------------------------------------------------------
    def write(self, columns: Mapping[str, np.ndarray | Sequence]) -> None:
        """Append a batch of rows given as columns.

        Columns not given are filled from :data:`kvsim.schema.DEFAULTS`; scalars broadcast;
        enum columns accept ints, enum members or names.  Raises ``ValueError`` for unknown
        column names, lossy conversions or rows that break the file invariants (row numbers
        in the message are 0-based over the whole file).
        """
        if self._atomic is None or (self._pq is None and self._text is None):
            raise RuntimeError("EventWriter.write() outside its `with` block")
        cols = _normalise(columns)
        n = len(cols["step"])
        if n == 0:
            return
        _validate_columns(cols, self._last_step, _writer_error(self.rows_written))
        self._last_step = int(cols["step"][-1])
        if self.format == "jsonl":
            self._write_jsonl(cols)
        else:
            self._pending.append(cols)
            self._pending_rows += n
            self._flush(final=False)
        self.rows_written += n

    def _flush(self, final: bool) -> None:
        if self._pq is None or not self._pending:
            return
        if self._pending_rows < self.row_group_rows and not final:
            return
        merged = {name: np.concatenate([p[name] for p in self._pending]) for name in COLUMN_NAMES}
        total = self._pending_rows
        start = 0
        while total - start >= self.row_group_rows or (final and start < total):
            stop = min(start + self.row_group_rows, total)
            arrays = [pa.array(merged[name][start:stop], type=typ) for name, typ, _ in COLUMNS]
            table = pa.Table.from_arrays(arrays, schema=event_schema(self.header))
            self._pq.write_table(table, row_group_size=self.row_group_rows)
            start = stop
        rest = {name: merged[name][start:] for name in COLUMN_NAMES}
        self._pending = [rest] if start < total else []
        self._pending_rows = total - start

    def _write_jsonl(self, cols: dict[str, np.ndarray]) -> None:
        """One JSON object per row: ``step``, ``time_us``, ``kind``, the conditionally
        required fields and every field that differs from its default, in column order.
        Built column by column (the text equals ``json.dumps`` of the row dict)."""
        kind = cols["kind"]
        n = len(kind)
        not_step = kind != int(EventKind.STEP)
        block_level = (kind == int(EventKind.ALLOCATE)) | (kind == int(EventKind.COMMIT))
        fragments: list[list[str]] = []
        for name in COLUMN_NAMES:
            arr = cols[name]
            if name in ("step", "time_us", "kind"):
                include = np.ones(n, dtype=bool)
            else:
                include = arr != DEFAULTS[name]
                if name == "request_id":
                    include |= not_step
                elif name == "block_index":
                    include |= block_level
            if not include.any():
                continue
            sep = "" if name == "step" else ", "
            key = f'{sep}"{name}": '
            if name in ENUM_COLUMNS:
                names = _ENUM_BY_VALUE[name]
                texts = [f'{key}"{names[v]}"' for v in arr.tolist()]
            elif arr.dtype.kind == "b":
                texts = [key + ("true" if v else "false") for v in arr.tolist()]
            elif arr.dtype.kind == "f":
                texts = [f"{key}{v!r}" for v in arr.tolist()]
            else:
                texts = [f"{key}{v}" for v in arr.tolist()]
            if not include.all():
                texts = [t if keep else "" for t, keep in zip(texts, include.tolist())]
            fragments.append(texts)
        self._text.write("".join(["{" + "".join(parts) + "}\n" for parts in zip(*fragments)]))


def write_events(path: str | Path, header: EventHeader,
                 df_or_columns: pd.DataFrame | Mapping[str, Any],
                 row_group_rows: int = 1 << 20) -> None:
    """Write a whole event table (DataFrame or mapping of columns) in one call."""
    if isinstance(df_or_columns, pd.DataFrame):
        columns = {c: df_or_columns[c].to_numpy() for c in df_or_columns.columns}
    else:
        columns = dict(df_or_columns)
    with EventWriter(path, header, row_group_rows=row_group_rows) as writer:
        if columns and any(np.ndim(v) >= 1 and len(v) for v in columns.values()):
            writer.write(columns)


# --------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------


_HEADER_TYPE_WORD = {int: "an integer", str: "a string", dict: "a JSON object"}


def _header_from_obj(obj: Any, path: Path, location: str) -> EventHeader:
    """Validate a decoded header object and build an :class:`EventHeader`."""
    if not isinstance(obj, dict):
        raise bad_value(path, location, "header", "a JSON object", type(obj).__name__)
    fields = EventHeader.__dataclass_fields__
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise KvsimInputError(f"unknown header field(s) {unknown}; known: {sorted(fields)}",
                              path, location, f"header.{unknown[0]}")
    expected_types = {"block_size_tokens": int, "kv_bytes_per_token": int, "model": str,
                      "hardware": str, "source": dict, "schema_version": int}
    for key, value in obj.items():
        want = expected_types.get(key)
        if want is None:
            continue
        if type(value) is not want:
            raise bad_value(path, location, f"header.{key}", _HEADER_TYPE_WORD[want], value)
    if "schema_version" in obj and obj["schema_version"] != SCHEMA_VERSION:
        raise bad_value(path, location, "header.schema_version",
                        f"schema version {SCHEMA_VERSION}", obj["schema_version"])
    if obj.get("block_size_tokens", 1) <= 0:
        raise bad_value(path, location, "header.block_size_tokens", "a positive integer",
                        obj["block_size_tokens"])
    if obj.get("kv_bytes_per_token", 0) < 0:
        raise bad_value(path, location, "header.kv_bytes_per_token", "an integer >= 0",
                        obj["kv_bytes_per_token"])
    return EventHeader.from_dict(obj)


class EventReader:
    """Stream a validated event file (Parquet or JSONL); a context manager.

    The header is read and checked on construction.  :meth:`batches` can be called more
    than once; each call streams the file from the start and validates as it goes.
    ``num_rows`` is known up front for Parquet, ``None`` for JSONL.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.format = event_format(self.path)
        self.num_rows: int | None = None
        self._pf: pq.ParquetFile | None = None
        if self.format == "parquet":
            self.header = self._open_parquet()
        else:
            self.header = self._read_jsonl_header()

    def __enter__(self) -> "EventReader":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def close(self) -> None:
        if self._pf is not None:
            self._pf.close()
            self._pf = None

    def batches(self, batch_rows: int = 1 << 20) -> Iterator[dict[str, np.ndarray]]:
        """Yield validated batches of at most ``batch_rows`` rows as numpy columns.

        Every batch has all columns of :data:`kvsim.schema.COLUMNS` with the dtypes of
        :data:`DTYPES`, C-contiguous.  Arrays may be read-only (Parquet columns are
        zero-copy views of Arrow buffers): copy before mutating.  Memory is bounded by one
        Parquet row group or ``batch_rows`` lines.
        """
        if batch_rows <= 0:
            raise ValueError("batch_rows must be positive")
        if self.format == "parquet":
            return self._parquet_batches(batch_rows)
        return self._jsonl_batches(batch_rows)

    # -- Parquet -----------------------------------------------------------------------
    def _open_parquet(self) -> EventHeader:
        path = self.path
        if not path.exists():
            raise FileNotFoundError(2, "No such file or directory", str(path))
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        if path.stat().st_size == 0:
            raise KvsimInputError("empty file: expected a Parquet event file "
                                  "(or name it *.jsonl for JSONL)", path)
        try:
            self._pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise KvsimInputError(f"not a readable Parquet file ({_short(exc)}); event files "
                                  "are Parquet, or JSONL when named *.jsonl", path) from None
        schema = self._pf.schema_arrow
        meta = schema.metadata or {}
        if HEADER_METADATA_KEY not in meta:
            raise KvsimInputError(f"missing kvsim header: Parquet schema metadata has no "
                                  f"{HEADER_METADATA_KEY.decode()!r} key (write event files with "
                                  "kvsim.events.EventWriter)", path, "schema metadata",
                                  "header")
        try:
            obj = json.loads(meta[HEADER_METADATA_KEY])
        except (ValueError, UnicodeDecodeError) as exc:
            raise KvsimInputError(f"header is not valid JSON ({exc})", path, "schema metadata",
                                  "header") from None
        header = _header_from_obj(obj, path, "schema metadata")
        names = set(schema.names)
        for name, typ, _ in COLUMNS:
            if name not in names:
                raise KvsimInputError(f"missing column (expected type {typ})", path,
                                      "schema", name)
            got = schema.field(name).type
            if not _compatible(typ, got):
                raise KvsimInputError(f"expected column type {typ}, got {got}", path,
                                      "schema", name)
        extra = [n for n in schema.names if n not in _COLUMN_INDEX
                 and not n.startswith("__index_level_")]
        if extra:
            raise KvsimInputError(f"unknown column (known columns: {', '.join(COLUMN_NAMES)})",
                                  path, "schema", extra[0])
        self.num_rows = self._pf.metadata.num_rows
        return header

    def _parquet_batches(self, batch_rows: int) -> Iterator[dict[str, np.ndarray]]:
        pf = self._pf
        if pf is None:  # closed: reopen
            pf = self._pf = pq.ParquetFile(self.path)
        prev_step = -1
        row0 = 0
        for rg in range(pf.num_row_groups):
            try:
                table = pf.read_row_group(rg, columns=list(COLUMN_NAMES))
            except (pa.ArrowException, OSError) as exc:
                raise KvsimInputError(f"corrupt or truncated Parquet data ({_short(exc)})",
                                      self.path, f"row group {rg} (from row {row0})") from None
            for start in range(0, table.num_rows, batch_rows):
                part = table.slice(start, batch_rows)
                cols = self._arrow_to_numpy(part, row0 + start)
                _validate_columns(cols, prev_step, self._row_error(row0 + start))
                prev_step = int(cols["step"][-1]) if len(cols["step"]) else prev_step
                yield cols
            row0 += table.num_rows

    def _row_error(self, offset: int) -> _ErrorFactory:
        path = self.path

        def make(i: int, field: str, expected: str, got: Any) -> Exception:
            return bad_value(path, f"row {offset + i}", field, expected, got)
        return make

    def _arrow_to_numpy(self, table: pa.Table, offset: int) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        for name in COLUMN_NAMES:
            col = table.column(name)
            if col.null_count:
                i = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
                raise bad_value(self.path, f"row {offset + i}", name, "a value", None)
            arr = col.to_numpy()
            dtype = DTYPES[name]
            if arr.dtype != dtype:
                if dtype.kind in "iu" and arr.size:
                    info = np.iinfo(dtype)
                    bad = (arr < info.min) | (arr > info.max)
                    if bad.any():
                        i = int(np.argmax(bad))
                        raise bad_value(self.path, f"row {offset + i}", name,
                                        f"an integer that fits {dtype}", arr[i].item())
                arr = arr.astype(dtype)
            cols[name] = arr
        return cols

    # -- JSONL -------------------------------------------------------------------------
    def _open_binary(self) -> IO[bytes]:
        """The file as a binary line stream, ``.gz`` / ``.zst`` decompressed.  Lines are
        decoded one by one so a decoding error names its own line."""
        name = self.path.name
        if name.endswith(".gz"):
            return gzip.open(self.path, "rb")
        if name.endswith(".zst"):
            import zstandard

            raw = open(self.path, "rb")
            reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
            return io.BufferedReader(reader)  # type: ignore[arg-type]
        return open(self.path, "rb")

    def _read_jsonl_header(self) -> EventHeader:
        path = self.path
        with self._open_binary() as fh:
            try:
                raw = fh.readline()
            except Exception as exc:  # gzip.BadGzipFile, EOFError, zstandard.ZstdError, ...
                raise KvsimInputError(f"cannot read{_compression_hint(path)}: {_short(exc)}",
                                      path, "line 1") from None
        if raw.startswith(b"\xef\xbb\xbf"):  # a byte-order mark (Windows tools): skip it
            raw = raw[3:]
        first = _decode(raw, path, 1)
        if not first:
            raise KvsimInputError(f"empty file: expected a header line "
                                  f'{{"{JSONL_HEADER_KEY}": {SCHEMA_VERSION}, "header": {{...}}}}',
                                  path, "line 1", "header")
        return self._parse_header_line(first)

    def _parse_header_line(self, line: str) -> EventHeader:
        path = self.path
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise KvsimInputError(f"header line is not valid JSON ({exc.args[0].split(':')[0]}); "
                                  f'expected {{"{JSONL_HEADER_KEY}": {SCHEMA_VERSION}, '
                                  '"header": {...}}', path, "line 1", "header") from None
        if not isinstance(obj, dict) or JSONL_HEADER_KEY not in obj:
            raise KvsimInputError(f'missing header: the first line must be {{"{JSONL_HEADER_KEY}"'
                                  f': {SCHEMA_VERSION}, "header": {{...}}}}', path, "line 1",
                                  JSONL_HEADER_KEY)
        extra = sorted(set(obj) - {JSONL_HEADER_KEY, "header"})
        if extra:
            raise KvsimInputError(f"unknown header-line key (expected only {JSONL_HEADER_KEY!r} "
                                  "and 'header')", path, "line 1", extra[0])
        version = obj[JSONL_HEADER_KEY]
        if type(version) is not int or version != SCHEMA_VERSION:
            raise bad_value(path, "line 1", JSONL_HEADER_KEY, f"schema version {SCHEMA_VERSION}",
                            version)
        if "header" not in obj:
            raise KvsimInputError("missing header object", path, "line 1", "header")
        return _header_from_obj(obj["header"], path, "line 1")

    def _jsonl_batches(self, batch_rows: int) -> Iterator[dict[str, np.ndarray]]:
        """Read ``batch_rows`` non-blank lines at a time and parse them column-wise.

        Fast path: the lines are parsed as one JSON array and checked column by column
        (type sets, enum lookups, numpy range checks).  Any failure falls back to parsing
        the batch line by line (:meth:`_parse_line`), which names the first bad line.
        """
        path = self.path
        prev_step = -1
        lineno = 1
        with self._open_binary() as fh:
            it = iter(fh)
            try:
                next(it)  # header, validated in __init__
            except StopIteration:
                return
            except Exception as exc:
                raise KvsimInputError(f"cannot read{_compression_hint(path)}: {_short(exc)}",
                                      path, "line 1") from None
            while True:
                try:
                    chunk = list(itertools.islice(it, batch_rows))
                except Exception as exc:  # gzip / zstd errors, truncated streams
                    raise KvsimInputError(f"cannot read{_compression_hint(path)}: "
                                          f"{_short(exc)}", path,
                                          f"after line {lineno}") from None
                if not chunk:
                    break
                if all(map(bytes.strip, chunk)):  # the common case: no blank line
                    lines = chunk
                    linenos = range(lineno + 1, lineno + 1 + len(chunk))
                else:
                    kept = [(line, lineno + 1 + i) for i, line in enumerate(chunk)
                            if line.strip()]
                    lines = [line for line, _ in kept]
                    linenos = [no for _, no in kept]
                lineno += len(chunk)
                if not lines:
                    continue
                cols = self._parse_lines(lines, linenos)
                line_arr = np.asarray(linenos)

                def make(i: int, field: str, expected: str, got: Any,
                         _lines: np.ndarray = line_arr) -> Exception:
                    return bad_value(path, f"line {int(_lines[i])}", field, expected, got)

                _validate_columns(cols, prev_step, make)
                prev_step = int(cols["step"][-1])
                yield cols

    def _parse_lines(self, lines: list[bytes], linenos: Sequence[int]) -> dict[str, np.ndarray]:
        try:
            objs = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:  # includes UnicodeDecodeError
            objs = None
        cols = self._objects_to_columns(objs, len(lines)) if objs is not None else None
        if cols is None:  # slow path: find and report the first bad line
            for line, lineno in zip(lines, linenos):
                self._parse_line(line, lineno)
            raise AssertionError("a JSONL batch failed the fast path but no line failed "
                                 "the line-by-line check")  # pragma: no cover
        return cols

    @staticmethod
    def _objects_to_columns(objs: Any, n: int) -> dict[str, np.ndarray] | None:
        """Columns of ``n`` decoded event objects, or None if anything is off (the caller
        then re-checks line by line to report the exact problem)."""
        if type(objs) is not list or len(objs) != n:
            return None
        if set(map(type, objs)) != {dict}:
            return None
        keys = set().union(*objs)
        if not keys <= _FIELD_SET:
            return None
        cols: dict[str, np.ndarray] = {}
        missing = _MISSING
        omitted: dict[str, np.ndarray | bool] = {}  # rows omitting request_id / block_index
        for name in COLUMN_NAMES:
            cls = _FIELD_CLASS[name]
            if name not in keys:
                if name in REQUIRED_JSONL_FIELDS:
                    return None
                cols[name] = np.full(n, DEFAULTS[name], dtype=DTYPES[name])
                omitted[name] = True
                continue
            values = [o.get(name, missing) for o in objs]
            types = set(map(type, values))
            partial = _Missing in types
            if partial:
                if name in REQUIRED_JSONL_FIELDS:
                    return None
                types.discard(_Missing)
                omitted[name] = np.fromiter((v is missing for v in values), bool, n)
                default = DEFAULTS[name]
                if cls == _ENUM:
                    default = _ENUM_BY_VALUE[name][default]
                values = [default if v is missing else v for v in values]
            else:
                omitted[name] = False
            if cls == _ENUM:
                if types != {str}:
                    return None
                names = _ENUM_BY_NAME[name]
                try:
                    values = [names[v] for v in values]
                except KeyError:
                    return None
            elif cls == _INT and types != {int}:
                return None
            elif cls == _FLOAT and not types <= {int, float}:
                return None
            elif cls == _BOOL and types != {bool}:
                return None
            try:
                arr = np.array(values, dtype=DTYPES[name])
            except OverflowError:
                return None
            if cls == _FLOAT and not np.isfinite(arr).all():
                return None
            cols[name] = arr
        # conditionally required fields
        kind = cols["kind"]
        if np.any(omitted["request_id"] & (kind != int(EventKind.STEP))):
            return None
        block_level = (kind == int(EventKind.ALLOCATE)) | (kind == int(EventKind.COMMIT))
        if np.any(omitted["block_index"] & block_level):
            return None
        return cols

    def _parse_line(self, raw: bytes, lineno: int) -> None:
        """Check one line; raise the precise :class:`KvsimInputError` if it is bad."""
        path = self.path
        line = _decode(raw, path, lineno)
        try:
            obj = json.loads(line)
        except ValueError as exc:
            msg = exc.args[0].split(":")[0] if exc.args else "invalid JSON"
            raise KvsimInputError(f"not valid JSON ({msg})", path, f"line {lineno}") from None
        if type(obj) is not dict:
            raise KvsimInputError(f"expected a JSON object, got {type(obj).__name__}", path,
                                  f"line {lineno}")
        for key, value in obj.items():
            cls = _FIELD_CLASS.get(key)
            if cls is None:
                raise KvsimInputError(f"unknown field (known fields: {', '.join(COLUMN_NAMES)})",
                                      path, f"line {lineno}", key)
            t = type(value)
            if cls == _INT:
                if t is not int:
                    raise bad_value(path, f"line {lineno}", key, "an integer", value)
                info = np.iinfo(DTYPES[key])
                if not info.min <= value <= info.max:
                    raise bad_value(path, f"line {lineno}", key,
                                    f"an integer in {info.min}..{info.max}", value)
            elif cls == _ENUM:
                if t is not str or value not in _ENUM_BY_NAME[key]:
                    names = ", ".join(_ENUM_BY_NAME[key])
                    raise bad_value(path, f"line {lineno}", key, f"one of {names}", value)
            elif cls == _FLOAT:
                if t is not float and t is not int:
                    raise bad_value(path, f"line {lineno}", key, "a number", value)
                try:
                    finite = math.isfinite(value)
                except OverflowError:  # an integer beyond float range
                    finite = False
                if not finite:
                    raise bad_value(path, f"line {lineno}", key, "a finite number", value)
            elif t is not bool:
                raise bad_value(path, f"line {lineno}", key, "true or false", value)
        for required in REQUIRED_JSONL_FIELDS:
            if required not in obj:
                raise KvsimInputError("missing required field", path, f"line {lineno}",
                                      required)
        kind = obj["kind"]
        if kind != EventKind.STEP.name and "request_id" not in obj:
            raise KvsimInputError(f"missing required field (required on every event but "
                                  f"STEP; this is {kind})", path, f"line {lineno}",
                                  "request_id")
        if kind in _BLOCK_KIND_NAMES and "block_index" not in obj:
            raise KvsimInputError(f"missing required field (required on ALLOCATE and COMMIT; "
                                  f"this is {kind})", path, f"line {lineno}", "block_index")


class _Missing:
    """Sentinel type for a field a JSONL line omits."""


_MISSING = _Missing()
_FIELD_SET = frozenset(COLUMN_NAMES)
_BLOCK_KIND_NAMES = frozenset(k.name for k in BLOCK_LEVEL_KINDS)


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KvsimInputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}"
                              "); is this a binary file?", path, f"line {lineno}") from None


def _compression_hint(path: Path) -> str:
    name = path.name
    if name.endswith(".gz"):
        return " (named .gz: expected a gzip stream)"
    if name.endswith(".zst"):
        return " (named .zst: expected a zstandard stream)"
    return ""


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _compatible(want: pa.DataType, got: pa.DataType) -> bool:
    """Parquet column types a reader accepts: the exact type, any integer type for an
    integer column (values range-checked), any integer or float type for a float column."""
    if want == got:
        return True
    if pa.types.is_integer(want):
        return pa.types.is_integer(got)
    if pa.types.is_floating(want):
        return pa.types.is_integer(got) or pa.types.is_floating(got)
    return False


def open_events(path: str | Path) -> EventReader:
    """Open an event file for streaming (``with open_events(p) as r: for b in r.batches()``)."""
    return EventReader(path)


def read_events(path: str | Path) -> tuple[EventHeader, pd.DataFrame]:
    """Read a whole (small) event file: the header and a DataFrame (enums as int8 codes)."""
    with open_events(path) as reader:
        parts = [pd.DataFrame(b) for b in reader.batches()]
        header = reader.header
    if not parts:
        df = pd.DataFrame({name: np.empty(0, dtype=DTYPES[name]) for name in COLUMN_NAMES})
    else:
        df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return header, df


def header_dict(header: EventHeader) -> dict[str, Any]:
    """The header as a plain dict (JSON-ready)."""
    return asdict(header)
