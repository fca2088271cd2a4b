"""Property: any valid event table survives JSONL -> Parquet -> JSONL unchanged (and the
header with it): the two formats carry exactly the same information."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.core.schema import COLUMN_NAMES, EventHeader, EventKind, Phase, Priority
from kvsim.events import DTYPES, read_events, write_events

I64 = st.integers(-(2**63), 2**63 - 1)
NONNEG_I64 = st.integers(0, 2**63 - 1)
FLOATS = st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False)
JSON_SCALARS = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=8), st.booleans())

BLOCK_KINDS = (EventKind.ALLOCATE, EventKind.COMMIT)
REQUEST_KINDS = (EventKind.STEP, EventKind.ARRIVE, EventKind.ACCESS, EventKind.FORK)


@st.composite
def event_rows(draw) -> dict:
    """One valid row (as a column-name -> Python value dict), step not set."""
    kind = draw(st.sampled_from(list(EventKind)))
    if kind in BLOCK_KINDS:
        block_index = draw(st.integers(0, 2**31 - 1))
    elif kind in REQUEST_KINDS:
        block_index = -1
    else:
        block_index = draw(st.integers(-1, 2**31 - 1))
    return {
        "time_us": draw(NONNEG_I64),
        "kind": int(kind),
        "request_id": draw(st.integers(-1 if kind == EventKind.STEP else 0, 2**63 - 1)),
        "block_index": block_index,
        "content_hash": draw(I64),
        "parent_request_id": draw(st.integers(0 if kind == EventKind.FORK else -1, 2**63 - 1)),
        "num_tokens": draw(st.integers(0, 2**31 - 1)),
        "duration_us": draw(FLOATS),
        "phase": int(draw(st.sampled_from(list(Phase)))),
        "priority": int(draw(st.sampled_from(list(Priority)))),
        "request_priority": draw(st.integers(0, 100)),
        "deadline_us": draw(st.integers(-1, 2**63 - 1)),
        "slack_us": draw(I64),
        "recompute_cost_us": draw(FLOATS),
        "target_decode_step": draw(st.integers(-1, 2**63 - 1)),
        "pin_requested": draw(st.booleans()),
        "compression_ok": draw(st.booleans()),
        "recompute_ok": draw(st.booleans()),
        "prefetch_ok": draw(st.booleans()),
        "size_bytes": draw(NONNEG_I64),
        "tenant": draw(st.integers(0, 2**31 - 1)),
    }


@st.composite
def event_tables(draw) -> pd.DataFrame:
    rows = draw(st.lists(event_rows(), max_size=25))
    steps = sorted(draw(st.lists(st.integers(0, 2**62), min_size=len(rows),
                                 max_size=len(rows))))
    for row, step in zip(rows, steps):
        row["step"] = step
    data = {name: np.array([r[name] for r in rows], dtype=DTYPES[name]) for name in COLUMN_NAMES}
    return pd.DataFrame(data)


HEADERS = st.builds(
    EventHeader,
    block_size_tokens=st.integers(1, 4096),
    kv_bytes_per_token=st.integers(0, 2**40),
    model=st.text(max_size=20),
    hardware=st.text(max_size=20),
    source=st.dictionaries(st.text(max_size=8), st.one_of(JSON_SCALARS,
                                                          st.lists(JSON_SCALARS, max_size=3)),
                           max_size=4),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(df=event_tables(), header=HEADERS,
       jsonl_name=st.sampled_from(["t.jsonl", "t.jsonl.gz", "t.jsonl.zst"]),
       row_group_rows=st.integers(1, 30))
def test_jsonl_parquet_round_trip_is_identity(df: pd.DataFrame, header: EventHeader,
                                              jsonl_name: str, row_group_rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, parquet, again = Path(tmp, jsonl_name), Path(tmp, "t.parquet"), Path(tmp, "b.jsonl")
        write_events(jsonl, header, df)
        h1, from_jsonl = read_events(jsonl)
        write_events(parquet, h1, from_jsonl, row_group_rows=row_group_rows)
        h2, from_parquet = read_events(parquet)
        write_events(again, h2, from_parquet)
        h3, from_again = read_events(again)
    assert h1 == h2 == h3 == header
    for got in (from_jsonl, from_parquet, from_again):
        pd.testing.assert_frame_equal(got, df, check_exact=True)
