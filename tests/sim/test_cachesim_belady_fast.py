"""The dedicated Belady loop of the cache simulator (``cachesim._replay_belady``).

It must evict exactly what the hooks of ``policies/belady.py`` evict through the generic
loop (same blocks, same order, including the choice among never-used-again blocks), and
every victim must be a block whose next use is the farthest among the residents.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.sim import cachesim
from kvsim.sim.cachesim import next_use_of, remap_keys, simulate_cache


def _streams():
    rng = np.random.default_rng(7)
    out = [(rng.zipf(1.2, 4000) % 500).astype(np.int64),  # skewed, many reuses
           rng.integers(0, 3000, 4000).astype(np.int64),  # mostly never used again: ties
           np.concatenate([np.tile(np.arange(120), 5), rng.integers(0, 40, 800)])]
    return out


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 100])
def test_fast_path_evicts_the_same_blocks_as_the_hooks(capacity):
    for keys in _streams():
        fast = simulate_cache(keys, capacity, "belady", record_victims=True)
        hooks = simulate_cache(keys, capacity, "belady", record_victims=True, fast_path=False)
        assert (fast.hits, fast.misses, fast.evictions) == (hooks.hits, hooks.misses,
                                                             hooks.evictions)
        assert fast.evictions > 0
        np.testing.assert_array_equal(fast.victims, hooks.victims)


def test_every_victim_has_the_farthest_next_use():
    # Brute force: replay the victims and check each against the resident set.
    keys = _streams()[0][:1500]
    capacity = 16
    r = simulate_cache(keys, capacity, "belady", record_victims=True)
    ids, _ = remap_keys(keys)
    nxt = next_use_of(ids, int(ids.max()) + 1)
    resident: dict[int, int] = {}  # dense id -> next use
    victims = iter(r.victims.tolist())
    misses = 0
    for i, b in enumerate(ids.tolist()):
        if b not in resident:
            misses += 1
            if len(resident) == capacity:
                v = next(victims)
                assert resident[v] == max(resident.values()), f"access {i}"
                del resident[v]
        resident[b] = int(nxt[i])
    assert misses == r.misses
    assert next(victims, None) is None


def test_fast_path_is_taken_only_for_builtin_belady_without_runners_up(monkeypatch):
    calls = []
    real = cachesim._replay_belady

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(cachesim, "_replay_belady", spy)
    keys = np.array([1, 2, 3, 1, 2, 3, 4, 1], np.int64)
    simulate_cache(keys, 2, "belady")
    assert len(calls) == 1
    simulate_cache(keys, 2, "belady", n_alt=3)  # runners-up: the hooks' victim() fills them
    simulate_cache(keys, 2, "belady", fast_path=False)
    simulate_cache(keys, 2, "lru")
    assert len(calls) == 1
