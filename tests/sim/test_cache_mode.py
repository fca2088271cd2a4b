"""Cache mode: exact hits on a hand-made trace, and the exact reduction to the single-tier
simulator (block-level variant, HBM only) for every built-in policy.

Blocks are 4 tokens of 25 bytes (tests/sim/conftest.py).  Tiny traces run interpreted.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.api import simulate
from kvsim.cachesim.simulator import simulate_cache
from kvsim.core.schema import EventHeader, Phase
from kvsim.engine.serial_lowering import CacheStream, stream_from_events
from kvsim.modes.cache import simulate_cache as replay_cache
from kvsim.policy.registry import list_policies
from kvsim.spec.sim_config import SimConfig


def cfg(hw, **kw) -> SimConfig:
    kw.setdefault("engine", "interpreted")
    kw.setdefault("check_invariants", True)
    kw.setdefault("dram_gb", 0)
    kw.setdefault("mode", "cache")
    return SimConfig(hardware=hw, **kw)


def four_requests(builder):
    """Engine-shaped trace: r0 [1,2,3]+1 token, r1 [1,2,4]+1, r2 [1,5]+1, r3 [1,2,3]+1,
    overlapping in time (r1 arrives before r0 finishes).  The 1-token tails have no
    identity (hash 0), as an agentic trace's tail."""
    tb = builder()
    tb.STEP(0, 100); tb.ARRIVE(0, 13); tb.prompt(0, [1, 2, 3, 0], last_tokens=1)
    tb.ACCESS(0, 13)
    tb.STEP(1000, 100); tb.ARRIVE(1, 13); tb.prompt(1, [1, 2, 4, 0], last_tokens=1)
    tb.ACCESS(1, 13); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    tb.STEP(2000, 100); tb.ARRIVE(2, 9); tb.prompt(2, [1, 5, 0], last_tokens=1)
    tb.ACCESS(2, 9); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1)
    tb.STEP(3000, 100); tb.ARRIVE(3, 13); tb.prompt(3, [1, 2, 3, 0], last_tokens=1)
    tb.ACCESS(3, 13); tb.ACCESS(2, 1, Phase.DECODE); tb.FREE(2)
    tb.STEP(4000, 100); tb.ACCESS(3, 1, Phase.DECODE); tb.FREE(3)
    return tb


def test_stream_from_events_keeps_identified_full_blocks(builder, tmp_path):
    trace = four_requests(builder).write(tmp_path / "t.parquet")
    s = stream_from_events(trace)
    assert s.request_id.tolist() == [0, 1, 2, 3]
    assert s.prompt_tokens.tolist() == [13, 13, 9, 13]
    assert s.offsets.tolist() == [0, 3, 6, 8, 11]
    assert s.chain.tolist() == [1, 2, 3, 1, 2, 4, 1, 5, 1, 2, 3]


def test_identified_partial_tail_is_cached_with_its_tokens(builder, tiny_hw, tmp_path):
    """Cache mode caches an identified partial last block (kvcache-simulator, Mooncake
    hash ids): the second identical prompt hits all 9 tokens, 3 of 3 blocks."""
    tb = builder()
    for r in range(2):
        tb.STEP(1000 * r, 1); tb.ARRIVE(r, 9); tb.prompt(r, [1, 2, 7], last_tokens=1)
        tb.ACCESS(r, 9); tb.FREE(r)
    trace = tb.write(tmp_path / "t.parquet")
    st_ = stream_from_events(trace)
    assert st_.chain.tolist() == [1, 2, 7, 1, 2, 7] and st_.tails().tolist() == [1, 1]
    for variant in ("prefix", "block"):
        s = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, cache_variant=variant)).summary
        assert (s["hit_tokens"], s["lookup_tokens"]) == (9, 18), variant
        assert (s["hit_blocks"], s["prompt_blocks"]) == (3, 6), variant
    opt = simulate(trace, "optimal", cfg(tiny_hw, hbm_blocks=8)).summary
    assert (opt["hit_tokens"], opt["hit_blocks"]) == (9, 3)
    # engine mode (vLLM) never shares a partial block, and recomputes the last token:
    # r1 hits blocks 1, 2 (8 tokens)
    e = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, mode="engine")).summary
    assert e["hit_tokens"] == 8


def test_vllm_variant_never_shares_the_partial_tail_and_caps_at_prompt_minus_one(
        builder, tiny_hw, tmp_path):
    """--cache-variant vllm: the identified partial last block is not shared (as engine
    mode and vLLM), and an exact repeat of a block-aligned prompt hits all but its last
    block (vLLM's num_tokens - 1 rule); prefix hits everything in both."""
    tb = builder()
    for r in range(2):
        tb.STEP(1000 * r, 1); tb.ARRIVE(r, 9); tb.prompt(r, [1, 2, 7], last_tokens=1)
        tb.ACCESS(r, 9); tb.FREE(r)
    for r in (2, 3):  # block-aligned 8-token prompt, sent twice
        tb.STEP(1000 * r, 1); tb.ARRIVE(r, 8); tb.prompt(r, [3, 4]); tb.ACCESS(r, 8)
        tb.FREE(r)
    trace = tb.write(tmp_path / "t.parquet")
    v = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, cache_variant="vllm")).summary
    p = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, cache_variant="prefix")).summary
    assert p["hit_tokens"] == 9 + 8
    assert v["hit_tokens"] == 8 + 4
    assert v["lookup_tokens"] == p["lookup_tokens"] == 34
    e = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, mode="engine")).summary
    assert e["hit_tokens"] == v["hit_tokens"]


