"""Live KV offload (``SimConfig(live_offload=True)``, kvsim/sim/live_offload.py): exact
stalls, spills and prefetch counts on hand-made traces.

Tiny profile (tests/sim/conftest.py): blocks of 100 bytes; DRAM: up latency 1 + 4 = 5 us,
link 100 bytes/us, so fetching n blocks from DRAM in one ACCESS stalls ``5 + n`` us.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import KvsimInputError
from kvsim.schema import Phase, Priority
from kvsim.sim import SimConfig, simulate

_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_live",
                                               Path(__file__).with_name("conftest.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
TraceBuilder = _helpers.TraceBuilder

DEC = Phase.DECODE


def live(hw, hbm, **kw) -> SimConfig:
    return SimConfig(hardware=hw, hbm_blocks=hbm, live_offload=True, **kw)


def three_requests(path: Path) -> Path:
    """A (2 blocks, decode deadline 250 us), B (1 block, deadline 10 ms), then C (2 blocks)
    arrives into a 4-block HBM: one block must be spilled; A decodes at the next step."""
    tb = TraceBuilder()
    tb.STEP(0, 100)
    tb.ARRIVE(0, 8)
    tb.ARRIVE(1, 4)
    for i in range(2):
        tb.ALLOC(0, i, 0, deadline_us=250)
    tb.ACCESS(0, 8, deadline_us=250)
    tb.ALLOC(1, 0, 0, deadline_us=10_000)
    tb.ACCESS(1, 4, deadline_us=10_000)
    tb.STEP(100, 100)
    tb.ARRIVE(2, 8)
    for i in range(2):
        tb.ALLOC(2, i, 0, deadline_us=10_000)
    tb.ACCESS(2, 8, deadline_us=10_000)
    tb.STEP(200, 100)
    tb.ACCESS(0, 1, DEC, deadline_us=250, priority=Priority.DECODE_CRITICAL)
    tb.FREE(0)
    tb.FREE(1)
    tb.FREE(2)
    return tb.write(path)


def test_lru_spills_the_block_needed_next_step_deadline_does_not(tmp_path, tiny_hw):
    trace = three_requests(tmp_path / "t.parquet")
    lru = simulate(trace, "lru", live(tiny_hw, 4)).summary
    dl = simulate(trace, "deadline", live(tiny_hw, 4)).summary
    # lru: A is least recently used -> A's block 1 spilled at step 1, fetched back at step 2
    # (5 us latency + 100 bytes / 100 bytes/us), making room by spilling B's block
    assert lru["stall_us"] == 6.0
    assert lru["decode_stalls"] == 1 and lru["decode_critical_stalls"] == 1
    assert lru["live_spills"] == 2 and lru["blocks_fetched"] == 1
    assert lru["bytes_dram_link"] == 300
    # deadline: B's deadline is the latest -> B spilled; A's step finds all its blocks
    assert dl["stall_us"] == 0.0
    assert dl["decode_stalls"] == 0 and dl["decode_critical_stalls"] == 0
    assert dl["live_spills"] == 1 and dl["blocks_fetched"] == 0
    assert dl["bytes_dram_link"] == 100
    steps = simulate(trace, "lru", live(tiny_hw, 4)).steps
    assert steps["latency_us"].tolist() == [100.0, 100.0, 106.0]
    assert lru["live_offload"] is True


def prefetch_trace(path: Path, step1_us: float, intruder: bool = False) -> Path:
    """HBM 3: A (2 blocks, deadline 5 ms), B (1 block, deadline 300 us); C arrives at
    step 1 (one block): deadline spills A's top block (A's 5 ms deadline is the latest); C finishes in step 1, so a slot is
    free for a prefetch of A's block at the end of step 1 (budget (step1_us - 5) x 100
    bytes).  ``intruder``: D allocates a block at step 2 before A reads (the prefetched
    block is spilled again: wasted); A then decodes at step 3."""
    tb = TraceBuilder()
    tb.STEP(0, 100)
    tb.ARRIVE(0, 8)
    tb.ARRIVE(1, 4)
    for i in range(2):
        tb.ALLOC(0, i, 0, deadline_us=5_000)
    tb.ACCESS(0, 8, deadline_us=5_000)
    tb.ALLOC(1, 0, 0, deadline_us=300)
    tb.ACCESS(1, 4, deadline_us=300)
    tb.STEP(100, step1_us)
    tb.ARRIVE(2, 4)
    tb.ALLOC(2, 0, 0, deadline_us=20_000)
    tb.ACCESS(2, 4, deadline_us=20_000)
    tb.FREE(2)
    tb.STEP(1000, 100)
    if intruder:
        tb.ARRIVE(3, 4)
        tb.ALLOC(3, 0, 0, deadline_us=1_000)
        tb.ACCESS(3, 4, deadline_us=1_000)
        tb.STEP(2000, 100)
    tb.ACCESS(0, 1, DEC, deadline_us=5_000)
    tb.FREE(0)
    tb.FREE(1)
    if intruder:
        tb.FREE(3)
    return tb.write(path)


def test_prefetch_hides_the_transfer_exactly_when_the_budget_fits(tmp_path, tiny_hw):
    # budget (6 - 5 us latency) x 100 bytes/us = 100 bytes = exactly one block: hidden
    fits = simulate(prefetch_trace(tmp_path / "a.parquet", 6.0), "deadline",
                    live(tiny_hw, 3)).summary
    assert fits["prefetches"] == 1 and fits["prefetches_useful"] == 1
    assert fits["prefetches_wasted"] == 0
    assert fits["stall_us"] == 0.0 and fits["blocks_fetched"] == 0
    # 0.5 us short: 50 bytes of budget, no prefetch, the decode step stalls 5 + 1 us
    short = simulate(prefetch_trace(tmp_path / "b.parquet", 5.5), "deadline",
                     live(tiny_hw, 3)).summary
    assert short["prefetches"] == 0 and short["stall_us"] == 6.0
    assert short["decode_stalls"] == 1
    # lru has no prefetch hook: fetch on demand, the same 6 us
    lru = simulate(prefetch_trace(tmp_path / "a.parquet", 6.0), "lru",
                   live(tiny_hw, 3)).summary
    assert lru["prefetches"] == 0 and lru["stall_us"] == 6.0
    # prefetch off for every policy
    off = simulate(prefetch_trace(tmp_path / "a.parquet", 6.0), "deadline",
                   live(tiny_hw, 3, prefetch=False)).summary
    assert off["prefetches"] == 0 and off["stall_us"] == 6.0


def test_wasted_prefetch_is_counted(tmp_path, tiny_hw):
    s = simulate(prefetch_trace(tmp_path / "w.parquet", 6.0, intruder=True), "deadline",
                 live(tiny_hw, 3)).summary
    # prefetched at the end of step 1, spilled again for D at step 2 before A read it
    assert s["prefetches"] == 1
    assert s["prefetches_wasted"] == 1 and s["prefetches_useful"] == 0
    assert s["blocks_fetched"] == 1 and s["stall_us"] == 6.0
