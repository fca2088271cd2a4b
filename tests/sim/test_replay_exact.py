"""Exact hits, stalls, recomputes, eviction/demotion orders and TTFTs on hand-made traces.

Every trace is tiny, so these run on the interpreted engine (the same source as the
compiled core, no compile time); tests/sim/test_compiled.py checks both engines agree.
Derivations are in the comments: blocks are 4 tokens / 100 bytes (tests/sim/conftest.py).
"""

from __future__ import annotations

import pandas as pd
import pytest

from kvsim.api import simulate
from kvsim.core.schema import Phase
from kvsim.results.log_schema import Action
from kvsim.spec.sim_config import SimConfig


def cfg(hw, **kw) -> SimConfig:
    kw.setdefault("engine", "interpreted")
    kw.setdefault("check_invariants", True)
    return SimConfig(hardware=hw, **kw)


def two_turns(builder):
    """r0 (prompt 8 = 2 full blocks) runs and finishes; r1 shares both blocks + 1 token."""
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 8); tb.prompt(0, [11, 12]); tb.ACCESS(0, 8)
    tb.STEP(1000, 500); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    tb.STEP(2000, 1000); tb.ARRIVE(1, 9); tb.prompt(1, [11, 12, 13], last_tokens=1)
    tb.ACCESS(1, 9)
    tb.STEP(3000, 500); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1)
    return tb


def test_prefix_hit_saves_recompute_and_sets_ttft(builder, tiny_hw, tmp_path):
    trace = two_turns(builder).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=4))
    s = res.summary
    # r0: 8 prompt tokens, at most 7 may hit -> no hit (first sight anyway).
    # r1: 9 prompt tokens, at most 8 may hit -> blocks 11 and 12 hit (8 tokens).
    assert s["hbm_hit_rate"] == pytest.approx(8 / 17)
    assert s["prefix_hit_rate"] == pytest.approx(8 / 17)
    assert s["block_hit_rate"] == pytest.approx(2 / 5)  # 2 hits of 5 prompt blocks
    assert s["first_compute_tokens"] == 8 and s["recompute_tokens"] == 0
    # step 2 saves the two hit blocks' recompute cost: 1000 - 2 x 100 = 800 us
    assert res.steps["latency_us"].tolist() == [1000.0, 500.0, 800.0, 500.0]
    req = res.requests.set_index("request_id")
    assert req.loc[0, "ttft_us"] == 1000.0 and req.loc[1, "ttft_us"] == 800.0
    assert req.loc[0, "tpot_us"] == 500.0 and req.loc[1, "tpot_us"] == 700.0
    assert s["makespan_us"] == 3500.0
    assert res.checks["pool_ok"] and res.checks["peak_within_capacity"]


def demote_promote(builder, wait_us=2000):
    """HBM of 3 blocks.  r0 (blocks 11, 12 + partial) finishes; r1 (21, 22 + partial) needs
    3 blocks: 1 empty + the two cached blocks of r0, which LRU evicts oldest-released first
    (r0 released tail-first: 12 then 11) and write_back demotes to DRAM.  r2 arrives
    ``wait_us`` before its admission and wants 11, 12 again: found in DRAM, promoted."""
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 9); tb.prompt(0, [11, 12, 0], last_tokens=1)
    tb.ACCESS(0, 9)
    tb.STEP(1000, 100); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    tb.STEP(2000, 1000); tb.ARRIVE(1, 9); tb.prompt(1, [21, 22, 0], last_tokens=1)
    tb.ACCESS(1, 9)
    tb.STEP(3000, 100); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1); tb.ARRIVE(2, 9)
    tb.STEP(3000 + wait_us, 1000); tb.prompt(2, [11, 12, 0], last_tokens=1)
    tb.ACCESS(2, 9)
    return tb


