"""Reader for any JSONL / CSV / Parquet request log, given a column mapping.

``mapping`` maps canonical fields to the file's column names (``--map
arrival_ms=ts,prompt_tokens=in,output_tokens=out``); a JSONL source name may be dotted to
reach nested objects (``usage.prompt_tokens``).  Fields not mapped are looked up under
their own name, then take their defaults.  Canonical fields:

* arrival, one of ``arrival_us``, ``arrival_ms``, ``arrival_s`` (required; relative or
  absolute numbers: arrivals are made relative to the earliest);
* ``prompt_tokens``, ``output_tokens`` (required);
* ``block_ids``: a list of integers (JSONL, Parquet) or integers separated by spaces or
  ``;`` (CSV): content ids of ``trace_block_tokens``-token blocks (default 16), equal
  ids meaning equal content *and prefix*;  ``hashed_tokens`` defaults to
  ``min(len(block_ids) * trace_block_tokens, prompt_tokens)``;
* ``session`` (integer or name), ``tenant`` (integer), ``request_priority`` (0..100),
  ``ttft_deadline_us`` | ``ttft_deadline_ms``, ``tpot_deadline_us`` | ``tpot_deadline_ms``
  (budgets relative to arrival), ``n``, ``beam_width``, ``model``;
* ``cache_salt`` (a string; vLLM's request field): requests with different salts never
  share a prompt block, as vLLM salts the first block's hash
  (:func:`kvsim.ingest.requests.salt_block_ids`); absent or empty = no salt.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import open_text, strip_compression_suffix
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import (
    INT64_MAX,
    BadRows,
    as_float,
    as_int,
    as_time_us,
    csv_rows,
    get_path,
    json_lines,
    parse_json,
)

CANONICAL_FIELDS = ("arrival_us", "arrival_ms", "arrival_s", "prompt_tokens", "output_tokens",
                    "block_ids", "hashed_tokens", "session", "tenant", "request_priority",
                    "ttft_deadline_us", "ttft_deadline_ms", "tpot_deadline_us",
                    "tpot_deadline_ms", "n", "beam_width", "model", "cache_salt")
_ARRIVAL_SCALE = {"arrival_us": 1.0, "arrival_ms": 1e3, "arrival_s": 1e6}


def parse_mapping(text: str | dict[str, str] | None) -> dict[str, str]:
    """``"a=x,b=y"`` (or a dict) -> {canonical: source}; unknown canonical names rejected."""
    if text is None:
        return {}
    if isinstance(text, dict):
        pairs = list(text.items())
    else:
        pairs = []
        for part in text.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise bad_value(None, None, "--map", "canonical=column pairs separated by ','",
                                part)
            k, v = part.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    out = {}
    for k, v in pairs:
        if k not in CANONICAL_FIELDS:
            raise bad_value(None, None, "--map", "a canonical field (" + ", ".join(
                CANONICAL_FIELDS) + ")", k)
        out[k] = v
    return out


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, record dict) of every row; location is ``line N`` or ``row N``."""
    name = strip_compression_suffix(path)
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        row = 0
        try:
            if path.stat().st_size == 0:
                raise KvsimInputError("empty file (0 bytes)", path)
            pf = pq.ParquetFile(path)
            batches = pf.iter_batches(batch_size=65536)
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                for rec in batch.to_pylist():
                    yield f"row {row}", rec
                    row += 1
        except (pa.ArrowException, OSError, ValueError) as exc:
            text = " ".join(str(exc).split())[:200]
            raise KvsimInputError(f"not a readable Parquet file (corrupt or truncated: "
                                  f"{text})", path, f"row {row}" if row else None) from None
    elif name.endswith(".csv") or name.endswith(".tsv"):
        with open_text(path) as fh:
            reader = csv.DictReader(fh, delimiter="\t" if name.endswith(".tsv") else ",")
            for i, rec in enumerate(csv_rows(reader, path), start=2):
                if None in rec:  # more fields than the header names
                    rec = KvsimInputError(f"expected {len(reader.fieldnames or [])} fields "
                                          "(as in the header line), got more", path,
                                          f"line {i}")
                yield f"line {i}", rec
    else:
        for lineno, text in json_lines(path):
            try:
                rec = parse_json(path, lineno, text)
                if not isinstance(rec, dict):
                    raise KvsimInputError("expected a JSON object", path, f"line {lineno}")
            except KvsimInputError as exc:
                rec = exc  # handed to the caller's bad-row policy, reading continues
            yield f"line {lineno}", rec


def _ids(value: Any, path, loc: str, field: str) -> list[int]:
    if isinstance(value, str):
        parts = value.replace(";", " ").split()
        try:
            if not value.isascii():
                raise ValueError
            out = [int(p) for p in parts]
            if any(not -INT64_MAX - 1 <= x <= INT64_MAX for x in out):
                raise ValueError
            return out
        except ValueError:
            raise bad_value(path, loc, field, "integers separated by spaces or ';'",
                            value) from None
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) and -INT64_MAX - 1 <= v <= INT64_MAX
            for v in value):
        return list(value)
    raise bad_value(path, loc, field, "a list of integers", value)


