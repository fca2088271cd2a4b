"""Bad-input corpus: a user policy that exits at import."""
NAME = "pol_exit0_at_import"
DESCRIPTION = "corpus policy: exits at import"
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
    return order[0], 0, 0
import sys
sys.exit(0)
