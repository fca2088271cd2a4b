"""A user policy cannot take kvsim down silently (issue 38): its print() goes to stderr,
never into ``--json`` stdout.  (SystemExit / BaseException at import and in a hook are rows
of the bad-input corpus, tests/bad_inputs/cli_cases.toml.)"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli import app

TRACES = Path(__file__).resolve().parents[2] / "traces"

POLICY = '''
print("hello from import")
NAME = "printing_fifo"
DESCRIPTION = "fifo that prints"
REASONS = ("first in",)


def init(capacity_blocks, num_slots, params):
    print("init")
    return ([],)


def on_insert(state, view, b, now_us):
    print("insert", b)
    state[0].append(b)


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    print("victim")
    return (state[0][0], 0, 0) if state[0] else (-1, 0, 0)
'''


def test_policy_print_goes_to_stderr_not_json(tmp_path: Path) -> None:
    path = tmp_path / "printing_fifo.py"
    path.write_text(POLICY)
    result = CliRunner().invoke(app, ["simulate", "--trace", str(TRACES / "sample_chat.jsonl"),
                                      "--hbm-gb", "0.05", "--policy-file", str(path),
                                      "--policy", "printing_fifo", "--json"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    json.loads(result.stdout)  # stdout is JSON only
    assert "hello from import" in result.stderr and "victim" in result.stderr
