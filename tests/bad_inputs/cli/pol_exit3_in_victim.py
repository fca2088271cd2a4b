"""Bad-input corpus: a user policy that calls sys.exit(3) in victim."""
NAME = "pol_exit3_in_victim"
DESCRIPTION = "corpus policy: calls sys.exit(3) in victim"
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
    raise SystemExit(3)
