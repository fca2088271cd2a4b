"""The ``kvsim`` command runs with :data:`kvsim.core.process_gc.CLI_THRESHOLDS` (issue 34:
a warm 1-replica Mooncake run spent 0.23 CPU-s in Python's garbage collector rescanning
the objects its start-up built; docs/benchmarks.md, "Per-process fixed costs"), from the start of the command whether it succeeds or fails, and keeps them (going
back to 700 at the end started one large collection); ``import kvsim`` and ``import
kvsim.cli`` alone leave the collector as it was."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from kvsim.cli import common
from kvsim.core.process_gc import CLI_THRESHOLDS


@pytest.fixture
def default_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


@pytest.mark.parametrize("outcome", ["ok", "error"])
def test_command_runs_under_cli_thresholds(monkeypatch, default_thresholds, outcome):
    seen = []

    def command(self, *args, **kwargs):  # the typer group's main: where the command runs
        seen.append(gc.get_threshold())
        if outcome == "error":
            raise common.KvsimError("bad")
        return 0

    monkeypatch.setattr(common.TyperGroup, "main", command)
    with pytest.raises(SystemExit):
        common.KvsimGroup().main(args=[], standalone_mode=True)
    assert seen == [CLI_THRESHOLDS]
    assert gc.get_threshold() == CLI_THRESHOLDS


def test_a_real_command_process_runs_under_them():
    code = ("import gc, sys\n"
            "from kvsim.cli import app\n"
            "assert gc.get_threshold() == (700, 10, 10), gc.get_threshold()\n"
            "sys.argv = ['kvsim', 'policies', '--help']\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "print(gc.get_threshold(), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True)
    assert p.stderr.strip().splitlines()[-1] == str(CLI_THRESHOLDS)


def test_import_leaves_the_collector_alone():
    code = ("import gc; t = gc.get_threshold(); import kvsim, kvsim.api, kvsim.cli; "
            "assert gc.get_threshold() == t, (t, gc.get_threshold())")
    subprocess.run([sys.executable, "-c", code], check=True)
