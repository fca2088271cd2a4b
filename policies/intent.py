"""Intent: evict by what the serving layer says about the block, then LRU.

Rank (higher = keep) = ``8 * priority + phase_rank``; ties evict the least recently used
first.  Priority dominates (it is the serving layer's explicit statement of need);
phase ranks what the owning request is doing, least useful first:

====================  ====  ======================================================
phase                 rank  why
====================  ====  ======================================================
ROLLBACK              0     rejected speculative drafts: never read again
DONE                  1     request finished: only a new request sharing the prefix
DRAFT                 2     speculative tokens that may still be rejected
IDLE                  3     session between turns: likely to come back (agentic, chat)
PREFILL               4     being computed: chunks read again by the next chunk
VERIFY                5     read by the target model's verification step
DECODE                6     read by every decode step
====================  ====  ======================================================

The rank is computed from the view at ``on_insert``/``on_hit`` (an intent change between
hooks is seen at the next hook).  Indexed heap keyed by ``(rank, access sequence)``:
O(log n) per hook.  Score: the rank.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (
    StateSpec,
    heap_new,
    heap_of,
    heap_peek,
    heap_push,
    heap_remove,
    heap_smallest,
    heap_update,
)

NAME = "intent"
DESCRIPTION = "Intent-aware: lowest priority, then least useful phase, then least recently used."
OFFLINE = False
REASONS = ("lowest priority and phase rank among candidates, least recently used among ties",)

# Indexed by Phase value: PREFILL, DECODE, VERIFY, DRAFT, ROLLBACK, IDLE, DONE.
PHASE_RANK = np.array([4, 6, 5, 2, 0, 3, 1], np.int64)
PHASE_LEVELS = 8  # > max(PHASE_RANK): one priority step outranks every phase


STATE = StateSpec(i64=(("heap", 4),  # the candidates' heap: tie, heap, pos, meta
                        "counter"),  # [hooks so far]: the LRU tie-break
                   f64=("key",))  # the heap's keys (the ranks)


def init(capacity_blocks, num_slots, params):
    key, tie, heap, pos, meta = heap_new(num_slots)
    return STATE.new(heap=(tie, heap, pos, meta), counter=np.zeros(1, np.int64), key=key)


@njit(cache=True)
def _rank(view, b):
    ph = view.phase[b]
    pr = PHASE_RANK[ph] if 0 <= ph < PHASE_RANK.shape[0] else 0
    return float(PHASE_LEVELS * view.priority[b] + pr)


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    counter = state.counter
    counter[0] += 1
    heap_push(heap_of(state.key, state.heap), b, _rank(view, b), counter[0])


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    counter = state.counter
    counter[0] += 1
    heap_update(heap_of(state.key, state.heap), b, _rank(view, b), counter[0])


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    heap_remove(heap_of(state.key, state.heap), b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    h = heap_of(state.key, state.heap)
    b = heap_peek(h)
    if b < 0:
        return -1, 0, 0
    return b, 0, heap_smallest(h, alt_blocks, alt_scores)


def explain(row, now_us):
    """Named terms: priority rank, phase rank, their combined rank, and idle time."""
    priority = int(row.get("priority", 0))
    phase = int(row.get("phase", 0))
    phase_rank = int(PHASE_RANK[phase]) if 0 <= phase < len(PHASE_RANK) else 0
    rank = float(PHASE_LEVELS * priority + phase_rank)
    return {"priority_rank_term": float(PHASE_LEVELS * priority),
            "phase_rank_term": float(phase_rank),
            "idle_us": float(now_us) - float(row.get("last_access_us", 0.0)),
            "score": rank}


def prefetch_rank(view, b, now_us):
    """Live offload (kvsim/modes/live/live_prefetch.py): among units whose request states a
    deadline still ahead (the only statement of *when* it runs next), fetch back first the
    one the serving layer ranks highest (priority, then phase), then the earliest
    deadline; live phases only (PREFILL, DECODE, VERIFY).  Otherwise ``inf`` (never)."""
    ph = int(view.phase[b])
    dl = int(view.deadline_us[b])
    if ph > 2 or dl < 0 or float(dl) < now_us:
        return float("inf")
    return float(dl) - 1e9 * _rank.py_func(view, b)
