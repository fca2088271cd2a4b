"""explain and diff on the hand-made deadline-pressure logs: exact values.

lru's eviction at step 2 (DEMOTE of block 101) is regretted one step later: request 0's
decode-critical step 3 stalls 40 us on the PROMOTE and misses the block's 3000 us deadline.
deadline spills 202 instead (never needed again); seq 8 is where the two logs diverge.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.results.log_diff import diff
from kvsim.results.log_explain import explain
from kvsim.results.log_reader import DecisionLog, parse_block

LRU = "least recently used: idle for the longest time"


def _cand(rank, block, req, idx, score, last, deadline, prio, nxt):
    step, action, by = nxt
    return {"rank": rank, "block": block, "request_id": req, "block_index": idx,
            "score": score, "terms": {"score": score}, "last_access_us": last,
            "access_count": 1, "priority": prio, "request_priority": 50,
            "deadline_us": deadline, "slack_us": 0, "recompute_cost_us": 250.0,
            "next_use": None, "phase": 0, "pinned": False, "next_use_step": step,
            "next_use_action": action, "next_use_request_id": by}


def test_explain_lru_eviction_names_the_stall(lru_path):
    e = dataclasses.asdict(explain(DecisionLog(lru_path), 2))
    assert e == {
        "path": str(lru_path), "policy": "lru", "seq": 8, "step": 2, "time_us": 2000.0,
        "action": "DEMOTE", "block": "101", "request_id": 2, "from_tier": "HBM",
        "to_tier": "DRAM", "cost_us": 0.0, "decode_critical": False, "reason": LRU,
        "terms_source": "logged score",
        "candidates": [
            _cand(0, "101", 0, 0, 500.0, 500.0, 3000, 2, (3, "PROMOTE", 0)),
            _cand(1, "102", 0, 1, 600.0, 600.0, 3000, 2, (3, "RECOMPUTE", 0)),
            _cand(2, "202", 1, 1, 800.0, 800.0, -1, 1, (None, None, None)),
            _cand(3, "201", 1, 0, 900.0, 900.0, -1, 1, (6, "RECOMPUTE", 4))],
        "next_need": {"seq": 13, "step": 3, "time_us": 3000.0, "action": "PROMOTE",
                      "request_id": 0, "cost_us": 40.0, "decode_critical": True,
                      "steps_later": 1, "deadline_us": 3000, "deadline_missed": True},
        "other_decisions": [{"seq": 10, "action": "EVICT", "block": "102"}]}


def test_explain_block_and_need_sums_the_step(lru_path):
    e = explain(DecisionLog(lru_path), 2, parse_block("102"))
    assert (e.seq, e.action, e.block) == (10, "EVICT", "102")
    # RECOMPUTE (250 us) + ALLOCATE (0 us) of block 102 in step 3: one need
    assert e.next_need == {"seq": 15, "step": 3, "time_us": 3000.0, "action": "RECOMPUTE",
                           "request_id": 0, "cost_us": 250.0, "decode_critical": True,
                           "steps_later": 1, "deadline_us": 3000, "deadline_missed": True}
    e = explain(DecisionLog(lru_path), 3)
    assert (e.block, e.next_need) == ("202", None)
    assert [d["block"] for d in e.other_decisions] == ["101", "201", "102"]


def _deadline_terms(row: dict, now_us: float) -> dict[str, float]:
    urgency = 1e6 / (row["deadline_us"] - now_us) if row["deadline_us"] >= 0 else 0.0
    recency = row["last_access_us"] / 1e3
    return {"urgency": urgency, "recency": recency, "score": urgency + recency}


def test_explain_uses_policy_terms(deadline_path, monkeypatch):
    import kvsim.results.log_explain as log_explain

    monkeypatch.setattr(log_explain, "policy_explainer",
                        lambda name: _deadline_terms if name == "deadline" else None)
    e = explain(DecisionLog(deadline_path), 2)
    assert e.terms_source == "policy explain()"
    assert [(c["block"], c["terms"]) for c in e.candidates] == [
        ("202", {"urgency": 0.0, "recency": 0.8, "score": 0.8}),
        ("201", {"urgency": 0.0, "recency": 0.9, "score": 0.9}),
        ("101", {"urgency": 1000.0, "recency": 0.5, "score": 1000.5}),
        ("102", {"urgency": 1000.0, "recency": 0.6, "score": 1000.6})]
    assert [c["next_use_step"] for c in e.candidates] == [None, 6, 3, 3]
    assert e.next_need is None  # 202 was never needed again
    e = explain(DecisionLog(deadline_path), 2, explainer=None)
    assert e.terms_source == "logged score"
    assert e.candidates[2]["terms"] == {"score": 1000.5}


def test_explain_errors(lru_path):
    log = DecisionLog(lru_path)
    with pytest.raises(KvsimInputError, match="expected a decision at step 1, found none; "
                                              "nearest steps with one: 2, 3"):
        explain(log, 1)
    with pytest.raises(KvsimInputError, match="about block 999 at step 2"):
        explain(log, 2, parse_block("999"))


def test_diff_lru_deadline(lru_path, deadline_path):
    d = dataclasses.asdict(diff(DecisionLog(lru_path), DecisionLog(deadline_path)))
    first = d.pop("first_divergence")
    assert (first["seq"], first["step"]) == (8, 2)
    a, b = first["a"], first["b"]
    assert (a["action"], a["block"], a["from_tier"], a["to_tier"], a["is_decision"]) == \
        ("DEMOTE", "101", "HBM", "DRAM", True)
    assert a["next_need"] == {"seq": 13, "step": 3, "time_us": 3000.0, "action": "PROMOTE",
                              "request_id": 0, "cost_us": 40.0, "decode_critical": True,
                              "steps_later": 1}
    assert (b["action"], b["block"], b["next_need"]) == ("DEMOTE", "202", None)
    assert d == {
        "path_a": str(lru_path), "path_b": str(deadline_path), "policy_a": "lru",
        "policy_b": "deadline", "trace": "tests/log/data/deadline_pressure.events.parquet",
        "rows_a": 29, "rows_b": 26, "evicted_only_a": 1, "evicted_only_b": 0,
        "cost_only_a_us": 40.0, "cost_only_b_us": 0.0, "regret_cost_a_us": 410.0,
        "regret_cost_b_us": 120.0,
        "top_only_a": [{"block": "101", "evictions": 1, "regretted": 1, "cost_us": 40.0}],
        "top_only_b": [],
        "differing_blocks": [
            {"block": "102", "evictions_a": 2, "cost_a_us": 250.0, "evictions_b": 1,
             "cost_b_us": 0.0},
            {"block": "101", "evictions_a": 1, "cost_a_us": 40.0, "evictions_b": 0,
             "cost_b_us": 0.0}]}


def test_diff_identical_and_other_trace(lru_path, tmp_path, make_logs):
    log = DecisionLog(lru_path)
    same = diff(log, log)
    assert same.first_divergence is None and same.differing_blocks == []
    other = make_logs.write(make_logs.table(make_logs.deadline_rows(), "deadline",
                                            trace="other.parquet"), tmp_path / "o.parquet")
    with pytest.raises(KvsimInputError, match="expected two logs of the same trace"):
        diff(log, DecisionLog(other))
    # a log that is a strict prefix of the other diverges where it ends
    short = make_logs.write(make_logs.table(make_logs.lru_rows()[:20], "lru"),
                            tmp_path / "short.parquet")
    cut = diff(log, DecisionLog(short))
    assert (cut.first_divergence["seq"], cut.first_divergence["b"]) == (20, None)
