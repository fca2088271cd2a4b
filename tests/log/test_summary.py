"""kvsim.results.log_summary.summary on the hand-made logs: every figure exact.

The story behind the numbers is in tests/log/make_logs.py: lru evicts 101 (DEMOTE), 102,
202, 201 and later 102 again; 101 comes back by PROMOTE (40 us), 102 by RECOMPUTE (250 us)
on request 0's decode-critical step 3, and 201 by RECOMPUTE (120 us) at step 6.
"""

from __future__ import annotations

import dataclasses

from kvsim.results.log_reader import DecisionLog
from kvsim.results.log_summary import summary

LRU = "least recently used: idle for the longest time"
DL = "no deadline soon: needed furthest in the future"


def test_lru_summary_exact(lru_path):
    s = dataclasses.asdict(summary(DecisionLog(lru_path)))
    assert (s["policy"], s["rows"], s["decisions"], s["first_step"], s["last_step"]) == \
        ("lru", 29, 8, 0, 7)
    assert (s["total_cost_us"], s["critical_cost_us"]) == (410.0, 290.0)
    assert s["by_action"] == [
        {"action": "ALLOCATE", "rows": 9, "bytes": 0, "cost_us": 0.0},
        {"action": "RELEASE", "rows": 9, "bytes": 0, "cost_us": 0.0},
        {"action": "EVICT", "rows": 4, "bytes": 0, "cost_us": 0.0},
        {"action": "RECOMPUTE", "rows": 2, "bytes": 0, "cost_us": 370.0},
        {"action": "REVIVE", "rows": 2, "bytes": 0, "cost_us": 0.0},
        {"action": "DEMOTE", "rows": 1, "bytes": 32768, "cost_us": 0.0},
        {"action": "FREE", "rows": 1, "bytes": 0, "cost_us": 0.0},
        {"action": "PROMOTE", "rows": 1, "bytes": 32768, "cost_us": 40.0}]
    assert s["by_reason"] == [
        {"action": "EVICT", "reason": LRU, "rows": 4, "cost_us": 0.0},
        {"action": "RECOMPUTE", "reason": "on demand: resident nowhere", "rows": 2,
         "cost_us": 370.0},
        {"action": "DEMOTE", "reason": LRU, "rows": 1, "cost_us": 0.0},
        {"action": "PROMOTE", "reason": "on demand: needed by this step", "rows": 1,
         "cost_us": 40.0}]
    assert s["by_tier"] == [
        {"action": "ALLOCATE", "from_tier": "-", "to_tier": "HBM", "rows": 9, "bytes": 0},
        {"action": "EVICT", "from_tier": "HBM", "to_tier": "-", "rows": 4, "bytes": 0},
        {"action": "RECOMPUTE", "from_tier": "-", "to_tier": "HBM", "rows": 2, "bytes": 0},
        {"action": "DEMOTE", "from_tier": "HBM", "to_tier": "DRAM", "rows": 1, "bytes": 32768},
        {"action": "PROMOTE", "from_tier": "DRAM", "to_tier": "HBM", "rows": 1, "bytes": 32768}]
    assert s["top_evicted_blocks"] == [
        {"block": "102", "evictions": 2, "regretted": 1, "cost_us": 250.0},
        {"block": "201", "evictions": 1, "regretted": 1, "cost_us": 120.0},
        {"block": "101", "evictions": 1, "regretted": 1, "cost_us": 40.0},
        {"block": "202", "evictions": 1, "regretted": 0, "cost_us": 0.0}]
    # owners of the victims (first candidate snapshot): request 0 owns 101, 102 (twice)
    assert s["top_evicted_requests"] == [{"request_id": 0, "evictions": 3},
                                         {"request_id": 1, "evictions": 2}]
    assert s["top_paying_requests"] == [
        {"request_id": 0, "cost_us": 290.0, "critical_cost_us": 290.0, "rows": 2},
        {"request_id": 4, "cost_us": 120.0, "critical_cost_us": 0.0, "rows": 1}]
    assert s["stall_by_cause"] == [
        {"action": "EVICT", "from_tier": "HBM", "reason": LRU, "evictions": 4, "regretted": 2,
         "cost_us": 370.0},
        {"action": "DEMOTE", "from_tier": "HBM", "reason": LRU, "evictions": 1, "regretted": 1,
         "cost_us": 40.0}]
    assert s["top_causes"] == [
        {"seq": 10, "step": 2, "block": "102", "action": "EVICT", "from_tier": "HBM",
         "reason": LRU, "cost_us": 250.0, "need_step": 3, "need_request_id": 0,
         "need_decode_critical": True},
        {"seq": 14, "step": 3, "block": "201", "action": "EVICT", "from_tier": "HBM",
         "reason": LRU, "cost_us": 120.0, "need_step": 6, "need_request_id": 4,
         "need_decode_critical": False},
        {"seq": 8, "step": 2, "block": "101", "action": "DEMOTE", "from_tier": "HBM",
         "reason": LRU, "cost_us": 40.0, "need_step": 3, "need_request_id": 0,
         "need_decode_critical": True}]
    assert (s["unattributed_needs"], s["unattributed_cost_us"]) == (0, 0.0)
    assert s["regret"] == {
        "evictions": 5, "needed_again": 3, "never_needed_again": 2,
        "needed_again_fraction": 0.6, "distance_steps_p50": 1, "distance_steps_p90": 3,
        "distance_steps_max": 3, "within_steps": {"1": 2, "10": 3, "100": 3, "1000": 3},
        "cost_us": 410.0, "decode_critical_cost_us": 290.0}


