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
