"""Fixtures for the backend, calibration and placement-replay tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.results.log_schema import LOG_METADATA_KEY, LOG_SCHEMA_VERSION, Action, log_schema

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def backend_checks():
    """The shared byte-exact checks (tests/backends/backend_checks.py) as a module."""
    spec = importlib.util.spec_from_file_location("kvsim_backend_checks",
                                                  HERE / "backend_checks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_python(code_or_args: list[str], cudasim: bool, timeout: float = 120.0):
    """Run ``python <args>`` in a fresh process, with or without the CUDA simulator."""
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if cudasim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run([sys.executable, *code_or_args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=HERE.parents[1])


def log_row(step, action, h, req, idx, frm=-1, to=-1, nbytes=0, cost=0.0):
    return {"step": step, "time_us": 1000.0 * step, "action": int(action), "content_hash": h,
            "request_id": req, "block_index": idx, "from_tier": frm, "to_tier": to,
            "bytes": nbytes, "cost_us": cost, "decode_critical": False, "reason_code": -1,
            "reason": "", "candidates": None}


def _write_log(rows: list[dict], path: Path, policy: str = "handmade",
              row_group_rows: int = 4) -> Path:
    """Rows -> a decision log with the exact v1 schema and kvsim metadata."""
    schema = log_schema()
    cols = {}
    for f in schema:
        values = list(range(len(rows))) if f.name == "seq" else [r[f.name] for r in rows]
        if f.name == "reason":
            cols[f.name] = pa.array(values, pa.string()).dictionary_encode().cast(f.type)
        else:
            cols[f.name] = pa.array(values, f.type)
    meta = {"log_schema_version": LOG_SCHEMA_VERSION, "policy": policy,
            "trace": "handmade", "config": {}}
    schema = schema.with_metadata({LOG_METADATA_KEY: json.dumps(meta).encode()})
    pq.write_table(pa.table(cols, schema=schema), path, row_group_size=row_group_rows)
    return path


A = Action
BLOCK = 8192  # bytes per block of the hand-made log
HBM, DRAM, CXL, NVME = 0, 1, 2, 3


def handmade_rows() -> list[dict]:
    """A small story with every replayed path; rows per (action, path) and batches are
    chosen so the expected tallies are exact (see test_placement_replay.py)."""
    return [
        log_row(0, A.ALLOCATE, 11, 0, 0), log_row(0, A.ALLOCATE, 12, 0, 1),
        log_row(0, A.ALLOCATE, 13, 0, 2), log_row(0, A.ALLOCATE, 0, 0, 3),
        # step 1: spill three blocks to DRAM in one batch (3 rows, 1 batch)
        log_row(1, A.DEMOTE, 11, 1, 0, HBM, DRAM, BLOCK, 10.0),
        log_row(1, A.DEMOTE, 12, 1, 1, HBM, DRAM, BLOCK, 10.0),
        log_row(1, A.DEMOTE, 0, 0, 3, HBM, DRAM, BLOCK, 10.0),  # no hash: (req, idx) key
        log_row(1, A.EVICT, 13, 1, 2, HBM, -1),
        # step 2: DRAM -> NVME (1 batch of 2), then a write-through HBM -> DRAM
        log_row(2, A.DEMOTE, 11, 1, 0, DRAM, NVME, BLOCK, 50.0),
        log_row(2, A.DEMOTE, 12, 1, 1, DRAM, NVME, BLOCK, 50.0),
        log_row(2, A.WRITE_THROUGH, 14, 2, 0, HBM, DRAM, BLOCK, 0.0),
        # step 3: promote from DRAM on demand; prefetch from NVME
        log_row(3, A.PROMOTE, 0, 0, 3, DRAM, HBM, BLOCK, 7.5),
        log_row(3, A.PREFETCH, 11, 3, 0, NVME, HBM, BLOCK, 100.0),
        log_row(3, A.RECOMPUTE, 13, 3, 2, -1, HBM, BLOCK, 250.0),
        # step 4: a second promote batch (another step = another batch); a CXL -> DRAM
        # move (a host copy); a "promotion" into NVME has no backend operation: skipped
        log_row(4, A.PROMOTE, 14, 4, 0, DRAM, HBM, BLOCK, 7.5),
        log_row(4, A.PROMOTE, 12, 4, 1, NVME, HBM, BLOCK, 120.0),
        log_row(4, A.DEMOTE, 15, 4, 2, CXL, DRAM, BLOCK, 5.0),
        log_row(4, A.PROMOTE, 16, 4, 3, DRAM, NVME, BLOCK, 1.0),
    ]


@pytest.fixture
def handmade_log(tmp_path) -> Path:
    return _write_log(handmade_rows(), tmp_path / "handmade.log.parquet")


@pytest.fixture(scope="session")
def run_python():
    """``run_python(args, cudasim) -> CompletedProcess``: a fresh interpreter."""
    return _run_python


@pytest.fixture(scope="session")
def write_log():
    """``write_log(rows, path)``: a decision log with the exact v1 schema."""
    return _write_log


@pytest.fixture(scope="session")
def log_rows():
    """``log_rows()`` -> the hand-made rows; ``log_rows.row(...)`` builds one row."""
    handmade_rows.row = log_row
    return handmade_rows
