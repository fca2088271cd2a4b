"""Bad-input corpus: a user policy that names a block id beyond the pool."""
NAME = "pol_victim_out_of_range"
DESCRIPTION = "corpus policy: names a block id beyond the pool"
REASONS = ("first in, first out",)


def init(capacity_blocks, num_slots, params):
    return ([],)


def on_insert(state, view, b, now_us):
    state[0].append(b)
    pass


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    order = state[0]
    if not order:
        return -1, 0, 0
    return 10**9, 0, 0
