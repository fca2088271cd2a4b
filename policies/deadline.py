"""Deadline: keep what is needed soonest and costs most to lose; pinned blocks last.

Keep score (higher = keep), in microseconds so every term is comparable:

    score = class_term + urgency_term + slack_term + recompute_term + request_term

``class_term = CLASS_WEIGHT_US * priority``
    The serving layer's class (COLD 0 .. DECODE_CRITICAL 3).  1000 s per class, so the class
    is lexicographic: it outweighs any deadline difference a cached block can have.  A HOT
    prefix of a session expected back in 40 s must outrank an idle WARM batch block whose
    (no-deadline) horizon is 1 s; with 1 s per class the returning session lost (measured
    on deadline_pressure: 1,952 decode-critical misses against lru's 95).
``urgency_term``  (minus the time until the block is expected to be needed)
    With a deadline: ``now_us - deadline_us``.  Without one: the block is expected one
    horizon plus its idle time from now (recency as evidence of reuse, so these blocks
    go least recently used first): ``-(NO_DEADLINE_HORIZON_US + now_us - last_access_us)``.
``slack_term = -SLACK_WEIGHT * slack_us``
    Slack left at the last intent update; less slack = the request is closer to missing
    its deadline = keep.  Half weight: the deadline already carries most of the urgency.
``recompute_term = RECOMPUTE_WEIGHT * recompute_cost_us``
    What losing the block costs if it is needed again (prefill time).  kvsim's blocks of
    one tier have one size, so cost per block ranks like cost per byte.
``request_term = REQUEST_PRIORITY_WEIGHT_US * request_priority``
    The request's own priority (0..100): 100 points = one class (1000 s).

Pinned blocks (``view.pinned``: pin requested or DECODE_CRITICAL) are evicted only when
no unpinned candidate remains.

Exact without scanning: ``now_us`` enters a block's score with coefficient +1 (deadline)
or -1 (no deadline), so within each of those two groups the ORDER is fixed between hooks.
Each group is an indexed heap keyed by the static part of the score (two more heaps for
pinned blocks); ``victim`` compares the two heap minima at the current ``now_us``.
O(log n) per hook.  Approximation: intent fields are read at ``on_insert``/``on_hit``; a
change in between is seen at the next hook.
"""

import numpy as np
from numba import njit

from kvsim.policy_api import heap_new, heap_peek, heap_push, heap_remove, heap_size, heap_smallest

NAME = "deadline"
DESCRIPTION = "Deadline-aware: priority class, time to deadline, slack, recompute cost; pins last."
OFFLINE = False
REASONS = ("lowest keep score: far from its deadline, low class, cheap to recompute",
           "every remaining candidate is pinned: evicting the lowest-scored pinned block")

CLASS_WEIGHT_US = 1e9  # 1000 s per priority class: lexicographic (see docstring)
NO_DEADLINE_HORIZON_US = 1_000_000.0  # assumed next use of a block with no deadline: +1 s
SLACK_WEIGHT = 0.5  # slack counts half as much as time to deadline
RECOMPUTE_WEIGHT = 1.0  # one us of recompute avoided = one us of urgency
REQUEST_PRIORITY_WEIGHT_US = 1e7  # 100 request-priority points = one class


# Heaps (5 arrays each) in the state tuple: 0 = unpinned with deadline, 1 = unpinned
# without, 2 = pinned with deadline, 3 = pinned without; then ``where`` and ``seq``.


def init(capacity_blocks, num_slots, params):
    return (heap_new(num_slots) + heap_new(num_slots) + heap_new(num_slots)
            + heap_new(num_slots) + (np.full(num_slots, -1, np.int8), np.zeros(1, np.int64)))


@njit(cache=True)
def _heap(state, g):
    if g == 0:
        return state[0:5]
    if g == 1:
        return state[5:10]
    if g == 2:
        return state[10:15]
    return state[15:20]


@njit(cache=True)
def _static_score(view, b):
    """The keep score minus ``sign * now_us`` (fixed between hooks), and ``sign``."""
    base = (CLASS_WEIGHT_US * view.priority[b] - SLACK_WEIGHT * view.slack_us[b]
            + RECOMPUTE_WEIGHT * view.recompute_cost_us[b]
            + REQUEST_PRIORITY_WEIGHT_US * view.request_priority[b])
    if view.deadline_us[b] >= 0:
        return base - float(view.deadline_us[b]), 1.0
    return base - NO_DEADLINE_HORIZON_US + view.last_access_us[b], -1.0


@njit(cache=True)
def on_insert(state, view, b, now_us):
    seq = state[21]
    seq[0] += 1
    s, sign = _static_score(view, b)
    g = (2 if view.pinned[b] else 0) + (0 if sign > 0 else 1)
    state[20][b] = g
    heap_push(_heap(state, g), b, s, seq[0])


@njit(cache=True)
def on_remove(state, view, b):
    heap_remove(_heap(state, state[20][b]), b)
    state[20][b] = -1


@njit(cache=True)
def on_hit(state, view, b, now_us):
    on_remove(state, view, b)  # the group or pin may have changed: re-file the block
    on_insert(state, view, b, now_us)


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    code = 0
    g = 0
    if heap_size(_heap(state, 0)) + heap_size(_heap(state, 1)) == 0:
        g = 2
        code = 1
    hd = _heap(state, g)
    hn = _heap(state, g + 1)
    bd = heap_peek(hd)
    bn = heap_peek(hn)
    if bd < 0 and bn < 0:
        return -1, 0, 0
    k = alt_blocks.shape[0]
    if k == 0:  # no runners-up wanted: compare the two minima at now_us
        if bn < 0 or (bd >= 0 and hd[0][bd] + now_us <= hn[0][bn] - now_us):
            return bd, code, 0
        return bn, code, 0
    # Runners-up: the k smallest of each group at now_us, merged (victim first).
    m = k
    db = np.empty(m, np.int64)
    ds = np.empty(m, np.float64)
    nb = np.empty(m, np.int64)
    ns = np.empty(m, np.float64)
    nd = heap_smallest(hd, db, ds)
    nn = heap_smallest(hn, nb, ns)
    for i in range(nd):
        ds[i] += now_us
    for i in range(nn):
        ns[i] -= now_us
    i = 0
    j = 0
    out = 0
    first = -1
    while (i < nd or j < nn) and (out < k or first < 0):
        if j >= nn or (i < nd and ds[i] <= ns[j]):
            blk = db[i]
            sc = ds[i]
            i += 1
        else:
            blk = nb[j]
            sc = ns[j]
            j += 1
        if first < 0:
            first = blk
        if out < k:
            alt_blocks[out] = blk
            alt_scores[out] = sc
            out += 1
    return first, code, out


def explain(row, now_us):
    """Every named term of the keep score of one block at ``now_us``, and their sum."""
    now = float(now_us)
    deadline = int(row.get("deadline_us", -1))
    last = float(row.get("last_access_us", 0.0))
    if deadline >= 0:
        urgency = now - deadline
    else:
        urgency = -(NO_DEADLINE_HORIZON_US + now - last)
    terms = {
        "class_term": CLASS_WEIGHT_US * int(row.get("priority", 0)),
        "urgency_term": urgency,
        "slack_term": -SLACK_WEIGHT * float(row.get("slack_us", 0)),
        "recompute_term": RECOMPUTE_WEIGHT * float(row.get("recompute_cost_us", 0.0)),
        "request_term": REQUEST_PRIORITY_WEIGHT_US * int(row.get("request_priority", 0)),
    }
    terms["score"] = sum(terms.values())
    terms["pinned"] = float(bool(row.get("pinned", False)))
    return terms
