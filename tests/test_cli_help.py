"""Every command of the `kvsim` CLI, discovered by walking the click tree (so commands and
nested groups added later are covered automatically), has help text, every option and
argument has help text, and `--help` exits 0."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kvsim.cli import app


def _walk(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _walk(sub, path + (name,))


ROOT = typer.main.get_command(app)
COMMANDS = list(_walk(ROOT, ()))
IDS = [" ".join(p) or "kvsim" for p, _ in COMMANDS]


def test_the_tree_is_discovered() -> None:
    names = {p for p, _ in COMMANDS}
    assert ("inspect",) in names
    assert len(COMMANDS) >= 2


@pytest.mark.parametrize("path, command", COMMANDS, ids=IDS)
def test_command_and_parameters_have_help(path: tuple[str, ...], command: Any) -> None:
    where = " ".join(("kvsim",) + path)
    assert (command.help or command.short_help or "").strip(), f"{where}: no help text"
    for param in command.params:
        label = "/".join(param.opts)
        assert (getattr(param, "help", None) or "").strip(), f"{where} {label}: no help text"


@pytest.mark.parametrize("path, command", COMMANDS, ids=IDS)
def test_help_exits_zero(path: tuple[str, ...], command: Any) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
