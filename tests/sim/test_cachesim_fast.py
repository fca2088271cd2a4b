"""The dedicated single-tier loops (kvsim.cachesim.fast_loops) evict exactly what the hooks of
``policies/<name>.py`` evict through the generic loop: same blocks, same order.

The hook path runs interpreted here (the same hook source, executed by Python, with the
generic loop's interpreted twin), so no per-policy loop is compiled; the hooks' own
compiled helpers (the list and heap operations of kvsim.policy.api) stay compiled."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvsim.cachesim import simulator as cachesim
from kvsim.cachesim.simulator import simulate_cache
from kvsim.policy.registry import get_policy

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


# --- the key domain's edges: prefetching loops (kvsim.jit.prefetch), wide and extreme keys


_I64 = np.iinfo(np.int64)


def _edge_streams():
    base = _streams()[0]  # skewed, 3000 accesses over <= 400 keys
    return {"near int64 max": _I64.max - base,  # direct table, lo = max - 399
            "near int64 min": _I64.min + base,
            "both int64 ends": np.where(base % 2 == 0, _I64.min + base, _I64.max - base),
            "wide, sparse": base * 1_000_003 - 7 * 10**12}


@pytest.mark.parametrize("policy", FAST + ["belady"])
@pytest.mark.parametrize("capacity", [1, 9])
def test_extreme_and_wide_keys_evict_what_the_hooks_evict(policy, capacity):
    """Keys at both ends of int64 (a direct table over a small span near one end; the
    np.unique path when they span both ends) and a wide sparse range give the same
    victims, as dense ids in order of first appearance, and the same keys_by_id as the
    generic hook loop."""
    for name, keys in _edge_streams().items():
        fast = simulate_cache(keys, capacity, policy, record_victims=True)
        slow = simulate_cache(keys, capacity, policy, record_victims=True, fast_path=False)
        assert (fast.hits, fast.misses, fast.evictions, fast.unique_keys) == (
            slow.hits, slow.misses, slow.evictions, slow.unique_keys), name
        np.testing.assert_array_equal(fast.victims, slow.victims, err_msg=name)
        np.testing.assert_array_equal(fast.keys_by_id, slow.keys_by_id, err_msg=name)
        assert fast.evictions > 0, name


def _arc_reference(keys, c):
    """ARC as policies/arc.py's docstring states it (libCacheSim's ARC), on Python
    OrderedDicts: ``(victims as keys, largest |T1|+|T2|+|B1|+|B2| seen)``."""
    from collections import OrderedDict

    T1, T2, B1, B2 = OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict()
    p, victims, most = 0.0, [], 0
    for x in keys.tolist():
        if x in T1 or x in T2:
            (T1 if x in T1 else T2).pop(x)
            T2[x] = None
            continue
        hit_b1, hit_b2 = x in B1, x in B2
        if hit_b1:
            p = min(p + max(len(B2) / len(B1), 1.0), float(c))
            B1.pop(x)
        elif hit_b2:
            p = max(p - max(len(B1) / len(B2), 1.0), 0.0)
            B2.pop(x)
        if len(T1) + len(T2) >= c:
            n1 = len(T1)
            replace_t1 = (n1 > 0 and (n1 > p or (n1 == p and hit_b2))) or not T2
            ghost = True
            if hit_b1 or hit_b2:
                from_t1 = replace_t1
            elif n1 + len(B1) + 1 > c:
                if B1:
                    B1.popitem(last=False)
                    from_t1 = replace_t1
                else:
                    from_t1, ghost = True, False
            else:
                if n1 + len(B1) + len(T2) + len(B2) >= 2 * c and B2:
                    B2.popitem(last=False)
                from_t1 = replace_t1
            v, _ = (T1 if from_t1 else T2).popitem(last=False)
            if ghost:
                (B1 if from_t1 else B2)[v] = None
            victims.append(v)
        (T2 if hit_b1 or hit_b2 else T1)[x] = None
        most = max(most, len(T1) + len(T2) + len(B1) + len(B2))
    return victims, most


@pytest.mark.parametrize("capacity", [1, 2, 5, 16])
def test_arc_with_full_ghost_lists_matches_a_plain_reference(capacity):
    """The arc loop's slots are sized to |T1|+|T2|+|B1|+|B2| <= 2c: streams that reach
    that bound (checked on the reference) evict the same keys as a plain-Python ARC."""
    rng = np.random.default_rng(5)
    hot = rng.integers(0, 3 * capacity + 3, 4000)
    keys = np.where(rng.random(4000) < 0.3, rng.integers(10**6, 2 * 10**6, 4000), hot)
    keys = np.concatenate([np.tile(np.arange(2 * capacity + 1), 3), keys]).astype(np.int64)
    want, most = _arc_reference(keys, capacity)
    assert most == 2 * capacity  # the ghost lists did fill up
    got = simulate_cache(keys, capacity, "arc", record_victims=True)
    np.testing.assert_array_equal(got.keys_by_id[got.victims], want)
    assert got.misses == got.evictions + min(capacity, got.unique_keys)


def test_prefetch_rule_follows_the_table_size():
    from kvsim.cachesim import fast_loops as f

    assert f.prefetch_distance(f.PREFETCH_MIN_SPAN - 1) == 0
    assert f.prefetch_distance(f.PREFETCH_MIN_SPAN) == f.AHEAD > 0


@pytest.mark.parametrize("policy", FAST + ["belady"])
def test_prefetching_loops_evict_what_the_hooks_evict(policy, monkeypatch):
    """The test streams' tables are small (no prefetch by the rule); with the threshold
    at 1 the same loops prefetch, including in the last AHEAD accesses, and must give
    the same victims as the hook path."""
    from kvsim.cachesim import fast_loops as f

    monkeypatch.setattr(f, "PREFETCH_MIN_SPAN", 1)
    seen = []
    real = f.prefetch_distance
    monkeypatch.setattr(f, "prefetch_distance", lambda span: seen.append(real(span)) or
                        seen[-1])
    for keys in _streams() + [_edge_streams()["near int64 max"], np.arange(5)]:
        for cap in (1, 7, 50):
            fast = simulate_cache(keys, cap, policy, record_victims=True)
            slow = simulate_cache(keys, cap, policy, record_victims=True, fast_path=False)
            assert (fast.hits, fast.misses, fast.unique_keys) == (
                slow.hits, slow.misses, slow.unique_keys)
            np.testing.assert_array_equal(fast.victims, slow.victims)
            np.testing.assert_array_equal(fast.keys_by_id, slow.keys_by_id)
    assert seen and all(a == f.AHEAD for a in seen)
