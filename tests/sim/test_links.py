"""``--link-model queue`` (kvsim.replay.kernel.links): transfers occupy their link, FIFO per
direction; exact stalls, queueing delays and link busy times on hand-made traces.

The tiny profile (tests/sim/conftest.py): a DRAM block (100 bytes) promotes in 1 us over a
100 bytes/us link, plus 5 us of latency (1 us medium + 4 us link) once per request, so one
request promoting one block is a transfer of T = 6 us.
"""

from __future__ import annotations

import pytest

from kvsim.api import simulate
from kvsim.core.schema import Phase
from kvsim.spec.sim_config import SimConfig

T_US = 6.0  # latency 5 us + 100 bytes / (100 bytes/us)


def cfg(hw, **kw) -> SimConfig:
    kw.setdefault("engine", "interpreted")
    kw.setdefault("check_invariants", True)
    return SimConfig(hardware=hw, **kw)


def concurrent(builder, n=4, wait_us=15):
    """r0..r{n-1} (one full block 11+k and a partial one each) run one after another; r{n}
    (8 full blocks) then takes the whole 8-block HBM, so 11.. are demoted to DRAM
    (write_back).  r{n+1}..r{2n} arrive together and, ``wait_us`` later, are admitted in
    one step: each promotes its one block from DRAM, n equal concurrent transfers."""
    tb = builder()
    t = 0
    for k in range(n):
        tb.STEP(t, 100); tb.ARRIVE(k, 5); tb.prompt(k, [11 + k, 0], last_tokens=1)
        tb.ACCESS(k, 5)
        tb.STEP(t + 100, 100); tb.ACCESS(k, 1, Phase.DECODE); tb.FREE(k)
        t += 200
    tb.STEP(t, 100); tb.ARRIVE(n, 32); tb.prompt(n, list(range(21, 29))); tb.ACCESS(n, 32)
    tb.STEP(t + 100, 1); tb.ACCESS(n, 1, Phase.DECODE); tb.FREE(n)
    for k in range(n):
        tb.ARRIVE(n + 1 + k, 5)
    tb.STEP(t + 100 + wait_us, 1000)
    for k in range(n):
        tb.prompt(n + 1 + k, [11 + k, 0], last_tokens=1)
    for k in range(n):
        tb.ACCESS(n + 1 + k, 5)
    return tb


def test_one_transfer_alone_is_latency_plus_bytes_over_bandwidth(builder, tiny_hw, tmp_path):
    trace = concurrent(builder, n=1).write(tmp_path / "t.parquet")
    s = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, prefetch=False,
                                   link_model="queue")).summary
    assert s["stall_us"] == T_US  # 5 us latency + 100 B / 100 B/us
    assert s["link_dram_up_busy_us"] == T_US and s["link_dram_up_transfers"] == 1
    assert s["link_dram_up_queue_us"] == 0.0 and s["link_queue_p99_us"] == 0.0
    # the same figure as the default model: alone, a transfer queues behind nothing
    d = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, prefetch=False)).summary
    assert d["stall_us"] == s["stall_us"] and "link_dram_up_busy_us" not in d


@pytest.mark.parametrize("n", [1, 2, 4])
def test_n_concurrent_equal_transfers_take_n_times_as_long(builder, tiny_hw, tmp_path, n):
    trace = concurrent(builder, n=n).write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, prefetch=False,
                                     link_model="queue"))
    s = res.summary
    # FIFO: the k-th (1-based) ends k x T after the step starts and waited (k - 1) x T; the
    # step waits for the last: N x T (a fair share ends all N at N x T: the same step)
    assert s["stall_us"] == n * T_US
    assert res.steps["stall_us"].iloc[-1] == n * T_US
    assert s["link_dram_up_busy_us"] == n * T_US
    assert s["link_dram_up_transfers"] == n
    assert s["link_dram_up_queue_us"] == T_US * n * (n - 1) / 2
    assert s["link_queue_mean_us"] == pytest.approx(T_US * (n - 1) / 2)
    assert s["link_queue_p50_us"] == pytest.approx(T_US * (n - 1) / 2)
    waits = res.requests.set_index("request_id")["stall_us"]
    assert [waits[n + 1 + k] for k in range(n)] == [T_US] * n  # each adds T to the step


def test_prefetches_queue_behind_each_other(builder, tiny_hw, tmp_path):
    """4 requests wait 15 us: the default model hides each one's 6 us prefetch behind its
    own wait (all 4 in parallel); on a FIFO link they end 6, 12, 18, 24 us after arrival,
    so the step (at 15 us) waits 9 us for the last two."""
    trace = concurrent(builder, n=4, wait_us=15).write(tmp_path / "t.parquet")
    d = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8)).summary
    assert d["stall_us"] == 0.0 and d["prefetches_useful"] == 4
    q = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, link_model="queue")).summary
    assert q["stall_us"] == 24.0 - 15.0
    # 1st and 2nd hidden, 3rd started before the step (late), 4th starts at 18: on demand
    assert (q["prefetches"], q["prefetches_useful"], q["promotions"]) == (3, 2, 1)
    assert q["link_dram_up_queue_us"] == 0 + 6 + 12 + 18
    assert q["dram_hit_rate"] == d["dram_hit_rate"]  # same hits, a worse step


