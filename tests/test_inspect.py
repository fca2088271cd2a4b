"""`kvsim inspect` and kvsim.analysis.trace_summary: exact counts on hand-built traces, format
independence, batch-boundary independence, the sample traces, and the infinite-cache
prefix-reuse fraction of the real Mooncake traces."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.analysis.trace_summary import head_events, summarize_trace
from kvsim.cli import app
from kvsim.core.schema import EventHeader, EventKind, Phase
from kvsim.events import read_events, write_events

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
HEADER = EventHeader(block_size_tokens=16, kv_bytes_per_token=1000, model="m")
A, AL, AC, ST, FR = "ARRIVE", "ALLOCATE", "ACCESS", "STEP", "FREE"

# (step, time_us, kind, request, block, hash, tokens, phase, size_bytes, priority)
ROWS = [
    (0, 0, ST, -1, -1, 0, 40, "PREFILL", 0, "WARM"),
    (0, 0, A, 0, -1, 0, 40, "PREFILL", 0, "WARM"),
    (0, 0, AL, 0, 0, 11, 16, "PREFILL", 100, "HOT"),
    (0, 0, AL, 0, 1, 12, 16, "PREFILL", 100, "HOT"),
    (0, 0, AL, 0, 2, 0, 8, "PREFILL", 100, "HOT"),       # partial, unhashed
    (0, 0, AC, 0, -1, 0, 40, "PREFILL", 0, "WARM"),
    (1, 500, ST, -1, -1, 0, 49, "PREFILL", 0, "WARM"),
    (1, 500, A, 1, -1, 0, 48, "PREFILL", 0, "WARM"),
    (1, 500, AL, 0, 3, 55, 1, "DECODE", 100, "DECODE_CRITICAL"),  # decode block, hashed
    (1, 500, AC, 0, -1, 0, 1, "DECODE", 0, "WARM"),
    (1, 500, AL, 1, 0, 11, 16, "PREFILL", 100, "HOT"),   # reuse
    (1, 500, AL, 1, 1, 12, 16, "PREFILL", 100, "HOT"),   # reuse
    (1, 500, AL, 1, 2, 13, 16, "PREFILL", 100, "HOT"),   # new
    (1, 500, AC, 1, -1, 0, 48, "PREFILL", 0, "WARM"),
    (1, 500, FR, 0, -1, 0, 0, "DONE", 0, "COLD"),
    (3, 1700, ST, -1, -1, 0, 20, "PREFILL", 0, "WARM"),
    (3, 1700, A, 2, -1, 0, 20, "PREFILL", 0, "WARM"),
    (3, 1700, AL, 2, 0, 11, 16, "PREFILL", 100, "WARM"),  # reuse
    (3, 1700, AL, 2, 1, 55, 16, "PREFILL", 100, "WARM"),  # reuse of a decode block
    (3, 1700, AL, 2, 2, 0, 4, "PREFILL", 100, "WARM"),    # unhashed
    (3, 1700, AC, 2, -1, 0, 20, "PREFILL", 0, "WARM"),
]


def _columns(rows=ROWS) -> dict:
    names = ("step", "time_us", "kind", "request_id", "block_index", "content_hash",
             "num_tokens", "phase", "size_bytes", "priority")
    cols = {n: [r[i] for r in rows] for i, n in enumerate(names)}
    cols["duration_us"] = [250.5 if r[2] == ST else 0.0 for r in rows]
    return cols


@pytest.fixture()
def small(tmp_path: Path) -> tuple[Path, Path]:
    pq_path, jl_path = tmp_path / "small.parquet", tmp_path / "small.jsonl"
    write_events(pq_path, HEADER, _columns())
    write_events(jl_path, HEADER, _columns())
    return pq_path, jl_path


def test_exact_summary(small) -> None:
    s = summarize_trace(small[0])
    assert s.requests == 3
    assert s.events == len(ROWS)
    assert s.events_by_kind == {"STEP": 3, "ARRIVE": 3, "ALLOCATE": 10, "ACCESS": 4,
                                "INTENT": 0, "COMMIT": 0, "FORK": 0, "FREE": 1}
    assert s.allocated_blocks == 10
    assert s.unique_blocks == 4 + 2  # hashes {11, 12, 13, 55} + two unhashed blocks
    assert s.bytes == {
        "total": 1000,
        "by_phase": {"PREFILL": 900, "DECODE": 100, "VERIFY": 0, "DRAFT": 0, "ROLLBACK": 0,
                     "IDLE": 0, "DONE": 0},
        "by_priority": {"COLD": 0, "WARM": 300, "HOT": 600, "DECODE_CRITICAL": 100},
        "by_tier": {"HBM": 1000, "DRAM": 0, "CXL": 0, "NVME": 0},
    }
    assert (s.steps, s.first_step, s.last_step) == (3, 0, 3)
    assert (s.first_time_us, s.last_time_us, s.time_span_us) == (0, 1700, 1700)
    assert s.step_compute_us == 3 * 250.5
    assert (s.prompt_tokens, s.prefill_tokens_computed, s.decode_tokens) == (108, 108, 1)
    assert (s.prompt_block_refs, s.prompt_block_reuses) == (9, 4)
    assert s.prefix_reuse_fraction == 4 / 9
    assert s.header["model"] == "m"


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 7, 1 << 20])
def test_summary_does_not_depend_on_batch_boundaries(small, batch_rows: int) -> None:
    assert summarize_trace(small[1], batch_rows=batch_rows) == summarize_trace(small[0])


def test_requests_without_arrive_rows(tmp_path: Path) -> None:
    rows = [r for r in ROWS if r[2] != A]
    write_events(tmp_path / "t.parquet", HEADER, _columns(rows))
    s = summarize_trace(tmp_path / "t.parquet")
    assert s.requests == 3 and s.prompt_tokens == 0


def test_empty_trace(tmp_path: Path) -> None:
    write_events(tmp_path / "e.jsonl", HEADER, {})
    s = summarize_trace(tmp_path / "e.jsonl")
    assert (s.events, s.requests, s.unique_blocks, s.steps) == (0, 0, 0, 0)
    assert s.first_step is None and s.prefix_reuse_fraction == 0.0


def _json(*args: str) -> object:
    result = CliRunner().invoke(app, ["inspect", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_json_same_for_parquet_and_jsonl(small) -> None:
    a, b = _json(str(small[0])), _json(str(small[1]))
    assert a == b
    for key in ("requests", "events", "events_by_kind", "unique_blocks", "bytes",
                "prefix_reuse_fraction"):
        assert key in a
    assert a["prefix_reuse_fraction"] == 4 / 9 and a["bytes"]["total"] == 1000


def test_cli_head(small) -> None:
    rows = _json(str(small[1]), "--head", "4")
    assert [r["kind"] for r in rows] == [ST, A, AL, AL]
    assert rows[2]["content_hash"] == 11 and rows[2]["priority"] == "HOT"
    assert len(_json(str(small[0]), "--head", "1000")) == len(ROWS)
    assert _json(str(small[0]), "--head", "0") == []
    df = head_events(small[0], 2)
    assert df["kind"].tolist() == [ST, A]


def test_cli_table(small) -> None:
    result = CliRunner().invoke(app, ["inspect", str(small[0])])
    assert result.exit_code == 0, result.output
    assert "prefix reuse" in result.stdout and "0.4444" in result.stdout
    result = CliRunner().invoke(app, ["inspect", str(small[0]), "--head", "3"])
    assert result.exit_code == 0 and "ALLOCATE" in result.stdout


# ---- the committed sample traces --------------------------------------------------------

def _reference_reuse(path: Path) -> tuple[int, int, int]:
    """(prompt refs, reuses, unique blocks) by a plain Python loop: the definition, spelled
    out row by row, to check the vectorised implementation."""
    _, df = read_events(path)
    seen: set[int] = set()
    refs = reuses = unhashed = 0
    for kind, h, phase in zip(df["kind"], df["content_hash"], df["phase"]):
        if kind != EventKind.ALLOCATE:
            continue
        if phase == Phase.PREFILL:
            refs += 1
            reuses += int(h != 0 and int(h) in seen)
        if h != 0:
            seen.add(int(h))
        else:
            unhashed += 1
    return refs, reuses, len(seen) + unhashed


def test_samples_parquet_and_jsonl_agree() -> None:
    pq_path, jl_path = TRACES / "sample_chat.parquet", TRACES / "sample_chat.jsonl"
    assert _json(str(pq_path)) == _json(str(jl_path))
    s = summarize_trace(pq_path)
    assert s.requests == 32
    assert sum(s.events_by_kind.values()) == s.events
    assert s.events_by_kind["ARRIVE"] == s.events_by_kind["FREE"] == 32
    refs, reuses, unique = _reference_reuse(pq_path)
    assert (s.prompt_block_refs, s.prompt_block_reuses, s.unique_blocks) == (refs, reuses, unique)
    assert 0.2 < s.prefix_reuse_fraction < 0.8  # shared system prompts and multi-turn reuse


def test_samples_regenerate_byte_identically(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_samples", TRACES / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_samples"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["make_samples"]
    written = module.main(tmp_path)
    assert [p.name for p in written] == ["sample_chat.parquet", "sample_chat.jsonl",
                                         "sample_fork.jsonl"]
    for path in written:
        assert path.read_bytes() == (TRACES / path.name).read_bytes(), path.name


# ---- real traces: the infinite-cache reuse of Mooncake's prompt blocks ---------------------

def _mooncake_events(src: Path, dst: Path) -> None:
    """One ALLOCATE (phase PREFILL) per Mooncake hash id, in request order: exactly the
    prompt-block references an importer with --block-size 512 produces."""
    hashes = []
    rids = []
    bidx = []
    with open(src) as fh:
        for rid, line in enumerate(fh):
            ids = json.loads(line)["hash_ids"]
            hashes.extend(ids)
            rids.extend([rid] * len(ids))
            bidx.extend(range(len(ids)))
    n = len(hashes)
    write_events(dst, EventHeader(block_size_tokens=512), {
        "step": np.asarray(rids), "kind": np.full(n, int(EventKind.ALLOCATE)),
        "request_id": np.asarray(rids), "block_index": np.asarray(bidx),
        "content_hash": np.asarray(hashes, dtype=np.int64) + 1,  # 0 is NO_HASH
        "phase": int(Phase.PREFILL)})


@pytest.mark.traces
@pytest.mark.parametrize("name, refs, unique, fraction", [
    ("conversation_trace.jsonl", 288_500, 182_790, 0.366),
    ("synthetic_trace.jsonl", 121_877, 43_924, 0.640),
])
def test_mooncake_prefix_reuse(shared_traces: Path, tmp_path: Path, name: str, refs: int,
                               unique: int, fraction: float) -> None:
    path = tmp_path / "mooncake.parquet"
    _mooncake_events(shared_traces / "mooncake" / name, path)
    s = summarize_trace(path, batch_rows=50_000)  # several batches: the seen set crosses them
    assert (s.prompt_block_refs, s.unique_blocks) == (refs, unique)
    assert s.prompt_block_reuses == refs - unique
    assert round(s.prefix_reuse_fraction, 3) == fraction


def test_summary_is_a_frozen_dataclass(small) -> None:
    s = summarize_trace(small[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.events = 0  # type: ignore[misc]


def test_progress_callback(small) -> None:
    calls: list[tuple[int, int | None]] = []
    summarize_trace(small[1], batch_rows=8, on_progress=lambda d, t: calls.append((d, t)))
    assert calls == [(8, None), (16, None), (21, None)]
    calls.clear()
    summarize_trace(small[0], on_progress=lambda d, t: calls.append((d, t)))
    assert calls == [(21, 21)]
