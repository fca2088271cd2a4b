"""RAGPulse reader: exact block ids, chunk concatenation order, side files, chunk reuse,
bad input (one line, exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.ingest import detect_format, read_requests
from kvsim.ingest.ragpulse import _block_id, chunk_reuse, native_block_ids
from tests.helpers import assert_one_line_error

runner = CliRunner()

SIDE = {
    "1_sys_prompt.jsonl": [{"sys_prompt_id": 100, "token_length": 20}],
    "2_passages.jsonl": [{"passage_id": 0, "token_length": 12},
                         {"passage_id": 1, "token_length": 30}],
    "3_history.jsonl": [{"history_id": 200, "token_length": 5}],
    "4_user_input.jsonl": [{"user_input_id": 300, "token_length": 10},
                           {"user_input_id": 301, "token_length": 8}],
    "5_web_search.jsonl": [{"web_search_id": 400, "token_length": 16}],
}
TRACE = [
    {"timestamp": "0", "input_length": 42, "output_length": 5, "session_id": "a",
     "hash_ids": {"sys_prompt": [100], "passages_ids": [0], "history": [], "web_search": [],
                  "user_input": [300]}},
    {"timestamp": "1.5", "input_length": 50, "output_length": 0, "session_id": "a",
     "hash_ids": {"sys_prompt": [100], "passages_ids": [1, 0], "history": [],
                  "web_search": [400], "user_input": [301]}},
    {"timestamp": "3", "input_length": 62, "output_length": 2, "session_id": "b",
     "hash_ids": {"sys_prompt": [100], "passages_ids": [1, 0], "history": [],
                  "web_search": [], "user_input": []}},
]


def write_folder(folder, trace=TRACE, side=SIDE):
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in side.items():
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "0_trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    return folder


def test_read_exact_blocks_and_columns(tmp_path):
    folder = write_folder(tmp_path / "rp")
    assert detect_format(folder) == "ragpulse"
    assert detect_format(folder / "0_trace.jsonl") == "ragpulse"
    t = read_requests(folder)
    df = t.df
    assert t.block_size_tokens == 16
    assert df["arrival_us"].tolist() == [0, 1_500_000, 3_000_000]
    assert df["prompt_tokens"].tolist() == [42, 50, 62]
    assert df["output_tokens"].tolist() == [5, 1, 2]
    assert df["hashed_tokens"].tolist() == [42, 50, 62]
    assert df["session"].tolist() == [0, 0, 1]
    b = [list(x) for x in df["block_ids"]]
    # r1: sys 100 (20 tok) + passage 0 (12) + user 300 (10) = 42 tokens
    assert b[0] == [_block_id([(100, 0, 16)]), _block_id([(100, 16, 20), (0, 0, 12)]),
                    _block_id([(300, 0, 10)])]
    # r2 is cut at 50 tokens: sys 100, then passage 1 (30 tokens); passage 0, the web
    # search and the user input lie beyond input_length
    assert b[1] == [_block_id([(100, 0, 16)]), _block_id([(100, 16, 20), (1, 0, 12)]),
                    _block_id([(1, 12, 28)]), _block_id([(1, 28, 30)])]
    assert b[2] == b[1][:3] + [_block_id([(1, 28, 30), (0, 0, 12)])]
    # reading the trace file directly finds the side files beside it
    assert [list(x) for x in read_requests(folder / "0_trace.jsonl").df["block_ids"]] == b


def test_component_order_web_search_before_user_input():
    ids, hashed = native_block_ids([(7, 10), (8, 6)], 16)
    assert (ids, hashed) == ([_block_id([(7, 0, 10), (8, 0, 6)])], 16)
    # chunks shorter than the prompt: only full blocks inside the chunks are identified
    assert native_block_ids([(7, 20)], 40) == ([_block_id([(7, 0, 16)])], 16)
    from kvsim.ingest.ragpulse import COMPONENT_ORDER
    assert [c for c, _ in COMPONENT_ORDER] == ["sys_prompt", "passages_ids", "history",
                                               "web_search", "user_input"]


def test_chunk_reuse_exact(tmp_path):
    t = read_requests(write_folder(tmp_path / "rp"))
    c = t.source["chunk_reuse"]
    # served chunks: r1 100,0,300 (42); r2 100,1 (50); r3 100,1,0 (62)
    assert c["chunk_tokens"] == 154
    assert c["prefix_reuse_tokens"] == 20 + 50
    assert c["position_independent_reuse_tokens"] == 20 + 62
    assert c["prefix_reuse_token_fraction"] == round(70 / 154, 6)
    assert c["position_independent_reuse_token_fraction"] == round(82 / 154, 6)
    assert c["extra_position_independent_reuse_fraction"] == round(12 / 154, 6)
    assert chunk_reuse([]) ["chunk_tokens"] == 0


def test_import_and_inspect_json(tmp_path):
    folder = write_folder(tmp_path / "rp")
    out = tmp_path / "ev.jsonl"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(folder), "--out",
                            str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["format"] == "ragpulse"
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["requests"] == 3
    # 11 prompt blocks; r2 reuses r1's block 0, r3 reuses r2's blocks 0..2
    assert s["prompt_block_refs"] == 11 and s["prompt_block_reuses"] == 4
    assert s["unique_blocks"] == 7
    assert s["prefix_reuse_fraction"] == pytest.approx(4 / 11)
    assert s["chunk_reuse"]["extra_position_independent_reuse_fraction"] == round(12 / 154, 6)


@pytest.mark.parametrize("mutate,fragments", [
    (lambda tr, side: side.pop("3_history.jsonl"), ("3_history.jsonl", "missing RAGPulse side file")),
    (lambda tr, side: tr[1]["hash_ids"]["passages_ids"].append(999),
     ("0_trace.jsonl", "line 2", "hash_ids.passages_ids", "chunk id 999", "2_passages.jsonl")),
    (lambda tr, side: tr[2].__setitem__("hash_ids", [1, 2]),
     ("line 3", "hash_ids", "object of component lists")),
    (lambda tr, side: tr[0].__setitem__("timestamp", "noon"), ("line 1", "timestamp")),
    (lambda tr, side: side["2_passages.jsonl"].append({"passage_id": 5}),
     ("2_passages.jsonl", "line 3", "token_length")),
    (lambda tr, side: tr[0]["hash_ids"].__setitem__("images", [1]),
     ("line 1", "hash_ids.images")),
    (lambda tr, side: tr[0].__setitem__("input_length", "٣٠٠"), ("line 1", "input_length",
                                                                  "ASCII")),
    (lambda tr, side: tr[1].__setitem__("output_length", 10**12), ("line 2", "output_length",
                                                                   "kvsim limit")),
])
def test_bad_input_one_line(tmp_path, mutate, fragments):
    trace = json.loads(json.dumps(TRACE))
    side = json.loads(json.dumps(SIDE))
    mutate(trace, side)
    folder = write_folder(tmp_path / "rp", trace, side)
    out = tmp_path / "ev.parquet"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(folder), "--out",
                            str(out)])
    assert_one_line_error(r, *fragments)
    assert not out.exists()
