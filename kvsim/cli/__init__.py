"""The ``kvsim`` command line: a typer app whose commands are thin shells over the API.

Each command lives in its own module below; importing the module registers its commands on
:data:`app`.  Shared conventions (errors, JSON, progress) are in :mod:`kvsim.cli.common`.
"""

from __future__ import annotations

import importlib
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
    "validate",
)
for _name in _COMMAND_MODULES:
    importlib.import_module(f"kvsim.cli.{_name}")


def main() -> None:
    """Console-script entry point."""
    app()
