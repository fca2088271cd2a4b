"""Exact victim orders of each policy on small hand-made streams.

Each expected order is derived by hand in the comment above it.  Notation: a list
``[a, b, c]`` is ordered from the next victim to the last; "m" = miss, "h" = hit.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.cachesim.simulator import simulate_cache
from kvsim.policy.api import Phase, Priority
from kvsim.policy.registry import get_policy, load_policy_file
from tests.policies.harness import USER_POLICY_FILE, Driver


def victims(policy: str, keys, capacity: int) -> list[int]:
    r = simulate_cache(np.array(keys, np.int64), capacity, policy, record_victims=True)
    return [int(k) for k in r.keys_by_id[r.victims]]


STREAM = [1, 2, 3, 1, 4, 2, 5, 1, 3, 6, 2, 1]


def test_lru():
    # cap 3: 1m 2m 3m [1,2,3]; 1h [2,3,1]; 4m evict 2 [3,1,4]; 2m evict 3 [1,4,2];
    # 5m evict 1 [4,2,5]; 1m evict 4 [2,5,1]; 3m evict 2 [5,1,3]; 6m evict 5 [1,3,6];
    # 2m evict 1 [3,6,2]; 1m evict 3.
    assert victims("lru", STREAM, 3) == [2, 3, 1, 4, 2, 5, 1, 3]


def test_vllm_is_lru_in_a_single_tier():
    # A single-tier hit = touch + release, which re-queues the block at the tail: LRU.
    assert victims("vllm", STREAM, 3) == victims("lru", STREAM, 3)


def test_vllm_free_queue_order():
    # Allocated (held) 7, 6, 5, 4, then released 5, 4, 6, 7 -> queue [5,4,6,7] (release
    # order, not allocation order).  4 is revived (touched out of the middle) and released
    # again -> [5,6,7,4].  8 is released without a content hash -> HEAD: [8,5,6,7,4].
    # Allocation pops from the head.
    d = Driver(get_policy("vllm"), capacity=8, num_slots=10)
    for b in (7, 6, 5, 4, 8):
        d.allocate(b)
    for b in (5, 4, 6, 7):
        d.release(b)
    d.hold(4)
    d.release(4)
    d.set_intent(8, content_hash=0)
    d.release(8)
    assert d.drain() == [8, 5, 6, 7, 4]


def test_fifo():
    # cap 3: [1,2,3]; 1h; 4m evict 1 [2,3,4]; 2h; 5m evict 2 [3,4,5]; 1m evict 3 [4,5,1];
    # 3m evict 4 [5,1,3]; 6m evict 5 [1,3,6]; 2m evict 1 [3,6,2]; 1m evict 3.
    assert victims("fifo", STREAM, 3) == [1, 2, 3, 4, 5, 1, 3]


def test_lfu_frequency_then_lru():
    # cap 3: 1m 2m 3m (f=1 each); 2h (2:f2), 1h (1:f2); 4m: only 3 has f1 -> evict 3;
    # 4h (4:f2).  5m: all f2; least recently used among them: 2 (t=4) < 1 (t=5) < 4 (t=7)
    # -> evict 2.
    assert victims("lfu", [1, 2, 3, 2, 1, 4, 4, 5], 3) == [3, 2]


def test_sieve():
    # cap 3, queue oldest->newest, hand starts at the oldest.
    # 1 2 3 -> [1,2,3]; 1h: visited{1}.  4m: hand at 1 (visited: clear, move on) -> 2
    # unvisited: evict 2, hand -> 3; [1,3,4].  2m: hand 3 unvisited: evict 3, hand -> 4;
    # [1,4,2].  5m: evict 4, hand -> 2; [1,2,5].  1h: visited{1}.  6m: hand 2: evict 2,
    # hand -> 5; [1,5,6].  7m: evict 5.
    assert victims("sieve", [1, 2, 3, 1, 4, 2, 5, 1, 6, 7], 3) == [2, 3, 4, 2, 5]


def test_belady():
    # cap 2: 1m 2m; 3m: next uses 1@3, 2@4 -> evict 2 [1,3]; 1h; 2m: 1 never again,
    # 3@5 -> evict 1; 3h.
    assert victims("belady", [1, 2, 3, 1, 2, 3], 2) == [2, 1]


def test_arc():
    # c = 4, p = 0.  1 2 3 4 -> T1 = [1,2,3,4].  5m: |T1|+|B1|+1 = 5 > 4 and B1 empty ->
    # drop T1's LRU 1 with no ghost; T1 = [2,3,4,5].  2h -> T2 = [2], T1 = [3,4,5].
    # 6m: |T1|+|B1|+1 = 4, not > 4; total 4 < 8; REPLACE: |T1| = 3 > p -> 3 to B1.
    # T1 = [4,5,6].  3m, ghost hit in B1: p += max(|B2|/|B1|, 1) = 1; REPLACE: 3 > 1 ->
    # 4 to B1; 3 enters T2 = [2,3].  7m: 2+1+1 = 4 not > 4; REPLACE: |T1| = 2 > 1 -> 5 to
    # B1 = [4,5]; T1 = [6,7].  8m: 2+2+1 = 5 > 4, B1 non-empty: drop B1's LRU 4, REPLACE:
    # 2 > 1 -> evict 6.
    assert victims("arc", [1, 2, 3, 4, 5, 2, 6, 3, 7, 8], 4) == [1, 3, 4, 5, 6]


def test_s3fifo():
    # c = 20: small 2, main 18, ghost 18.  0..19: 0, 1 fill SMALL; SMALL is full and
    # nothing was evicted yet, so 2..19 go to MAIN.  20m: |MAIN| = 18 not > 18 -> sweep
    # SMALL: 0 (freq 0) evicted to GHOST; SMALL = [1,20].  0m: ghost hit -> will enter
    # MAIN; sweep SMALL: evict 1 (to GHOST); MAIN = [2..19,0] (19).  2h: freq 1.
    # 21m: |MAIN| = 19 > 18 -> sweep MAIN: 2 (freq 1) reinserted with freq 0, 3 evicted;
    # SMALL = [20,21].  22m: |MAIN| = 18 -> sweep SMALL: evict 20.
    keys = list(range(20)) + [20, 0, 2, 21, 22]
    assert victims("s3fifo", keys, 20) == [0, 1, 3, 20]


def test_hotcold_reuse_makes_hot():
    # cap 3, all COLD priority: 0 1 2; 1h -> 1 is hot (reused).  3m: cold [0,2] -> evict 0;
    # 4m: cold [2,3] -> evict 2.
    assert victims("hotcold", [0, 1, 2, 1, 3, 4], 3) == [0, 2]


def test_hotcold_priority_and_fallback():
    # 0 HOT, 1 and 2 COLD, inserted 0,1,2: cold [1,2], hot [0].  Drain: 1, 2, then the
    # hot block 0 once no cold candidate is left.
    d = Driver(get_policy("hotcold"), capacity=3, num_slots=4)
    d.set_intent(0, priority=int(Priority.HOT))
    for b in (0, 1, 2):
        d.access(b)
    assert d.drain() == [1, 2, 0]


def test_intent_priority_then_phase_then_lru():
    # rank = 8*priority + phase rank: 0 (WARM, DECODE) = 14; 1 (COLD, IDLE) = 3;
    # 2 (COLD, DONE) = 1; 3 (COLD, IDLE) = 3.  Drain: 2, then 1 and 3 (LRU: 1 older), 0.
    d = Driver(get_policy("intent"), capacity=4, num_slots=4)
    for b, pr, ph in ((0, Priority.WARM, Phase.DECODE), (1, Priority.COLD, Phase.IDLE),
                      (2, Priority.COLD, Phase.DONE), (3, Priority.COLD, Phase.IDLE)):
        d.set_intent(b, priority=int(pr), phase=int(ph))
        d.access(b)
    assert d.drain() == [2, 1, 3, 0]


def test_predictive_farthest_predicted_use_first():
    # 3 accessed at t=1 and t=5 (gap 4 -> predicted 9); 0 deadline 500; 1 target step 10
    # (x 20 ms = 200000 us); 2 no evidence (inf).  Farthest first: 2, 1, 0, 3.
    d = Driver(get_policy("predictive"), capacity=4, num_slots=4)
    d.set_intent(0, deadline_us=500)
    d.set_intent(1, target_decode_step=10)
    for b in (3, 0, 1, 2, 3):
        d.access(b)
    assert d.drain() == [2, 1, 0, 3]


def test_predictive_passed_prediction_is_no_evidence():
    # Accessed at t = 1..4: 0 deadline 2 (passes at t = 3), 1 deadline 500, 2 target step
    # 10 (200,000 us), 3 no evidence.  Drained at t = 4 (n_alt = 4 records the order):
    # 0's prediction passed unused, so it ranks as "never" with 3, least recently hooked
    # first: 0 (hooked at 1) then 3 (at 4); then the farthest prediction, 2, then 1.
    # Before the expiry rule 0 kept the earliest time, so it was drained last: 3, 2, 1, 0.
    d = Driver(get_policy("predictive"), capacity=4, num_slots=4, n_alt=4)
    d.set_intent(0, deadline_us=2)
    d.set_intent(1, deadline_us=500)
    d.set_intent(2, target_decode_step=10)
    for b in (0, 1, 2, 3):
        d.access(b)
    v, reason, n = d.raw_victim()
    assert (int(v), int(reason), int(n)) == (0, 3, 4)
    assert list(d.alt_b) == [0, 3, 2, 1]
    assert list(d.alt_s[:2]) == [-np.inf, -np.inf]
    assert d.drain() == [0, 3, 2, 1]
    row = {"deadline_us": 2, "last_access_us": 1.0, "access_count": 1}
    assert d.p.module.explain(row, 4.0)["evidence"] == 3.0


def test_deadline_score_order_and_pins():
    # Accessed at now = 1..6, drained at now = 6; every block is live (phase PREFILL, the
    # view's default), so each score carries LIVE_NEED_US = 1e9 (written L below).  Keep
    # scores (class 1e6 us each; a live block without a deadline has horizon 0):
    # 0: no deadline, last 1: L - (0 + 6 - 1)       = L - 5
    # 1: deadline 100:         L + 6 - 100          = L - 94
    # 2: deadline 100, HOT:    L + 2e6 + 6 - 100    = L + 1999906
    # 3: pinned, live                                (last)
    # 4: no deadline, last 5: L - (0 + 6 - 5)       = L - 1
    # 5: deadline 5e6:         L + 6 - 5e6          = L - 4999994
    # Lowest first: 5, 1, 0, 4, 2, then the pinned 3.
    # (Was 5, 0, 4, 1, 2, 3 when the class weight was 1e9 us and a block without a
    # deadline had a 1 s horizon whatever its phase: a block of a request that has not
    # finished is needed at that request's next step, so its horizon is 0 now; see
    # policies/deadline.py.)
    L = 1e9
    pol = get_policy("deadline")
    d = Driver(pol, capacity=6, num_slots=6, n_alt=6)
    d.set_intent(1, deadline_us=100)
    d.set_intent(2, deadline_us=100, priority=int(Priority.HOT))
    d.set_intent(3, pinned=True)
    d.set_intent(5, deadline_us=5_000_000)
    for b in range(6):
        d.access(b)
    v, code, n_alt = d.raw_victim()
    assert (v, code, n_alt) == (5, 0, 5)  # runners-up cover the 5 unpinned blocks only
    assert list(d.alt_b[:5]) == [5, 1, 0, 4, 2]
    np.testing.assert_allclose(d.alt_s[:5], [L - 4999994, L - 94, L - 5, L - 1, L + 1999906])
    # explain() reproduces the logged score from the same fields
    row = {"deadline_us": 100, "priority": int(Priority.HOT), "last_access_us": 3.0,
           "phase": int(Phase.PREFILL)}
    terms = pol.explain(row, 6.0)
    assert terms["score"] == pytest.approx(L + 1999906)
    assert terms["class_term"] == 2e6 and terms["urgency_term"] == L - 94
    assert d.drain() == [5, 1, 0, 4, 2, 3]
    assert pol.reasons  # reason 1 = pinned fallback
    d2 = Driver(pol, capacity=1, num_slots=1)
    d2.set_intent(0, pinned=True)
    d2.access(0)
    assert d2.raw_victim()[1] == 1


def test_user_python_policy_mru():
    # my_mru (plain Python): cap 3: [1,2,3]; 1h -> most recent 1; 4m evict 1 [2,3,4];
    # 2h; 5m evict 2 [3,4,5]; 1m evict 5 [3,4,1]; 3h; 6m evict 3.
    pol = load_policy_file(USER_POLICY_FILE)
    assert not pol.compiled
    assert victims(pol.name, [1, 2, 3, 1, 4, 2, 5, 1, 3, 6], 3) == [1, 2, 5, 3]


# ---- history across reuse (HBM: holds and releases) -------------------------------------
# Blocks 1..4 get new content in that order (allocated, held), are released tail-first
# (4, 3, 2, 1, as vLLM frees a request's table), then 2 is revived (hit + hold), hit again
# by another request while held, released; then 1 is revived and released.


def _reused(policy: str) -> Driver:
    d = Driver(get_policy(policy), capacity=4, num_slots=10)
    for b in (1, 2, 3, 4):
        d.allocate(b)
    for b in (4, 3, 2, 1):
        d.release(b)
    d.hold(2)
    d.hit_held(2)
    d.release(2)
    d.hold(1)
    d.release(1)
    return d


def test_fifo_keeps_first_admission_across_reuse():
    # Admission order 1, 2, 3, 4; releases and reuse do not reorder.  (When state was
    # reset at release, FIFO evicted in release order [4, 3, 2, 1]: LRU's order.)
    assert _reused("fifo").drain() == [1, 2, 3, 4]


def test_lru_and_vllm_order_by_release_in_hbm():
    # LRU: last access.  A cached block is accessed only by being held, and its holder
    # reads it until it releases it, so last access = release: 4 (t5), 3 (t6), 2 (t11),
    # 1 (t13).  vLLM's free queue is release order by construction: the same.
    assert _reused("lru").drain() == [4, 3, 2, 1]
    assert _reused("vllm").drain() == [4, 3, 2, 1]


def test_lfu_counts_every_access_across_reuse():
    # Counts: 4 and 3 once (their allocation); 1 twice (revived once); 2 three times
    # (revived, then hit while held).  Lowest count first, least recent among ties:
    # 4 and 3 (count 1, released 4 then 3), then 1 (2), then 2 (3).
    assert _reused("lfu").drain() == [4, 3, 1, 2]


def test_sieve_marks_reuse_and_keeps_queue_place():
    # Queue by insertion [1, 2, 3, 4]; 2 and 1 were reused: visited.  The hand starts at
    # 1 (visited: cleared), 2 (visited: cleared), evicts 3, then 4; wraps to 1, 2.
    assert _reused("sieve").drain() == [3, 4, 1, 2]


def test_sieve_hand_skips_held_blocks():
    # 3 is held: the hand passes it without clearing or evicting; 4 goes first; with
    # only held blocks left there is no victim; released, 3 goes.
    d = _reused("sieve")
    d.hold(3)  # hit (visited) + hold
    assert d.evict_one() == 4
    d.hold(1)
    d.hold(2)
    assert d.victim() == -1
    for b in (1, 2, 3):
        d.release(b)
    # queue [1, 2, 3] all visited (1, 2 by their holds, 3 by its hold): one sweep clears
    # them, then the oldest goes first.
    assert d.drain() == [1, 2, 3]


def test_arc_ghosts_are_content_not_slots():
    # After the reuse above T1 = [4, 3] (seen once), T2 = [2, 1].  Draining: |T1| = 2 >
    # p = 0 -> 4, then 3 from T1 (ghosts B1 = [h4, h3]); T1 empty -> 2, then 1 from T2
    # (B2 = [h2, h1]).
    d = _reused("arc")
    assert d.drain() == [4, 3, 2, 1]
    # Slot 5 now receives the content that block 3 held (hash 4): a B1 ghost hit, p = 1,
    # and it enters T2.  Slot 6 gets new content (T1).  Released 6 then 5.  REPLACE with
    # |T1| = 1, p = 1: not above target -> evict from T2: 5.  Had the ghost been keyed by
    # slot, 5 would have entered T1 and T1's LRU, 6, would go.
    d.set_intent(5, content_hash=4)
    d.allocate(5)
    d.allocate(6)
    d.release(6)
    d.release(5)
    assert d.evict_one() == 5


def test_s3fifo_sweeps_skip_held_blocks_and_keep_freq():
    # cap 10: SMALL holds 1 block, MAIN 9.  New content 1 -> SMALL (empty), 2 and 3 ->
    # MAIN (SMALL full, nothing evicted yet).  3 is revived and hit while held: freq 2;
    # 1 revived: freq 1.  Then 2 is held (freq 1).  Victim: SMALL sweep: 1 (freq 1 < 2)
    # goes.  Then MAIN: 2 held (skipped), 3 freq 2 -> tail, freq 1; wrap: 2 skipped,
    # 3 -> freq 0; wrap: 3 goes.  Only 2 is left and it is held: no victim.
    d = Driver(get_policy("s3fifo"), capacity=10, num_slots=12)
    for b in (1, 2, 3):
        d.allocate(b)
    for b in (3, 2, 1):
        d.release(b)
    d.hold(3)
    d.hit_held(3)
    d.release(3)
    d.hold(1)
    d.release(1)
    d.hold(2)
    assert [d.evict_one(), d.evict_one()] == [1, 3]
    assert d.victim() == -1
    d.release(2)
    assert d.drain() == [2]
