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


#: The parsed-trace cache's switch (:mod:`kvsim.core.parsed_cache`).
TRACE_CACHE_ENV = "KVSIM_TRACE_CACHE"
#: The folder of the tables kept out of memory (:mod:`kvsim.core.spill`).
TMPDIR_ENV = "KVSIM_TMPDIR"


def trace_cache_on() -> bool:
    """``KVSIM_TRACE_CACHE``: ``0`` off, ``1`` or unset on; any other value (``off``,
    ``false``, which would otherwise leave the cache on silently) is an error."""
    import os

    switch = os.environ.get(TRACE_CACHE_ENV, "")
    if switch not in ("", "0", "1"):
        raise KvsimInputError(f"expected 0 (the parsed-trace cache off) or 1 (on), got "
                              f"{switch!r}", None, None, TRACE_CACHE_ENV)
    return switch != "0"


def spill_dir() -> str | None:
    """``KVSIM_TMPDIR``: the folder of kvsim's temporary files (None: Python's default,
    ``TMPDIR`` then /tmp).  Set, it must name an existing folder kvsim may write into: a
    missing one was an exit-1 "cannot write a temporary file" only once a long run first
    spilled a table, and nothing at all in a short one."""
    import os

    folder = os.environ.get(TMPDIR_ENV) or None
    if folder is not None and not (os.path.isdir(folder) and
                                   os.access(folder, os.W_OK | os.X_OK)):
        why = ("not writable" if os.path.isdir(folder) else
               "not a folder" if os.path.exists(folder) else "no such folder")
        raise KvsimInputError(f"expected an existing, writable folder for kvsim's temporary "
                              f"files (tables kept out of memory), got {folder!r} ({why})",
                              None, None, TMPDIR_ENV)
    return folder


def check_environment() -> None:
    """The environment variables of kvsim, checked before a command's work, whatever the
    command (docs/cli.md, "Safety"); main read each only where it was used, so a typo
    passed silently in every run that did not reach that code: ``KVSIM_TRACE_CACHE`` (a
    Mooncake parse), ``KVSIM_TMPDIR`` (a spill), ``KVSIM_LIMIT_<NAME>`` (the limit's
    check), ``KVSIM_COMPILE_WORKERS`` (a cold compile), ``KVSIM_CACHE_CHECK`` (anything
    but ``full`` meant off), ``KVSIM_PROGRESS_INTERVAL_S`` (``nan`` was taken)."""
    import os

    from kvsim.core.limits import get_limits

    trace_cache_on()
    spill_dir()
    get_limits()  # every KVSIM_LIMIT_<NAME>
    env = os.environ
    for name, ok, expected in (
            ("KVSIM_COMPILE_WORKERS", lambda v: v.isdigit() and int(v) >= 1,
             "an integer >= 1"),
            ("KVSIM_CACHE_CHECK", lambda v: v == "full", "full (or unset)"),
            ("KVSIM_PROGRESS_INTERVAL_S", _seconds, "a number of seconds >= 0")):
        value = env.get(name, "").strip()
        if value and not ok(value):
            raise KvsimInputError(f"expected {expected}, got {env[name]!r}", None, None, name)


def _seconds(text: str) -> bool:
    try:
        return 0 <= float(text) < math.inf
    except ValueError:
        return False