def test_demotion_order_promotion_and_prefetch_hiding(builder, tiny_hw, tmp_path):
    trace = demote_promote(builder).write(tmp_path / "t.parquet")
    log = tmp_path / "log.parquet"
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3), decision_log=log)
    s = res.summary
    assert s["hbm_hit_rate"] == 0.0
    assert s["dram_hit_rate"] == pytest.approx(8 / 27)
    assert s["spills_hbm"] == 4 and s["evictions"] == 0
    # 4 blocks down (400 B) + 2 up (200 B) over the DRAM link
    assert s["bytes_dram_link"] == 600 and s["bytes_moved"] == 600
    # transfer 5 us latency + 2 x 1 us, hidden behind 2000 us of queueing
    assert s["prefetches"] == 2 and s["prefetches_useful"] == 2 and s["promotions"] == 0
    assert s["stall_us"] == 0.0
    req = res.requests.set_index("request_id")
    assert req.loc[2, "ttft_us"] == 2000 + 1000 - 200  # queued, then 800 us step
    df = pd.read_parquet(log)
    got = [(Action(a).name, h, f, t) for a, h, f, t in
           zip(df["action"], df["content_hash"], df["from_tier"], df["to_tier"])]
    assert got == [("DEMOTE", 12, 0, 1), ("DEMOTE", 11, 0, 1),
                   ("DEMOTE", 22, 0, 1), ("DEMOTE", 21, 0, 1),
                   ("PREFETCH", 11, 1, 0), ("PREFETCH", 12, 1, 0)]
    assert df["seq"].tolist() == list(range(6))
    assert df["reason"][0] == "least recently used: idle for the longest time"
    # the victim leads its candidate list: 12 (released first), then 11
    assert [c["content_hash"] for c in df["candidates"][0]] == [12, 11]
    assert df["bytes"].tolist() == [100, 100, 100, 100, 100, 100]
    assert df["cost_us"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_promotion_stalls_without_prefetch(builder, tiny_hw, tmp_path):
    trace = demote_promote(builder).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, prefetch=False))
    s = res.summary
    # latency (1 us medium + 4 us link) once + 100 B / 100 B/us per block = 5 + 1 + 1
    assert s["stall_us"] == 7.0
    assert s["promotions"] == 2 and s["prefetches"] == 0
    assert res.steps["latency_us"].iloc[-1] == 1000 - 200 + 7


def test_no_lower_tier_means_drop_and_recompute(builder, tiny_hw, tmp_path):
    trace = demote_promote(builder).write(tmp_path / "t.parquet")
    log = tmp_path / "log.parquet"
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, dram_gb=0), decision_log=log)
    s = res.summary
    assert s["evictions_hbm"] == 4 and s["spills"] == 0
    assert s["recompute_tokens"] == 8  # 11 and 12 were computed before, now nowhere
    assert s["bytes_moved"] == 0
    df = pd.read_parquet(log)
    assert [Action(a).name for a in df["action"]] == ["EVICT"] * 4 + ["RECOMPUTE"] * 2
    assert df["content_hash"].tolist() == [12, 11, 22, 21, 11, 12]
    assert df["cost_us"].tolist()[-2:] == [100.0, 100.0]


def test_write_through_copies_on_first_use(builder, tiny_hw, tmp_path):
    trace = demote_promote(builder).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, write_policy="write_through"))
    s = res.summary
    # every full block is backed up when first allocated: 11, 12, 21, 22; evictions then
    # drop (a copy exists), and 11, 12 come back from DRAM.
    assert s["write_throughs"] == 4 and s["spills_hbm"] == 0 and s["evictions_hbm"] == 4
    assert s["dram_hit_rate"] == pytest.approx(8 / 27)


