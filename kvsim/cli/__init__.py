"""The ``kvsim`` command line: a typer app whose commands are thin shells over the API.

Each command lives in its own module below; importing the module registers its commands on
:data:`app`.  Shared conventions (errors, JSON, progress) are in :mod:`kvsim.cli.common`.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Annotated

import typer

from kvsim import __version__
from kvsim.cli.common import KvsimGroup

app = typer.Typer(
    name="kvsim",
    cls=KvsimGroup,
    help="Trace-driven simulator and policy lab for LLM KV-cache memory "
    "(HBM / DRAM / CXL / NVMe).  Docs: README.md and docs/ in the source repository "
    "(start with docs/cli.md; kv_deadline_scheduler users: docs/migrating-from-kvmi.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the kvsim version and exit.")] = False,
) -> None:
    """kvsim: replay KV-cache block events through tiered memory under placement policies."""
    from kvsim.cli.common import err_console
    from kvsim.jit.disk_cache import on_cold_compile

    # the first compiled run says why it waits (docs/simulate.md, "Engines")
    on_cold_compile(lambda message: err_console.print(message, highlight=False))


# One module per command (group); each registers itself on `app` when imported.
_COMMAND_MODULES = (
    "inspect",
    "estimate",
    "importing",
    "generate",
    "simulate",
    "log",
    "calibrate",
    "sweep",
    "plan",
    "validate",
    "reorder",
)
for _name in _COMMAND_MODULES:
    importlib.import_module(f"kvsim.cli.{_name}")


def main() -> None:
    """Console-script entry point.

    The command runs as typer runs it (its exit code, ``KvsimInputError`` as one line and
    exit 2); then the process ends without the interpreter's final teardown: the
    ``atexit`` handlers run (worker pools, temporary folders) and the standard streams are
    flushed, but the objects left alive are not freed one by one.  After a cold compile
    that freeing of numba's and LLVM's code libraries took ~0.7 s of the README job's wall
    time, spent after the output was written (docs/benchmarks.md, "Cold compile").  An
    uncaught exception (a bug) still ends the ordinary way, traceback and all."""
    from kvsim.cli.common import INTERRUPTED, TERMINATED
    from kvsim.core.errors import Terminated

    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:  # before the command ran (typer building it): one line
        sys.stderr.write(f"error: {INTERRUPTED}\n")
        code = 130
    except Terminated:
        sys.stderr.write(f"error: {TERMINATED}\n")
        code = 143
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
        code = 1
    _fast_exit(code or 0)


def _fast_exit(code: int) -> None:
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the interpreter would ignore it too
            pass
    os._exit(code)
