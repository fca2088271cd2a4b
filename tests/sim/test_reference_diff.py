"""The whole tiered replay against an independent reference (tests/reference/).

``kvsim.sim.simulate`` (interpreted engine: the same source as the compiled one) and the
plain-Python reference written from the docs replay the same small traces under the same
configurations; their summaries (every key of ``SimResult.summary``) and decision logs
(row by row, every column, candidates included) must be identical.  Hypothesis draws the
traces (shared prefixes, identical prompts, decode appends, intents, frees) and the
configurations (HBM small enough to evict and preempt, lower tiers on or off, write
policies, preemption modes, priority scheduling, prefetch), for every built-in policy;
derandomized, so CI runs the same examples every time.  Hand-made cases below pin exact
values worked out by hand.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.policy_registry import list_policies
from kvsim.schema import Phase, Priority
from kvsim.sim import SimConfig, simulate
from kvsim.sim.metrics import SUMMARY_KEYS
from tests.reference import reference_replay

from tests.sim.conftest import TraceBuilder

POLICIES = sorted(p.name for p in list_policies())
ONLINE = [p.name for p in list_policies() if not p.offline]
BLOCK_BYTES = 100  # TraceBuilder: 4 tokens x 25 bytes


def gb(blocks: int) -> float:
    return blocks * BLOCK_BYTES / 1e9


def replay_log(path: Path) -> list[dict]:
    rows = pq.read_table(path).to_pylist()
    return [dict(r) for r in rows]


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def check(trace: Path, policy: str, config: SimConfig, tmp: Path) -> None:
    log = tmp / f"{policy}.parquet"
    res = simulate(trace, policy, config, decision_log=log)
    want, want_rows = reference_replay(trace, policy, config)
    diff = {k: (res.summary[k], want[k]) for k in SUMMARY_KEYS
            if not same(res.summary[k], want[k])}
    got_rows = replay_log(log)
    for i, (g, w) in enumerate(zip(got_rows, want_rows)):
        if g != w:
            keys = [k for k in w if g.get(k) != w[k]]
            raise AssertionError(f"{policy}: decision-log row {i} differs in {keys}:\n"
                                 f"  replay    {g}\n  reference {w}\n  summary diff {diff}")
    assert len(got_rows) == len(want_rows), \
        f"{policy}: {len(got_rows)} log rows, reference {len(want_rows)}; summary diff {diff}"
    assert not diff, f"{policy}: summary differs (replay, reference): {diff}"


# ---------------------------------------------------------------------------------------
# random traces
# ---------------------------------------------------------------------------------------

request_st = st.fixed_dictionaries({
    "family": st.integers(0, 2),  # requests of one family share a prefix chain
    "shared": st.integers(0, 4),  # blocks of the family chain
    "own": st.integers(0, 2),  # private full blocks
    "tail": st.integers(0, 3),  # tokens of a partial last block
    "tail_hash": st.booleans(),  # the partial block carries a hash (must be ignored)
    "decode": st.integers(0, 6),  # decode steps
    "gap": st.integers(0, 2),  # steps after the previous arrival
    "deadline": st.booleans(),
    "rprio": st.sampled_from([0, 50, 100]),
    "prio": st.sampled_from([Priority.WARM, Priority.HOT, Priority.COLD,
                             Priority.DECODE_CRITICAL]),
    "prefetch_ok": st.booleans(),
    "intent": st.booleans(),  # a request-level INTENT at its first decode step
    "chunks": st.integers(1, 2),  # chunked prefill: ACCESS rows over 1 or 2 steps
    "fork": st.sampled_from([False, False, True]),  # a child forks at the first decode
})

config_st = st.fixed_dictionaries({
    "hbm_blocks": st.integers(2, 14),
    "dram": st.sampled_from([0, 0, 2, 4, 8]),
    "cxl": st.sampled_from([0, 0, 2, 3]),
    "nvme": st.sampled_from([0, 3, 6]),
    "tier_policy": st.sampled_from(["lru", "fifo", "lfu", "s3fifo", "arc", "sieve"]),
    "write_policy": st.sampled_from(["write_back", "write_through",
                                     "write_through_selective"]),
    "preemption": st.sampled_from(["recompute", "swap"]),
    "priority_scheduling": st.booleans(),
    "prefetch": st.booleans(),
    "log_lifecycle": st.booleans(),
})


def build_trace(reqs: list[dict], max_running: int) -> TraceBuilder:
    """A small continuous-batching engine that follows the lowering rules of
    docs/trace-format.md: ARRIVE, then at admission every prompt block ALLOCATEd in block
    order and the first prefill chunk's ACCESS; one decode token per step (a new block
    ALLOCATEd in the step whose token starts it); a forked child (parallel sampling) shares
    its parent's table, and each one's first write into the shared partial block is an
    ALLOCATE at that index (copy-on-write); request-level FREE when done."""
    tb = TraceBuilder()
    arrive, s = [], 0
    for q in reqs:
        s += q["gap"]
        arrive.append(s)
    waiting, running, t, step, nxt = [], [], 0, 0, 0
    tokens, left, chunk, cow = {}, {}, {}, set()
    spec = {r: q for r, q in enumerate(reqs)}
    child = len(reqs)
    while nxt < len(reqs) or waiting or running:
        tb.STEP(t, 300.0 + 40.0 * len(running))
        while nxt < len(reqs) and arrive[nxt] <= step:
            q = reqs[nxt]
            prompt = 4 * (q["shared"] + q["own"]) + q["tail"] or 1
            tb.ARRIVE(nxt, prompt, t + 2500 if q["deadline"] else -1,
                      request_priority=q["rprio"], priority=int(q["prio"]))
            waiting.append(nxt)
            nxt += 1
        for r in list(running):
            q = spec[r]
            if chunk.get(r):  # the rest of a chunked prefill
                tb.ACCESS(r, chunk.pop(r))
                continue
            if q["fork"] and left[r] == q["decode"] and r < len(reqs):
                c = child
                child += 1
                spec[c] = dict(q, fork=False, intent=False)
                tb.ARRIVE(c, 0, -1, request_priority=q["rprio"])
                tb.add(kind=6, request_id=c, parent_request_id=r)
                tokens[c], left[c] = tokens[r], q["decode"]
                running.append(c)
                if tokens[r] % 4:
                    cow.update((r, c))
            if q["intent"] and left[r] == q["decode"]:
                tb.add(kind=4, request_id=r, phase=int(Phase.DECODE),
                       priority=int(Priority.DECODE_CRITICAL), deadline_us=t + 900,
                       request_priority=q["rprio"], pin_requested=True)
            if r in cow:  # first write into the shared partial block
                cow.discard(r)
                tb.ALLOC(r, tokens[r] // 4, 0, tokens[r] % 4 + 1, 80.0,
                         phase=int(Phase.DECODE))
            if tokens[r] % 4 == 0:
                tb.ALLOC(r, tokens[r] // 4, 0, 1, 90.0, phase=int(Phase.DECODE))
            tokens[r] += 1
            left[r] -= 1
            tb.ACCESS(r, 1, Phase.DECODE, deadline_us=t + 1200 if q["deadline"] else -1)
        while waiting and len(running) < max_running:
            r = waiting.pop(0)
            q = reqs[r]
            f = q["family"]
            hashes = [f * 100 + j + 1 for j in range(q["shared"])] + \
                [10_000 + 10 * r + j for j in range(q["own"])]
            ntok = [4] * len(hashes)
            if q["tail"] or not hashes:
                hashes.append(20_000 + r if q["tail_hash"] else 0)
                ntok.append(q["tail"] or 1)
            for i, (h, n) in enumerate(zip(hashes, ntok)):
                tb.ALLOC(r, i, h, n, 25.0 * n + i, priority=int(q["prio"]),
                         request_priority=q["rprio"], prefetch_ok=q["prefetch_ok"])
            tokens[r] = sum(ntok)
            left[r] = q["decode"]
            first = sum(ntok) if q["chunks"] == 1 else (sum(ntok) + 1) // 2
            tb.ACCESS(r, first)
            if sum(ntok) > first:
                chunk[r] = sum(ntok) - first
            running.append(r)
        for r in [r for r in running if left[r] == 0 and not chunk.get(r)]:
            tb.FREE(r)
            running.remove(r)
        t += 1000
        step += 1
    return tb


def config_from(c: dict, hw: str) -> SimConfig:
    return SimConfig(hardware=hw, hbm_blocks=c["hbm_blocks"], dram_gb=gb(c["dram"]),
                     cxl_gb=gb(c["cxl"]), nvme_gb=gb(c["nvme"]),
                     tier_policies=tuple((t, c["tier_policy"]) for t in ("dram", "cxl", "nvme")),
                     write_policy=c["write_policy"], preemption=c["preemption"],
                     priority_scheduling=c["priority_scheduling"], prefetch=c["prefetch"],
                     log_lifecycle=c["log_lifecycle"], engine="interpreted")


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=int(os.environ.get("KVSIM_REFERENCE_EXAMPLES", "12")), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(request_st, min_size=1, max_size=6), max_running=st.integers(1, 4),
       cfg=config_st)
def test_replay_matches_reference(policy, reqs, max_running, cfg, tiny_hw):
    with tempfile.TemporaryDirectory() as d:
        trace = build_trace(reqs, max_running).write(Path(d) / "t.jsonl")
        check(trace, policy, config_from(cfg, tiny_hw), Path(d))
