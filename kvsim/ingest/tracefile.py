"""Reading trace files line by line with one-line errors and optional bad-row skipping.

Every reader walks its file through :func:`json_lines` (or pandas for CSV/Parquet) and
turns each record into request fields with the typed getters below, which raise
:class:`~kvsim.core.errors.KvsimInputError` naming file, line and field.  A :class:`BadRows`
decides what happens to such an error: re-raise it (default) or count it and skip the row
(``--skip-bad-rows``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import open_text


class BadRows:
    """Policy for bad rows: raise (default) or skip and count (``skip=True``)."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.count = 0
        self.first: KvsimInputError | None = None

    def handle(self, error: KvsimInputError) -> None:
        """Raise ``error``, or record it and return so the caller skips the row."""
        if not self.skip:
            raise error
        self.count += 1
        if self.first is None:
            self.first = error


def json_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, stripped text) of every non-blank line; .gz/.zst transparent."""
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            text = line.strip()
            if text:
                yield lineno, text


def parse_json(path, lineno: int, text: str) -> Any:
    """``json.loads`` with a one-line error naming the line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvsimInputError(f"invalid JSON ({exc.msg} at column {exc.colno})", path,
                              f"line {lineno}") from None
    except RecursionError:
        raise KvsimInputError("invalid JSON (nested too deeply)", path,
                              f"line {lineno}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise KvsimInputError(f"invalid JSON ({exc})", path, f"line {lineno}") from None


def csv_rows(reader, path, first_line: int = 1):
    """Iterate a ``csv.reader`` / ``csv.DictReader``; ``csv.Error`` (a NUL byte, a field
    over the size limit) becomes a one-line error naming the line."""
    import csv

    lineno = first_line
    it = iter(reader)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except csv.Error as exc:
            raise KvsimInputError(f"not readable CSV ({exc})", path,
                                  f"line {getattr(reader, 'line_num', lineno)}") from None
        lineno += 1
        yield row


def get_path(obj: Any, dotted: str) -> Any:
    """``obj['a']['b']`` for ``"a.b"``; None when any part is missing."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


INT64_MAX = 2**63 - 1
#: the one element type a JSON list of integers has (``bool`` is a subclass of ``int``:
#: refused, as ``type(v) is int`` does)
_INT_ONLY = frozenset({int})


def _number_text(value: str, path, loc: str, field: str, expected: str) -> str:
    """``value`` stripped; digits in other scripts ("٣٠٠", full-width "３００") refused:
    Python's float()/int() would read them, no trace writer means them."""
    text = value.strip()
    if not text.isascii():
        raise bad_value(path, loc, field, f"{expected} written in ASCII digits", value)
    return text


def as_int(value: Any, path, loc: str, field: str, minimum: int | None = None,
           maximum: int | None = None) -> int:
    """An integer (ints, integral floats and integral ASCII strings accepted) in
    [``minimum``, ``maximum``]; ``maximum`` defaults to int64's largest value."""
    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    out: int | None = None
    if isinstance(value, bool):
        out = None
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        text = _number_text(value, path, loc, field, expected)
        try:
            out = int(text)
        except ValueError:
            try:
                f = float(text)
                out = int(f) if f.is_integer() else None
            except (ValueError, OverflowError):
                out = None
    if out is None:
        raise bad_value(path, loc, field, expected, value)
    if minimum is not None and out < minimum:
        raise bad_value(path, loc, field, expected, value)
    top = INT64_MAX if maximum is None else maximum
    if out > top or out < -INT64_MAX - 1:
        raise bad_value(path, loc, field, f"{expected} and <= {top:,}"
                        + (" (kvsim limit, see docs/cli.md)" if maximum is not None else
                           " (int64)"), value)
    return out


def as_float(value: Any, path, loc: str, field: str, minimum: float | None = None,
             maximum: float | None = None) -> float:
    """A finite number in [``minimum``, ``maximum``]."""
    out: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            out = float(value)
        except OverflowError:  # an int beyond float range
            out = None
    elif isinstance(value, str):
        text = _number_text(value, path, loc, field, "a number")
        try:
            out = float(text)
        except ValueError:
            out = None
    if out is None or out != out or out in (float("inf"), float("-inf")):
        raise bad_value(path, loc, field, "a finite number", value)
    if minimum is not None and out < minimum:
        raise bad_value(path, loc, field, f"a number >= {minimum}", value)
    if maximum is not None and out > maximum:
        raise bad_value(path, loc, field, f"a number <= {maximum:g} (kvsim limit, see "
                        "docs/cli.md)", value)
    return out


def as_time_us(value: Any, scale_us: float, path, loc: str, field: str,
               minimum: float | None = 0.0, limits=None) -> int:
    """A timestamp in units of ``scale_us`` microseconds (1e3 = milliseconds) as integer
    microseconds; refused beyond :attr:`kvsim.core.limits.Limits.max_epoch_us` (1e300 ms, a
    unit error, would not fit int64).  ``limits``: the reader's
    :func:`kvsim.core.limits.get_limits` (read once per file: it parses the environment)."""
    if limits is None:
        from kvsim.core.limits import get_limits

        limits = get_limits()
    top = limits.max_epoch_us / scale_us
    t = as_float(value, path, loc, field, minimum, top)
    return int(round(t * scale_us))


def as_int_list(value: Any, path, loc: str, field: str) -> list[int]:
    """A JSON list of integers, each within int64."""
    # the checks run in C (set of types, min, max): ~25 ids per line of a Mooncake trace
    if not isinstance(value, list) or not set(map(type, value)) <= _INT_ONLY:
        shown = value if not isinstance(value, list) else f"list with {value[:3]}..."
        raise bad_value(path, loc, field, "a list of integers", shown)
    if value and (min(value) < -INT64_MAX - 1 or max(value) > INT64_MAX):
        for i, v in enumerate(value):  # the first one out of range, named
            if not -INT64_MAX - 1 <= v <= INT64_MAX:
                raise bad_value(path, loc, f"{field}[{i}]", "an integer within int64", v)
    return value
