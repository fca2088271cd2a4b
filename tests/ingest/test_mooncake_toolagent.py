"""The Mooncake reader assumes nothing specific to the conversation trace: a file to the
FAST'25 tool&agent schema (same keys; its own time origin; extra keys; a 0-token output)."""

from __future__ import annotations

import json

from kvsim.ingest import detect_format, read_requests

ROWS = [
    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]},
    {"timestamp": 30535, "input_length": 6472, "output_length": 0,
     "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366], "tool": "search"},
    {"timestamp": 28000, "input_length": 512, "output_length": 3, "hash_ids": [46]},
]


def test_toolagent_schema(tmp_path):
    p = tmp_path / "toolagent_trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert detect_format(p) == "mooncake"
    t = read_requests(p)
    df = t.df
    assert t.block_size_tokens == 512
    # relative to the earliest timestamp, sorted by arrival
    assert df["arrival_us"].tolist() == [0, 518_000, 3_053_000]
    assert df["prompt_tokens"].tolist() == [6955, 512, 6472]
    assert df["output_tokens"].tolist() == [52, 3, 1]
    assert df["hashed_tokens"].tolist() == [6955, 512, 6472]
    assert [len(x) for x in df["block_ids"]] == [14, 1, 13]
