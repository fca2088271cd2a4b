"""The Mooncake reader assumes nothing specific to the conversation trace: a file to the
FAST'25 tool&agent schema (same keys; its own time origin; extra keys)."""

from __future__ import annotations

import json

from kvsim.ingest import detect_format, read_requests

ROWS = [
    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]},
    {"timestamp": 30535, "input_length": 6472, "output_length": 1,
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


def test_toolagent_import_inspect(tmp_path):
    import json as _json

    from typer.testing import CliRunner

    from kvsim.cli import app
    runner = CliRunner()
    p = tmp_path / "toolagent_trace.jsonl"
    p.write_text("".join(_json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "ev.jsonl"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out),
                            "--block-size", "512"])
    assert r.exit_code == 0, r.output
    s = _json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)
    # 28 prompt blocks; the 512-token request re-uses block 46, the third request the
    # twelve shared ids 46..57
    assert (s["requests"], s["prompt_block_refs"], s["prompt_block_reuses"]) == (3, 28, 13)
    # 15 distinct prompt blocks + the 512-token request's first decode block (unhashed)
    assert (s["unique_blocks"], s["allocated_blocks"]) == (28 - 13 + 1, 29)
    assert s["prefix_reuse_fraction"] == 13 / 28
