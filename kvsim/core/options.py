"""Option values checked the same way by every command (kvsim.cli.common applies them to
every option centrally; a command module calls the reusable ones on its own values).

Each check raises :class:`kvsim.core.errors.KvsimInputError` naming the option as typed
(``--hbm-gb``), so the command prints one ``error:`` line and exits 2 (docs/cli.md).  No
typer here: the checks are plain functions of the option's name and value, usable from
the Python API's callers too.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from kvsim.core.errors import KvsimInputError

#: The largest value of an int64 option (numpy's and the compiled code's integers).
INT64_MAX = 2**63 - 1


def _base_type(annotation: Any) -> Any:
    """``float`` for ``float``, ``float | None``, ``Optional[float]``, ``list[float]``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0]) if len(args) == 1 else None
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        return _base_type(args[0]) if args else None
    return annotation


def option_error(option: str, expected: str, got: Any) -> KvsimInputError:
    """The one-line error of a bad option value: ``--opt: expected X, got 'Y'``."""
    return KvsimInputError(f"expected {expected}, got {got!r}", None, None, option)


def check_finite(option: str, value: float | None, minimum: float | None = None,
                 maximum: float | None = None) -> float | None:
    """Reusable check of a float option: finite (no nan / inf) and within bounds."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise option_error(option, "a finite number", str(value))
    if minimum is not None and value < minimum:
        raise option_error(option, f"a number >= {minimum:g}", value)
    if maximum is not None and value > maximum:
        raise option_error(option, f"a number <= {maximum:g}", value)
    return value


def check_limit(option: str, value: int | None, limit: str) -> int | None:
    """Reusable: ``value`` of ``option`` must not exceed the :mod:`kvsim.core.limits` limit
    ``limit`` (e.g. ``"max_prompt_tokens"``); the error says how to raise it."""
    from kvsim.core.limits import get_limits

    top = getattr(get_limits(), limit)
    if value is not None and value > top:
        raise option_error(option, f"at most {top:,} (kvsim limit {limit}; raise it with "
                           f"KVSIM_LIMIT_{limit.upper()})", value)
    return value


def check_option_value(option: str, base: Any, raw: Any) -> None:
    """The checks every option value passes before typer converts it (all commands):
    a float must be finite (``nan``, ``inf`` refused: typer would accept ``inf`` and
    report ``nan`` as out of range); an integer must fit in int64; ``--seed`` must be
    >= 0 (numpy seeds are non-negative).  Raises :class:`KvsimInputError`."""
    values = raw if isinstance(raw, (list, tuple)) else [raw]
    for v in values:
        if not isinstance(v, str):
            continue
        text = v.strip()
        if base is float:
            try:
                f = float(text)
            except ValueError:
                continue  # typer reports a non-number itself
            if not math.isfinite(f):
                raise option_error(option, "a finite number", v)
            if not text.isascii():
                raise option_error(option, "a number written in ASCII digits", v)
        elif base is int:
            try:
                i = int(text)
            except ValueError:
                continue
            if not text.isascii():
                raise option_error(option, "an integer written in ASCII digits", v)
            if not -INT64_MAX - 1 <= i <= INT64_MAX:
                raise option_error(option, "an integer within int64 (|n| < 2**63)", v)
            if option == "--seed" and i < 0:
                raise option_error(option, "a seed >= 0", v)


def comma_names(option: str, text: str | None) -> list[str] | None:
    """The names of a comma-separated option (``--policies lru,arc``), stripped; None when
    the option was not given.  Given but naming nothing (``--policies ""``, ``","``) is an
    error: the command would otherwise run its default set silently."""
    if text is None:
        return None
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise option_error(option, "a comma-separated list of names (leave the option out "
                           "for the default)", text)
    if len(set(names)) != len(names):  # compare ran a policy twice, sweep refused
        raise option_error(option, "distinct names", text)
    return names
