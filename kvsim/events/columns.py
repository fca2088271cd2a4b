"""Event columns: dtypes, enum names, the JSONL header key, and the validation the reader
and the writer share (vectorised over a batch).  See :mod:`kvsim.events`."""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kvsim.core.fsutil import strip_compression_suffix
from kvsim.core.schema import COLUMN_NAMES, COLUMNS, ENUM_COLUMNS, EventKind

#: Key of the first JSONL line's object whose value is the schema version.
JSONL_HEADER_KEY = "kvsim_events"

#: numpy dtype of every column (the Arrow type's numpy equivalent; enums are int8).
DTYPES: dict[str, np.dtype] = {name: np.dtype(typ.to_pandas_dtype()) for name, typ, _ in COLUMNS}

#: Fields every JSONL event line must carry.  Besides these, ``request_id`` is required on
#: every line whose kind is not ``STEP`` and ``block_index`` on ``ALLOCATE`` and ``COMMIT``
#: lines.  Every other field defaults to :data:`kvsim.core.schema.DEFAULTS`.
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


#: The int values of each enum column's members; the kinds of block- and request-level
#: events.  Tested by one equality pass per value (int8 comparisons vectorise: ~10x
#: cheaper than ``np.isin`` on a batch; docs/benchmarks.md, "Issue 34: the 16-token
#: replay's passes").
_ENUM_VALID = {col: tuple(int(m) for m in enum_cls) for col, enum_cls in ENUM_COLUMNS.items()}
_BLOCK_LEVEL = tuple(int(k) for k in BLOCK_LEVEL_KINDS)
_REQUEST_LEVEL = tuple(int(k) for k in REQUEST_LEVEL_KINDS)


def _one_of(values: np.ndarray, members: tuple[int, ...], negate: bool = False) -> np.ndarray:
    """Is each value one of ``members`` (with ``negate``: none of them)?  Two boolean
    arrays per call, whatever the number of members (one scratch array reused: a batch's
    temporaries are page-faulted afresh, ~12 % of the pre-pass reader's samples on the
    Mooncake 16-token import before; docs/benchmarks.md, "16-token replay: read buffers
    kept, pandas not imported")."""
    out = values == members[0]
    if len(members) > 1:
        tmp = np.empty_like(out)
        for m in members[1:]:
            np.equal(values, m, out=tmp)
            out |= tmp
    if negate:
        np.logical_not(out, out=out)
    return out


def _validate_columns(cols: Mapping[str, np.ndarray], prev_step: int, error: _ErrorFactory,
                      kind_names: bool = True, checked: Container[str] = ()) -> None:
    """Check the batch invariants listed in the module docstring; ``prev_step`` is the last
    step of the previous batch (-1 for the first).  A batch read with a subset of the
    columns (``EventReader.batches(columns=...)``: ``step`` and ``kind`` always among
    them) gets the checks of those columns only; the checks that read only columns of
    ``checked`` (checked by an earlier pass over the same file) are left out."""

    def todo(col: str) -> bool:
        return col in cols and col not in checked

    step = cols["step"]
    if step.size == 0:
        return
    if todo("step"):
        _check(step < 0, "step", "a step >= 0", step, error)
        if step[0] < prev_step:
            raise error(0, "step", f"steps never decreasing (previous row has step "
                        f"{prev_step})", step[0].item())
        if step.size > 1:
            dec = np.empty(step.size, dtype=bool)
            dec[0] = False
            np.less(step[1:], step[:-1], out=dec[1:])
            if dec.any():
                i = int(np.argmax(dec))
                raise error(i, "step", f"steps never decreasing (previous row has step "
                            f"{int(step[i - 1])})", step[i].item())
    for col, enum_cls in ENUM_COLUMNS.items():
        if not todo(col):
            continue
        values = cols[col]
        names = ", ".join(m.name for m in enum_cls)
        _check(_one_of(values, _ENUM_VALID[col], negate=True), col, f"one of {names}", values, error)
    kind = cols["kind"]
    if todo("block_index") or "block_index" in cols and todo("kind"):
        bidx = cols["block_index"]
        _check(bidx < -1, "block_index", "block_index >= 0, or -1 for request-level events",
               bidx, error)
        _check(_one_of(kind, _BLOCK_LEVEL) & (bidx < 0), "block_index",
               "block_index >= 0 on ALLOCATE and COMMIT events", bidx, error)
        _check(_one_of(kind, _REQUEST_LEVEL) & (bidx != -1), "block_index",
               "block_index -1 on STEP, ARRIVE, ACCESS and FORK events", bidx, error)
    if todo("request_id") or "request_id" in cols and todo("kind"):
        rid = cols["request_id"]
        _check(rid < -1, "request_id", "request_id >= 0 (or -1 on STEP rows)", rid, error)
        _check((kind != int(EventKind.STEP)) & (rid < 0), "request_id",
               "request_id >= 0 on every event but STEP", rid, error)
    if todo("parent_request_id") or "parent_request_id" in cols and todo("kind"):
        parent = cols["parent_request_id"]
        _check(parent < -1, "parent_request_id", "parent_request_id >= 0 or -1", parent,
               error)
        _check((kind == int(EventKind.FORK)) & (parent < 0), "parent_request_id",
               "parent_request_id >= 0 on FORK events", parent, error)
    for col in ("num_tokens", "size_bytes", "time_us", "tenant"):
        if todo(col):
            _check(cols[col] < 0, col, f"{col} >= 0", cols[col], error)
    for col in ("deadline_us", "target_decode_step"):
        if todo(col):
            _check(cols[col] < -1, col, f"{col} >= 0 or -1 (unset)", cols[col], error)
    if todo("request_priority"):
        rp = cols["request_priority"]
        _check((rp < 0) | (rp > 100), "request_priority", "request_priority in 0..100", rp,
               error)
    for col in _FLOAT_COLUMNS:
        if not todo(col):
            continue
        values = cols[col]
        _check(~np.isfinite(values), col, "a finite number", values, error)
        _check(values < 0, col, f"{col} >= 0", values, error)

