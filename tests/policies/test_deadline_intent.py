"""Exact victim orders of ``deadline`` for cached blocks of finished requests.

Hook level (tests/policies/harness.py ``Driver``), orders derived by hand in the comments.
Keep score = class_term + urgency_term + slack_term + recompute_term + request_term
(policies/deadline.py): class 1e6 us each; live blocks + 1e9 us (LIVE_NEED_US); horizons
without a usable deadline: live 0, IDLE 1e6 us, DONE 3.6e9 us.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.policy.api import Phase, Priority
from kvsim.policy.registry import get_policy
from tests.policies.harness import Driver

HOT = int(Priority.HOT)
IDLE = int(Phase.IDLE)


def _finished_blocks(d: Driver) -> None:
    """Blocks 0..5 accessed at now = 1..6 with the intents a serving layer gives them."""
    d.set_intent(0, phase=int(Phase.DONE), priority=int(Priority.COLD))  # finished, no reuse
    d.set_intent(1, phase=IDLE, priority=HOT)  # shared prefix: reuse expected, not when
    d.set_intent(2, phase=IDLE, priority=HOT, deadline_us=50)  # session back by t = 50
    d.set_intent(3, phase=IDLE, priority=HOT, deadline_us=10_000_000)  # back by t = 10 s
    d.set_intent(4, phase=IDLE, priority=HOT, pinned=True)  # pin of a finished request
    d.set_intent(5, phase=int(Phase.DECODE), priority=int(Priority.DECODE_CRITICAL),
                 pinned=True, deadline_us=0)  # a preempted decode: live and pinned
    for b in range(6):
        d.access(b)


def test_finished_blocks_by_expected_next_use():
    # At now = 6:
    # 0 DONE:               -(3.6e9 + 6 - 1)          = -3600000005
    # 1 IDLE, no deadline:  2e6 - (1e6 + 6 - 2)       = 999996
    # 2 IDLE, deadline 50:  2e6 + 6 - 50              = 1999956
    # 3 IDLE, deadline 1e7: 2e6 + 6 - 1e7             = -7999994
    # 4 IDLE, stale pin:    2e6 - (1e6 + 6 - 5)       = 999999   (the pin is ignored)
    # 5 live pinned:        pinned heap, last
    # Lowest first: 0, 3, 1, 4, 2, then 5 (reason 1).
    pol = get_policy("deadline")
    d = Driver(pol, capacity=6, num_slots=6, n_alt=6)
    _finished_blocks(d)
    v, code, n = d.raw_victim()
    assert (v, code, n) == (0, 0, 5)
    assert list(d.alt_b[:5]) == [0, 3, 1, 4, 2]
    np.testing.assert_allclose(d.alt_s[:5], [-3600000005, -7999994, 999996, 999999, 1999956])
    out = [d.evict_one() for _ in range(5)]
    assert out == [0, 3, 1, 4, 2]
    v, code, _ = d.raw_victim(d.alt_b[:0], d.alt_s[:0])
    assert (v, code) == (5, 1)


def test_expired_deadline_of_finished_request_carries_no_urgency():
    # Same blocks, drained at now = 100: block 2's deadline (50) has passed and its
    # request has finished, so it is ranked like an IDLE block without a deadline:
    # 0: -(3.6e9 + 99); 3: 2e6 + 100 - 1e7 = -7999900; 1: 2e6 - (1e6 + 98) = 999902;
    # 2: 2e6 - (1e6 + 97) = 999903; 4: 2e6 - (1e6 + 95) = 999905.
    # Lowest first: 0, 3, 1, 2, 4, then 5.  (Keeping the deadline, block 2 would score
    # 2e6 + 100 - 50 and be kept longest.)
    pol = get_policy("deadline")
    d = Driver(pol, capacity=6, num_slots=6, n_alt=6)
    _finished_blocks(d)
    d.now = 100.0
    v, code, n = d.raw_victim()
    assert list(d.alt_b[:5]) == [0, 3, 1, 2, 4]
    np.testing.assert_allclose(d.alt_s[:5], [-3600000099, -7999900, 999902, 999903, 999905])
    assert d.drain() == [0, 3, 1, 2, 4, 5]


def test_live_deadline_is_kept_when_overdue():
    # Both COLD, both with deadline 50, drained at now = 100.  Block 0 is live (PREFILL):
    # overdue, 1e9 + 100 - 50 (LIVE_NEED_US = 1e9: needed at its request's next step).  Block 1 is finished (IDLE): expired, ranked without a
    # deadline: -(1e6 + 100 - 2) = -1000098.  Lowest first: 1, 0.
    pol = get_policy("deadline")
    d = Driver(pol, capacity=2, num_slots=2)
    d.set_intent(0, deadline_us=50)
    d.set_intent(1, phase=IDLE, deadline_us=50)
    d.access(0)
    d.access(1)
    d.now = 100.0
    assert d.drain() == [1, 0]


def test_chain_shrinks_from_the_tail():
    # Blocks 0..3 of one finished request (same deadline, class, priority), prefill cost
    # growing with position (500, 510, 520, 530 us).  recompute_term = -cost, so the
    # deepest block goes first whichever order they were released in: 3, 2, 1, 0.
    # (With +cost the head went first and broke the chain: docs/benchmarks.md.)
    pol = get_policy("deadline")
    for release_order in ((3, 2, 1, 0), (0, 1, 2, 3)):
        d = Driver(pol, capacity=4, num_slots=4)
        for b in range(4):
            d.set_intent(b, phase=IDLE, priority=HOT, deadline_us=10_000_000,
                         recompute_cost_us=500.0 + 10 * b)
        for b in release_order:
            d.access(b)
        assert d.drain() == [3, 2, 1, 0]


def test_explain_terms():
    pol = get_policy("deadline")
    # A finished session's block (phase logged): deadline ahead, slack not counted.
    row = {"phase": IDLE, "priority": HOT, "deadline_us": 1_000, "slack_us": 900,
           "recompute_cost_us": 500.0, "request_priority": 90, "last_access_us": 0.0}
    t = pol.explain(row, 100.0)
    assert t["urgency_term"] == -900 and t["slack_term"] == 0.0
    assert t["recompute_term"] == -500.0 and t["request_term"] == 900_000
    assert t["score"] == pytest.approx(2e6 - 900 - 500 + 900_000)
    assert t["live"] == 0.0 and t["phase_inferred"] == 0.0
    # Decision logs carry no phase: COLD is read as DONE (finished, no reuse).
    t = pol.explain({"priority": 0, "deadline_us": -1, "last_access_us": 40.0}, 100.0)
    assert t["urgency_term"] == -(3.6e9 + 60) and t["phase_inferred"] == 1.0
