"""Bad-input corpus: a user policy that writes into the view."""
NAME = "pol_writes_view"
DESCRIPTION = "corpus policy: writes into the view"
REASONS = ("first in, first out",)


def init(capacity_blocks, num_slots, params):
    return ([],)


def on_insert(state, view, b, now_us):
    state[0].append(b)
    view.size_bytes[b] = 1


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    order = state[0]
    if not order:
        return -1, 0, 0
    return order[0], 0, 0
