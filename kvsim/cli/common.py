"""Conventions shared by every command: error handling, output, progress, shared options.

- Results go to stdout (a rich table, or JSON with ``--json``); progress and logs go to
  stderr, so ``kvsim ... --json | jq`` always works.
- A :class:`kvsim.errors.KvsimError` raised anywhere under a command becomes ONE line on
  stderr (``error: <file>: <line>: field '<f>': expected ...``) and its exit code (2 for bad
  input), never a traceback.  Exit codes are documented in docs/cli.md.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from typer.core import TyperGroup

from kvsim.errors import EXIT_BAD_INPUT, KvsimError

#: stdout: results only.
out_console = Console(soft_wrap=True)
#: stderr: progress, warnings, logs.
err_console = Console(stderr=True)


def fail(message: str, code: int) -> None:
    """Print one line ``error: message`` on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {message}\n".replace("\r", " "))
    raise typer.Exit(code)


class KvsimGroup(TyperGroup):
    """The root command group: turns user errors into one line and an exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KvsimError as exc:
            fail(str(exc).replace("\n", " "), exc.exit_code)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            fail(f"{exc.filename}: {exc.strerror}", EXIT_BAD_INPUT)


JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the result as JSON on stdout (stable keys, "
                       "documented in docs/cli.md) instead of a table.")
]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return _jsonable(asdict(obj))
    return obj


def emit_json(obj: Any) -> None:
    """Write ``obj`` as JSON to stdout (numpy scalars converted, NaN/inf as null)."""
    sys.stdout.write(json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")


def quiet_progress(json_: bool) -> bool:
    """Progress is silent under ``--json`` when stdout is not a terminal (a pipe or a file:
    a script reads the JSON, nobody watches the bar)."""
    return bool(json_) and not sys.stdout.isatty()


def progress(transient: bool = True, quiet: bool = False) -> Progress:
    """A rich progress bar on stderr: description, bar, done/total, elapsed, ETA (hidden
    when stderr is not a terminal, or when ``quiet``, see :func:`quiet_progress`)."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=transient,
        disable=quiet or not err_console.is_terminal,
    )
