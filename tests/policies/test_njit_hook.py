"""``policy_api.njit_hook``: hooks it decorates behave exactly as ordinary ``njit``
hooks, from Python, from the compiled cache-simulator loop and its interpreted twin."""

from __future__ import annotations

import types

import numpy as np
import pytest
from numba import njit

from kvsim.cachesim.simulator import simulate_cache
from kvsim.policy.api import (
    dll_ends,
    dll_links,
    dll_move_to_tail,
    dll_push_tail,
    dll_remove,
    njit_hook,
)
from kvsim.policy.registry import get_policy, policy_from_module


def _lru_module(decorate, name):
    """A list LRU whose four hooks are decorated with ``decorate``."""
    mod = types.ModuleType(name)
    mod.NAME, mod.DESCRIPTION, mod.REASONS = name, "test LRU", ("lru",)

    def init(capacity_blocks, num_slots, params):
        prev, nxt = dll_links(num_slots)
        return (prev, nxt, dll_ends())

    def on_insert(state, view, b, now_us):
        dll_push_tail(state[0], state[1], state[2], b)

    def on_hit(state, view, b, now_us):
        dll_move_to_tail(state[0], state[1], state[2], b)

    def on_remove(state, view, b):
        dll_remove(state[0], state[1], state[2], b)

    def victim(state, view, now_us, alt_blocks, alt_scores):
        b = state[2][0]
        if b < 0:
            return -1, 0, 0
        return b, 0, 0

    mod.init = init
    mod.on_insert, mod.on_hit = decorate(on_insert), decorate(on_hit)
    mod.on_remove, mod.victim = decorate(on_remove), decorate(victim)
    return policy_from_module(mod, "test")


def test_njit_hook_policy_evicts_exactly_as_the_builtin_lru():
    keys = (np.random.default_rng(3).zipf(1.3, 3000) % 200).astype(np.int64)
    hooked = _lru_module(njit_hook, "lru_njit_hook_test")
    plain = _lru_module(lambda f: f, "lru_python_test")  # interpreted loop, Python hooks
    assert hooked.compiled and not plain.compiled
    for cap in (1, 5, 40):
        want = simulate_cache(keys, cap, "lru", record_victims=True)
        for pol in (hooked, plain):
            got = simulate_cache(keys, cap, pol, record_victims=True)
            assert (got.hits, got.misses) == (want.hits, want.misses)
            np.testing.assert_array_equal(got.victims, want.victims)
    assert want.evictions > 0


def test_njit_hook_is_callable_from_python_and_from_a_refcounting_caller():
    @njit_hook
    def bump(state, view, b, now_us):
        state[0][b] += 1

    @njit(cache=False)
    def caller(state, n):
        for i in range(n):
            bump(state, None, i % 3, 0.0)

    state = (np.zeros(3, np.int64),)
    bump(state, None, 1, 0.0)
    caller(state, 7)
    assert state[0].tolist() == [3, 3, 2]  # 1 from Python; i % 3 for i < 7: 3, 2, 2


@pytest.mark.parametrize("name", ["arc", "s3fifo", "sieve", "lfu"])
def test_builtin_hooks_keep_reference_counting(name):
    """``_nrt=False`` was withdrawn (numba's cache does not key on it and served
    refcount-free helpers to ordinary callers): no built-in hook may use it."""
    pol = get_policy(name)
    for hook in (pol.on_insert, pol.on_hit, pol.on_remove, pol.victim):
        assert hook.targetoptions.get("_nrt") is not False, (name, hook)