def read_generic(path: str | Path, mapping: str | dict[str, str] | None = None, *,
                 skip_bad_rows: bool = False, trace_block_tokens: int = 16) -> RequestTable:
    """Read a JSONL / CSV / Parquet request log through ``mapping``."""
    path = Path(path)
    m = parse_mapping(mapping)
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    arrival_key = next((k for k in ("arrival_us", "arrival_ms", "arrival_s") if k in m), None)
    cols: dict[str, list] = {k: [] for k in (
        "arrival_us", "prompt_tokens", "output_tokens", "block_ids", "hashed_tokens", "session",
        "tenant", "request_priority", "ttft_deadline_us", "tpot_deadline_us", "n",
        "beam_width", "model")}
    sessions: dict[str, int] = {}
    salts: list[str | None] = []

    def get(rec: dict, field: str) -> Any:
        src = m.get(field, field)
        return get_path(rec, src) if "." in src and src not in rec else rec.get(src)

    def label(field: str) -> str:
        return m.get(field, field)

    for loc, rec in _records(path):
        try:
            if isinstance(rec, KvsimInputError):
                raise rec
            key = arrival_key or next((k for k in _ARRIVAL_SCALE if get(rec, k) not in
                                       (None, "")), None)
            if key is None:
                raise KvsimInputError("missing arrival (map one of arrival_us, "
                                      "arrival_ms, arrival_s)", path, loc, "arrival_us")
            row: dict[str, Any] = {"arrival_us": as_time_us(
                get(rec, key), _ARRIVAL_SCALE[key], path, loc, label(key), None)}
            for f in ("prompt_tokens", "output_tokens"):
                v = get(rec, f)
                if v in (None, ""):
                    raise KvsimInputError("missing required field", path, loc, label(f))
                row[f] = as_int(v, path, loc, label(f), 1, lim.max_prompt_tokens
                                if f == "prompt_tokens" else lim.max_output_tokens)
            v = get(rec, "block_ids")
            ids = [] if v in (None, "") else _ids(v, path, loc, label("block_ids"))
            row["block_ids"] = ids
            v = get(rec, "hashed_tokens")
            row["hashed_tokens"] = (min(len(ids) * trace_block_tokens, row["prompt_tokens"])
                                    if v in (None, "") else
                                    as_int(v, path, loc, label("hashed_tokens"), 0))
            v = get(rec, "session")
            if v in (None, ""):
                row["session"] = -1
            elif isinstance(v, int) and not isinstance(v, bool):
                row["session"] = v
            else:
                row["session"] = sessions.setdefault(str(v), len(sessions))
            for f, d in (("tenant", 0), ("request_priority", 50), ("n", 1),
                         ("beam_width", 1)):
                v = get(rec, f)
                row[f] = d if v in (None, "") else as_int(v, path, loc, label(f), 0)
            for f in ("ttft", "tpot"):
                us, ms = get(rec, f"{f}_deadline_us"), get(rec, f"{f}_deadline_ms")
                if us not in (None, ""):
                    row[f"{f}_deadline_us"] = as_int(us, path, loc, label(f"{f}_deadline_us"), 1)
                elif ms not in (None, ""):
                    row[f"{f}_deadline_us"] = int(round(as_float(
                        ms, path, loc, label(f"{f}_deadline_ms"), 0.001, INT64_MAX / 1e4)
                        * 1000))
                else:
                    row[f"{f}_deadline_us"] = -1
            v = get(rec, "model")
            row["model"] = "" if v is None else str(v)
            salt = get(rec, "cache_salt")
            if salt is not None and not isinstance(salt, str):
                raise bad_value(path, loc, label("cache_salt"), "a string", salt)
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        for k, v in row.items():
            cols[k].append(v)
        salts.append(salt or None)
    if cols["arrival_us"]:
        t0 = min(cols["arrival_us"])
        cols["arrival_us"] = [t - t0 for t in cols["arrival_us"]]
    table = build_request_table(cols, block_size_tokens=trace_block_tokens, path=str(path),
                                skipped=bad.count,
                                source={"format": "generic", "file": path.name, "map": m,
                                        "trace_block_tokens": trace_block_tokens})
    if any(salts):
        from kvsim.ingest.requests import salt_block_ids

        # build_request_table sorted the rows by arrival (stable): salts follow
        order = np.argsort(np.asarray(cols["arrival_us"], dtype=np.int64), kind="stable")
        table = salt_block_ids(table, [salts[i] for i in order])
        table.source["cache_salt"] = True
    return table
