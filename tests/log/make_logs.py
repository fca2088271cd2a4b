"""Write the small hand-made decision logs under tests/log/data/ (run: python tests/log/make_logs.py).

The scenario, "deadline pressure" on a 4-block HBM with a DRAM tier below, replayed by two
policies on the same trace (every value below is chosen by hand; the tests assert exact
results derived from this story):

- step 0: request 0 allocates blocks 101, 102; request 1 allocates 201, 202.
- step 1: both finish their turn; the blocks stay cached while free (RELEASE, tail first).
- step 2: request 2 needs two new blocks (301, 302): two evictions.
  lru spills 101 to DRAM (DEMOTE) and drops 102 (EVICT): the least recently used.
  deadline spills 202 and drops 201: request 0 returns at step 3 with a deadline
  (deadline_us 3000), request 1 never returns.  Seq 8 is the first divergence.
- step 3: request 0 returns decode-critical.  lru: EVICT 202 and 201 for room, PROMOTE 101
  from DRAM (40 us stall), RECOMPUTE 102 (250 us) + ALLOCATE it.  deadline: REVIVE both.
- step 4: request 2 finishes.  step 5: request 0 finishes; request 3 revives 301, 302.
- step 6: request 4 needs 201 (evicted by both): one EVICT of 102 for room, RECOMPUTE 201
  (120 us) + ALLOCATE it, plus a partial block without content hash (4:1).
- step 7: request 4 finishes: RELEASE 201, FREE its partial block.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.results.log_schema import LOG_METADATA_KEY, LOG_SCHEMA_VERSION, Action, log_schema

DATA = Path(__file__).resolve().parent / "data"
NEVER = 2**63 - 1
BLOCK_BYTES = 32_768
TRACE = "tests/log/data/deadline_pressure.events.parquet"
CONFIG = {"hbm_blocks": 4, "tiers": ["HBM", "DRAM"], "block_size_tokens": 16}

LRU_REASONS = ("least recently used: idle for the longest time",)
DEADLINE_REASONS = ("no deadline soon: needed furthest in the future",)
PROMOTE_REASON = "on demand: needed by this step"
RECOMPUTE_REASON = "on demand: resident nowhere"
A = Action


def cand(h, req, idx, score, last_access_us, deadline_us=-1, priority=1, slack_us=0,
         recompute_cost_us=250.0, access_count=1, phase=0, pinned=False):
    return {"content_hash": h, "request_id": req, "block_index": idx, "score": score,
            "last_access_us": last_access_us, "access_count": access_count,
            "priority": priority, "request_priority": 50, "deadline_us": deadline_us,
            "slack_us": slack_us, "recompute_cost_us": recompute_cost_us, "next_use": NEVER,
            "phase": phase, "pinned": pinned}


def ev(step, action, h, req, idx, frm=-1, to=-1, nbytes=0, cost=0.0, critical=False,
       code=-1, reason="", candidates=None):
    return {"step": step, "time_us": 1000.0 * step, "action": int(action), "content_hash": h,
            "request_id": req, "block_index": idx, "from_tier": frm, "to_tier": to,
            "bytes": nbytes, "cost_us": cost, "decode_critical": critical,
            "reason_code": code, "reason": reason, "candidates": candidates}


def _common_head():
    return [
        ev(0, A.ALLOCATE, 101, 0, 0, to=0), ev(0, A.ALLOCATE, 102, 0, 1, to=0),
        ev(0, A.ALLOCATE, 201, 1, 0, to=0), ev(0, A.ALLOCATE, 202, 1, 1, to=0),
        ev(1, A.RELEASE, 102, 0, 1), ev(1, A.RELEASE, 101, 0, 0),
        ev(1, A.RELEASE, 202, 1, 1), ev(1, A.RELEASE, 201, 1, 0),
    ]


def _common_tail(evict_reason: str, scores: tuple[float, float]):
    return [
        ev(6, A.EVICT, 102, 4, 1, frm=0, code=0, reason=evict_reason,
           candidates=[cand(102, 0, 1, scores[0], 5000.0), cand(101, 0, 0, scores[1], 5000.0)]),
        ev(6, A.RECOMPUTE, 201, 4, 0, to=0, cost=120.0, reason=RECOMPUTE_REASON),
        ev(6, A.ALLOCATE, 201, 4, 0, to=0),
        ev(6, A.ALLOCATE, 0, 4, 1, to=0),
        ev(7, A.RELEASE, 201, 4, 0), ev(7, A.FREE, 0, 4, 1),
    ]


def lru_rows() -> list[dict]:
    r = LRU_REASONS[0]
    return _common_head() + [
        ev(2, A.DEMOTE, 101, 2, 0, frm=0, to=1, nbytes=BLOCK_BYTES, code=0, reason=r,
           candidates=[cand(101, 0, 0, 500.0, 500.0, deadline_us=3000, priority=2),
                       cand(102, 0, 1, 600.0, 600.0, deadline_us=3000, priority=2),
                       cand(202, 1, 1, 800.0, 800.0), cand(201, 1, 0, 900.0, 900.0)]),
        ev(2, A.ALLOCATE, 301, 2, 0, to=0),
        ev(2, A.EVICT, 102, 2, 1, frm=0, code=0, reason=r,
           candidates=[cand(102, 0, 1, 600.0, 600.0, deadline_us=3000, priority=2),
                       cand(202, 1, 1, 800.0, 800.0), cand(201, 1, 0, 900.0, 900.0)]),
        ev(2, A.ALLOCATE, 302, 2, 1, to=0),
        ev(3, A.EVICT, 202, 0, 0, frm=0, code=0, reason=r,
           candidates=[cand(202, 1, 1, 800.0, 800.0), cand(201, 1, 0, 900.0, 900.0)]),
        ev(3, A.PROMOTE, 101, 0, 0, frm=1, to=0, nbytes=BLOCK_BYTES, cost=40.0, critical=True,
           reason=PROMOTE_REASON),
        ev(3, A.EVICT, 201, 0, 1, frm=0, code=0, reason=r,
           candidates=[cand(201, 1, 0, 900.0, 900.0)]),
        ev(3, A.RECOMPUTE, 102, 0, 1, to=0, cost=250.0, critical=True, reason=RECOMPUTE_REASON),
        ev(3, A.ALLOCATE, 102, 0, 1, to=0, critical=True),
        ev(4, A.RELEASE, 302, 2, 1), ev(4, A.RELEASE, 301, 2, 0),
        ev(5, A.RELEASE, 102, 0, 1), ev(5, A.RELEASE, 101, 0, 0),
        ev(5, A.REVIVE, 301, 3, 0), ev(5, A.REVIVE, 302, 3, 1),
    ] + _common_tail(r, (5000.0, 5000.0))


def deadline_rows() -> list[dict]:
    r = DEADLINE_REASONS[0]
    return _common_head() + [
        ev(2, A.DEMOTE, 202, 2, 0, frm=0, to=1, nbytes=BLOCK_BYTES, code=0, reason=r,
           candidates=[cand(202, 1, 1, 0.8, 800.0), cand(201, 1, 0, 0.9, 900.0),
                       cand(101, 0, 0, 1000.5, 500.0, deadline_us=3000, priority=2),
                       cand(102, 0, 1, 1000.6, 600.0, deadline_us=3000, priority=2)]),
        ev(2, A.ALLOCATE, 301, 2, 0, to=0),
        ev(2, A.EVICT, 201, 2, 1, frm=0, code=0, reason=r,
           candidates=[cand(201, 1, 0, 0.9, 900.0),
                       cand(101, 0, 0, 1000.5, 500.0, deadline_us=3000, priority=2),
                       cand(102, 0, 1, 1000.6, 600.0, deadline_us=3000, priority=2)]),
        ev(2, A.ALLOCATE, 302, 2, 1, to=0),
        ev(3, A.REVIVE, 101, 0, 0, critical=True), ev(3, A.REVIVE, 102, 0, 1, critical=True),
        ev(4, A.RELEASE, 302, 2, 1), ev(4, A.RELEASE, 301, 2, 0),
        ev(5, A.RELEASE, 102, 0, 1), ev(5, A.RELEASE, 101, 0, 0),
        ev(5, A.REVIVE, 301, 3, 0), ev(5, A.REVIVE, 302, 3, 1),
    ] + _common_tail(r, (5.0, 5.0))


def table(rows: list[dict], policy: str, version: int = LOG_SCHEMA_VERSION,
          trace: str = TRACE) -> pa.Table:
    """Rows -> a log table with the exact schema and the kvsim metadata."""
    schema = log_schema()
    cols = {}
    for f in schema:
        values = [row[f.name] for row in rows] if f.name != "seq" else list(range(len(rows)))
        if f.name == "reason":
            cols[f.name] = pa.array(values, pa.string()).dictionary_encode().cast(f.type)
        else:
            cols[f.name] = pa.array(values, f.type)
    meta = {"log_schema_version": version, "policy": policy, "trace": trace, "config": CONFIG}
    schema = schema.with_metadata({LOG_METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    return pa.table(cols, schema=schema)


def write(tab: pa.Table, path: Path, row_group_rows: int = 8) -> Path:
    """Small row groups on purpose, so the tests exercise multi-group scans and pushdown."""
    pq.write_table(tab, path, row_group_size=row_group_rows)
    return path


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    write(table(lru_rows(), "lru"), DATA / "lru.log.parquet")
    write(table(deadline_rows(), "deadline"), DATA / "deadline.log.parquet")


if __name__ == "__main__":
    main()
