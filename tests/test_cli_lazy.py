"""The command line imports a command's module only when that command runs: `kvsim --help`
and `kvsim --version` import no command module, numba, numpy, pandas or pyarrow (issue 34: the
import was 1.13 CPU-s of a 5.1 CPU-s Mooncake run), and the root's --help lists exactly
what the modules register (kvsim.cli.COMMANDS against the modules themselves)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys

import typer
import typer.main

from kvsim.cli import COMMANDS, app

HEAVY = ("numba", "numpy", "pandas", "pyarrow", "kvsim.api", "kvsim.cli.simulate", "kvsim.cli.log")


def _modules_after(argv: list[str]) -> tuple[list[str], str]:
    """The heavy modules a fresh `kvsim ARGV` process imported, and what it printed."""
    code = ("import sys, json\n"
            f"sys.argv = ['kvsim', *{argv!r}]\n"
            "from kvsim.cli import app\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n")
    env = dict(os.environ, COLUMNS="120")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    return json.loads(p.stderr.strip().splitlines()[-1]), p.stdout


def test_version_and_help_import_no_command_module() -> None:
    for argv in (["--version"], ["--help"], []):
        loaded, out = _modules_after(argv)
        assert loaded == [], (argv, loaded)
        assert out.strip(), argv


def test_the_table_matches_the_modules() -> None:
    for module, _hidden, _text in COMMANDS.values():
        importlib.import_module(f"kvsim.cli.{module}")
    infos = {i.name: i.callback.__module__ for i in app.registered_commands}
    infos.update({i.name: i.typer_instance.registered_commands[0].callback.__module__
                  for i in app.registered_groups})
    root = typer.main.get_group(app)
    built = root.commands.built  # every module imported above: all built
    assert list(built) == list(COMMANDS)
    for name, command in built.items():
        module, hidden, text = COMMANDS[name]
        assert infos[name] == f"kvsim.cli.{module}", name
        assert command.hidden == hidden, name
        first = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
        assert first == text, name


def test_root_help_is_the_same_lazy_or_loaded() -> None:
    _loaded, lazy = _modules_after(["--help"])
    code = ("import sys, importlib\n"
            "from kvsim.cli import COMMANDS, app\n"
            "[importlib.import_module('kvsim.cli.' + m) for m, _h, _t in COMMANDS.values()]\n"
            "sys.argv = ['kvsim', '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="120"), timeout=120)
    assert p.stdout == lazy
    assert "simulate" in lazy and "demo" not in lazy  # hidden stays hidden


def test_typo_suggestion_and_unknown_command() -> None:
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["simulat"])
    assert r.exit_code == 2
    assert "No such command 'simulat'. Did you mean 'simulate'?" in r.output
    r = CliRunner().invoke(app, ["nosuch"])
    assert r.exit_code == 2 and "No such command 'nosuch'." in r.output
