"""Hot/cold: two classes, cold evicted first, LRU inside each class.

A block is HOT when its priority is at least ``Priority.HOT`` or it was reused since it
entered the tier (``access_count >= 2``); otherwise COLD.  The class is decided when the
block enters the candidate set (``on_insert``) and refreshed on every hit (``on_hit``);
an intent change between hooks is seen at the next hook (documented approximation: hooks
are the only points where a policy sees time pass).  Two lists share one set of links;
all hooks O(1).  Score: 1 for hot, 0 for cold.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (
    NIL,
    Priority,
    StateSpec,
    dll_ends,
    dll_links,
    dll_push_tail,
    dll_remove,
)

NAME = "hotcold"
DESCRIPTION = "Hot/cold: blocks with priority >= HOT or reuse are hot; cold evicted first, LRU."
OFFLINE = False
REASONS = ("cold (priority below HOT, not reused) and least recently used among cold blocks",
           "hot, but no cold candidate left: least recently used among hot blocks")

HOT_PRIORITY = int(Priority.HOT)

STATE = StateSpec(i64=("prev", "nxt",  # links shared by the two lists
                        "cold", "hot"),  # [head, tail, size] of each class's list, head = LRU
                   i8=("cls",))  # per block: 1 hot, 0 cold


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    return STATE.new(prev=prev, nxt=nxt, cold=dll_ends(), hot=dll_ends(),
                     cls=np.zeros(num_slots, np.int8))


@njit(cache=True)
def _is_hot(view, b):
    return view.priority[b] >= HOT_PRIORITY or view.access_count[b] >= 2


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    prev, nxt, cold, hot, cls = state.prev, state.nxt, state.cold, state.hot, state.cls
    if _is_hot(view, b):
        dll_push_tail(prev, nxt, hot, b)
        cls[b] = 1
    else:
        dll_push_tail(prev, nxt, cold, b)
        cls[b] = 0


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    prev, nxt, cold, hot, cls = state.prev, state.nxt, state.cold, state.hot, state.cls
    dll_remove(prev, nxt, hot if cls[b] == 1 else cold, b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    on_remove(state, view, b)
    on_insert(state, view, b, now_us)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    nxt, cold, hot, cls = state.nxt, state.cold, state.hot, state.cls
    b = cold[0] if cold[2] > 0 else hot[0]
    if b == NIL:
        return NIL, 0, 0
    n_alt = 0  # runners-up: the rest of the class list, then the hot list
    c = b
    in_hot = cls[b] == 1
    while n_alt < alt_blocks.shape[0]:
        if c == NIL:
            if in_hot:
                break
            in_hot = True
            c = hot[0]
            continue
        alt_blocks[n_alt] = c
        alt_scores[n_alt] = cls[c]
        n_alt += 1
        c = nxt[c]
    return b, int(cls[b]), n_alt


def explain(row, now_us):
    """Named terms: the two hotness tests and the idle time that orders each class."""
    by_priority = float(int(row.get("priority", 0)) >= HOT_PRIORITY)
    by_reuse = float(int(row.get("access_count", 0)) >= 2)
    hot = float(by_priority or by_reuse)
    return {"hot_by_priority": by_priority, "hot_by_reuse": by_reuse, "hot": hot,
            "idle_us": float(now_us) - float(row.get("last_access_us", 0.0)), "score": hot}
