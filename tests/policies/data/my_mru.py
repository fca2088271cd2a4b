"""A user policy in plain Python (no numba): most recently used goes first.

Shows the ``--policy-file`` path: kvsim runs the interpreted twin of its loops with these
hooks.  State is a tuple holding a Python list ordered from least to most recent.
"""

NAME = "my_mru"
DESCRIPTION = "Most recently used first (plain-Python example policy)."
REASONS = ("most recently used: touched after every other candidate",)


def init(capacity_blocks, num_slots, params):
    return ([],)


def on_insert(state, view, b, now_us):
    state[0].append(b)


def on_hit(state, view, b, now_us):
    order = state[0]
    order.remove(b)
    order.append(b)


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    order = state[0]
    if not order:
        return -1, 0, 0
    n_alt = min(len(order), alt_blocks.shape[0])
    for i in range(n_alt):
        alt_blocks[i] = order[-1 - i]
        alt_scores[i] = -view.last_access_us[order[-1 - i]]
    return order[-1], 0, n_alt
