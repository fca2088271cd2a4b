"""Reading a subset of an event file's columns (``EventReader.batches(columns=...)``, the
replay's pre-pass) and the batch checks' table lookups (issue 34, 16-token replay)."""

from __future__ import annotations

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
)
from kvsim.events import open_events
from kvsim.events.columns import _BLOCK_LEVEL, _ENUM_VALID, _REQUEST_LEVEL, _one_of
from kvsim.replay.prepass import SCAN_COLUMNS

HEADER = EventHeader(block_size_tokens=16, kv_bytes_per_token=131072, model="llama-3.1-8b",
                     source={"generator": "test", "seed": 0})


def _write(path: Path, **cols) -> None:
    """Four rows (STEP, ARRIVE, ALLOCATE, FREE of request 0) written without the writer's
    checks, with ``cols`` replacing columns."""
    df = pd.DataFrame({name: np.full(4, DEFAULTS[name]) for name in COLUMN_NAMES})
    df["kind"] = np.array([EventKind.STEP, EventKind.ARRIVE, EventKind.ALLOCATE,
                           EventKind.FREE], dtype=np.int8)
    df["request_id"] = [-1, 0, 0, 0]
    df["block_index"] = [-1, -1, 0, -1]
    df["content_hash"] = [0, 0, 77, 0]
    for name, values in cols.items():
        df[name] = values
    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(
        {HEADER_METADATA_KEY: HEADER.to_json().encode()})
    pq.write_table(table, path)


def test_subset_read_holds_those_columns_with_the_same_values(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    _write(path, step=[0, 0, 1, 2], size_bytes=[0, 0, 2048, 0])
    with open_events(path) as reader:
        full = next(iter(reader.batches()))
        part = next(iter(reader.batches(columns=["size_bytes"])))
        scan = next(iter(reader.batches(columns=SCAN_COLUMNS)))
    assert list(part) == ["step", "kind", "size_bytes"]  # step and kind always, schema order
    assert list(scan) == [n for n in COLUMN_NAMES if n in SCAN_COLUMNS]
    for got in (part, scan):
        for name, values in got.items():
            assert values.dtype == full[name].dtype
            assert values.tolist() == full[name].tolist()
    with open_events(path) as reader, pytest.raises(ValueError, match="unknown columns"):
        reader.batches(columns=["no_such_column"])


def test_subset_read_checks_its_columns_only(tmp_path: Path) -> None:
    """A bad value in a column left out is not seen; in a column read, it is reported as
    the full read reports it (file, row, field)."""
    path = tmp_path / "bad.parquet"
    _write(path, phase=np.array([0, 0, 99, 0], dtype=np.int8))
    with open_events(path) as reader:
        with pytest.raises(KvsimInputError, match=r"row 2: field 'phase'.*one of") as full:
            list(reader.batches())
        with pytest.raises(KvsimInputError) as part:
            list(reader.batches(columns=["phase"]))
        assert str(part.value) == str(full.value)
        assert len(list(reader.batches(columns=SCAN_COLUMNS))) == 1
    _write(path, block_index=[-1, -1, -1, -1])  # an ALLOCATE row without a block
    with open_events(path) as reader, pytest.raises(
            KvsimInputError, match=r"row 2: field 'block_index'.*ALLOCATE and COMMIT"):
        list(reader.batches(columns=SCAN_COLUMNS))


@pytest.mark.parametrize("dtype", [np.int8, np.int64])
def test_member_checks_match_np_isin(dtype) -> None:
    """The per-member comparisons that replaced ``np.isin`` (and the enum checks' loop)
    give the same answer for every int8 value, and reject what int8 cannot hold."""
    values = np.arange(-128, 128).astype(dtype)
    cases = [(_ENUM_VALID["kind"], EventKind), (_ENUM_VALID["phase"], Phase),
             (_ENUM_VALID["priority"], Priority),
             (_BLOCK_LEVEL, (EventKind.ALLOCATE, EventKind.COMMIT)),
             (_REQUEST_LEVEL, (EventKind.STEP, EventKind.ARRIVE, EventKind.ACCESS,
                               EventKind.FORK))]
    for table, members in cases:
        want = np.isin(values, [int(m) for m in members])
        assert _one_of(values, table).tolist() == want.tolist()
    wide = np.array([256 + int(EventKind.ALLOCATE), -256, 1 << 40], dtype=np.int64)
    assert not _one_of(wide, _ENUM_VALID["kind"]).any()


def test_checked_columns_are_not_checked_again(tmp_path: Path) -> None:
    """The replay's pass after its pre-pass (``checked=SCAN_COLUMNS``) leaves out the checks
    of the pre-pass's columns, and keeps every other."""
    path = tmp_path / "bad.parquet"
    _write(path, size_bytes=[0, 0, -5, 0])
    with open_events(path) as reader:
        with pytest.raises(KvsimInputError, match=r"row 2: field 'size_bytes'"):
            list(reader.batches(columns=SCAN_COLUMNS))
        assert len(list(reader.batches(checked=SCAN_COLUMNS))) == 1
    _write(path, size_bytes=[0, 0, -5, 0], phase=np.array([0, 0, 99, 0], dtype=np.int8))
    with open_events(path) as reader, pytest.raises(KvsimInputError,
                                                     match=r"row 2: field 'phase'"):
        list(reader.batches(checked=SCAN_COLUMNS))


@pytest.mark.parametrize("engine", ["interpreted", "compiled"])
def test_simulate_reports_a_bad_value_its_pre_pass_no_longer_reads(tmp_path: Path,
                                                                   engine: str) -> None:
    """A bad value in a column the pre-pass leaves out is raised by the replay's pass: the
    same one-line error (file, row, field), and no decision log left behind."""
    from kvsim.api import SimConfig, simulate

    path = tmp_path / "bad.parquet"
    _write(path, deadline_us=[-1, -1, -7, -1])
    log = tmp_path / "log.parquet"
    with pytest.raises(KvsimInputError, match=r"row 2: field 'deadline_us'.*-7"):
        simulate(path, "lru", SimConfig(engine=engine), log)
    assert not log.exists()
    assert "deadline_us" not in SCAN_COLUMNS
