"""The COMPILED replay (numba: the one open-loop core, ``kvsim.replay.kernel.core.run``, every policy's
hooks passed to it as first-class functions) against the independent plain-Python
reference (tests/reference/), in the default test run (issue 17).

tests/sim/test_reference_diff.py checks the interpreted engine against the reference on
hypothesis draws; this file runs the same ``check`` (summaries: every key of
``SimResult.summary``; decision logs row by row, every column) on the compiled engine, for
every built-in policy, on a handful of FIXED traces written with that file's
``build_trace`` (the lowering rules of docs/trace-format.md).  Each case below names what
it exercises; together they cover HBM eviction with every lower tier (DRAM, CXL, NVMe)
under every lower-tier policy family, recompute and swap preemption, priority
scheduling, copy-on-write forks, decode blocks cached once full, block-level FREE of a
rejected draft, write-back / write-through / selective write-through, prefetch hidden by
queueing time on slow links, INTENT rows, chunked prefill, warm-up and lifecycle rows.

Cost: the open-loop core compiles once (~40-45 CPU-s from an empty numba cache, then
loaded from the cache; tests/sim/test_compiled.py compiles the same core) plus each
policy's hooks (~0.5 CPU-s each); the replays themselves are tiny.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvsim.core.schema import Priority
from tests.sim.test_reference_diff import (
    POLICIES,
    build_trace,
    check,
    config_from,
    hw_pair,  # noqa: F401  (hw_pair: a fixture)
)

WARM, HOT, COLD, CRIT = (int(Priority.WARM), int(Priority.HOT), int(Priority.COLD),
                         int(Priority.DECODE_CRITICAL))


def req(**kw) -> dict:
    """One request of test_reference_diff's ``request_st`` with these fields set."""
    base = {"family": 0, "shared": 2, "own": 1, "tail": 2, "tail_hash": False,
            "decode_hash": True, "decode": 4, "gap": 0, "deadline": False, "rprio": 50,
            "prio": WARM, "prefetch_ok": True, "intent": False, "chunks": 1, "fork": False,
            "rollback": False}
    assert set(kw) <= set(base), set(kw) - set(base)
    return {**base, **kw}


def cfg(**kw) -> dict:
    """One configuration of test_reference_diff's ``config_st`` with these fields set."""
    base = {"hbm_blocks": 8, "dram": 4, "cxl": 0, "nvme": 0, "tier_policy": "lru",
            "write_policy": "write_back", "preemption": "recompute",
            "priority_scheduling": False, "prefetch": True, "log_lifecycle": False,
            "slow_links": False, "warmup": 0, "log_candidates": 4}
    assert set(kw) <= set(base), set(kw) - set(base)
    return {**base, **kw}


