"""Bad-input corpus: a user policy that raises a BaseException in on_insert."""
NAME = "pol_base_exception"
DESCRIPTION = "corpus policy: raises a BaseException in on_insert"
REASONS = ("first in, first out",)


def init(capacity_blocks, num_slots, params):
    return ([],)


def on_insert(state, view, b, now_us):
    state[0].append(b)
    raise BaseException('odd')


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    order = state[0]
    if not order:
        return -1, 0, 0
    return order[0], 0, 0
