"""Event writer: :class:`EventWriter` writes Parquet or JSONL through
:func:`kvsim.core.fsutil.atomic_output`; :func:`write_events` writes a whole table.  See
:mod:`kvsim.events`."""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kvsim.core.fsutil import atomic_output
from kvsim.core.schema import (
    COLUMN_NAMES,
    COLUMNS,
    DEFAULTS,
    ENUM_COLUMNS,
    SCHEMA_VERSION,
    EventHeader,
    EventKind,
    event_schema,
)
from kvsim.events.columns import (
    _COLUMN_INDEX,
    _ENUM_BY_NAME,
    _ENUM_BY_VALUE,
    DTYPES,
    JSONL_HEADER_KEY,
    _ErrorFactory,
    _validate_columns,
    event_format,
)


def _to_column(name: str, value: Any, n: int) -> np.ndarray:
    """Convert a caller's column to the exact dtype, raising ValueError on lossy input."""
    dtype = DTYPES[name]
    pd = sys.modules.get("pandas")  # a pandas value only if pandas was imported
    if pd is not None and isinstance(value, (pd.Series, pd.Index)):
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
    other name Parquet.  Output goes through :func:`kvsim.core.fsutil.atomic_output`: if the
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
        self._pq: pa.parquet.ParquetWriter | None = None
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> EventWriter:
        self._atomic = atomic_output(self.path)
        tmp = self._atomic.__enter__()
        try:
            if self.format == "jsonl":
                self._open_jsonl(tmp)
            else:
                import pyarrow.parquet as pq  # only where Parquet is written

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

        Columns not given are filled from :data:`kvsim.core.schema.DEFAULTS`; scalars broadcast;
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
                 df_or_columns: Mapping[str, Any],
                 row_group_rows: int = 1 << 20) -> None:
    """Write a whole event table (DataFrame or mapping of columns) in one call."""
    pd = sys.modules.get("pandas")  # a DataFrame only if pandas was imported
    if pd is not None and isinstance(df_or_columns, pd.DataFrame):
        columns = {c: df_or_columns[c].to_numpy() for c in df_or_columns.columns}
    else:
        columns = dict(df_or_columns)
    with EventWriter(path, header, row_group_rows=row_group_rows) as writer:
        if columns and any(np.ndim(v) >= 1 and len(v) for v in columns.values()):
            writer.write(columns)

