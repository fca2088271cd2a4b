"""``kvsim replay``: a hand-made decision log (exact v1 schema) replayed on the cpu pool;
tallies per action type and tier path are exact, timings are real."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.analysis.placement_replay import (
    ReplaySettings,
    SlotRing,
    operations_for,
    replay_decision_log,
)
from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.results.log_schema import Action

BLOCK = 8192
# (action, path, operations, rows, batches, predicted_us) in report order (by action code,
# then from tier, then to tier), from tests/backends/conftest.py::handmade_rows.
EXPECTED = [
    ("DEMOTE", "HBM->DRAM", "spill", 3, 1, 30.0),
    ("DEMOTE", "DRAM->NVME", "disk_write", 2, 1, 100.0),
    ("DEMOTE", "CXL->DRAM", "host_copy", 1, 1, 5.0),
    ("PROMOTE", "DRAM->HBM", "promote", 2, 2, 15.0),
    ("PROMOTE", "NVME->HBM", "disk_read+promote", 1, 1, 120.0),
    ("PREFETCH", "NVME->HBM", "disk_read+promote", 1, 1, 100.0),
    ("WRITE_THROUGH", "HBM->DRAM", "spill", 1, 1, 0.0),
]


def settings(tmp_path, **kw) -> ReplaySettings:
    return ReplaySettings(pool_bytes=16 * BLOCK, disk_dir=str(tmp_path / "disk"),
                          num_layers=4, **kw)


def test_operations_per_path():
    A = Action
    assert operations_for(A.DEMOTE, 0, 1) == ("spill",)
    assert operations_for(A.DEMOTE, 0, 2) == ("spill",)  # CXL: host memory here
    assert operations_for(A.DEMOTE, 0, 3) == ("spill", "disk_write")
    assert operations_for(A.WRITE_THROUGH, 1, 3) == ("disk_write",)
    assert operations_for(A.PROMOTE, 1, 0) == ("promote",)
    assert operations_for(A.PREFETCH, 3, 0) == ("disk_read", "promote")
    assert operations_for(A.PROMOTE, 3, 1) == ("disk_read",)
    assert operations_for(A.DEMOTE, 1, 2) == ("host_copy",)  # DRAM -> CXL: CPU copy
    assert operations_for(A.PROMOTE, 2, 1) == ("host_copy",)
    assert operations_for(A.PROMOTE, 1, 3) is None  # a "promotion" downwards
    assert operations_for(A.DEMOTE, 1, 1) is None
    assert operations_for(A.EVICT, 0, -1) is None


def test_slot_ring_keeps_slots_until_recycled():
    ring = SlotRing(3)
    assert ring.slots(["a", "b", "c"]).tolist() == [0, 1, 2]
    assert ring.slots(["b", "a"]).tolist() == [1, 0]  # known keys keep their slots
    assert ring.slots(["d"]).tolist() == [0]  # ring wraps: "a" loses slot 0
    assert ring.slots(["a", "c"]).tolist() == [1, 2]  # "a" is new again; "b" lost slot 1
    assert ring.slots([(7, 0)]).tolist() == [2]


def test_replay_tallies_per_action_and_path(handmade_log, tmp_path):
    r = replay_decision_log(handmade_log, settings(tmp_path))
    got = [(a.action, a.path, a.operations, a.rows, a.batches, a.predicted_us)
           for a in r.actions]
    assert got == EXPECTED
    for a in r.actions:
        assert a.blocks == a.rows and a.bytes == a.rows * BLOCK
        assert a.measured_us > 0
        assert a.relative_error == pytest.approx((a.predicted_us - a.measured_us)
                                                 / a.measured_us)
    assert r.rows_scanned == 12 and r.rows_replayed == 11 and not r.truncated
    assert r.skipped == {"PROMOTE DRAM->NVME: no backend operation": 1}
    assert r.layout.block_bytes == BLOCK and r.layout.num_layers == 4
    assert r.pool_blocks == 16 and r.policy == "handmade"
    frame = r.to_frame()
    total = frame.iloc[-1]
    assert total["action"] == "TOTAL" and total["rows"] == 11
    assert total["predicted_us"] == 370.0
    assert total["measured_us"] == pytest.approx(sum(a.measured_us for a in r.actions))
    assert list((tmp_path / "disk").iterdir()) == []  # disk tier scratch file removed


def test_pool_smaller_than_a_batch_is_split_and_rows_can_be_capped(handmade_log, tmp_path):
    r = replay_decision_log(handmade_log, ReplaySettings(pool_bytes=2 * BLOCK,
                                                         disk_dir=str(tmp_path)))
    assert r.pool_blocks == 2
    assert [(a.path, a.rows) for a in r.actions][:2] == [("HBM->DRAM", 3), ("DRAM->NVME", 2)]
    capped = replay_decision_log(handmade_log, settings(tmp_path, max_rows=4))
    assert capped.truncated and capped.rows_replayed == 4
    assert [(a.action, a.path, a.rows) for a in capped.actions] == [
        ("DEMOTE", "HBM->DRAM", 3), ("DEMOTE", "DRAM->NVME", 1)]


def test_block_bytes_override_splits_rows_into_blocks(handmade_log, tmp_path):
    r = replay_decision_log(handmade_log, settings(tmp_path, block_bytes=BLOCK // 2))
    assert all(a.blocks == 2 * a.rows for a in r.actions)


def test_bad_rows_are_named_by_seq(log_rows, write_log, tmp_path):
    rows = log_rows()
    rows[5]["bytes"] = 0  # seq 5: the second DEMOTE HBM->DRAM
    path = write_log(rows, tmp_path / "bad.parquet")
    with pytest.raises(KvsimInputError) as err:
        replay_decision_log(path, settings(tmp_path))
    assert str(err.value) == (f"{path}: seq 5: field 'bytes': expected bytes > 0 on a data "
                              "movement, got 0")
    rows = log_rows()
    rows[8]["cost_us"] = float("nan")
    path = write_log(rows, tmp_path / "nan.parquet")
    with pytest.raises(KvsimInputError, match="seq 8: field 'cost_us': expected cost_us >= 0"):
        replay_decision_log(path, settings(tmp_path))


def test_log_without_movements_is_refused(log_rows, write_log, tmp_path):
    rows = [r for r in log_rows() if r["action"] not in (1, 2, 3, 5)]
    path = write_log(rows, tmp_path / "still.parquet")
    with pytest.raises(KvsimInputError, match="expected at least one DEMOTE"):
        replay_decision_log(path, settings(tmp_path))


def test_not_a_decision_log_is_refused(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(KvsimInputError, match="not a readable Parquet decision log"):
        replay_decision_log(path, settings(tmp_path))


def test_cli_replay_json_and_table(handmade_log, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["replay", "--decision-log", str(handmade_log), "--backend",
                              "cpu", "--pool-mib", "0.125", "--layers", "4", "--disk-dir",
                              str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"] == "cpu" and data["rows_replayed"] == 11
    assert data["pool_blocks"] == 16 and data["layout"]["block_bytes"] == BLOCK
    acts = data["actions"]
    assert [(a["action"], a["path"], a["rows"]) for a in acts] == \
        [(e[0], e[1], e[3]) for e in EXPECTED] + [("TOTAL", "", 11)]
    assert set(acts[0]) == {"action", "path", "operations", "rows", "blocks", "bytes",
                            "batches", "predicted_us", "measured_us", "predicted_mean_us",
                            "measured_mean_us", "relative_error"}
    assert np.isclose(acts[-1]["predicted_us"], 370.0)
    table = runner.invoke(app, ["replay", "--decision-log", str(handmade_log),
                                "--pool-mib", "0.125", "--disk-dir", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert "PREFETCH" in table.stdout and "skipped 1 rows: PROMOTE DRAM->NVME" in table.stdout


def test_a_steps_interleaved_rows_batch_per_action_and_path(log_rows, write_log, tmp_path):
    row, A = log_rows.row, Action
    rows = [row(5, A.DEMOTE, 1, 0, 0, 0, 1, BLOCK, 1.0),   # HBM -> DRAM
            row(5, A.DEMOTE, 2, 0, 1, 1, 2, BLOCK, 2.0),   # DRAM -> CXL
            row(5, A.DEMOTE, 3, 0, 2, 0, 1, BLOCK, 1.0),
            row(5, A.DEMOTE, 4, 0, 3, 1, 2, BLOCK, 2.0),
            row(6, A.DEMOTE, 5, 0, 4, 0, 1, BLOCK, 1.0)]   # next step: a new batch
    path = write_log(rows, tmp_path / "interleaved.parquet")
    r = replay_decision_log(path, settings(tmp_path))
    assert [(a.path, a.rows, a.batches, a.predicted_us) for a in r.actions] == [
        ("HBM->DRAM", 3, 2, 3.0), ("DRAM->CXL", 2, 1, 4.0)]
