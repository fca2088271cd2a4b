"""One-pass hit-rate curves (kvsim.cachesim.curves): exact equality with per-capacity simulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvsim.cachesim.curves import (
    block_stream,
    distance_histogram,
    hit_curve,
    mooncake_block_stream,
    shards_mask,
    stack_distances,
)
from kvsim.cachesim.simulator import simulate_cache
from kvsim.core.errors import KvsimInputError

REPO = Path(__file__).resolve().parents[2]


def _streams():
    rng = np.random.default_rng(7)
    yield "zipf", rng.zipf(1.2, 4000) % 500
    yield "uniform", rng.integers(0, 300, 3000)
    # prefix-chain shaped: sessions re-reading growing prefixes, like KV block streams
    keys, nxt = [], 10_000
    chains = [[] for _ in range(40)]
    for _ in range(400):
        c = chains[int(rng.integers(0, 40))]
        c.extend(range(nxt, nxt + int(rng.integers(1, 6))))
        nxt += 10
        keys.extend(c)
    yield "chains", np.asarray(keys, dtype=np.int64)
    yield "loop", np.tile(np.arange(50), 20)


CAPS = (1, 2, 3, 4, 7, 10, 16, 31, 50, 64, 100, 128, 200, 256, 299, 300, 400, 499, 500,
        1000, 5000)


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_one_pass_curve_equals_per_capacity_simulation(policy):
    for name, keys in _streams():
        curve = hit_curve(keys, CAPS, policies=(policy,))
        for cap, hits, misses in zip(curve["capacity_blocks"], curve["hits"], curve["misses"]):
            ref = simulate_cache(keys, int(cap), policy)
            assert (hits, misses) == (ref.hits, ref.misses), (name, policy, cap)


def test_exact_distances_small_example():
    keys = np.array([1, 2, 3, 1, 2, 4, 1, 3])
    # LRU: distinct keys since the previous access, the key included
    assert stack_distances(keys, "lru").tolist() == [0, 0, 0, 3, 3, 0, 3, 4]
    # OPT (the key just accessed is always on top): after 1,2,3 the stack is [3, 1, 2]
    # (below the top, sooner next use first: 1 at t3, 2 at t4), so 1 hits at depth 2;
    # then [1, 3, 2]: 2 at depth 3; then [2, 1, 3]; 4 is new: [4, 1, 3, 2] (2 is never
    # used again, so it sinks); 1 at depth 2; then [1, 4, 3, 2]: 3 at depth 3.
    assert stack_distances(keys, "belady").tolist() == [0, 0, 0, 2, 3, 0, 2, 3]
    for cap in range(1, 6):
        curve = hit_curve(keys, [cap])
        for pol in ("lru", "belady"):
            assert int(curve[curve.policy == pol]["hits"].iloc[0]) == \
                simulate_cache(keys, cap, pol).hits


def test_empty_and_single_key():
    df = hit_curve(np.zeros(0, np.int64), [1, 5])
    assert df["hits"].tolist() == [0, 0, 0, 0]
    df = hit_curve(np.full(10, 42), [1, 3])
    assert df["hits"].tolist() == [9, 9, 9, 9]
    assert df["misses"].tolist() == [1, 1, 1, 1]


def test_shards_mask_is_per_key_and_seeded():
    keys = np.random.default_rng(1).integers(0, 10_000, 50_000)
    m = shards_mask(keys, 0.1, seed=3)
    # every access of a key is in or out together
    inside = set(keys[m].tolist())
    assert not (inside & set(keys[~m].tolist()))
    assert np.array_equal(m, shards_mask(keys, 0.1, seed=3))
    assert not np.array_equal(m, shards_mask(keys, 0.1, seed=4))
    frac = len(inside) / len(set(keys.tolist()))
    assert 0.08 < frac < 0.12
    assert shards_mask(keys, 1.0).all()


def test_shards_rate_one_is_exact_and_sampled_is_close():
    keys = np.random.default_rng(2).zipf(1.1, 200_000) % 20_000
    caps = [100, 1000, 5000, 10_000]
    exact = hit_curve(keys, caps, policies=("lru",))
    assert exact["hits"].tolist() == hit_curve(keys, caps, policies=("lru",),
                                               sample_rate=1.0)["hits"].tolist()
    est = hit_curve(keys, caps, policies=("lru",), sample_rate=0.1)
    err = np.abs(est["hit_rate"].to_numpy() - exact["hit_rate"].to_numpy())
    assert err.max() < 0.03, err


def test_block_stream_of_event_file():
    keys = block_stream(REPO / "traces" / "sample_chat.parquet")
    # full, hashed ALLOCATE rows of the sample trace; inspect reports 408 unique blocks
    assert len(keys) > 0 and (keys != 0).all()
    h = distance_histogram(keys, "lru")
    assert h.counts[0] == len(np.unique(keys))  # cold misses = distinct keys


def test_bad_input():
    with pytest.raises(KvsimInputError, match="policy"):
        hit_curve(np.arange(5), [1], policies=("fifo",))
    with pytest.raises(KvsimInputError, match="sample_rate"):
        hit_curve(np.arange(5), [1], sample_rate=0.0)
    with pytest.raises(KvsimInputError, match="capacity_blocks"):
        hit_curve(np.arange(5), [0])


@pytest.mark.traces
def test_mooncake_curves_exact_and_shards_error(shared_traces):
    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    keys = mooncake_block_stream(path)
    assert (len(keys), len(np.unique(keys))) == (288_500, 182_790)  # README facts
    caps = [1000, 10_000, 50_000]
    exact = hit_curve(keys, caps)
    for pol in ("lru", "belady"):
        sub = exact[exact.policy == pol]
        for cap, hits in zip(sub["capacity_blocks"], sub["hits"]):
            assert hits == simulate_cache(keys, int(cap), pol).hits
    est = hit_curve(keys, caps, sample_rate=0.1)
    err = np.abs(est["hit_rate"].to_numpy() - exact["hit_rate"].to_numpy())
    assert err.max() < 0.02, err  # docs/sweep.md: measured error table
