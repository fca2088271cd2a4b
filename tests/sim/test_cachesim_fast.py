"""The dedicated single-tier loops (kvsim.sim.cachesim_fast) evict exactly what the hooks of
``policies/<name>.py`` evict through the generic loop: same blocks, same order.

The hook path runs interpreted here (the same hook source, executed by Python, with the
generic loop's interpreted twin), so no per-policy loop is compiled; the hooks' own
compiled helpers (the list and heap operations of kvsim.policy_api) stay compiled."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.policy_registry import get_policy
from kvsim.sim import cachesim
from kvsim.sim.cachesim import simulate_cache

FAST = ["lru", "fifo", "lfu", "sieve", "s3fifo", "arc"]


def _py(f):
    return getattr(f, "py_func", f)


def _hook_path(name: str):
    """The built-in policy with its hooks as plain Python (so simulate_cache takes the
    generic, interpreted loop)."""
    p = get_policy(name)
    return dataclasses.replace(p, on_insert=_py(p.on_insert), on_hit=_py(p.on_hit),
                               on_remove=_py(p.on_remove), victim=_py(p.victim),
                               on_miss=_py(p.on_miss), compiled=False)


def _streams():
    rng = np.random.default_rng(11)
    return [(rng.zipf(1.2, 3000) % 400).astype(np.int64),  # skewed, many reuses
            rng.integers(0, 2000, 3000).astype(np.int64),  # mostly one-hit wonders
            np.concatenate([np.tile(np.arange(90), 6), rng.integers(0, 30, 600),
                            np.tile(np.arange(50, 200), 3)]).astype(np.int64),  # scans
            (rng.zipf(1.05, 3000) * 7919 % 5000).astype(np.int64)]


@pytest.mark.parametrize("policy", FAST)
@pytest.mark.parametrize("capacity", [1, 2, 7, 50, 128])
def test_dedicated_loop_evicts_what_the_hooks_evict(policy, capacity):
    hooks = _hook_path(policy)
    for keys in _streams():
        fast = simulate_cache(keys, capacity, policy, record_victims=True)
        slow = simulate_cache(keys, capacity, hooks, record_victims=True)
        assert (fast.hits, fast.misses, fast.evictions) == (slow.hits, slow.misses,
                                                             slow.evictions), policy
        np.testing.assert_array_equal(fast.victims, slow.victims)
    assert fast.evictions > 0


def test_s3fifo_params_reach_the_dedicated_loop():
    keys = _streams()[0]
    params = {"small_size_ratio": 0.25, "ghost_size_ratio": 0.5}
    fast = simulate_cache(keys, 40, "s3fifo", params=params, record_victims=True)
    slow = simulate_cache(keys, 40, _hook_path("s3fifo"), params=params, record_victims=True)
    np.testing.assert_array_equal(fast.victims, slow.victims)
    default = simulate_cache(keys, 40, "s3fifo", record_victims=True)
    assert not np.array_equal(default.victims, fast.victims)  # the params do matter


def test_dedicated_loop_only_for_builtin_hooks_without_runners_up(monkeypatch):
    calls = []
    real = cachesim._dedicated

    def spy(*args):
        loop = real(*args)
        calls.append(loop is not None)
        return loop

    monkeypatch.setattr(cachesim, "_dedicated", spy)
    keys = np.array([1, 2, 3, 1, 2, 3, 4, 1], np.int64)
    simulate_cache(keys, 2, "lru")
    simulate_cache(keys, 2, _hook_path("lru"))  # other hook functions: generic loop
    simulate_cache(keys, 2, "lru", n_alt=2)  # runners-up: only the hooks produce them
    simulate_cache(keys, 2, "lru", fast_path=False)
    assert calls == [True, False]


@pytest.mark.parametrize("policy", FAST + ["belady"])
def test_key_domain_paths_agree(policy):
    """The loops read keys directly (fused remap, table of the key span), wide keys
    through np.unique's dense ids, or prepared ids: same victims (as dense ids in order
    of first appearance), same keys_by_id as remap_keys."""
    keys = _streams()[3]
    want_ids, want_keys = cachesim.remap_keys(keys)
    direct = simulate_cache(keys, 37, policy, record_victims=True)
    wide = simulate_cache(keys * (1 << 40) - 5, 37, policy, record_victims=True)
    prep = simulate_cache(cachesim.prepare_keys(keys), 37, policy, record_victims=True)
    hooks = simulate_cache(keys, 37, policy, record_victims=True, fast_path=False)
    np.testing.assert_array_equal(direct.keys_by_id, want_keys)
    np.testing.assert_array_equal(wide.keys_by_id, want_keys * (1 << 40) - 5)
    np.testing.assert_array_equal(prep.keys_by_id, want_keys)
    for r in (direct, wide, prep):
        assert (r.hits, r.misses, r.evictions, r.unique_keys) == (
            hooks.hits, hooks.misses, hooks.evictions, hooks.unique_keys)
        np.testing.assert_array_equal(r.victims, hooks.victims)
    assert direct.unique_keys == want_keys.shape[0] and direct.evictions > 100


@pytest.mark.parametrize("policy", FAST + ["belady"])
def test_capacity_above_stream_length_and_empty_stream(policy):
    keys = np.array([5, 9, 5, 7, 9, 9, 11], np.int64)
    r = simulate_cache(keys, 10**9, policy)  # slot arrays sized to the stream, not 10^9
    assert (r.hits, r.misses, r.evictions, r.unique_keys) == (3, 4, 0, 4)
    e = simulate_cache(np.zeros(0, np.int64), 3, policy)
    assert (e.hits, e.misses, e.unique_keys) == (0, 0, 0)