def test_prefix_variant_exact_lru(builder, tiny_hw, tmp_path):
    trace = four_requests(builder).write(tmp_path / "t.parquet")
    s = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=4)).summary
    # r0 misses; released tail-first, LRU order 3,2,1 (+1 empty).  r1 hits 1,2 (8 tok),
    # 4 takes the empty slot: order 3,4,2,1.  r2 hits 1 (4 tok), 5 evicts 3.  r3 hits 1,2
    # (8 tok), 3 evicts 4.  Hits 20 of 48 prompt tokens, 5 of 15 prompt blocks.
    assert s["mode"] == "cache"
    assert s["hit_tokens"] == 20 and s["lookup_tokens"] == 48
    assert s["hbm_hit_rate"] == pytest.approx(20 / 48)
    assert s["block_hit_rate"] == pytest.approx(5 / 15)
    assert s["evictions_hbm"] == 2
    for k in ("p99_step_us", "ttft_p50_us", "tpot_p99_us", "steps", "makespan_us"):
        assert k not in s  # no engine timing: absent, not zero
    w = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=4, warmup_requests=2)).summary
    assert w["requests"] == 2 and w["hit_tokens"] == 12 and w["lookup_tokens"] == 22
    assert w["evictions_hbm"] == 2  # both evictions happen from request 2 on


def test_prefix_lookup_stops_at_first_miss_block_variant_does_not(builder, tiny_hw, tmp_path):
    tb = builder()
    tb.STEP(0, 1); tb.ARRIVE(0, 8); tb.prompt(0, [1, 2]); tb.ACCESS(0, 8); tb.FREE(0)
    tb.STEP(1, 1); tb.ARRIVE(1, 4); tb.prompt(1, [3]); tb.ACCESS(1, 4); tb.FREE(1)
    tb.STEP(2, 1); tb.ARRIVE(2, 8); tb.prompt(2, [1, 2]); tb.ACCESS(2, 8); tb.FREE(2)
    trace = tb.write(tmp_path / "t.parquet")
    # 2 blocks of HBM, lru: r0 releases tail-first (2, then 1), so the LRU head is 2 and
    # r1's block 3 evicts it.  r2: the prefix lookup hits 1, then stops at 2.
    p = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=2)).summary
    assert p["hit_blocks"] == 1
    # block variant, same pool: accesses 1,2,3,1,2 -> 3 evicts 1 (LRU), 1 evicts 2: 0 hits
    b = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=2, cache_variant="block")).summary
    assert b["hit_blocks"] == 0
    assert simulate_cache(np.array([1, 2, 3, 1, 2]), 2, "lru").hits == 0


# ---- the exact reduction: block variant, HBM only == the single-tier simulator ------------

#: Built-ins whose HBM hooks do not yet keep a block's history across reuse (issue #14, the
#: policy-history branch changes the hook contract): in the tiered replay a reused block
#: leaves the policy (on_remove) and re-enters at release (on_insert), so their order is
#: release order.  Must be empty once that branch is merged.
_HISTORY_PENDING: set[str] = set()


def _policies():
    out = []
    for p in list_policies():
        marks = ()
        if p.name in _HISTORY_PENDING:
            marks = pytest.mark.xfail(strict=True, reason="needs the policy-history hook "
                                      "contract (block history across reuse)")
        out.append(pytest.param(p.name, marks=marks))
    return out


def _stream(chains, bs=4, bpt=25) -> CacheStream:
    lengths = np.array([len(c) for c in chains], np.int64)
    offsets = np.zeros(len(chains) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    chain = np.concatenate([np.asarray(c, np.int64) for c in chains]) if chains else \
        np.zeros(0, np.int64)
    n = len(chains)
    return CacheStream(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64) * 10,
                       lengths * bs + 1, offsets, chain, bs, bs * bpt,
                       EventHeader(block_size_tokens=bs, kv_bytes_per_token=bpt))


def _tree_chains(seed: int, n_requests: int, fanout: int = 3):
    """Requests on a prefix tree: each extends a random existing path by 0-3 new nodes
    (content hash = node id + 1, unique per path, as chained hashes are)."""
    rng = np.random.default_rng(seed)
    parent = [-1]
    children: dict[int, list[int]] = {0: []}
    chains = []
    for _ in range(n_requests):
        node, path = 0, [1]
        while children[node] and rng.random() < 0.7:
            node = children[node][int(rng.integers(len(children[node])))]
            path.append(node + 1)
        for _ in range(int(rng.integers(0, 4))):
            if len(children[node]) >= fanout:
                break
            new = len(parent)
            parent.append(node)
            children[node].append(new)
            children[new] = []
            node = new
            path.append(new + 1)
        chains.append(path)
    return chains


