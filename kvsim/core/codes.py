"""Every enum code compiled code uses, defined once.

The IntEnums :class:`EventKind`, :class:`Phase`, :class:`Priority` and :class:`Tier` are
the event schema's codes (kvsim.core.schema re-exports them: import them from either).
Compiled code cannot use an IntEnum member; numba reads a module-level ``int`` as a
compile-time constant, so each member also has a plain int here, derived from the member
(never written out as a literal anywhere else: tests/test_codes.py fails on a
module-level ``PH_IDLE = 5`` or ``K_STEP, ... = range(8)`` outside this module):

- ``EK_<MEMBER>``: :class:`EventKind` (``EK_ALLOCATE``; ``EK_``, not ``K_``, because
  kvsim/replay/layout.py's ``K_*`` name the knob slots the same compiled code reads);
- ``PH_<MEMBER>``: :class:`Phase` (``PH_IDLE``);
- ``PR_<MEMBER>``: :class:`Priority` (``PR_DECODE_CRITICAL``);
- ``TIER_<MEMBER>``: :class:`Tier` (``TIER_HBM``, ``TIER_NONE``).

A compiled module imports the names it uses (``from kvsim.core.codes import
PR_DECODE_CRITICAL``): numba folds them into the code exactly as it did the literal copies
they replace.  This module is in kvsim.jit.disk_cache.SOURCES, so an edit here recompiles
the replay.
"""

from __future__ import annotations

import enum


class Phase(enum.IntEnum):
    """What the request owning a block is doing (the serving layer knows this exactly)."""

    PREFILL = 0  # prompt tokens being computed (possibly in chunks)
    DECODE = 1  # one token per step
    VERIFY = 2  # speculative decoding: target model verifying draft tokens
    DRAFT = 3  # speculative decoding: draft tokens not yet accepted
    ROLLBACK = 4  # speculative decoding: rejected drafts being released
    IDLE = 5  # request finished its turn; its blocks are cached for a possible next turn
    DONE = 6  # request finished for good


class Priority(enum.IntEnum):
    """How badly the next step needs a block in HBM (higher = keep)."""

    COLD = 0  # not expected to be used soon
    WARM = 1  # expected to be used, not on the critical path
    HOT = 2  # on the next steps' path (prefix of an active or returning session)
    DECODE_CRITICAL = 3  # read by the very next decode step of a deadline-bound request; pinned


class Tier(enum.IntEnum):
    """Memory tiers, fastest first.  ``NONE`` means resident nowhere (must be recomputed)."""

    NONE = -1
    HBM = 0
    DRAM = 1
    CXL = 2
    NVME = 3


class EventKind(enum.IntEnum):
    """Event kinds.  "request-level" events have ``block_index == -1``."""

    STEP = 0  # an engine step starts: time_us, duration_us (compute), num_tokens (batched)
    ARRIVE = 1  # request-level: a request arrives; num_tokens = prompt tokens; TTFT deadline
    ALLOCATE = 2  # block-level: block appended to the request's table at block_index
    ACCESS = 3  # request-level: the request is in this step's batch and reads all its blocks
    INTENT = 4  # block- or request-level: new intent (phase, priority, deadline, ...)
    COMMIT = 5  # block-level: a DRAFT block's tokens were accepted
    FORK = 6  # request-level: request_id is a copy-on-write child of parent_request_id
    FREE = 7  # request-level: release every block tail-first; block-level: release one block


#: ``block_index`` of a FREE row that preempts its request (the engine's scheduler decided
#: it: vLLM's recompute preemption, kvsim.engine.vllm_rows): its blocks are released
#: tail-first and stay cached, its block table and prefill progress are dropped, and its
#: next ALLOCATE rows admit it again (prefix lookup).  Only the closed loop writes it.
FREE_PREEMPT_BLOCK = -2

#: ``block_index`` of a FREE row (``request_id`` -1) that resets the HBM prefix cache: vLLM's
#: ``reset_prefix_cache()`` succeeded (no block was held, so nothing is released), every
#: cached HBM block loses its hash and becomes free without being spilled, and later
#: admissions hit nothing cached before it (vllm/v1/core/block_pool.py
#: ``reset_prefix_cache``).  Only the closed loop writes it (kvsim.engine.vllm_rows).
FREE_RESET_CACHE = -3


