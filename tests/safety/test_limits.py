"""Limits and degenerate runs (issue 38) that a corpus row cannot express: a pipe read as
``--requests /dev/stdin`` (format detection must not consume its start), a run that
serves nothing (refused, never "0 requests" at exit 0), requests dropped because they
never fit HBM (a warning).  The other cases are corpus rows (line length, turns = 0,
--replicas over the memory budget: tests/bad_inputs/cli_cases.toml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli import app
from tests.helpers import assert_one_line_error

TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_stdin_errors_name_the_right_line(tmp_path: Path) -> None:
    lines = (TRACES / "sample_mooncake.jsonl").read_text().splitlines()[:10]
    bad = '{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": [1]}'
    result = subprocess.run([sys.executable, "-m", "kvsim", "import-request-trace",
                             "--requests", "/dev/stdin", "--out", str(tmp_path / "o.parquet")],
                            input="\n".join([*lines, bad]) + "\n", capture_output=True,
                            text=True, timeout=300)
    assert_one_line_error(result, "/dev/stdin", "line 11", "field 'input_length'")
    assert list(tmp_path.iterdir()) == []


def _last_line(result) -> str:
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_a_run_that_serves_nothing_is_refused() -> None:
    result = CliRunner().invoke(app, ["simulate", "--request-trace",
                                      str(TRACES / "sample_mooncake.jsonl"), "--model",
                                      "llama-3.1-8b", "--hbm-blocks", "1", "--json"])
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert result.stdout == ""
    line = _last_line(result)
    assert line.startswith("error: ") and "all 65 requests were dropped" in line


def test_dropped_requests_warn() -> None:
    result = CliRunner().invoke(app, ["simulate", "--profile", "multi_turn_chat", "--requests",
                                      "200", "--block-size", "512", "--hbm-gb", "0.5",
                                      "--json"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    out = json.loads(result.stdout)
    dropped = out["policies"][0]["dropped_requests"]
    assert dropped > 0
    codes = {w["code"]: w["message"] for w in out["warnings"]}
    assert f"{dropped:,} of 200 requests dropped" in codes["request_larger_than_hbm"]
    assert any(f"{dropped:,} of 200 requests dropped" in line
               for line in result.stderr.splitlines())


def test_memory_budget_is_documented_in_replicas() -> None:
    from kvsim.core.limits import REPLICA_BYTES, Limits

    assert Limits().memory_budget_bytes // REPLICA_BYTES >= 64  # a real cluster fits
