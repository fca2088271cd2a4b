"""Predictive: evict the candidate whose predicted next use is farthest away.

The predicted time of the next use (absolute engine clock, microseconds) comes from the
best evidence the block's intent carries, in this order:

1. ``deadline_us`` (>= 0): the serving layer's deadline for the next use of the block;
2. ``target_decode_step`` (>= 0): the step at which it is next needed, converted at
   ``step_time_us`` per step (``params["step_time_us"]``, default 20 ms);
3. reuse rate: with ``access_count >= 2``, ``last_access_us + mean gap`` where the mean gap
   is ``(last_access_us - insert_us) / (access_count - 1)``;
4. no evidence: never (+inf) -- evicted first, least recently used first among them.

A prediction that has **passed** without the use happening is evidence of nothing any
more: the block is then ranked as case 4 (never; evicted first).  Without this, a block
whose deadline or predicted step went by unused would keep the earliest possible time,
i.e. the strongest protection, for ever, and such blocks would fill the cache (the flaw
``deadline`` v1 had, docs/policies.md).

The prediction is made at ``on_insert``/``on_hit`` and kept as a time-invariant key in an
indexed heap (``-predicted``), O(log n) per hook; a second heap orders the finite
predictions by time, and ``victim`` first re-files those already past ``now_us`` as
"never" (each at most once per hook), keeping their tie-break (the sequence number of their
last hook, so they go least recently used first among the never-blocks).  Score:
``-predicted_next_use_us`` (sooner = keep; ``-inf`` once passed).
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

NAME = "predictive"
DESCRIPTION = "Predictive: evict the block whose predicted next use (deadline/step/rate) is farthest."
OFFLINE = False
REASONS = ("predicted next use (from its deadline) is the farthest away",
           "predicted next use (from its target decode step) is the farthest away",
           "predicted next use (from its reuse rate) is the farthest away",
           "no evidence it will be used again (no deadline, target step or reuse, or its "
           "predicted use passed unused)")

#: Engine step time used to turn a target step into a time.  Source: an order of
#: magnitude -- decode steps (TPOT) of 7B-70B models on one H100 node are tens of ms in
#: vLLM's published benchmarks; set params["step_time_us"] from the trace's STEP rows.
STEP_TIME_US = 20_000.0


STATE = StateSpec(i64=(("heap", 4),  # blocks keyed by -predicted (tie, heap, pos, meta)
                        "counter",  # [hooks so far]: the tie-break
                        ("expiry", 4)),  # finite predictions keyed by their time
                   f64=("key",  # the keys of heap
                        "step_us",  # [step time, us]
                        "expiry_key"))  # the keys of expiry


def init(capacity_blocks, num_slots, params):
    step_us = np.array([float(params.get("step_time_us", STEP_TIME_US))], np.float64)
    key, *heap = heap_new(num_slots)
    ekey, *expiry = heap_new(num_slots)
    return STATE.new(heap=heap, counter=np.zeros(1, np.int64), expiry=expiry, key=key,
                     step_us=step_us, expiry_key=ekey)


@njit(cache=True)
def _predict(view, b, step_time_us):
    """(predicted next use in us, evidence code = reason code)."""
    if view.deadline_us[b] >= 0:
        return float(view.deadline_us[b]), 0
    if view.target_decode_step[b] >= 0:
        return view.target_decode_step[b] * step_time_us, 1
    n = view.access_count[b]
    if n >= 2:
        gap = (view.last_access_us[b] - view.insert_us[b]) / (n - 1)
        return view.last_access_us[b] + gap, 2
    return np.inf, 3


@njit(cache=True)
def _file_expiry(state, b, t):
    """Track ``b``'s finite prediction ``t`` in the expiry heap (or drop it there)."""
    he = heap_of(state.expiry_key, state.expiry)
    if he[3][b] >= 0:
        heap_remove(he, b)
    if t < np.inf:
        heap_push(he, b, t, state.counter[0])


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    counter = state.counter
    counter[0] += 1
    t, _ = _predict(view, b, state.step_us[0])
    heap_push(heap_of(state.key, state.heap), b, -t, counter[0])
    _file_expiry(state, b, t)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    counter = state.counter
    counter[0] += 1
    t, _ = _predict(view, b, state.step_us[0])
    heap_update(heap_of(state.key, state.heap), b, -t, counter[0])
    _file_expiry(state, b, t)


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    heap_remove(heap_of(state.key, state.heap), b)
    he = heap_of(state.expiry_key, state.expiry)
    if he[3][b] >= 0:
        heap_remove(he, b)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    he = heap_of(state.expiry_key, state.expiry)
    h = heap_of(state.key, state.heap)
    e = heap_peek(he)
    while e >= 0 and he[0][e] < now_us:  # passed unused: no evidence any more
        heap_remove(he, e)
        heap_update(h, e, -np.inf, h[1][e])
        e = heap_peek(he)
    b = heap_peek(h)
    if b < 0:
        return -1, 0, 0
    code = 3
    if h[0][b] > -np.inf:
        _, code = _predict(view, b, state.step_us[0])
    return b, code, heap_smallest(h, alt_blocks, alt_scores)


def explain(row, now_us, step_time_us=STEP_TIME_US):
    """Named terms: the prediction, which evidence produced it, and the time until it."""
    deadline = int(row.get("deadline_us", -1))
    step = int(row.get("target_decode_step", -1))
    count = int(row.get("access_count", 0))
    last = float(row.get("last_access_us", 0.0))
    insert = float(row.get("insert_us", last))
    if deadline >= 0:
        t, source = float(deadline), 0.0
    elif step >= 0:
        t, source = step * step_time_us, 1.0
    elif count >= 2:
        t, source = last + (last - insert) / (count - 1), 2.0
    else:
        t, source = float("inf"), 3.0
    if t < float(now_us):  # passed without the use: no evidence any more
        t, source = float("inf"), 3.0
    return {"predicted_next_use_us": t, "evidence": source,
            "time_to_predicted_use_us": t - float(now_us), "score": -t}