def test_preemption_recompute_last_running(builder, tiny_hw, tmp_path):
    """HBM of 3 blocks: r0 holds 2, r1 needs 2 -> r0 (the other running request) is
    preempted; its blocks become cached, r1 takes the empty block and evicts 12 (released
    first by r0's tail-first release).  When r0 resumes after r1 left, 11 is still cached
    (revived) and 12 is recomputed: 100 us added to that step."""
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 8); tb.prompt(0, [11, 12]); tb.ACCESS(0, 8)
    tb.STEP(1000, 1000); tb.ARRIVE(1, 8); tb.prompt(1, [31, 32]); tb.ACCESS(1, 8)
    tb.STEP(2000, 100); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1)
    tb.STEP(3000, 100); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    trace = tb.write(tmp_path / "t.parquet")
    log = tmp_path / "log.parquet"
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, dram_gb=0), decision_log=log)
    s = res.summary
    assert s["preemptions"] == 1
    assert s["preempt_recompute_tokens"] == 4
    assert res.steps["latency_us"].tolist() == [1000.0, 1000.0, 100.0, 200.0]
    df = pd.read_parquet(log)
    assert [(Action(a).name, r) for a, r in zip(df["action"], df["request_id"])] == [
        ("PREEMPT", 0), ("EVICT", 0), ("EVICT", 1), ("RECOMPUTE", 0)]
    assert df["content_hash"].tolist() == [0, 12, 32, 12]
    assert res.checks["pool_ok"]


def test_deadline_and_decode_critical_accounting(builder, tiny_hw, tmp_path):
    """r2 is deadline-bound (TTFT deadline 3500 us after... absolute 5000): its prefix was
    demoted, so both promoted blocks count as decode-critical misses; its TTFT ends at
    3000 + 2000 + 807 > 5000 without prefetch -> one deadline miss."""
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 9); tb.prompt(0, [11, 12, 0], last_tokens=1)
    tb.ACCESS(0, 9)
    tb.STEP(1000, 100); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    tb.STEP(2000, 1000); tb.ARRIVE(1, 9); tb.prompt(1, [21, 22, 0], last_tokens=1)
    tb.ACCESS(1, 9)
    tb.STEP(3000, 100); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1); tb.ARRIVE(2, 9, 5000)
    tb.STEP(5000, 1000); tb.prompt(2, [11, 12, 0], last_tokens=1); tb.ACCESS(2, 9)
    trace = tb.write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, prefetch=False))
    s = res.summary
    assert s["decode_critical_misses"] == 2
    assert s["deadline_misses"] == 1 and s["ttft_deadline_misses"] == 1
    req = res.requests.set_index("request_id")
    assert req.loc[2, "ttft_us"] == 2000 + 807
    assert bool(req.loc[2, "ttft_missed"]) and not bool(req.loc[0, "ttft_missed"])


def test_warmup_excludes_early_steps_and_requests(builder, tiny_hw, tmp_path):
    trace = two_turns(builder).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=4, warmup_fraction=0.5))
    s = res.summary
    # steps 0, 1 excluded; request 1 (arrives at step 2) measured alone: 8 of 9 hit
    assert s["steps"] == 2 and s["requests"] == 1
    assert s["hbm_hit_rate"] == pytest.approx(8 / 9)
    assert s["p50_step_us"] == pytest.approx(650.0)


def test_preemption_swap_costs(builder, tiny_hw, tmp_path):
    """Same scenario as the recompute test with --preemption swap: r0's two blocks (200 B)
    go out over the DRAM link when r1 needs room (5 us latency + 200 B / 100 B/us = 7 us
    on that step); when r0 resumes, 11 is still cached and 12 is swapped back in
    (5 + 1 = 6 us on that step)."""
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 8); tb.prompt(0, [11, 12]); tb.ACCESS(0, 8)
    tb.STEP(1000, 1000); tb.ARRIVE(1, 8); tb.prompt(1, [31, 32]); tb.ACCESS(1, 8)
    tb.STEP(2000, 100); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1)
    tb.STEP(3000, 100); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    trace = tb.write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, dram_gb=0, preemption="swap"))
    s = res.summary
    assert s["preemptions"] == 1 and s["preempt_recompute_tokens"] == 0
    assert s["swap_out_bytes"] == 200 and s["swap_in_bytes"] == 100
    assert res.steps["latency_us"].tolist() == [1000.0, 1007.0, 100.0, 106.0]