def test_spills_occupy_the_down_link(builder, tiny_hw, tmp_path):
    trace = concurrent(builder, n=4).write(tmp_path / "t.parquet")
    s = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, link_model="queue")).summary
    # demotions: 11..14 (step of r4), then r4's 8 blocks in the last step: 12 blocks of
    # 100 B, each 5 us (write latency 1 + 4) + 1 us, asynchronous (no stall)
    assert s["link_dram_down_transfers"] == s["spills_hbm"] == 12
    assert s["link_dram_down_busy_us"] == 12 * T_US
    # the last step's 8 spills are issued together: FIFO waits 0, 6, ..., 42 us
    assert s["link_dram_down_queue_us"] == T_US * (4 * 3 / 2 + 8 * 7 / 2)


def test_link_model_is_validated(tiny_hw):
    from kvsim.core.errors import KvsimInputError

    with pytest.raises(KvsimInputError, match="--link-model"):
        SimConfig(hardware=tiny_hw, link_model="fair")


def test_compiled_engine_agrees(builder, tiny_hw, tmp_path):
    trace = concurrent(builder, n=4, wait_us=15).write(tmp_path / "t.parquet")
    got = [simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, link_model="queue",
                                      engine=e)).summary for e in ("interpreted", "compiled")]
    keys = [k for k in got[0] if k.startswith("link_") or k in ("stall_us", "prefetches")]
    assert len(keys) > 10
    assert [got[1][k] for k in keys] == [got[0][k] for k in keys]


def test_the_decision_log_records_each_queued_transfer(builder, tiny_hw, tmp_path):
    import pandas as pd

    from kvsim.results.log_schema import Action

    trace = concurrent(builder, n=4, wait_us=15).write(tmp_path / "t.parquet")
    log = tmp_path / "log.parquet"
    simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, link_model="queue"), decision_log=log)
    df = pd.read_parquet(log)
    up = df[df["to_tier"] == 0]
    got = [(Action(a).name, h, f, b, c) for a, h, f, b, c in
           zip(up["action"], up["content_hash"], up["from_tier"], up["bytes"], up["cost_us"])]
    # each block's cost: what it added to the step's wait (0, 0, 18 - 15, 24 - 18)
    assert got == [("PREFETCH", 11, 1, 100, 0.0), ("PREFETCH", 12, 1, 100, 0.0),
                   ("PREFETCH", 13, 1, 100, 3.0), ("PROMOTE", 14, 1, 100, 6.0)]


@pytest.mark.parametrize("kw, field", [({"shared_tier_gb": 1.0}, "--shared-tier-gb"),
                                       ({"link_model": "queue", "mode": "cache"},
                                        "--link-model")])
def test_options_the_replay_cannot_honour_are_refused(builder, tiny_hw, tmp_path, kw, field):
    from kvsim.core.errors import KvsimInputError

    trace = concurrent(builder, n=1).write(tmp_path / "t.parquet")
    with pytest.raises(KvsimInputError, match=field):
        simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, **kw))


def test_swaps_alone_cost_what_they_cost_untimed(builder, tiny_hw, tmp_path):
    """tests/sim/test_replay_exact.py's swap scenario: r0's swap-out (7 us) and its block
    12 swapped back in (6 us), each on a link nobody else uses, cost the same under the
    queue; each is one transfer on the DRAM link (down, then up)."""
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 8); tb.prompt(0, [11, 12]); tb.ACCESS(0, 8)
    tb.STEP(1000, 1000); tb.ARRIVE(1, 8); tb.prompt(1, [31, 32]); tb.ACCESS(1, 8)
    tb.STEP(2000, 100); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1)
    tb.STEP(3000, 100); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    trace = tb.write(tmp_path / "t.parquet")
    res = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=3, dram_gb=0, preemption="swap",
                                     link_model="queue"))
    assert res.steps["latency_us"].tolist() == [1000.0, 1007.0, 100.0, 106.0]
    assert res.summary["link_dram_up_busy_us"] == 6.0
    assert res.summary["link_dram_up_transfers"] == 1
    # and the swap-out (200 B: 5 + 2 us) is one transfer on the down link
    assert res.summary["link_dram_down_busy_us"] == 7.0
    assert res.summary["link_dram_down_transfers"] == 1
