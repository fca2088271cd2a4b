"""The ``kvsim`` command runs with :data:`kvsim.core.process_gc.CLI_THRESHOLDS` (issue 34:
a warm 1-replica Mooncake run spent 0.23 CPU-s in Python's garbage collector rescanning
the objects its start-up built; docs/benchmarks.md, "Per-process fixed costs (session 18,
proc6)"), and gives the interpreter's thresholds back when the command returns or fails;
``import kvsim`` alone leaves them as they were."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from kvsim.cli import common
from kvsim.core.process_gc import CLI_THRESHOLDS, cli_thresholds


def test_cli_thresholds_set_and_restored():
    before = gc.get_threshold()
    with cli_thresholds():
        assert gc.get_threshold() == CLI_THRESHOLDS
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), cli_thresholds():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


@pytest.mark.parametrize("outcome", ["ok", "error"])
def test_command_runs_under_cli_thresholds(monkeypatch, outcome):
    seen = []

    def command(self, *args, **kwargs):  # the typer group's main: where the command runs
        seen.append(gc.get_threshold())
        if outcome == "error":
            raise common.KvsimError("bad")
        return 0

    monkeypatch.setattr(common.TyperGroup, "main", command)
    before = gc.get_threshold()
    with pytest.raises(SystemExit):
        common.KvsimGroup().main(args=[], standalone_mode=True)
    assert seen == [CLI_THRESHOLDS]
    assert gc.get_threshold() == before


def test_import_leaves_the_collector_alone():
    code = ("import gc; t = gc.get_threshold(); import kvsim, kvsim.api, kvsim.cli; "
            "assert gc.get_threshold() == t, (t, gc.get_threshold())")
    subprocess.run([sys.executable, "-c", code], check=True)