def test_deadline_summary_regret(deadline_path):
    s = summary(DecisionLog(deadline_path))
    assert (s.rows, s.decisions, s.total_cost_us, s.critical_cost_us) == (26, 4, 120.0, 0.0)
    assert s.regret == {
        "evictions": 3, "needed_again": 1, "never_needed_again": 2,
        "needed_again_fraction": 1 / 3, "distance_steps_p50": 4, "distance_steps_p90": 4,
        "distance_steps_max": 4, "within_steps": {"1": 0, "10": 1, "100": 1, "1000": 1},
        "cost_us": 120.0, "decode_critical_cost_us": 0.0}
    assert s.top_evicted_blocks == [
        {"block": "201", "evictions": 1, "regretted": 1, "cost_us": 120.0},
        {"block": "102", "evictions": 1, "regretted": 0, "cost_us": 0.0},
        {"block": "202", "evictions": 1, "regretted": 0, "cost_us": 0.0}]
    assert s.top_evicted_requests == [{"request_id": 1, "evictions": 2},
                                      {"request_id": 0, "evictions": 1}]
    assert s.stall_by_cause == [
        {"action": "EVICT", "from_tier": "HBM", "reason": DL, "evictions": 2, "regretted": 1,
         "cost_us": 120.0},
        {"action": "DEMOTE", "from_tier": "HBM", "reason": DL, "evictions": 1, "regretted": 0,
         "cost_us": 0.0}]


def test_top_bounds_every_list(lru_path):
    s = summary(DecisionLog(lru_path), top=1)
    assert [b["block"] for b in s.top_evicted_blocks] == ["102"]
    assert [c["seq"] for c in s.top_causes] == [10]
    assert [r["request_id"] for r in s.top_paying_requests] == [0]


def test_sparse_request_ids_give_the_same_summary(lru_path, monkeypatch):
    """Request ids beyond the dense-array limit switch to pandas partials mid-stream."""
    import kvsim.results.log_summary as log_summary

    dense = summary(DecisionLog(lru_path))
    monkeypatch.setattr(log_summary, "DENSE_REQUEST_IDS", 3)
    sparse = summary(DecisionLog(lru_path))
    assert dataclasses.asdict(sparse) == dataclasses.asdict(dense)


def test_the_benchmarks_synthetic_log_is_of_the_current_schema(tmp_path):
    """bench/make_big_log.py (docs/benchmarks.md, "Decision logs") writes a log the reader
    takes: every candidate field of the schema, including those added after version 1's
    first files (it failed with KeyError 'phase' once they were added)."""
    import importlib.util
    from pathlib import Path

    from kvsim.results.log_schema import CANDIDATE_TYPE

    path = Path(__file__).resolve().parents[2] / "bench" / "make_big_log.py"
    spec = importlib.util.spec_from_file_location("make_big_log", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "big.log.parquet"
    mod.main([str(out), "--rows", "3000", "--seed", "0"])
    log = DecisionLog(out)
    s = summary(log)
    assert s.rows == 3000 and 0 < s.decisions < 3000
    cands = log.table().column("candidates").combine_chunks().flatten()
    assert [f.name for f in cands.type] == [f.name for f in CANDIDATE_TYPE]
    assert cands.field("pinned").to_pylist() == [p == 3 for p in
                                                 cands.field("priority").to_pylist()]
