"""A test-only eviction order: the cached block released LAST is evicted first (LIFO).
Used to prove the candidate order is pluggable (tests/memory/test_order_plugin.py)."""

import numpy as np
from numba import njit

from kvsim.policy.api import policy_state

NAME = "test-lifo"
DESCRIPTION = "most recently released cached block first"
REASONS = ("released most recently",)


def init(capacity_blocks, num_slots, params):
    # stack as an intrusive list: nxt[s] = top; sentinel s = num_slots
    return policy_state(i64=(np.full(num_slots + 1, num_slots, np.int64),
                             np.full(num_slots + 1, num_slots, np.int64)))


@njit(cache=True)
def on_insert(state, view, b, now_us):
    nxt, prv = state.i64[0], state.i64[1]
    s = nxt.shape[0] - 1
    top = nxt[s]
    nxt[s] = b
    prv[b] = s
    nxt[b] = top
    prv[top] = b


@njit(cache=True)
def on_hit(state, view, b, now_us):
    pass


@njit(cache=True)
def on_remove(state, view, b):
    nxt, prv = state.i64[0], state.i64[1]
    nxt[prv[b]] = nxt[b]
    prv[nxt[b]] = prv[b]


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    nxt = state.i64[0]
    s = nxt.shape[0] - 1
    if nxt[s] == s:
        return -1, 0, 0
    alt_blocks[0] = nxt[s]
    alt_scores[0] = 0.0
    return nxt[s], 0, 1
