"""Belady's MIN is never beaten on hit count by an online policy (single tier, size 1)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.cachesim.simulator import simulate_cache
from kvsim.policy.registry import list_policies


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.integers(0, 12), min_size=1, max_size=80),
       capacity=st.integers(1, 8))
def test_belady_is_a_bound(keys, capacity):
    keys = np.array(keys, np.int64)
    best = simulate_cache(keys, capacity, "belady").hits
    for policy in list_policies():
        if not policy.offline:
            assert simulate_cache(keys, capacity, policy).hits <= best, policy.name
