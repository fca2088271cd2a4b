"""The policy interface: the one kvsim module a policy may import.

A placement policy orders the **eviction candidates** of one tier and names a victim when
the tier needs room.  Candidates are the blocks resident in the tier that nobody holds:
in HBM, blocks with reference count 0 that stay cached for reuse (vLLM's free queue); in
a lower tier (DRAM, CXL, NVMe), every resident block.  Blocks held by running requests are
never candidates, so a policy never has to skip them.

A policy is one module (``policies/<name>.py``, or a user file given with
``--policy-file``) defining:

``NAME: str``, ``DESCRIPTION: str``
    Registry name and a one-line description (shown by ``kvsim compare --help``).
``OFFLINE: bool`` (default False)
    True for policies that read the future (``view.next_use``), such as Belady's MIN.
    Their results are labelled as bounds, never as achievable.
``REASONS: tuple[str, ...]``
    Sentences explaining a choice, indexed by the reason code ``victim`` returns, e.g.
    ``("least recently used: idle for the longest time",)``.
``init(capacity_blocks: int, num_slots: int, params: dict) -> tuple``
    Plain Python.  Returns the policy's state: a tuple of numpy arrays (numba-friendly),
    sized by ``num_slots`` (block ids of this tier run from 0 to ``num_slots - 1``).
``on_insert(state, view, b, now_us)``
    Block ``b`` became a candidate: it was written into this tier, or released by its last
    holder (HBM).  Called once per entry into the candidate set.
``on_hit(state, view, b, now_us)``
    Candidate ``b`` was accessed and *stays* a candidate (single-tier cache hit).  In HBM a
    revived block (hit by a new request, which then holds it) gets ``on_hit`` followed by
    ``on_remove``, so history-keeping policies (LFU, ARC, S3-FIFO) see the reuse.
``on_remove(state, view, b)``
    ``b`` stops being a candidate: evicted (after ``victim`` named it), held again, or
    invalidated.  Never called for a block that is not a candidate.
``victim(state, view, now_us, alt_blocks, alt_scores) -> (block, reason_code, n_alt)``
    Name the candidate to evict (it is *not* removed yet: the core calls ``on_remove``).
    Return -1 when there is no candidate.  The policy may write up to
    ``alt_blocks.shape[0]`` runners-up (the next candidates it would have chosen) with
    their scores into the two arrays and returns how many it wrote; the decision log
    records them.  Scores are "higher = more worth keeping"; the victim's own score goes
    in ``alt_scores[0]`` with ``alt_blocks[0] == block`` when ``n_alt >= 1``.
``explain(row: dict, now_us: float) -> dict[str, float]`` (optional, plain Python)
    The named score terms of one block given its logged intent fields, for
    ``kvsim log explain``.  Scored policies should provide it.

The four hooks are ``numba.njit`` functions for built-ins (the replay loop is compiled once
per policy).  Plain Python functions work too: the core then runs its interpreted twin, the
same code, slower.  A policy must be deterministic: no global random state; if it needs
randomness it seeds a generator from ``params["seed"]`` in ``init``.

The view
--------
``view`` is a :class:`BlockView`: read-only per-block arrays of the tier, indexed by block
id, maintained by the core.  A policy must not write to it.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from kvsim.schema import Phase, Priority, Tier  # re-exported: policies import only this module

#: "Never used again" in ``BlockView.next_use``.
NEVER = np.iinfo(np.int64).max

#: Fields of :class:`BlockView`, each a numpy array indexed by the tier's block id.
BLOCK_VIEW_FIELDS = (
    "last_access_us",  # float64: engine time of the block's latest access
    "insert_us",  # float64: engine time the block entered this tier
    "access_count",  # int64: accesses since the content first entered this tier
    "phase",  # int8: Phase of the request that last touched it
    "priority",  # int8: Priority (COLD..DECODE_CRITICAL)
    "request_priority",  # int8: 0..100
    "deadline_us",  # int64: absolute deadline of the next expected use, -1 = none
    "slack_us",  # int64: slack at the last intent update
    "target_decode_step",  # int64: step at which it is next needed, -1 = unknown
    "recompute_cost_us",  # float64: prefill time to recompute the block
    "size_bytes",  # int64
    "pinned",  # bool: pin requested (DECODE_CRITICAL implies it); policies should avoid
    "next_use",  # int64: OFFLINE ONLY: ordinal of the next access, NEVER if none
    "content_hash",  # int64: content identity (0 = none)
)

BlockView = namedtuple("BlockView", BLOCK_VIEW_FIELDS)

_VIEW_DTYPES = {
    "last_access_us": np.float64,
    "insert_us": np.float64,
    "access_count": np.int64,
    "phase": np.int8,
    "priority": np.int8,
    "request_priority": np.int8,
    "deadline_us": np.int64,
    "slack_us": np.int64,
    "target_decode_step": np.int64,
    "recompute_cost_us": np.float64,
    "size_bytes": np.int64,
    "pinned": np.bool_,
    "next_use": np.int64,
    "content_hash": np.int64,
}


def new_block_view(num_slots: int) -> BlockView:
    """A zeroed view for a tier of ``num_slots`` blocks (``deadline_us`` etc. set to -1)."""
    arrays = {name: np.zeros(num_slots, dtype=_VIEW_DTYPES[name]) for name in BLOCK_VIEW_FIELDS}
    arrays["deadline_us"][:] = -1
    arrays["target_decode_step"][:] = -1
    arrays["next_use"][:] = NEVER
    return BlockView(**arrays)
