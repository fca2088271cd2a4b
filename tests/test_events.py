"""Event files: exact JSONL encoding, defaults, dtypes, streaming and writer contracts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import (
    COLUMN_NAMES,
    DEFAULTS,
    HEADER_METADATA_KEY,
    EventHeader,
    EventKind,
    Phase,
    Priority,
    event_schema,
)
from kvsim.events import DTYPES, EventWriter, event_format, open_events, read_events, write_events

HEADER = EventHeader(block_size_tokens=16, kv_bytes_per_token=131072, model="llama-3.1-8b",
                     source={"generator": "test", "seed": 0})

# step 0: request 0 arrives with 20 prompt tokens (one full hashed block + one partial)
SMALL = {
    "step": [0, 0, 0, 0, 0, 1, 1, 1],
    "time_us": [0, 0, 0, 0, 0, 950, 950, 950],
    "kind": [EventKind.STEP, EventKind.ARRIVE, EventKind.ALLOCATE, EventKind.ALLOCATE,
             EventKind.ACCESS, EventKind.STEP, EventKind.ACCESS, EventKind.FREE],
    "request_id": [-1, 0, 0, 0, 0, -1, 0, 0],
    "block_index": [-1, -1, 0, 1, -1, -1, -1, -1],
    "content_hash": [0, 0, 7001, 0, 0, 0, 0, 0],
    "num_tokens": [20, 20, 16, 4, 20, 1, 1, 0],
    "duration_us": [950.0, 0, 0, 0, 0, 40.5, 0, 0],
    "phase": ["PREFILL"] * 6 + ["DECODE", "DONE"],
    "size_bytes": [0, 0, 2097152, 2097152, 0, 0, 0, 0],
}

EXPECTED_JSONL = [
    '{"kvsim_events": 1, "header": {"block_size_tokens": 16, "hardware": "", '
    '"kv_bytes_per_token": 131072, "model": "llama-3.1-8b", "schema_version": 1, '
    '"source": {"generator": "test", "seed": 0}}}',
    '{"step": 0, "time_us": 0, "kind": "STEP", "num_tokens": 20, "duration_us": 950.0}',
    '{"step": 0, "time_us": 0, "kind": "ARRIVE", "request_id": 0, "num_tokens": 20}',
    '{"step": 0, "time_us": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 0, '
    '"content_hash": 7001, "num_tokens": 16, "size_bytes": 2097152}',
    '{"step": 0, "time_us": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 1, '
    '"num_tokens": 4, "size_bytes": 2097152}',
    '{"step": 0, "time_us": 0, "kind": "ACCESS", "request_id": 0, "num_tokens": 20}',
    '{"step": 1, "time_us": 950, "kind": "STEP", "num_tokens": 1, "duration_us": 40.5}',
    '{"step": 1, "time_us": 950, "kind": "ACCESS", "request_id": 0, "num_tokens": 1, '
    '"phase": "DECODE"}',
    '{"step": 1, "time_us": 950, "kind": "FREE", "request_id": 0, "phase": "DONE"}',
]


def test_event_format_by_name() -> None:
    assert event_format("a/t.jsonl") == "jsonl"
    assert event_format("t.jsonl.gz") == "jsonl"
    assert event_format("t.jsonl.zst") == "jsonl"
    assert event_format("t.parquet") == "parquet"
    assert event_format("t.events") == "parquet"


def test_jsonl_encoding_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    write_events(path, HEADER, SMALL)
    assert path.read_text().splitlines() == EXPECTED_JSONL


def test_jsonl_defaults_and_dtypes(tmp_path: Path) -> None:
    path = tmp_path / "small.jsonl"
    path.write_text("\n".join(EXPECTED_JSONL) + "\n\n")  # a trailing blank line is allowed
    header, df = read_events(path)
    assert header == HEADER
    assert list(df.columns) == list(COLUMN_NAMES)
    assert {c: df[c].dtype for c in df.columns} == DTYPES
    assert df["kind"].tolist() == [int(k) for k in SMALL["kind"]]
    assert df["phase"].tolist() == [0, 0, 0, 0, 0, 0, int(Phase.DECODE), int(Phase.DONE)]
    # columns never written take their defaults
    assert (df["priority"] == int(Priority.WARM)).all()
    assert (df["request_priority"] == 50).all()
    assert (df["deadline_us"] == -1).all() and df["compression_ok"].all()
    assert df["request_id"].tolist() == SMALL["request_id"]


def test_parquet_stores_exact_types_and_header(tmp_path: Path) -> None:
    path = tmp_path / "small.parquet"
    write_events(path, HEADER, SMALL)
    schema = pq.read_schema(path)
    assert schema.remove_metadata() == event_schema()
    assert json.loads(schema.metadata[HEADER_METADATA_KEY]) == json.loads(HEADER.to_json())
    table = pq.read_table(path)
    assert table.column("kind").to_pylist() == [int(k) for k in SMALL["kind"]]
    assert table.column("content_hash").to_pylist() == SMALL["content_hash"]


def test_parquet_streams_by_row_group(tmp_path: Path) -> None:
    path = tmp_path / "many.parquet"
    n = 1000
    with EventWriter(path, HEADER, row_group_rows=300) as writer:
        # batch sizes unrelated to the row-group size
        for start in range(0, n, 70):
            stop = min(start + 70, n)
            writer.write({"step": np.arange(start, stop), "kind": "STEP",
                          "num_tokens": np.arange(start, stop) % 17})
        assert writer.rows_written == n
    pf = pq.ParquetFile(path)
    assert [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)] == \
        [300, 300, 300, 100]
    with open_events(path) as reader:
        assert reader.num_rows == n
        sizes = [len(b["step"]) for b in reader.batches()]
        assert sizes == [300, 300, 300, 100]
        sizes = [len(b["step"]) for b in reader.batches(batch_rows=128)]
        assert sizes == [128, 128, 44] * 3 + [100]
        steps = np.concatenate([b["step"] for b in reader.batches()])
    assert steps.tolist() == list(range(n))


def test_jsonl_streams_in_line_batches(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl.gz"
    write_events(path, HEADER, {"step": np.arange(10), "kind": "STEP"})
    with open_events(path) as reader:
        assert reader.num_rows is None
        assert [len(b["step"]) for b in reader.batches(batch_rows=4)] == [4, 4, 2]


def test_step_order_checked_across_jsonl_batches(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [EXPECTED_JSONL[0]] + [json.dumps({"step": s, "kind": "STEP"}) for s in
                                   [0, 1, 2, 3, 1]]
    path.write_text("\n".join(lines) + "\n")
    with open_events(path) as reader:
        with pytest.raises(KvsimInputError, match=r"line 6: field 'step'.*previous row has "
                                                  r"step 3.*got 1"):
            for _ in reader.batches(batch_rows=2):
                pass


def test_writes_are_deterministic(tmp_path: Path) -> None:
    for name in ("a.parquet", "a.jsonl.gz", "a.jsonl.zst"):
        write_events(tmp_path / name, HEADER, SMALL)
        first = (tmp_path / name).read_bytes()
        write_events(tmp_path / name, HEADER, SMALL)
        assert (tmp_path / name).read_bytes() == first, name


def test_empty_files_round_trip(tmp_path: Path) -> None:
    for name in ("e.parquet", "e.jsonl"):
        write_events(tmp_path / name, HEADER, {})
        header, df = read_events(tmp_path / name)
        assert header == HEADER and len(df) == 0
        assert {c: df[c].dtype for c in df.columns} == DTYPES


def test_writer_accepts_enum_members_ints_names_and_series(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    write_events(path, HEADER, pd.DataFrame({
        "step": [0, 0, 0],
        "kind": [int(EventKind.STEP), int(EventKind.ARRIVE), int(EventKind.ARRIVE)],
        "request_id": pd.Series([-1, 4, 5], dtype="int32"),
        "priority": [Priority.HOT, Priority.COLD, Priority.DECODE_CRITICAL],
    }))
    _, df = read_events(path)
    assert df["priority"].tolist() == [2, 0, 3]
    assert df["request_id"].tolist() == [-1, 4, 5]


@pytest.mark.parametrize("columns, message", [
    ({"step": [0], "kind": "STEP", "blok": [1]}, "unknown event column"),
    ({"step": [0], "kind": "STEPP"}, "unknown kind name"),
    ({"step": [0.5], "kind": "STEP"}, "non-integral"),
    ({"step": [0], "kind": "STEP", "num_tokens": [2**40]}, "do not fit int32"),
    ({"step": [0, 1], "kind": "STEP", "num_tokens": [1, 2, 3]}, "expected 2 values"),
    ({"step": [0, 1], "kind": ["STEP", "ALLOCATE"], "request_id": [-1, 0]},
     "row 1: field 'block_index'"),
    ({"step": [0], "kind": "ARRIVE"}, "row 0: field 'request_id'"),
    ({"step": [0], "kind": "FORK", "request_id": 1}, "field 'parent_request_id'"),
    ({"step": [0], "kind": "STEP", "duration_us": [-1.0]}, "duration_us >= 0"),
])
def test_writer_rejects_programming_errors(tmp_path: Path, columns, message) -> None:
    with pytest.raises(ValueError, match=message):
        write_events(tmp_path / "t.parquet", HEADER, columns)
    assert not (tmp_path / "t.parquet").exists()


def test_reader_accepts_wider_parquet_integer_types(tmp_path: Path) -> None:
    """A file written by pandas (int64 everywhere) reads fine; values are range-checked."""
    path = tmp_path / "pandas.parquet"
    df = pd.DataFrame({name: np.full(3, DEFAULTS[name]) for name in COLUMN_NAMES})
    df["step"] = [0, 1, 2]
    df["kind"] = np.array([0, 0, 0], dtype=np.int64)
    table = pa.Table.from_pandas(df, preserve_index=True)
    table = table.replace_schema_metadata({**table.schema.metadata,
                                           HEADER_METADATA_KEY: HEADER.to_json().encode()})
    pq.write_table(table, path)
    header, got = read_events(path)
    assert header == HEADER
    assert got["kind"].dtype == np.int8 and got["step"].tolist() == [0, 1, 2]
    df["phase"] = [0, 0, 300]
    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(
        {HEADER_METADATA_KEY: HEADER.to_json().encode()})
    pq.write_table(table, path)
    with pytest.raises(KvsimInputError, match=r"row 2: field 'phase'.*fits int8.*300"):
        read_events(path)


def test_batches_can_be_read_twice(tmp_path: Path) -> None:
    for name in ("t.parquet", "t.jsonl"):
        write_events(tmp_path / name, HEADER, SMALL)
        with open_events(tmp_path / name) as reader:
            a = [b["kind"].tolist() for b in reader.batches()]
            b = [b["kind"].tolist() for b in reader.batches()]
        assert a == b == [[int(k) for k in SMALL["kind"]]]


def test_parquet_batches_as_to_numpy_gives_them_without_pandas(tmp_path: Path) -> None:
    """Each Parquet batch column is what pyarrow's ``to_numpy()`` gives (values, dtype,
    read-only for the number columns, a writable copy for the booleans), also at a batch
    that starts inside a row group (an offset into Arrow's buffers, bits of the booleans
    included), and reading them imports no pandas (``to_numpy`` does: ~0.5 CPU-s on
    the 16-token replay's critical path; on main this child found pandas imported)."""
    import subprocess
    import sys

    rng = np.random.default_rng(3)
    n = 1001
    cols = {"step": np.arange(n), "kind": "STEP", "num_tokens": rng.integers(0, 99, n),
            "duration_us": rng.random(n), "pin_requested": rng.random(n) < 0.5,
            "prefetch_ok": rng.random(n) < 0.3, "tenant": rng.integers(0, 5, n)}
    path = tmp_path / "t.parquet"
    write_events(path, HEADER, cols)
    want = pq.read_table(path)
    with open_events(path) as reader:
        got = list(reader.batches(batch_rows=77))  # 77 does not divide a row group: offsets
    for name in COLUMN_NAMES:
        ref = want.column(name).to_numpy()
        arr = np.concatenate([b[name] for b in got])
        assert arr.dtype == ref.dtype and np.array_equal(arr, ref), name
        assert all(b[name].flags.writeable == (ref.dtype == np.bool_) for b in got), name
    code = ("import sys; from kvsim.events import open_events\n"
            f"with open_events({str(path)!r}) as r:\n"
            "    n = sum(len(b['step']) for b in r.batches(batch_rows=77, read_ahead=True))\n"
            "print(n, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(n), "False"]


def test_write_outside_with_block_is_an_error(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path / "t.parquet", HEADER)
    with pytest.raises(RuntimeError):
        writer.write({"step": [0]})


def test_trace_format_doc_names_every_column_and_enum_value() -> None:
    from kvsim.core.schema import ENUM_COLUMNS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "trace-format.md").read_text()
    for name in COLUMN_NAMES:
        assert f"| `{name}` |" in doc, name
    for enum_cls in ENUM_COLUMNS.values():
        for member in enum_cls:
            assert f"`{member.name}` | {int(member)} |" in doc, member