def _assert_reduction(stream, cap, name, hw):
    res = replay_cache(stream, name, cfg(hw, hbm_blocks=cap, cache_variant="block"))
    single = simulate_cache(stream.key_stream(), cap, name)
    assert res.summary["hit_blocks"] == single.hits, (name, cap)
    assert res.summary["evictions_hbm"] == single.evictions, (name, cap)


@pytest.mark.slow
@pytest.mark.parametrize("name", _policies())
def test_block_variant_equals_single_tier_on_prefix_trees(name, tiny_hw):
    for seed, cap in ((0, 3), (1, 5), (2, 8)):
        _assert_reduction(_stream(_tree_chains(seed, 60)), cap, name, tiny_hw)


@pytest.mark.slow
@pytest.mark.parametrize("name", _policies())
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 50), cap=st.integers(1, 10))
def test_block_variant_equals_single_tier_hypothesis(name, seed, n, cap, tiny_hw):
    """Every built-in, hypothesis-generated prefix-tree streams."""
    _assert_reduction(_stream(_tree_chains(seed, n)), cap, name, tiny_hw)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), cap=st.integers(1, 12))
def test_block_variant_equals_single_tier_hypothesis_lru(seed, n, cap, tiny_hw):
    _assert_reduction(_stream(_tree_chains(seed, n)), cap, "lru", tiny_hw)


def test_compare_in_cache_mode_reports_gap_to_optimal(builder, tiny_hw, tmp_path):
    from kvsim.modes.comparison import compare

    trace = four_requests(builder).write(tmp_path / "t.parquet")
    df = compare(trace, ["lru", "fifo", "optimal"],
                 cfg(tiny_hw, hbm_blocks=4)).set_index("policy")
    assert list(df.index) == ["lru", "fifo", "optimal"]
    assert (df["mode"] == "cache").all() and "p99_step_us" not in df.columns
    # optimal: r1 hits 1,2; r2 hits 1; r3 hits 1,2,3 (keeps 3, bypasses 4 and 5) -> 24 tok
    assert df.loc["optimal", "hit_tokens"] == 24 and bool(df.loc["optimal", "offline"])
    assert df.loc["lru", "gap_hbm_hit_rate_to_optimal"] == pytest.approx((24 - 20) / 48)
    assert (df["gap_hbm_hit_rate_to_optimal"] >= 0).all()


def _head(stream: CacheStream, n: int) -> CacheStream:
    """The first ``n`` requests of ``stream``."""
    end = int(stream.offsets[n])
    return CacheStream(stream.request_id[:n], stream.arrival_us[:n],
                       stream.prompt_tokens[:n], stream.offsets[:n + 1].copy(),
                       stream.chain[:end].copy(), stream.block_size_tokens,
                       stream.block_bytes, stream.header)


@pytest.mark.traces
@pytest.mark.slow
@pytest.mark.parametrize("name", _policies())
def test_block_variant_equals_single_tier_on_mooncake(name, shared_traces, tiny_hw):
    """The Mooncake conversation trace's block stream (512-token blocks), first 1,500
    requests (~36 k block accesses: the interpreted replay of all 288,500 would take
    minutes per policy), at 2,000 blocks."""
    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    from kvsim.engine.serial_lowering import stream_from_requests
    from kvsim.ingest import read_requests

    stream = _head(stream_from_requests(read_requests(path, "mooncake"), 512, 1), 1500)
    _assert_reduction(stream, 2000, name, tiny_hw)


@pytest.mark.slow
def test_sweep_in_cache_mode_runs_optimal_and_gaps(builder, tiny_hw, tmp_path):
    from kvsim.analysis.report import build_report
    from kvsim.analysis.sweep import SweepSpec, run_sweep

    trace = four_requests(builder).write(tmp_path / "t.parquet")
    base = SimConfig(hardware=tiny_hw, mode="cache", engine="interpreted", dram_gb=0)
    spec = SweepSpec(str(trace), ("lru", "fifo"), (400e-9,), (0.0,), base)  # 4 blocks
    res = run_sweep(spec, tmp_path / "sw", jobs=1)
    t = res.table.set_index("policy")
    assert list(t.index) == ["lru", "fifo", "belady", "optimal"]
    assert (t["mode"] == "cache").all() and t["p99_step_us"].isna().all()
    assert t.loc["lru", "hbm_capacity_blocks"] == 4
    assert t.loc["lru", "gap_hbm_hit_rate_to_optimal"] == pytest.approx((24 - 20) / 48)
    assert (t["gap_hbm_hit_rate_to_optimal"] >= 0).all()
    assert res.summary["mode"] == "cache"
    rep = build_report(tmp_path / "sw", tmp_path / "r.html")
    text = rep.html_path.read_text()
    assert "hit-rate gap to optimal" in text and "(cache mode)" in text
