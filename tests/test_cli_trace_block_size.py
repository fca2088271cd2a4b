"""``--trace-block-size`` wherever a request trace is read: ``simulate`` / ``compare
--request-trace`` pass it to :func:`kvsim.ingest.read_requests` (``trace_block_tokens``), as
``import-request-trace`` does.  A generic trace whose ids name 512-token blocks (its
``hashed_tokens`` beyond 16 tokens per id) was refused without it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from tests.helpers import assert_one_line_error


def _trace(path):
    """Two requests of one 512-token prefix block, each with its own second block."""
    rows = [{"arrival_ms": 0, "prompt_tokens": 1000, "output_tokens": 2,
             "block_ids": [7, 8], "hashed_tokens": 1000},
            {"arrival_ms": 5000, "prompt_tokens": 1000, "output_tokens": 2,
             "block_ids": [7, 9], "hashed_tokens": 1000}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ARGS = ["--format", "generic", "--hbm-blocks", "256", "--dram-gb", "0", "--cxl-gb", "0",
        "--nvme-gb", "0", "--engine", "interpreted", "--json"]


@pytest.mark.parametrize("command", ["simulate", "compare"])
def test_request_trace_takes_trace_block_size(tmp_path, command):
    src = _trace(tmp_path / "g.jsonl")
    policy = ["--policy", "lru"] if command == "simulate" else ["--policies", "lru"]
    res = CliRunner().invoke(app, [command, "--request-trace", str(src), *policy, *ARGS,
                                   "--trace-block-size", "512"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["policies"][0]
    # the second request hits the shared 512-token block: 32 blocks of 16 tokens
    assert row["hit_tokens"] == 512
    # without it the ids are read as 16-token blocks and hashed_tokens 1000 > 2 x 16
    res = CliRunner().invoke(app, [command, "--request-trace", str(src), *policy, *ARGS])
    assert_one_line_error(res, "hashed_tokens")


def test_trace_block_size_needs_a_request_trace(tmp_path):
    res = CliRunner().invoke(app, ["simulate", "--profile", "balanced", "--requests", "2",
                                   "--policy", "lru", "--trace-block-size", "512"])
    assert_one_line_error(res, "--trace-block-size", "--request-trace")
