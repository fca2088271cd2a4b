"""The eviction ledger against a plain-Python reference on random logs.

The reference walks the same semantics (log_ledger docstring) with dicts and lists: needs
grouped per (block, step) at their first row, every pending eviction of a block matched by
its next need, the need's cost attributed to the newest pending eviction.  The compiled
pending table, step-aligned batching (tiny batches here) and carry-over must agree exactly.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from kvsim.results.log_ledger import build_ledger
from kvsim.results.log_pending import MAX_LOAD, PendingEvictions
from kvsim.results.log_reader import EVICTING, NEEDING, DecisionLog
from kvsim.results.log_schema import Action


def _random_rows(rng: np.random.Generator, n: int) -> list[dict]:
    actions = [a for a in Action]
    rows = []
    step = 0
    for _ in range(n):
        step += int(rng.random() < 0.3)
        a = actions[int(rng.integers(len(actions)))]
        hashed = rng.random() < 0.8
        h = int(rng.integers(1, 40)) * 7919 if hashed else 0
        rows.append({
            "step": step, "time_us": 10.0 * step, "action": int(a), "content_hash": h,
            "request_id": int(rng.integers(0, 5)), "block_index": int(rng.integers(0, 3)),
            "from_tier": int(rng.integers(-1, 3)), "to_tier": int(rng.integers(-1, 3)),
            "bytes": 0, "cost_us": float(rng.integers(0, 4)) * 10.0,
            "decode_critical": bool(rng.random() < 0.3), "reason_code": 0,
            "reason": f"r{int(rng.integers(0, 3))}", "candidates": None})
    return rows


def _key(r):
    return (r["content_hash"], -1, -1) if r["content_hash"] else \
        (0, r["request_id"], r["block_index"])


def _reference(rows: list[dict]) -> dict:
    need_groups: dict[tuple, dict] = {}
    events = []
    for seq, r in enumerate(rows):
        a, key = r["action"], _key(r)
        if a in EVICTING:
            events.append((seq, "ev", key, r))
        elif a in NEEDING or (a == int(Action.ALLOCATE) and r["content_hash"] != 0):
            g = need_groups.get((key, r["step"]))
            if g is None:
                g = need_groups[(key, r["step"])] = {"seq": seq, "step": r["step"], "cost": 0.0,
                                                     "crit": False}
                events.append((seq, "need", key, g))
            g["cost"] += r["cost_us"]
            g["crit"] = g["crit"] or r["decode_critical"]
    pending = defaultdict(list)
    out = {"evictions": 0, "regretted": 0, "cost": 0.0, "crit_cost": 0.0, "orphans": 0,
           "orphan_cost": 0.0, "dist": defaultdict(int),
           "blocks": defaultdict(lambda: [0, 0, 0.0]), "causes": defaultdict(lambda: [0, 0, 0.0])}
    for seq, kind, key, data in sorted(events, key=lambda e: e[0]):
        if kind == "ev":
            out["evictions"] += 1
            pending[key].append((seq, data))
            out["blocks"][key][0] += 1
            out["causes"][(data["action"], data["from_tier"], data["reason"])][0] += 1
            continue
        evs = pending.pop(key, [])
        if not evs:
            out["orphans"] += int(data["cost"] > 0)
            out["orphan_cost"] += data["cost"]
            continue
        for i, (_, ev) in enumerate(evs):
            paid = data["cost"] if i == len(evs) - 1 else 0.0
            out["regretted"] += 1
            out["dist"][data["step"] - ev["step"]] += 1
            out["cost"] += paid
            out["crit_cost"] += paid if data["crit"] else 0.0
            out["blocks"][key][1] += 1
            out["blocks"][key][2] += paid
            cause = out["causes"][(ev["action"], ev["from_tier"], ev["reason"])]
            cause[1] += 1
            cause[2] += paid
    out["never"] = sum(len(v) for v in pending.values())
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_ledger_matches_reference(tmp_path, make_logs, seed):
    rows = _random_rows(np.random.default_rng(seed), 1200)
    path = make_logs.write(make_logs.table(rows, "random"), tmp_path / "r.parquet",
                           row_group_rows=64)
    ledger = build_ledger(DecisionLog(path), batch_rows=300)
    ref = _reference(rows)
    assert ledger.evictions == ref["evictions"]
    assert ledger.regretted == ref["regretted"]
    assert ledger.never_needed() == ref["never"]
    assert ledger.regret_cost_us == pytest.approx(ref["cost"], abs=1e-9)
    assert ledger.regret_critical_cost_us == pytest.approx(ref["crit_cost"], abs=1e-9)
    assert ledger.unattributed_needs == ref["orphans"]
    assert ledger.unattributed_cost_us == pytest.approx(ref["orphan_cost"], abs=1e-9)
    hist = {d: int(c) for d, c in enumerate(ledger.distance_steps) if c}
    assert hist == dict(ref["dist"])
    blocks = {k: [int(v.evictions), int(v.regretted), float(v.cost_us)]
              for k, v in ledger.per_block().iterrows()}
    assert blocks == {k: v for k, v in ref["blocks"].items()}
    reasons = ledger.reasons
    causes = {(a, f, reasons[r]): v for (a, f, r), v in ledger.by_cause.items()}
    assert causes == dict(ref["causes"])


def test_pending_table_grows_and_rehashes():
    """20k distinct keys force slot rebuilds and record growth; then every key matches."""
    table = PendingEvictions(capacity_keys=16)
    n = 20_000
    keys = np.arange(1, n + 1, dtype=np.int64) * 1_000_003
    minus = np.full(n, -1, np.int64)
    zeros = np.zeros(n, np.int64)
    evict = np.zeros(n, np.bool_)
    seq = np.arange(n, dtype=np.int64)
    out, orphan = table.match(evict, keys, minus, minus, seq, seq, zeros, zeros, zeros, zeros)
    assert len(out) == 0 and not orphan.any()
    assert table.pending == n and table.live_keys == n and table.state.size * MAX_LOAD >= n
    # a second eviction of the first 10 keys chains behind the first one
    out, _ = table.match(evict[:10], keys[:10], minus[:10], minus[:10], seq[:10] + n,
                         seq[:10] + n, zeros[:10], zeros[:10], zeros[:10], zeros[:10])
    assert table.pending == n + 10
    needs = np.ones(n + 1, np.bool_)
    probe = np.concatenate([keys[::-1], [7]])  # key 7 was never evicted: an orphan
    m1 = np.full(n + 1, -1, np.int64)
    z1 = np.zeros(n + 1, np.int64)
    s1 = np.arange(n + 1, dtype=np.int64) + 2 * n
    out, orphan = table.match(needs, probe, m1, m1, s1, s1, z1, z1, z1, z1)
    assert len(out) == n + 10 and orphan.tolist() == [False] * n + [True]
    assert table.pending == 0 and table.live_keys == 0
    causes = out[out[:, 7] == 1]
    assert len(causes) == n  # one cause (the newest eviction) per need
    # the first 10 keys: the newest eviction (seq >= n) is the cause, the older one is not
    first = out[np.isin(out[:, 6], np.arange(n - 10, n))]
    assert sorted(first[first[:, 7] == 1][:, 0].tolist()) == list(range(n, n + 10))
    assert sorted(first[first[:, 7] == 0][:, 0].tolist()) == list(range(10))
