"""Event reader: :class:`EventReader` streams and validates a Parquet or JSONL event file
(one row group / line batch at a time); :func:`open_events`, :func:`read_events`,
:func:`header_dict`.  See :mod:`kvsim.events`."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.schema import (
    COLUMN_NAMES,
    COLUMNS,
    DEFAULTS,
    HEADER_METADATA_KEY,
    SCHEMA_VERSION,
    EventHeader,
    EventKind,
)
from kvsim.events.columns import (
    _BOOL,
    _COLUMN_INDEX,
    _ENUM,
    _ENUM_BY_NAME,
    _ENUM_BY_VALUE,
    _FIELD_CLASS,
    _FLOAT,
    _INT,
    BLOCK_LEVEL_KINDS,
    DTYPES,
    JSONL_HEADER_KEY,
    REQUIRED_JSONL_FIELDS,
    _ErrorFactory,
    _validate_columns,
    event_format,
)
from kvsim.events.read_ahead import ReadAhead

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas as pd

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
        self._pf: pa.parquet.ParquetFile | None = None
        self._ahead: list[ReadAhead] = []
        if self.format == "parquet":
            self.header = self._open_parquet()
        else:
            self.header = self._read_jsonl_header()

    def __enter__(self) -> EventReader:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def close(self) -> None:
        for ahead in self._ahead:  # before the file: no read is left running
            ahead.close()
        self._ahead.clear()
        if self._pf is not None:
            self._pf.close()
            self._pf = None

    def batches(self, batch_rows: int = 1 << 20, *, read_ahead: bool = False,
                columns: Sequence[str] | None = None,
                checked: Sequence[str] = ()) -> Iterator[dict[str, np.ndarray]]:
        """Yield validated batches of at most ``batch_rows`` rows as numpy columns.

        Every batch has all columns of :data:`kvsim.core.schema.COLUMNS` with the dtypes of
        :data:`DTYPES`, C-contiguous.  Arrays may be read-only (Parquet columns are
        zero-copy views of Arrow buffers): copy before mutating.  Memory is bounded by
        ``batch_rows`` decoded rows (a Parquet row group is decoded as it is read, not
        whole) or ``batch_rows`` JSONL lines.  ``read_ahead``: the next batch is read
        in a thread while the caller works on this one (:mod:`kvsim.events.read_ahead`;
        one batch more in memory); :meth:`close` stops that thread.  ``columns``: a Parquet
        file's batches hold only these columns (and ``step`` and ``kind``), decoded and
        checked alone (the replay's pre-pass reads 8 of the 22: docs/benchmarks.md, "Issue
        34: the 16-token replay's passes"); a JSONL file's batches hold every column.
        ``checked``: columns an earlier pass over the same Parquet file has checked (read
        with ``columns`` including them): the checks that read only those are left out.
        """
        if batch_rows <= 0:
            raise ValueError("batch_rows must be positive")
        if self.format == "parquet":
            it = self._parquet_batches(batch_rows, _subset(columns), frozenset(checked))
        else:
            it = self._jsonl_batches(batch_rows)
        if not read_ahead:
            return it
        ahead = ReadAhead(it)
        self._ahead.append(ahead)
        return ahead

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
        import pyarrow.parquet as pq  # pyarrow.parquet (with pyarrow.fs, ssl) only where Parquet is read or written

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

    def _parquet_batches(self, batch_rows: int, names: tuple[str, ...] = COLUMN_NAMES,
                         checked: frozenset = frozenset()) -> Iterator[dict[str, np.ndarray]]:
        pf = self._pf
        if pf is None:  # closed: reopen
            import pyarrow.parquet as pq

            pf = self._pf = pq.ParquetFile(self.path)
        prev_step = -1
        row0 = 0
        for rg in range(pf.num_row_groups):
            # decoded batch_rows rows at a time, not the whole row group (memory)
            parts = None
            start = row0
            while True:
                try:
                    if parts is None:
                        parts = pf.iter_batches(batch_size=batch_rows, row_groups=[rg],
                                                columns=list(names), use_threads=False)
                    part = next(parts, None)
                except (pa.ArrowException, OSError) as exc:
                    raise KvsimInputError(f"corrupt or truncated Parquet data ({_short(exc)})",
                                          self.path, f"row group {rg} (from row {row0})") from None
                if part is None:
                    break
                cols = self._arrow_to_numpy(part, start, names)
                _validate_columns(cols, prev_step, self._row_error(start), checked=checked)
                prev_step = int(cols["step"][-1]) if len(cols["step"]) else prev_step
                start += part.num_rows
                yield cols
            row0 = start

    def _row_error(self, offset: int) -> _ErrorFactory:
        path = self.path

        def make(i: int, field: str, expected: str, got: Any) -> Exception:
            return bad_value(path, f"row {offset + i}", field, expected, got)
        return make

    def _arrow_to_numpy(self, table: pa.Table | pa.RecordBatch, offset: int,
                        names: tuple[str, ...] = COLUMN_NAMES) -> dict[str, np.ndarray]:
        cols: dict[str, np.ndarray] = {}
        for name in names:
            col = table.column(name)
            if col.null_count:
                i = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
                raise bad_value(self.path, f"row {offset + i}", name, "a value", None)
            arr = _to_numpy(col)
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


def _subset(columns: Sequence[str] | None) -> tuple[str, ...]:
    """The columns a Parquet read decodes, in the schema's order: ``columns`` with ``step``
    and ``kind`` (the batch checks need them), or every column."""
    if columns is None:
        return COLUMN_NAMES
    unknown = set(columns) - set(COLUMN_NAMES)
    if unknown:
        raise ValueError(f"unknown columns: {sorted(unknown)}")
    want = set(columns) | {"step", "kind"}
    return tuple(name for name in COLUMN_NAMES if name in want)


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


def _to_numpy(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column without nulls as numpy, as ``to_numpy()`` gives it: a read-only view of
    Arrow's buffer for a number column (no copy), a new writable array for a boolean one.
    Done by hand because pyarrow's ``to_numpy`` imports pandas on its first call (~0.5
    CPU-s in the reader thread, on the critical path of the 16-token replay's pre-pass:
    docs/benchmarks.md, "16-token replay: read buffers kept, pandas not imported"); the
    replay never needs pandas otherwise."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks != 1:
            return col.to_numpy()
        col = col.chunk(0)
    typ = col.type
    n = len(col)
    if n == 0 or col.buffers()[1] is None:
        return col.to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(typ):  # bit-packed, bit i of byte i >> 3, least significant first
        bits = np.frombuffer(col.buffers()[1], np.uint8)
        out = np.unpackbits(bits, count=col.offset + n, bitorder="little").view(np.bool_)
        return out[col.offset:] if col.offset else out
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        dtype = np.dtype(typ.to_pandas_dtype())
        out = np.frombuffer(col.buffers()[1], dtype, count=n, offset=col.offset * dtype.itemsize)
        out.flags.writeable = False  # Arrow's memory: read only, as to_numpy() gives it
        return out
    return col.to_numpy(zero_copy_only=False)


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
    import pandas as pd

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
