"""Readers: each format on a small hand-made file (exact facts) and on a bad file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.engine.lowering import import_request_trace
from kvsim.ingest import detect_format, read_requests
from kvsim.ingest.requests import REQUEST_COLUMN_NAMES
from tests.helpers import assert_one_line_error

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def ids(table, row: int) -> list[int]:
    return [int(x) for x in table.df["block_ids"].iloc[row]]


def test_detect_format():
    assert detect_format(DATA / "mooncake_small.jsonl") == "mooncake"
    assert detect_format(DATA / "azure_small.csv") == "azure"
    assert detect_format(DATA / "openai_small.jsonl") == "openai"
    assert detect_format(DATA / "agentic_small") == "agentic"
    assert detect_format(DATA / "agentic_bad.json") == "agentic"
    assert detect_format(DATA / "kvmi_small.jsonl") == "kvmi"
    assert detect_format(DATA / "generic_small.csv") == "generic"


def test_mooncake_small():
    t = read_requests(DATA / "mooncake_small.jsonl")
    assert list(t.df.columns) == list(REQUEST_COLUMN_NAMES)
    assert t.block_size_tokens == 512
    assert t.df["arrival_us"].tolist() == [0, 10_000, 20_000, 20_000]
    assert t.df["prompt_tokens"].tolist() == [1024, 1300, 700, 512]
    assert t.df["hashed_tokens"].tolist() == [1024, 1300, 700, 512]  # partial last id counts
    assert ids(t, 1)[:2] == ids(t, 0) and ids(t, 2)[0] == ids(t, 0)[0]


def test_azure_small():
    t = read_requests(DATA / "azure_small.csv")
    assert t.df["arrival_us"].tolist() == [0, 52_000, 1_020_040]
    assert t.df["prompt_tokens"].tolist() == [4808, 3180, 100]
    assert t.df["output_tokens"].tolist() == [10, 8, 1]
    assert all(len(x) == 0 for x in t.df["block_ids"])  # no content: nothing shared


def test_openai_small():
    t = read_requests(DATA / "openai_small.jsonl")
    df = t.df
    assert df["arrival_us"].tolist() == [0, 1_500_000, 2_000_000, 3_000_000]
    assert df["prompt_tokens"].tolist() == [60, 70, 40, 33]
    # blocks never claimed beyond usage.prompt_tokens: 60//16, 70//16, 40//16, text too short
    assert [len(x) for x in df["block_ids"]] == [3, 4, 2, 0]
    assert df["hashed_tokens"].tolist() == [48, 64, 32, 0]
    # the shared system prompt covers the first 192 proxy bytes of both chats: same ids
    assert ids(t, 1)[:3] == ids(t, 0)
    assert df["session"].tolist() == [0, 1, 0, -1]  # alice, bob, alice, none
    assert df["tenant"].tolist() == [0, 1, 0, 0]  # "acme" numbered from 1
    assert df["request_priority"].tolist() == [80, 50, 50, 50]
    assert df["ttft_deadline_us"].tolist() == [500_000, -1, -1, -1]
    assert df["tpot_deadline_us"].tolist() == [50_000, -1, -1, -1]
    assert df["n"].tolist() == [1, 1, 2, 1]
    assert df["model"].tolist() == ["llama-3-8b", "llama-3-8b", "llama-3-8b", "other-model"]


def test_agentic_small():
    t = read_requests(DATA / "agentic_small")
    df = t.df
    # conv_a and conv_b both start at 0 (8 conversations may run at once)
    assert df["arrival_us"].tolist() == [0, 0, 5_000_000, 10_000_000]
    assert df["prompt_tokens"].tolist() == [200, 64, 130, 300]
    assert df["output_tokens"].tolist() == [10, 1, 5, 4]  # out 0 is lowered as 1
    assert df["hashed_tokens"].tolist() == [192, 64, 128, 256]
    assert df["session"].tolist() == [0, 2, 1, 0]  # conv_a, conv_b, conv_a's sub-agent
    assert df["session_continues"].tolist() == [True, False, False, False]
    assert df["next_turn_gap_us"].tolist() == [10_000_000, -1, -1, -1]
    a0, b0, sub, a1 = (ids(t, i) for i in range(4))
    assert a1[:3] == a0  # same conversation, same local ids
    assert sub[0] == a0[0] and sub[1] not in a0  # sub-agent shares the parent's namespace
    assert b0[0] != a0[0]  # local id 1 of another file is other content


def test_agentic_arrival_rules():
    t = read_requests(DATA / "agentic_small", concurrency=1)
    # conv_a ends at max(0 + 2.0, 5 + 1.0, 10 + 1.5) = 11.5 s, then conv_b starts
    assert sorted(t.df["arrival_us"].tolist()) == [0, 5_000_000, 10_000_000, 11_500_000]
    r1 = read_requests(DATA / "agentic_small", arrival_rate=0.1, seed=3)
    r2 = read_requests(DATA / "agentic_small", arrival_rate=0.1, seed=3)
    assert r1.df["arrival_us"].tolist() == r2.df["arrival_us"].tolist()
    assert r1.df["arrival_us"].iloc[0] == 0


def test_generic_small_csv_mapping():
    t = read_requests(DATA / "generic_small.csv",
                      mapping="arrival_ms=ts,prompt_tokens=in,output_tokens=out,"
                              "block_ids=ids,session=user")
    assert t.df["arrival_us"].tolist() == [0, 250_000, 1_000_000]
    assert [list(map(int, x)) for x in t.df["block_ids"]] == [[7, 8], [7, 8, 9], []]
    assert t.df["hashed_tokens"].tolist() == [32, 48, 0]
    assert t.df["session"].tolist() == [0, 0, 1]


def test_generic_parquet(tmp_path):
    import pandas as pd

    p = tmp_path / "log.parquet"
    pd.DataFrame({"t": [2.0, 1.0], "p": [30, 20], "o": [4, 5]}).to_parquet(p)
    t = read_requests(p, mapping="arrival_s=t,prompt_tokens=p,output_tokens=o")
    assert t.df["arrival_us"].tolist() == [0, 1_000_000]  # sorted by arrival
    assert t.df["prompt_tokens"].tolist() == [20, 30]


def test_gzip_transparent(tmp_path):
    import gzip

    p = tmp_path / "trace.jsonl.gz"
    p.write_bytes(gzip.compress((DATA / "mooncake_small.jsonl").read_bytes()))
    assert detect_format(p) == "mooncake"
    assert len(read_requests(p)) == 4


def test_kvmi_small(tmp_path):
    from kvsim.events import read_events

    out = tmp_path / "k.jsonl"
    s = import_request_trace(DATA / "kvmi_small.jsonl", out)
    assert s.num_requests == 2 and s.dropped_events == 2
    assert s.dropped_by_type == {"EVICTED": 1, "SPILLED": 1}
    _, df = read_events(out)
    kinds = [(int(r.step), int(r.kind), int(r.request_id), int(r.block_index))
             for r in df.itertuples()]
    S, AR, AL, AC, IN, FR = 0, 1, 2, 3, 4, 7
    assert kinds == [(0, S, -1, -1), (0, AR, 0, -1), (0, AL, 0, 0), (0, AL, 0, 1),
                     (1, S, -1, -1), (1, AC, 0, -1),
                     (2, S, -1, -1), (2, AR, 1, -1), (2, IN, 0, 1), (2, AL, 1, 0),
                     (3, S, -1, -1), (3, FR, 0, 1)]
    intent = df[df.kind == IN].iloc[0]
    assert intent.priority == 3 and bool(intent.pin_requested)  # DECODE_CRITICAL, pinned
    assert df.time_us.max() == 3000 and set(df.content_hash) == {0}
    # kvmi's deadline_us (10,000 on every line) is a budget from the event's time
    assert df[df.kind == AL].deadline_us.tolist() == [10_000, 10_000, 12_000]
    assert intent.deadline_us == 2000 + 10_000
    assert df[df.kind == AC].iloc[0].deadline_us == 1000 + 10_000


def test_kvmi_null_optional_fields_are_unset(tmp_path):
    """kv_deadline_scheduler writes null for an unset deadline/slack/target step."""
    from kvsim.events import read_events

    line = (DATA / "kvmi_small.jsonl").read_text().splitlines()[0]
    event = json.loads(line)
    for key in ("deadline_us", "slack_us", "target_decode_step"):
        event["intent"][key] = None
    src = tmp_path / "null.jsonl"
    src.write_text(json.dumps(event) + "\n")
    out = tmp_path / "null_events.jsonl"
    import_request_trace(src, out, format="kvmi")
    _, df = read_events(out)
    block = df[df.kind == 2].iloc[0]
    assert (block.deadline_us, block.slack_us, block.target_decode_step) == (-1, 0, -1)


def test_skip_bad_rows_counts():
    t = read_requests(DATA / "mooncake_bad.jsonl", skip_bad_rows=True)
    assert len(t) == 1 and t.skipped == 2


@pytest.mark.parametrize("name, fmt, fragments", [
    ("mooncake_bad.jsonl", None, ("mooncake_bad.jsonl", "line 2", "input_length")),
    ("azure_bad.csv", None, ("azure_bad.csv", "line 3", "GeneratedTokens")),
    ("openai_bad.jsonl", None, ("openai_bad.jsonl", "line 2", "usage.prompt_tokens")),
    ("agentic_bad.json", None, ("agentic_bad.json", "requests[1]", "'in'")),
    ("kvmi_bad.jsonl", None, ("kvmi_bad.jsonl", "line 3", "event_type")),
    ("generic_bad.csv", None, ("generic_bad.csv", "line 3", "in")),
])
def test_bad_file_cli(tmp_path, name, fmt, fragments):
    out = tmp_path / "ev.parquet"
    args = ["import-request-trace", "--requests", str(DATA / name), "--out", str(out)]
    if name.startswith("generic"):
        args += ["--map", "arrival_ms=ts,prompt_tokens=in,output_tokens=out"]
    result = runner.invoke(app, args)
    assert_one_line_error(result, *fragments)
    assert not out.exists()  # no partial output


def test_bad_file_api_raises():
    with pytest.raises(KvsimInputError) as info:
        read_requests(DATA / "mooncake_bad.jsonl")
    assert "line 2" in str(info.value) and "input_length" in str(info.value)


def test_unknown_format_option(tmp_path):
    result = runner.invoke(app, ["import-request-trace", "--requests",
                                 str(DATA / "azure_small.csv"), "--out",
                                 str(tmp_path / "x.parquet"), "--format", "nope"])
    assert_one_line_error(result, "--format")


def test_block_ids_dtype():
    t = read_requests(DATA / "mooncake_small.jsonl")
    off, vals = t.flat_block_ids()
    assert off.tolist() == [0, 2, 5, 7, 8] and vals.dtype == np.int64


def test_cli_import_json_summary(tmp_path):
    import json

    out = tmp_path / "ev.jsonl"
    result = runner.invoke(app, ["import-request-trace", "--requests",
                                 str(DATA / "mooncake_bad.jsonl"), "--out", str(out),
                                 "--skip-bad-rows", "--block-size", "512", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_requests"] == 1 and summary["skipped_rows"] == 2
    assert summary["prompt_blocks"] == 2 and summary["format"] == "mooncake"
    assert out.exists()
