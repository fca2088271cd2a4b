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
    # as sets: the order they were built in is the order the modules were first imported,
    # which an earlier test in the same process decides (the help's order is COMMANDS',
    # checked by test_root_help_is_the_same_lazy_or_loaded)
    assert sorted(built) == sorted(COMMANDS)
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


# --- issue 34, per-process fixed costs (helper proc5) --------------------------------------

BENCH_ARGS = ["simulate", "--request-trace", "trace.jsonl", "--block-size", "512",
              "--hbm-blocks", "900", "--model", "llama-3.1-8b", "--policy", "lru",
              "--cxl-gb", "0", "--nvme-gb", "0", "--dram-gb", "0", "--engine", "compiled",
              "--json"]


def _parsed(argv: list[str]) -> dict:
    """The values `kvsim ARGV` hands its command (the command itself not run) and the heavy
    modules imported by then (``plain``); then the values with every option converted by
    typer's own conversion (pydantic), as before kvsim's plain conversion (``own``)."""
    code = ("import sys, json\n"
            "import typer.main\n"
            "from typer._coercion import build_runtime_param\n"
            "from kvsim.cli import app\n"
            f"sys.argv = ['kvsim', *{argv!r}]\n"
            "group = typer.main.get_group(app)\n"
            "command = group.get_command(None, sys.argv[1])\n"
            "got = {}\n"
            "def record(**kw):\n"
            "    got.update({k: repr(v) for k, v in kw.items()})\n"
            "command.callback = record\n"
            "out = {}\n"
            "for way in ('plain', 'own'):\n"
            "    if way == 'own':\n"
            "        for p in command.params:\n"
            "            p._runtime_param = build_runtime_param(p.type_descriptor)\n"
            "    got.clear()\n"
            "    try:\n        group.main(standalone_mode=False)\n    except SystemExit:\n"
            "        pass\n"
            "    out[way] = {'values': dict(got), 'modules': [m for m in ('pydantic', "
            "'typer._adapters', 'pyarrow.parquet') if m in sys.modules]}\n"
            "print(json.dumps(out))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="120"), timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_simulate_options_convert_without_pydantic_as_typer_does() -> None:
    # typer converts every option through a pydantic TypeAdapter: importing pydantic and
    # typer's adapters was 0.08-0.14 CPU-s of every `kvsim simulate` process
    both = _parsed(BENCH_ARGS)
    plain, own = both["plain"], both["own"]
    assert plain["modules"] == []
    assert "pydantic" in own["modules"]
    assert plain["values"] == own["values"]
    assert plain["values"]["block_size"] == "512" and plain["values"]["dram_gb"] == "0.0"


def test_plain_conversion_equals_typers_on_every_option() -> None:
    """Every option of every command: kvsim's plain conversion gives typer's value, or
    typer's own error, for plain and odd values alike."""
    import importlib

    from typer._click.exceptions import BadParameter
    from typer._coercion import build_runtime_param

    from kvsim.cli.common import _PlainValue

    raws = ["512", "0", "-3", "1", "1.5", "0.001", "-0.25", "-0", "-0.0", "1e3", " 5", "05",
            "1_000", "abc", "", "inf", "nan", "99999999999999999999", "0.99", "1.0",
            "x/y.jsonl", "-", ".", "/", 3, 2.5, True, (), ("a",)]
    for module, _hidden, _text in COMMANDS.values():
        importlib.import_module(f"kvsim.cli.{module}")
    checked = 0
    for command in typer.main.get_group(app).commands.built.values():
        subs = getattr(command, "commands", None) or {command.name: command}
        for sub in subs.values():
            for param in sub.params:
                plain = getattr(param, "_runtime_param", None)
                if not isinstance(plain, _PlainValue):
                    continue
                own = build_runtime_param(param.type_descriptor)
                for raw in [None, *raws]:
                    try:
                        want = ("ok", repr(own.coerce(raw, param, None)))
                    except BadParameter as e:
                        want = ("error", e.format_message())
                    try:
                        got = ("ok", repr(plain.coerce(raw, param, None)))
                    except BadParameter as e:
                        got = ("error", e.format_message())
                    assert got == want, (sub.name, param.name, raw)
                    checked += 1
    assert checked > 1000


def test_a_run_imports_only_its_own_policies() -> None:
    # every built-in policy module (13, each a set of numba dispatchers) was imported to
    # resolve one name
    code = ("import sys\n"
            "from kvsim.policy.registry import get_policy, list_policies\n"
            "assert get_policy('lru').name == 'lru' and get_policy('fifo').name == 'fifo'\n"
            "print(sorted(m for m in sys.modules if m.startswith('kvsim.policies.')))\n"
            "print(len(list_policies()))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    loaded, count = p.stdout.strip().splitlines()
    assert loaded == "['kvsim.policies.fifo', 'kvsim.policies.lru']"
    assert int(count) == 13  # listing still finds every one