#: (id, requests, max_running, configuration): fixed cases, each with what it exercises.
CASES = [
    # Shared prefixes of two families pushed down to a small DRAM and an NVMe tier and
    # promoted back; decode blocks hashed (cached once full) and a partial block that
    # carries its full content's hash; write-back; recompute preemption in a 6-block HBM.
    ("tiers_decode_cache", [
        req(family=0, shared=3, own=1, tail=2, tail_hash=True, decode=5),
        req(family=1, shared=2, own=2, tail=1, decode=3, gap=1, prio=HOT),
        req(family=0, shared=3, own=0, tail=3, decode=6, gap=1),
        req(family=1, shared=2, own=1, tail=0, decode=2, gap=2, prio=COLD),
        req(family=0, shared=2, own=2, tail=1, decode=4, gap=1),
        req(family=1, shared=3, own=0, tail=2, decode=5, gap=0, decode_hash=False),
    ], 3, cfg(hbm_blocks=6, dram=2, nvme=6, tier_policy="s3fifo")),
    # Swap preemption in a 5-block HBM with priority scheduling and request priorities;
    # copy-on-write forks (a child shares its parent's partial block), a rejected draft
    # block freed by a block-level FREE, write-through to DRAM and CXL under arc.
    ("swap_cow_write_through", [
        req(family=0, shared=1, own=1, tail=2, fork=True, decode=4, rprio=100),
        req(family=1, shared=2, own=0, tail=1, rollback=True, decode=5, rprio=0, gap=1),
        req(family=0, shared=1, own=2, tail=3, fork=True, decode=3, rprio=50, gap=1,
            prio=CRIT),
        req(family=0, shared=0, own=1, tail=1, decode=2, rprio=0, gap=0),
    ], 3, cfg(hbm_blocks=5, dram=4, cxl=3, tier_policy="arc",
              write_policy="write_through", preemption="swap", priority_scheduling=True,
              log_candidates=8)),
    # Prefetch partly hidden by queueing time on slow links (one request admitted at a
    # time, so the others queue), selective write-through, INTENT rows with deadlines,
    # chunked prefill, requests that refuse prefetch, lfu in the lower tiers, warm-up and
    # lifecycle rows in the decision log.
    ("prefetch_slow_links", [
        req(family=0, shared=3, own=0, tail=1, decode=2, deadline=True, intent=True),
        req(family=1, shared=3, own=1, tail=0, decode=1, chunks=2, gap=0),
        req(family=0, shared=3, own=1, tail=2, decode=3, gap=0, prefetch_ok=False),
        req(family=1, shared=2, own=0, tail=3, decode=2, gap=1, intent=True,
            deadline=True, prio=CRIT),
        req(family=0, shared=3, own=0, tail=1, decode=2, gap=0, chunks=2),
    ], 1, cfg(hbm_blocks=7, dram=8, cxl=2, nvme=3, tier_policy="lfu",
              write_policy="write_through_selective", slow_links=True, warmup=1,
              log_lifecycle=True, log_candidates=1)),
    # A tight HBM (4 blocks) with recompute preemption, sieve and fifo-family lower tiers,
    # no prefetch, no candidates logged, unhashed decode blocks and forks.
    ("tight_hbm_no_prefetch", [
        req(family=0, shared=2, own=0, tail=3, decode=6, decode_hash=False),
        req(family=0, shared=2, own=1, tail=0, decode=3, fork=True, gap=0),
        req(family=1, shared=1, own=0, tail=2, decode=4, gap=2, rollback=True),
        req(family=0, shared=2, own=0, tail=1, decode=2, gap=1),
    ], 2, cfg(hbm_blocks=4, dram=2, nvme=3, tier_policy="sieve", prefetch=False,
              log_candidates=0)),
    # The write_back cascade through all three lower tiers (DRAM -> CXL -> NVMe ->
    # dropped) with tiers of 2 blocks: blocks demoted from HBM push victims down two tiers
    # and out of NVMe, and later requests of the same families find their prefixes in
    # each tier (the tiers share one hash table whose entries move in place:
    # kvsim.replay.kernel.spill, "One table, entries moved in place").
    ("cascade_three_tiers", [
        req(family=0, shared=3, own=1, tail=1, decode=2),
        req(family=1, shared=3, own=1, tail=1, decode=2, gap=1),
        req(family=2, shared=3, own=0, tail=2, decode=2, gap=1),
        req(family=0, shared=3, own=1, tail=0, decode=1, gap=1),
        req(family=3, shared=2, own=2, tail=1, decode=2, gap=0),
        req(family=1, shared=3, own=0, tail=1, decode=2, gap=1),
        req(family=2, shared=2, own=1, tail=0, decode=1, gap=0),
        req(family=0, shared=3, own=0, tail=1, decode=1, gap=1),
    ], 2, cfg(hbm_blocks=5, dram=2, cxl=2, nvme=2)),
]


@pytest.mark.parametrize("policy", POLICIES)
def test_compiled_replay_matches_reference(policy, hw_pair, tmp_path):  # noqa: F811
    """Every built-in on every fixed case: the compiled replay equals the reference."""
    for name, reqs, max_running, c in CASES:
        tb = build_trace(reqs, max_running)
        case_dir = tmp_path / name
        case_dir.mkdir()
        trace = tb.write(case_dir / "t.jsonl")
        n_requests = len({r["request_id"] for r in tb.rows if r["request_id"] >= 0})
        config = dataclasses.replace(config_from(c, hw_pair, n_requests), engine="compiled")
        assert config.engine == "compiled"
        check(trace, policy, config, case_dir)


def test_cases_exercise_what_they_claim(hw_pair, tmp_path):  # noqa: F811
    """The fixed cases really evict to lower tiers (and on down DRAM -> CXL -> NVMe ->
    dropped), promote, prefetch, preempt (both modes), fork and write through (counted on lru by the reference itself), so the
    comparison above is not vacuous."""
    from tests.reference import reference_replay

    totals: dict[str, int] = {}
    for name, reqs, max_running, c in CASES:
        tb = build_trace(reqs, max_running)
        trace = tb.write(tmp_path / f"{name}.jsonl")
        n_requests = len({r["request_id"] for r in tb.rows if r["request_id"] >= 0})
        s, rows = reference_replay(trace, "lru", config_from(c, hw_pair, n_requests))
        for k in ("spills_hbm", "spills_dram", "spills_cxl", "evictions_nvme",
                  "promotions", "prefetches", "preemptions", "swap_out_bytes",
                  "preempt_recompute_tokens", "hit_tokens"):
            totals[k] = totals.get(k, 0) + int(s[k])
        totals["rows"] = totals.get("rows", 0) + len(rows)
    assert all(v > 0 for v in totals.values()), totals
