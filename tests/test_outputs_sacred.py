"""Inputs are sacred (issue 38): every output option of every command is known to the one
central check (kvsim.cli.common.OUTPUT_OPTIONS / check_command_paths), and the check sees
through symlinks and hard links.  The command-line cases are rows of the bad-input corpus
(tests/bad_inputs/cli_cases.toml, "inputs are sacred")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer.main

from kvsim.cli import app
from kvsim.cli.common import OUTPUT_OPTIONS
from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import check_inputs_outputs

#: Parameter names that write something; an option so named on a command missing from
#: OUTPUT_OPTIONS would escape the check.  (``replay --decision-log`` reads a log.)
OUTPUT_WORDS = ("out", "csv", "parquet", "html", "png", "decision_log", "decision_log_dir",
                "requests_out")
READS = {("replay", "decision_log"), ("show", "csv"), ("timeline", "csv")}  # csv: a flag (stdout)


def _leaves(command, name=""):
    subs = getattr(command, "commands", None)
    if subs:
        for sub_name, sub in subs.items():
            yield from _leaves(sub, sub_name)
    else:
        yield name, command


def test_every_output_option_is_checked() -> None:
    root = typer.main.get_command(app)
    missing = []
    for name, command in _leaves(root):
        for param in command.params:
            if param.name in OUTPUT_WORDS and (name, param.name) not in READS \
                    and param.name not in OUTPUT_OPTIONS.get(name, {}):
                missing.append(f"{name} {param.name}")
    assert missing == []


def test_symlink_hard_link_and_folder(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    trace.write_bytes(b"x")
    (tmp_path / "l.parquet").symlink_to(trace)
    os.link(trace, tmp_path / "h.parquet")
    for out in ("t.parquet", "l.parquet", "h.parquet", "./t.parquet"):
        with pytest.raises(KvsimInputError, match="--out .* same file as the input --trace"):
            check_inputs_outputs([("--trace", trace)], [("--out", tmp_path / out, False)])
    with pytest.raises(KvsimInputError, match="folder holding"):
        check_inputs_outputs([("--trace", trace)], [("--dir", tmp_path, True)])
    check_inputs_outputs([("--trace", trace)], [("--out", tmp_path / "o.parquet", False)])
