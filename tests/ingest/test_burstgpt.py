"""BurstGPT reader: exact columns, no prefix identity (said in the summary), bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.ingest import detect_format, read_requests
from tests.helpers import assert_one_line_error

runner = CliRunner()

CSV = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
118,GPT-4,417,0,417,API log
"""
CSV_SESSIONS = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
0.5,s-1,1.2,ChatGPT,100,20,120,Conversation log
2.0,s-2,0.8,ChatGPT,50,5,55,Conversation log
3.0,s-1,0.9,ChatGPT,200,8,208,Conversation log
"""


def test_read_exact(tmp_path):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(CSV)
    assert detect_format(p) == "burstgpt"
    df = read_requests(p).df
    assert df["arrival_us"].tolist() == [0, 40_000_000, 113_000_000]
    assert df["prompt_tokens"].tolist() == [472, 1087, 417]
    assert df["output_tokens"].tolist() == [18, 230, 1]  # a failed request (0) -> 1
    assert df["model"].tolist() == ["ChatGPT", "ChatGPT", "GPT-4"]
    assert all(len(x) == 0 for x in df["block_ids"]) and df["hashed_tokens"].sum() == 0
    assert df["session"].tolist() == [-1, -1, -1]


def test_session_layout(tmp_path):
    p = tmp_path / "BurstGPT_3.csv"
    p.write_text(CSV_SESSIONS)
    df = read_requests(p).df
    assert df["session"].tolist() == [0, 1, 0]
    assert df["arrival_us"].tolist() == [0, 1_500_000, 2_500_000]


def test_summary_says_no_prefix_identity(tmp_path):
    p = tmp_path / "b.csv"
    p.write_text(CSV)
    out = tmp_path / "ev.jsonl"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "content identity" in r.stdout and "none (no prompt content)" in r.stdout
    j = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out),
                            "--json"])
    assert json.loads(j.stdout)["hashed_prompt_blocks"] == 0
    s = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)
    assert s["requests"] == 3
    assert s["prefix_reuse_fraction"] == 0.0
    assert s["unique_blocks"] == s["allocated_blocks"]  # every block its own
    # prompt blocks: ceil(472/16) + ceil(1087/16) + ceil(417/16)
    assert s["prompt_block_refs"] == 30 + 68 + 27


@pytest.mark.parametrize("line,fragments", [
    ("9,ChatGPT,0,5,5,Conversation log", ("line 3", "Request tokens", ">= 1")),
    ("9,ChatGPT,abc,5,5,Conversation log", ("line 3", "Request tokens")),
    ("x,ChatGPT,10,5,15,Conversation log", ("line 3", "Timestamp")),
    ("9,ChatGPT,10", ("line 3", "expected 6 fields")),
    ("9,ChatGPT,１０,5,15,Conversation log", ("line 3", "Request tokens", "ASCII")),
])
def test_bad_input_one_line(tmp_path, line, fragments):
    p = tmp_path / "bad.csv"
    p.write_text(CSV.splitlines()[0] + "\n" + CSV.splitlines()[1] + "\n" + line + "\n")
    out = tmp_path / "ev.parquet"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out)])
    assert_one_line_error(r, "bad.csv", *fragments)
    assert not out.exists()


def test_empty_and_bom(tmp_path):
    p = tmp_path / "empty.csv"
    p.write_text("")
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out",
                            str(tmp_path / "o.parquet"), "--format", "burstgpt"])
    assert_one_line_error(r, "empty.csv", "empty file")
    p = tmp_path / "bom.csv"
    p.write_bytes(b"\xef\xbb\xbf" + CSV.encode())
    assert detect_format(p) == "burstgpt"
    assert read_requests(p).df["prompt_tokens"].tolist() == [472, 1087, 417]


def test_bad_header(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out",
                            str(tmp_path / "o.parquet"), "--format", "burstgpt"])
    assert_one_line_error(r, "bad.csv", "line 1", "expected header")
