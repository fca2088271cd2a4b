"""Reading trace files line by line with one-line errors and optional bad-row skipping.

Every reader walks its file through :func:`json_lines` (or pandas for CSV/Parquet) and
turns each record into request fields with the typed getters below, which raise
:class:`~kvsim.errors.KvsimInputError` naming file, line and field.  A :class:`BadRows`
decides what happens to such an error: re-raise it (default) or count it and skip the row
(``--skip-bad-rows``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from kvsim.errors import KvsimInputError, bad_value
from kvsim.fsutil import open_text


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


def get_path(obj: Any, dotted: str) -> Any:
    """``obj['a']['b']`` for ``"a.b"``; None when any part is missing."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def as_int(value: Any, path, loc: str, field: str, minimum: int | None = None) -> int:
    """An integer (ints, integral floats and integral strings accepted) >= ``minimum``."""
    out: int | None = None
    if isinstance(value, bool):
        out = None
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        try:
            f = float(value)
            out = int(f) if f.is_integer() else None
        except ValueError:
            out = None
    if out is None:
        raise bad_value(path, loc, field, "an integer" if minimum is None
                        else f"an integer >= {minimum}", value)
    if minimum is not None and out < minimum:
        raise bad_value(path, loc, field, f"an integer >= {minimum}", value)
    return out


def as_float(value: Any, path, loc: str, field: str, minimum: float | None = None) -> float:
    """A finite number >= ``minimum``."""
    out: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str):
        try:
            out = float(value)
        except ValueError:
            out = None
    if out is None or out != out or out in (float("inf"), float("-inf")):
        raise bad_value(path, loc, field, "a number", value)
    if minimum is not None and out < minimum:
        raise bad_value(path, loc, field, f"a number >= {minimum}", value)
    return out


def as_int_list(value: Any, path, loc: str, field: str) -> list[int]:
    """A JSON list of integers."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool)
                                               for v in value):
        shown = value if not isinstance(value, list) else f"list with {value[:3]}..."
        raise bad_value(path, loc, field, "a list of integers", shown)
    return value
