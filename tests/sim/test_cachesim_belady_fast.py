"""The dedicated Belady loop of the cache simulator (``cachesim._replay_belady``).

It must evict exactly what the hooks of ``policies/belady.py`` evict through the generic
loop (same blocks, same order, including the choice among never-used-again blocks), and
every victim must be a block whose next use is the farthest among the residents.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.cachesim import simulator as cachesim
from kvsim.cachesim.simulator import next_use_of, remap_keys, simulate_cache


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


@pytest.mark.parametrize("ahead", [0, 16])
def test_next_use_pass_int32_and_int64_agree_with_next_use_of(ahead):
    """The fused next-use pass writes int32 (NEVER = int32 max) when the stream is short
    enough, int64 (NEVER = int64 max) otherwise: same next uses, and the Belady loop
    evicts the same blocks with either."""
    from kvsim.cachesim import fast_loops as f

    keys = _streams()[1] + 1000  # keys 1000..3999, many never used again
    lo, span = int(keys.min()), int(keys.max() - keys.min()) + 1
    ids, _ = remap_keys(keys)
    want = next_use_of(ids, int(ids.max()) + 1)
    short = f.next_use_keys(keys, lo, f.next_use_table(keys.shape[0], span), ahead)
    wide = f.next_use_keys(keys, lo, np.full(span, np.iinfo(np.int64).max, np.int64), ahead)
    assert short.dtype == np.int32 and wide.dtype == np.int64
    never = want == np.iinfo(np.int64).max
    np.testing.assert_array_equal(short[~never], want[~never])
    assert (short[never] == np.iinfo(np.int32).max).all() and never.sum() > 1000
    np.testing.assert_array_equal(wide, want)
    runs = []
    for nu in (short, wide):
        victims = np.zeros(keys.shape[0], np.int64)
        uniq = np.empty(span, np.int64)
        r = f.replay_belady(keys, lo, f.new_table(span), nu, 64, victims, uniq, ahead)
        runs.append((r, victims[: r[2]]))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