#: The prefix of each enum's plain-int constants (tests/test_codes.py reads this).
class Action(enum.IntEnum):
    """What happened to a block.  The first group are policy decisions; the second,
    lifecycle facts recorded so ``kvsim log timeline`` can tell a block's whole story."""

    EVICT = 0  # dropped from a tier (no copy kept below)
    DEMOTE = 1  # spilled from a tier to a lower one
    PROMOTE = 2  # fetched up into HBM on demand (the requester stalled for it)
    PREFETCH = 3  # fetched up ahead of use (hidden behind compute if early enough)
    RECOMPUTE = 4  # needed but resident nowhere: its tokens were recomputed
    WRITE_THROUGH = 5  # copied down to a lower tier while staying in HBM (host-write policy)
    PREEMPT = 6  # the request was preempted (recompute or swap); block released or swapped
    ALLOCATE = 10  # a new block was allocated in HBM for a request
    HIT = 11  # a prefix-cache hit shared an HBM block (ref count +1)
    RELEASE = 12  # the last holder freed the block; it stays cached as a candidate
    REVIVE = 13  # a cached candidate (ref 0) was hit and held again
    FREE = 14  # released with no content identity: the slot is empty again


class Reason(enum.IntEnum):
    """The replay's own reasons for what it did (the decision log's ``why`` column; -1 is
    the policy's reason): each indexes a sentence of :data:`kvsim.replay.kernel.core.WHY`."""

    PROMOTE = 0
    PREFETCH = 1
    RECOMP = 2
    RECOMP_RERUN = 3
    WT = 4
    WTS = 5
    PRE_LAST = 6
    PRE_PRIO = 7
    SWAP_IN = 8
    ALLOC = 9
    HIT = 10
    RELEASE = 11
    REVIVE = 12
    FREE = 13
    PROMOTE_RERUN = 14
    BACKED = 15
    COW = 16


PREFIXES = {EventKind: "EK_", Phase: "PH_", Priority: "PR_", Tier: "TIER_", Action: "A_",
            Reason: "W_"}

# ---- plain ints for compiled code (written out, not generated, so that readers and
# linters see the names; tests/test_codes.py checks each equals its member) -------------

EK_STEP = int(EventKind.STEP)
EK_ARRIVE = int(EventKind.ARRIVE)
EK_ALLOCATE = int(EventKind.ALLOCATE)
EK_ACCESS = int(EventKind.ACCESS)
EK_INTENT = int(EventKind.INTENT)
EK_COMMIT = int(EventKind.COMMIT)
EK_FORK = int(EventKind.FORK)
EK_FREE = int(EventKind.FREE)

PH_PREFILL = int(Phase.PREFILL)
PH_DECODE = int(Phase.DECODE)
PH_VERIFY = int(Phase.VERIFY)
PH_DRAFT = int(Phase.DRAFT)
PH_ROLLBACK = int(Phase.ROLLBACK)
PH_IDLE = int(Phase.IDLE)
PH_DONE = int(Phase.DONE)

PR_COLD = int(Priority.COLD)
PR_WARM = int(Priority.WARM)
PR_HOT = int(Priority.HOT)
PR_DECODE_CRITICAL = int(Priority.DECODE_CRITICAL)

TIER_NONE = int(Tier.NONE)
TIER_HBM = int(Tier.HBM)
TIER_DRAM = int(Tier.DRAM)
TIER_CXL = int(Tier.CXL)
TIER_NVME = int(Tier.NVME)

A_EVICT = int(Action.EVICT)
A_DEMOTE = int(Action.DEMOTE)
A_PROMOTE = int(Action.PROMOTE)
A_PREFETCH = int(Action.PREFETCH)
A_RECOMPUTE = int(Action.RECOMPUTE)
A_WRITE_THROUGH = int(Action.WRITE_THROUGH)
A_PREEMPT = int(Action.PREEMPT)
A_ALLOCATE = int(Action.ALLOCATE)
A_HIT = int(Action.HIT)
A_RELEASE = int(Action.RELEASE)
A_REVIVE = int(Action.REVIVE)
A_FREE = int(Action.FREE)

W_PROMOTE = int(Reason.PROMOTE)
W_PREFETCH = int(Reason.PREFETCH)
W_RECOMP = int(Reason.RECOMP)
W_RECOMP_RERUN = int(Reason.RECOMP_RERUN)
W_WT = int(Reason.WT)
W_WTS = int(Reason.WTS)
W_PRE_LAST = int(Reason.PRE_LAST)
W_PRE_PRIO = int(Reason.PRE_PRIO)
W_SWAP_IN = int(Reason.SWAP_IN)
W_ALLOC = int(Reason.ALLOC)
W_HIT = int(Reason.HIT)
W_RELEASE = int(Reason.RELEASE)
W_REVIVE = int(Reason.REVIVE)
W_FREE = int(Reason.FREE)
W_PROMOTE_RERUN = int(Reason.PROMOTE_RERUN)
W_BACKED = int(Reason.BACKED)
W_COW = int(Reason.COW)
