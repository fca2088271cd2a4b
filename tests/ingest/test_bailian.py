"""Bailian (Qwen usage trace) reader: exact columns, parent_chat_id sessions, bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.ingest import detect_format, read_requests
from tests.helpers import assert_one_line_error

runner = CliRunner()

ROWS = [
    {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40,
     "output_length": 10, "type": "text", "turn": 1, "hash_ids": [11, 12, 13]},
    {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 32,
     "output_length": 0, "type": "search", "turn": 1, "hash_ids": [21, 22]},
    {"chat_id": 3, "parent_chat_id": 1, "timestamp": 2.25, "input_length": 70,
     "output_length": 7, "type": "text", "turn": 2, "hash_ids": [11, 12, 13, 14]},
    {"chat_id": 4, "parent_chat_id": 3, "timestamp": 4.0, "input_length": 20,
     "output_length": 3, "type": "file", "turn": 3, "hash_ids": [31, 32]},
    {"chat_id": 5, "parent_chat_id": 99, "timestamp": 3.0, "input_length": 16,
     "output_length": 1, "type": "image", "turn": 2, "hash_ids": [41]},
]


def write(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_exact(tmp_path):
    p = write(tmp_path / "qwen_traceA_blksz_16.jsonl")
    assert detect_format(p) == "bailian"
    t = read_requests(p)
    df = t.df
    assert t.block_size_tokens == 16
    # sorted by arrival: chats 1, 2, 3, 5, 4
    assert df["arrival_us"].tolist() == [500_000, 1_000_000, 2_250_000, 3_000_000, 4_000_000]
    assert df["prompt_tokens"].tolist() == [40, 32, 70, 16, 20]
    assert df["output_tokens"].tolist() == [10, 1, 7, 1, 3]
    assert [list(x) for x in df["block_ids"]] == [[11, 12, 13], [21, 22], [11, 12, 13, 14],
                                                  [41], [31, 32]]
    # ceil ids -> the partial block is identified; floor ids (70 tokens, 4 ids) -> 64
    assert df["hashed_tokens"].tolist() == [40, 32, 64, 16, 20]
    # sessions follow parent_chat_id: 1 <- 3 <- 4 one session; 5's parent 99 is not in the file
    assert df["session"].tolist() == [0, 1, 0, 2, 0]
    assert df["session_continues"].tolist() == [True, False, True, False, False]
    assert df["next_turn_gap_us"].tolist() == [1_750_000, -1, 1_750_000, -1, -1]


def test_import_inspect_json(tmp_path):
    p = write(tmp_path / "b.jsonl")
    out = tmp_path / "ev.jsonl"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out)])
    assert r.exit_code == 0, r.output
    s = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)
    assert s["requests"] == 5
    # prompt blocks 3+2+5+1+2 = 13; chat 3 re-uses chat 1's 2 full blocks.  Chat 1's
    # partial third block (8 tokens, id 13) is not chat 3's full block 13: a partial
    # block's hash is tagged with its token count (docs/importers.md, "Partial last
    # block"; real Bailian ids hash the block's tokens, so a partial block and a full one
    # never share an id anyway).  Chat 3's 4th full block and its unhashed tail are new.
    assert s["prompt_block_refs"] == 13
    assert s["prompt_block_reuses"] == 2
    assert s["prefix_reuse_fraction"] == pytest.approx(2 / 13)
    assert s["unique_blocks"] == s["allocated_blocks"] - 2


@pytest.mark.parametrize("row,fragments", [
    ({"chat_id": 9, "parent_chat_id": -1, "timestamp": 1, "input_length": 40,
      "output_length": 1, "hash_ids": [1]}, ("line 2", "hash_ids", "ceil(input_length/16) = 3")),
    ({"chat_id": 9, "parent_chat_id": -1, "timestamp": 1, "input_length": 16,
      "output_length": 1}, ("line 2", "hash_ids", "missing")),
    ({"chat_id": 9, "parent_chat_id": 9, "timestamp": 1, "input_length": 16,
      "output_length": 1, "hash_ids": [1]}, ("line 2", "parent_chat_id")),
    ({"chat_id": 1, "parent_chat_id": -1, "timestamp": 1, "input_length": 16,
      "output_length": 1, "hash_ids": [1]}, ("line 2", "chat_id", "already used on line 1")),
    ({"chat_id": 9, "parent_chat_id": -1, "timestamp": "x", "input_length": 16,
      "output_length": 1, "hash_ids": [1]}, ("line 2", "timestamp")),
    ({"chat_id": 9, "parent_chat_id": -1, "timestamp": 1, "input_length": 16,
      "output_length": 1, "type": "video", "hash_ids": [1]}, ("line 2", "type", "text")),
    ({"chat_id": 9, "parent_chat_id": -1, "timestamp": 1, "input_length": 16,
      "output_length": 1, "hash_ids": [1 << 64]}, ("line 2", "hash_ids[0]", "int64")),
    ({"chat_id": 9, "parent_chat_id": -1, "timestamp": 1e300, "input_length": 16,
      "output_length": 1, "hash_ids": [1]}, ("line 2", "timestamp", "kvsim limit")),
])
def test_bad_input_one_line(tmp_path, row, fragments):
    p = write(tmp_path / "bad.jsonl", [ROWS[0], row])
    out = tmp_path / "ev.parquet"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out),
                            "--format", "bailian"])
    assert_one_line_error(r, "bad.jsonl", *fragments)
    assert not out.exists()
