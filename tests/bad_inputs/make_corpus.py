"""Regenerate the bad-input corpus: ``python tests/bad_inputs/make_corpus.py``.

Every file here is an event file with exactly one defect; ``expected.toml`` lists, per
file, the fragments the one-line error must contain (file name, line/row, field, what).
JSONL files are written by hand below (they are meant to be read by people too); Parquet
files are built with pyarrow directly so that they can break the rules kvsim's own
writer enforces.  Deterministic: running it twice gives identical bytes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.core.schema import COLUMNS, DEFAULTS, HEADER_METADATA_KEY, EventHeader

HERE = Path(__file__).resolve().parent
HEADER = json.dumps({"kvsim_events": 1, "header": {"block_size_tokens": 16,
                                                   "kv_bytes_per_token": 131072}})
GOOD = [
    '{"step": 0, "time_us": 0, "kind": "STEP", "num_tokens": 20, "duration_us": 950.0}',
    '{"step": 0, "time_us": 0, "kind": "ARRIVE", "request_id": 0, "num_tokens": 20}',
    '{"step": 0, "time_us": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 0, '
    '"content_hash": 7001, "num_tokens": 16, "size_bytes": 2097152}',
    '{"step": 0, "time_us": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 1, '
    '"num_tokens": 4, "size_bytes": 2097152}',
    '{"step": 0, "time_us": 0, "kind": "ACCESS", "request_id": 0, "num_tokens": 20}',
    '{"step": 1, "time_us": 950, "kind": "STEP", "num_tokens": 1, "duration_us": 40.0}',
    '{"step": 1, "time_us": 950, "kind": "ACCESS", "request_id": 0, "num_tokens": 1, '
    '"phase": "DECODE"}',
    '{"step": 1, "time_us": 950, "kind": "FREE", "request_id": 0, "phase": "DONE"}',
]


def jsonl(name: str, body_lines: list[str], header: str | None = HEADER) -> None:
    lines = ([header] if header is not None else []) + body_lines
    (HERE / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def replace_line(index: int, text: str) -> list[str]:
    """GOOD with body line ``index`` (0-based; file line index + 2) replaced."""
    body = list(GOOD)
    body[index] = text
    return body


def good_columns(n: int = 12) -> dict[str, np.ndarray]:
    cols = {name: np.full(n, DEFAULTS[name], dtype=typ.to_pandas_dtype())
            for name, typ, _ in COLUMNS}
    cols["step"] = np.arange(n, dtype=np.int64) // 3
    cols["kind"] = np.tile(np.array([0, 1, 2], dtype=np.int8), n // 3)  # STEP ARRIVE ALLOCATE
    cols["request_id"] = np.where(cols["kind"] == 0, -1, np.arange(n) // 3).astype(np.int64)
    cols["block_index"] = np.where(cols["kind"] == 2, 0, -1).astype(np.int32)
    cols["size_bytes"] = np.where(cols["kind"] == 2, 2097152, 0).astype(np.int64)
    cols["num_tokens"] = np.full(n, 16, dtype=np.int32)
    return cols


def parquet(name: str, cols: dict, header: EventHeader | None = EventHeader(),
            row_group_rows: int = 4, types: dict | None = None) -> None:
    types = types or {}
    fields, arrays = [], []
    for col, values in cols.items():
        typ = types.get(col) or dict((n, t) for n, t, _ in COLUMNS).get(col, pa.int64())
        arr = pa.array(values, type=typ)
        fields.append(pa.field(col, typ, nullable=True))
        arrays.append(arr)
    schema = pa.schema(fields)
    if header is not None:
        schema = schema.with_metadata({HEADER_METADATA_KEY: header.to_json().encode()})
    table = pa.Table.from_arrays(arrays, schema=schema)
    pq.write_table(table, HERE / name, row_group_size=row_group_rows, compression="zstd")


def main() -> None:
    # ---- JSONL: one defect each (file line = body index + 2) ----
    jsonl("bad_json.jsonl", replace_line(1, '{"step": 0, "kind": "ARRIVE", "request_id": 0,'))
    jsonl("missing_step.jsonl", replace_line(1, '{"kind": "ARRIVE", "request_id": 0}'))
    jsonl("missing_request_id.jsonl", replace_line(4, '{"step": 0, "kind": "ACCESS"}'))
    jsonl("unknown_field.jsonl", replace_line(
        2, '{"step": 0, "kind": "ALLOCATE", "request_id": 0, "blok_index": 0}'))
    jsonl("string_for_int.jsonl", replace_line(
        1, '{"step": 0, "kind": "ARRIVE", "request_id": "12", "num_tokens": 20}'))
    jsonl("float_for_int.jsonl", replace_line(
        4, '{"step": 0, "kind": "ACCESS", "request_id": 0, "num_tokens": 16.5}'))
    jsonl("bool_for_int.jsonl", replace_line(
        4, '{"step": 0, "kind": "ACCESS", "request_id": 0, "tenant": true}'))
    jsonl("int_for_bool.jsonl", replace_line(
        4, '{"step": 0, "kind": "ACCESS", "request_id": 0, "pin_requested": 1}'))
    jsonl("unknown_enum.jsonl", replace_line(
        2, '{"step": 0, "kind": "ALLOC", "request_id": 0, "block_index": 0}'))
    jsonl("enum_as_number.jsonl", replace_line(
        6, '{"step": 1, "kind": "ACCESS", "request_id": 0, "phase": 1}'))
    jsonl("negative_size.jsonl", replace_line(
        3, '{"step": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 1, '
           '"size_bytes": -4096}'))
    jsonl("negative_tokens.jsonl", replace_line(
        1, '{"step": 0, "kind": "ARRIVE", "request_id": 0, "num_tokens": -20}'))
    jsonl("nan_duration.jsonl", replace_line(
        5, '{"step": 1, "kind": "STEP", "duration_us": NaN}'))
    jsonl("inf_recompute.jsonl", replace_line(
        3, '{"step": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 1, '
           '"recompute_cost_us": Infinity}'))
    jsonl("priority_out_of_range.jsonl", replace_line(
        1, '{"step": 0, "kind": "ARRIVE", "request_id": 0, "request_priority": 101}'))
    jsonl("step_decreasing.jsonl", GOOD + ['{"step": 0, "kind": "STEP"}'])
    jsonl("allocate_without_block_index.jsonl", replace_line(
        3, '{"step": 0, "kind": "ALLOCATE", "request_id": 0, "size_bytes": 2097152}'))
    jsonl("block_index_overflow.jsonl", replace_line(
        3, '{"step": 0, "kind": "ALLOCATE", "request_id": 0, "block_index": 4294967296}'))
    jsonl("not_an_object.jsonl", replace_line(4, '[0, "ACCESS", 0]'))
    jsonl("no_header.jsonl", GOOD, header=None)
    jsonl("wrong_schema_version.jsonl", GOOD, header=HEADER.replace('"kvsim_events": 1',
                                                                     '"kvsim_events": 2'))
    jsonl("bad_header_field.jsonl", GOOD, header=HEADER.replace("16", '"16"'))
    jsonl("unknown_header_field.jsonl", GOOD, header=json.dumps(
        {"kvsim_events": 1, "header": {"block_size_tokens": 16, "blocksize": 16}}))
    (HERE / "empty.jsonl").write_bytes(b"")
    (HERE / "not_gzip.jsonl.gz").write_text(HEADER + "\n" + "\n".join(GOOD) + "\n")
    body = (HEADER + "\n" + "\n".join(GOOD * 40) + "\n").encode()
    packed = gzip.compress(body, mtime=0)
    (HERE / "truncated.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    (HERE / "requests.csv.jsonl").write_text(
        "timestamp,input_length,output_length\n0,6758,500\n27,7319,490\n")
    (HERE / "requests.csv").write_text(
        "timestamp,input_length,output_length\n0,6758,500\n27,7319,490\n")

    (HERE / "binary_garbage.jsonl").write_bytes(
        (HEADER + "\n" + GOOD[0] + "\n").encode() + bytes(range(128, 256)) + b"\n")

    # ---- Parquet ----
    parquet("valid_reference.parquet", good_columns())  # not in the corpus: sanity anchor
    data = (HERE / "valid_reference.parquet").read_bytes()
    (HERE / "truncated.parquet").write_bytes(data[: len(data) // 2])
    # Same file with the middle of its data pages overwritten (footer intact).
    corrupt = bytearray(data)
    for i in range(4, 200):
        corrupt[i] = 0xFF
    (HERE / "corrupt_data.parquet").write_bytes(bytes(corrupt))
    (HERE / "valid_reference.parquet").unlink()
    (HERE / "empty.parquet").write_bytes(b"")
    cols = good_columns()
    del cols["phase"]
    parquet("missing_column.parquet", cols)
    cols = good_columns()
    parquet("wrong_column_type.parquet", {**cols, "num_tokens": cols["num_tokens"].astype(str)},
            types={"num_tokens": pa.string()})
    parquet("float_column_for_int.parquet", {**cols, "step": cols["step"].astype(float)},
            types={"step": pa.float64()})
    parquet("no_header.parquet", good_columns(), header=None)
    parquet("wrong_schema_version.parquet", good_columns(),
            header=EventHeader(schema_version=2))
    cols = good_columns()
    cols["size_bytes"][8] = -1
    parquet("negative_size.parquet", cols)
    cols = good_columns()
    cols["step"][8:] -= 2  # decreases at row 8, the first row of the third row group
    parquet("step_decreasing_across_row_groups.parquet", cols)
    cols = good_columns()
    cols["kind"][5] = 9
    parquet("bad_enum_code.parquet", cols)
    cols = good_columns()
    cols["duration_us"][6] = np.nan
    parquet("nan_duration.parquet", cols)
    cols = good_columns()
    steps = cols["step"].astype(object)
    steps[10] = None
    parquet("null_step.parquet", {**cols, "step": list(steps)})
    cols = good_columns()
    cols["request_priority"][2] = -3
    parquet("priority_out_of_range.parquet", cols)
    cols = good_columns()
    cols["block_index"][11] = -1
    parquet("allocate_without_block_index.parquet", cols)
    parquet("unknown_column.parquet", {**good_columns(), "blok_index": np.zeros(12)},
            types={"blok_index": pa.float64()})


if __name__ == "__main__":
    main()
