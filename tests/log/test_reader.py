"""DecisionLog: metadata, validation of bad logs (one line), block identities, alignment."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.results.log_reader import DecisionLog, format_block, parse_block, step_aligned
from kvsim.results.log_schema import LOG_METADATA_KEY


def test_opens_hand_made_log_lazily(lru_path, make_logs):
    log = DecisionLog(lru_path)
    assert log.policy == "lru"
    assert log.trace == make_logs.TRACE
    assert log.metadata["config"] == make_logs.CONFIG
    assert log.num_rows == 29
    assert log.num_row_groups == 4  # 8-row groups: scans cross group boundaries


def test_committed_logs_match_generator(lru_path, deadline_path, make_logs):
    for path, rows, policy in ((lru_path, make_logs.lru_rows(), "lru"),
                               (deadline_path, make_logs.deadline_rows(), "deadline")):
        assert pq.read_table(path).equals(make_logs.table(rows, policy))


def _one_line_error(path, match: str):
    with pytest.raises(KvsimInputError) as info:
        DecisionLog(path)
    text = str(info.value)
    assert "\n" not in text and str(path) in text and match in text, text
    return text


def test_not_parquet(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("seq,step\n0,0\n")
    _one_line_error(bad, "not a readable Parquet decision log")


def test_truncated_file(tmp_path, lru_path):
    bad = tmp_path / "cut.parquet"
    bad.write_bytes(lru_path.read_bytes()[:1500])
    _one_line_error(bad, "truncated")


def test_wrong_schema_version(tmp_path, make_logs):
    path = make_logs.write(make_logs.table(make_logs.lru_rows(), "lru", version=2),
                           tmp_path / "v2.parquet")
    text = _one_line_error(path, "expected decision-log schema version 1, got 2")
    assert "log_schema_version" in text


def test_missing_column_and_wrong_type(tmp_path, make_logs):
    table = make_logs.table(make_logs.lru_rows(), "lru")
    path = tmp_path / "nocost.parquet"
    pq.write_table(table.drop_columns(["cost_us"]), path)
    assert "field 'cost_us'" in _one_line_error(path, "missing")
    path = tmp_path / "strstep.parquet"
    idx = table.schema.get_field_index("step")
    bad = table.set_column(idx, pa.field("step", pa.string()),
                           pa.array([str(v) for v in table.column("step").to_pylist()]))
    pq.write_table(bad, path)
    assert "field 'step'" in _one_line_error(path, "expected type int64, got string")


def test_no_metadata(tmp_path, make_logs):
    path = tmp_path / "plain.parquet"
    pq.write_table(make_logs.table(make_logs.lru_rows(), "lru").replace_schema_metadata({}), path)
    _one_line_error(path, "expected Parquet metadata key 'kvsim.decision_log'")
    path2 = tmp_path / "junk.parquet"
    pq.write_table(make_logs.table(make_logs.lru_rows(), "lru")
                   .replace_schema_metadata({LOG_METADATA_KEY: b"{not json"}), path2)
    _one_line_error(path2, "expected a JSON object")


def test_missing_file_and_directory(tmp_path):
    _one_line_error(tmp_path / "absent.parquet", "no such file")
    _one_line_error(tmp_path, "got a directory")


def test_block_identity_text_round_trip():
    assert parse_block("101") == (101, -1, -1)
    assert parse_block("-7") == (-7, -1, -1)
    assert parse_block("4:1") == (0, 4, 1)
    assert format_block(101, 9, 9) == "101"
    assert format_block(0, 4, 1) == "4:1"
    for bad in ("0", "x", "1:y"):
        with pytest.raises(KvsimInputError):
            parse_block(bad)


def test_step_aligned_never_splits_a_step(lru_path):
    log = DecisionLog(lru_path)
    tables = list(step_aligned(log.scan(["seq", "step"], batch_rows=5)))
    steps = [t.column("step").to_pylist() for t in tables]
    assert sum(len(s) for s in steps) == 29
    assert np.concatenate([t.column("seq").to_numpy() for t in tables]).tolist() == list(range(29))
    for a, b in zip(steps, steps[1:]):
        assert a[-1] < b[0]


def test_metadata_is_json_with_required_keys(lru_path):
    raw = pq.ParquetFile(lru_path).schema_arrow.metadata[LOG_METADATA_KEY]
    assert set(json.loads(raw)) == {"log_schema_version", "policy", "trace", "config"}
