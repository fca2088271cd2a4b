"""show and timeline on the hand-made lru log: exact rows, filters pushed down."""

from __future__ import annotations

import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import Tier
from kvsim.results.log_query import parse_step_range, show, tiers_visited, timeline
from kvsim.results.log_reader import DecisionLog, parse_block
from kvsim.results.log_schema import Action

LRU = "least recently used: idle for the longest time"


@pytest.fixture()
def log(lru_path):
    return DecisionLog(lru_path)


def test_show_filters(log):
    assert show(log, request=0)["seq"].tolist() == [0, 1, 4, 5, 12, 13, 14, 15, 16, 19, 20]
    assert show(log, request=0, limit=3)["seq"].tolist() == [0, 1, 4]
    assert show(log, block=parse_block("102"))["seq"].tolist() == [1, 4, 10, 15, 16, 19, 23]
    assert show(log, block=parse_block("4:1"))["seq"].tolist() == [26, 28]
    ev = [int(Action.EVICT), int(Action.DEMOTE)]
    assert show(log, actions=ev, steps=(2, 3))["seq"].tolist() == [8, 10, 12, 14]
    assert show(log, actions=ev, steps=(4, None))["seq"].tolist() == [23]
    assert show(log, tiers=[int(Tier.DRAM)])["seq"].tolist() == [8, 13]
    assert show(log, reason="ON DEMAND")["seq"].tolist() == [13, 15, 24]
    assert show(log, reason="demand", request=4)["seq"].tolist() == [24]
    assert show(log, request=99).empty
    assert len(show(log, limit=0)) == 29


def test_show_row_values(log):
    frame = show(log, actions=[int(Action.DEMOTE)])
    assert frame.to_dict(orient="records") == [{
        "seq": 8, "step": 2, "time_us": 2000.0, "action": "DEMOTE", "block": "101",
        "request_id": 2, "block_index": 0, "from_tier": "HBM", "to_tier": "DRAM",
        "bytes": 32768, "cost_us": 0.0, "decode_critical": False, "reason": LRU,
        "n_candidates": 4}]


def test_step_range_parsing():
    assert parse_step_range("2:3") == (2, 3)
    assert parse_step_range("2:") == (2, None)
    assert parse_step_range(":3") == (None, 3)
    assert parse_step_range("5") == (5, 5)
    for bad in ("a:b", "5:2", ""):
        with pytest.raises(KvsimInputError):
            parse_step_range(bad)


def test_block_timeline(log):
    frame = timeline(log, block=parse_block("101"))
    assert frame[["seq", "step", "action", "request_id", "what", "resident"]].values.tolist() == [
        [0, 0, "ALLOCATE", 0, "allocated in HBM for request 0", "HBM"],
        [5, 1, "RELEASE", 0, "released by its last holder; cached while free", "HBM"],
        [8, 2, "DEMOTE", 2, "demoted HBM -> DRAM", "DRAM"],
        [13, 3, "PROMOTE", 0, "promoted DRAM -> HBM on demand for request 0 (40 us)",
         "HBM+DRAM"],
        [20, 5, "RELEASE", 0, "released by its last holder; cached while free", "HBM+DRAM"]]
    assert tiers_visited(frame) == ["HBM", "DRAM", "HBM"]
    frame = timeline(log, block=parse_block("102"))
    assert frame["what"].tolist() == [
        "allocated in HBM for request 0",
        "released by its last holder; cached while free",
        "evicted from HBM (no copy kept below)",
        "recomputed into HBM for request 0 (250 us)",
        "allocated in HBM for request 0",
        "released by its last holder; cached while free",
        "evicted from HBM (no copy kept below)"]
    assert frame["resident"].tolist() == ["HBM", "HBM", "-", "HBM", "HBM", "HBM", "-"]
    frame = timeline(log, block=parse_block("4:1"))
    assert frame[["action", "resident"]].values.tolist() == [["ALLOCATE", "HBM"],
                                                             ["FREE", "-"]]


def test_request_timeline(log):
    frame = timeline(log, request=4)
    assert frame[["seq", "action", "block", "what"]].values.tolist() == [
        [23, "EVICT", "102", "evicted from HBM (no copy kept below)"],
        [24, "RECOMPUTE", "201", "recomputed into HBM for request 4 (120 us)"],
        [25, "ALLOCATE", "201", "allocated in HBM for request 4"],
        [26, "ALLOCATE", "4:1", "allocated in HBM for request 4"],
        [27, "RELEASE", "201", "released by its last holder; cached while free"],
        [28, "FREE", "4:1", "freed (no content identity): slot empty again"]]
    assert "resident" not in frame.columns
    with pytest.raises(KvsimInputError):
        timeline(log)
