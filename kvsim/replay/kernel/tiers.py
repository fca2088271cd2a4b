"""Lower tiers (DRAM, CXL, NVMe) and the decision-log buffer: hook-free compiled helpers.

The operations that call a tier policy's hooks live in :mod:`kvsim.replay.kernel.tier_ops` (compiled
once for every policy, like :mod:`kvsim.memory.pool_ops`).

A lower tier is a *content-addressed cache of hashed blocks*: slot ids ``0 .. cap-1``, a
hash -> slot map, a free-slot stack, a :class:`kvsim.policy.api.BlockView` and the state of
its own eviction policy (any registered policy; every resident block is a candidate).
It is *inclusive*: promoting a block to HBM copies it and the lower copy stays (SGLang
HiCache keeps the host copy of a loaded node), so a later HBM eviction of that block
costs no write.

One tier is the named tuple :class:`Tier` ``(L_i, L_free, L_h, L_view, L_ps, Lm)``:
``L_i[slot, LI_*]`` (owner request, block index, tokens, state), ``L_free`` (stack of free
slots), ``L_h`` (an open-addressing hash table content hash -> tier and slot, linear
probing, key 0 = empty: the same scheme as the HBM prefix index in kvsim.memory.fast, and
much cheaper to compile than a typed Dict; keys and values interleaved in one array,
``L_h[2i]`` the key of entry ``i`` and ``L_h[2i + 1]`` its value ``slot * 4 + tier``
(:func:`tier_value`), so a probe that finds its key has the value in the same cache line:
at 16-token blocks the table has 4 M entries and every probe is a cache miss).  **The
three tiers share ONE table** (each tier's ``L_h`` is the same array, capacity a power of
two >= 2 x the tiers' slots together): a content is in at most one lower tier (a block is
written down only when no lower copy exists, :func:`kvsim.replay.kernel.tier_ops._write_through` and
:func:`kvsim.replay.kernel.spill._hbm_evicted_range`, and a victim leaves its tier before it enters
the next), so a demotion from one tier into the
next rewrites its entry's value in place instead of a removal from one table and an
insertion into another, and "is it below, and where?" is one probe, not three
(docs/benchmarks.md, "Speed: tiered replay of 16-token traces").
``L_view`` (BlockView, one 88-byte row per slot: :func:`new_record_view`), ``L_ps`` (the
policy as ``(state, hooks)``, kvsim.policy.hooks), ``Lm`` (int64 scalars
``LM_*``: tier id, capacity, free top, used).  Compiled code receives each tier as ONE
value, a :class:`kvsim.policy.hooks.TierRef` (a structref with the same field names, made
by :func:`kvsim.policy.hooks.tier_ref`), and reads its members by name (``T.L_h``), as
the interpreted twin does on the named tuple.

Invariants: ``Lm[LM_USED] + Lm[LM_FREE_TOP] == Lm[LM_CAP]``; a slot is resident iff its
hash is in the table with the tier's tag iff ``L_i[slot, LI_STATE] == 1`` iff it is a candidate of the tier's
policy; ``C[C_USED + tier] == Lm[LM_USED]`` after every operation (only
``tier_ops.spill_step`` changes the count, and it copies it into the counters so the step
close, which does not see the tiers, can record per-step occupancy).

The decision log is the tuple ``G = (G_i, G_f, GC_i, GC_f)`` of preallocated buffers
(layout ``GI_*``, ``GF_*``, ``CI_*``, ``CF_*``); the driver flushes them to Parquet through
:class:`kvsim.results.decision_log.DecisionLogWriter` when they fill up.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvsim.core.layout import (
    C_LOG_SEQ,
    C_NLOG,
    CF_LAST,
    CF_RECOMP,
    CF_SCORE,
    CI_BI,
    CI_COUNT,
    CI_DEADLINE,
    CI_HASH,
    CI_NEXT,
    CI_PHASE,
    CI_PINNED,
    CI_PRIO,
    CI_REQ,
    CI_RPRIO,
    CI_SLACK,
    GF_COST,
    GF_TIME,
    GI_ACTION,
    GI_BI,
    GI_BYTES,
    GI_DC,
    GI_FROM,
    GI_HASH,
    GI_NCAND,
    GI_REASON,
    GI_REQ,
    GI_SEQ,
    GI_STEP,
    GI_TO,
    GI_WHY,
    LI_STATE,
    LM_CAP,
    LM_FREE_TOP,
    LM_USED,
)
from kvsim.jit.decorators import helper, njit
from kvsim.jit.prefetch import prefetch


class Tier(NamedTuple):
    """One lower tier's members (see the module's docstring); compiled code takes it as a
    :class:`kvsim.policy.hooks.TierRef` with the same field names."""

    L_i: np.ndarray
    L_free: np.ndarray
    L_h: np.ndarray
    L_view: object
    L_ps: object
    Lm: np.ndarray


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def copy_view(dst, d, src, s):
    """Copy the BlockView fields of slot ``s`` of ``src`` into slot ``d`` of ``dst``, all
    but the two timestamps (``insert_us``, ``last_access_us``): every caller is a tier fill
    (or the cascade's copy of a victim into ``TMP`` on its way to the next tier's fill),
    and a fill sets both to the time of the move.  13 of the 15 fields; in the record
    layout of the replay's views (:func:`new_record_view`) they lie in 2-3 cache lines of
    one row on each side."""
    dst.access_count[d] = src.access_count[s]
    dst.phase[d] = src.phase[s]
    dst.priority[d] = src.priority[s]
    dst.request_priority[d] = src.request_priority[s]
    dst.deadline_us[d] = src.deadline_us[s]
    dst.slack_us[d] = src.slack_us[s]
    dst.target_decode_step[d] = src.target_decode_step[s]
    dst.recompute_cost_us[d] = src.recompute_cost_us[s]
    dst.size_bytes[d] = src.size_bytes[s]
    dst.pinned[d] = src.pinned[s]
    dst.next_use[d] = src.next_use[s]
    dst.content_hash[d] = src.content_hash[s]
    dst.tenant[d] = src.tenant[s]


# ---------------------------------------------------------------------------------------
# the replay's views: one row per slot
# ---------------------------------------------------------------------------------------

#: Byte offset of each :class:`kvsim.policy.api.BlockView` field in a row of
#: :func:`new_record_view`: the ten 8-byte fields first, then the four 1-byte ones
#: (``phase``, ``priority``, ``request_priority``, ``pinned``) and the 4-byte ``tenant``
#: in one word.  88 bytes used.
ROW_OFFSET_BYTES = {
    "last_access_us": 0, "insert_us": 8, "access_count": 16, "deadline_us": 24,
    "slack_us": 32, "target_decode_step": 40, "recompute_cost_us": 48, "size_bytes": 56,
    "next_use": 64, "content_hash": 72,
    "phase": 80, "priority": 81, "request_priority": 82, "pinned": 83, "tenant": 84,
}
#: 8-byte words per row: 88 bytes, so a row spans 2 cache lines, or 3 when it straddles
#: two line boundaries (rows starting 48 or 56 bytes into a line: 2 of every 8 rows; 2.25
#: lines per row on average); row 0 starts on a 64-byte boundary.
ROW_WORDS = 11
ROW_BYTES = 8 * ROW_WORDS


def new_record_view(num_slots: int, initialise: bool = True):
    """A :class:`kvsim.policy.api.BlockView` in a record layout: one 88-byte row per slot
    (:data:`ROW_OFFSET_BYTES`) in one 64-byte-aligned buffer, each field a strided view of
    it (stride 88 bytes), initialised as :func:`kvsim.policy.api.new_block_view`
    initialises its arrays.  The replay's views (the HBM pool's and each lower tier's,
    :mod:`kvsim.replay.driver`) use it: writing one block's fields (a tier fill copies 12 and
    sets 2; an HBM allocation sets 11) touches 2-3 cache lines, against one line per field
    with one array per field, and at 16-token blocks each is a miss (the NVMe tier holds
    1.8 M slots).  Numba types every view's fields as arrays of any layout
    (:data:`kvsim.policy.hooks.VIEW_REF`), this one and the contiguous arrays of
    :func:`~kvsim.policy.api.new_block_view` alike, so a policy's hooks compile once.
    Measured: docs/benchmarks.md, "Speed: tiered replay of 16-token traces".

    ``initialise=False`` leaves every field 0 and the buffer untouched, so its pages are
    only mapped as slots fill (a lower tier's memory grows with what it holds): a tier
    slot's 15 fields are all written by its fill (:func:`copy_view`'s 13 and the two
    timestamps) before it becomes resident, and only resident slots are read (hooks see
    their candidates, the decision log a tier's victims).  The HBM view is initialised
    (its blocks are small in number and filled from the records)."""
    from kvsim.policy.api import BLOCK_VIEW_FIELDS, BlockView, new_block_view

    n = max(int(num_slots), 0)
    raw = np.zeros(n * ROW_WORDS + 8, dtype=np.int64)
    skip = (-raw.ctypes.data % 64) // 8  # whole words to a 64-byte boundary
    rows = raw[skip: skip + n * ROW_WORDS].reshape(n, ROW_WORDS)
    initial = new_block_view(1)._asdict()  # one slot as new_block_view sets it
    fields = {}
    for name in BLOCK_VIEW_FIELDS:
        dt = initial[name].dtype
        a = rows.view(dt)[:, ROW_OFFSET_BYTES[name] // dt.itemsize]
        if initialise and initial[name][0] != 0:
            a[:] = initial[name][0]
        fields[name] = a
    return BlockView(**fields)


def record_rows(view) -> np.ndarray:
    """The rows of ``view``, a :func:`new_record_view`, as one int64 array of shape
    ``(slots, ROW_WORDS)`` over the same memory (no copy): what :func:`copy_row` copies.
    Raises ValueError for a view of another layout."""
    a = view.last_access_us
    if a.ndim != 1 or (a.shape[0] > 1 and a.strides[0] != ROW_BYTES) or \
            a.ctypes.data % 8 != 0:
        raise ValueError("record_rows: not a record view (kvsim.replay.kernel.tiers.new_record_view)")
    return np.lib.stride_tricks.as_strided(a.view(np.int64), shape=(a.shape[0], ROW_WORDS),
                                           strides=(ROW_BYTES, 8))


#: The words of a row that :func:`copy_row` copies: all but the two timestamps (words 0
#: and 1, ``last_access_us`` and ``insert_us``), i.e. the 12 fields of :func:`copy_view`
#: (the four 1-byte fields share word 10 with 4 bytes of padding, always 0).
ROW_COPY_FROM = 2


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def copy_row(dst_rows, d, src_rows, s):
    """:func:`copy_view` on the rows of two record views (:func:`record_rows`): words
    ``ROW_COPY_FROM .. ROW_WORDS - 1`` of row ``s`` into row ``d``, 9 loads and stores
    instead of 12 fields each loaded through its view (its data pointer and stride
    first)."""
    for w in range(ROW_COPY_FROM, ROW_WORDS):
        dst_rows[d, w] = src_rows[s, w]


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def prefetch_lines(a, b, c, s):
    """Ask for the cache lines of slot ``s`` of a lower tier's view
    (:func:`new_record_view`) that a tier step reads or writes next (a no-op in plain
    Python; kvsim.jit.prefetch), given three of its fields bound by the caller once
    (``a, b, c``: ``last_access_us``, ``target_decode_step``, ``pinned``; a call passing
    the view read its members again, a counted reference each, per block and tier): a
    tier's victim is copied (the fields of :func:`copy_view`) and its slot filled just after
    its removal, whose own misses (policy links, table entry) then overlap these.  Bytes
    0, 40 and 83 of the row: every line an 88-byte row can touch holds one of them."""
    prefetch(a, s)
    prefetch(b, s)
    prefetch(c, s)


# ---------------------------------------------------------------------------------------
# decision-log buffer
# ---------------------------------------------------------------------------------------

@helper(_nrt=False)  # one compile for its constant codes (kvsim.jit.decorators)
def log_row(G, C, step, now_us, action, h, req, bi, frm, to, nbytes, cost_us, dc, reason,
            why):
    """Append one row; returns its index in the buffer (the caller may add candidates)."""
    G_i, G_f, GC_i, GC_f = G
    k = int(C[C_NLOG])
    G_i[k, GI_STEP] = step
    G_i[k, GI_ACTION] = action
    G_i[k, GI_HASH] = h
    G_i[k, GI_REQ] = req
    G_i[k, GI_BI] = bi
    G_i[k, GI_FROM] = frm
    G_i[k, GI_TO] = to
    G_i[k, GI_BYTES] = nbytes
    G_i[k, GI_REASON] = reason
    G_i[k, GI_WHY] = why
    G_i[k, GI_DC] = dc
    G_i[k, GI_NCAND] = 0
    G_i[k, GI_SEQ] = int(C[C_LOG_SEQ])
    G_f[k, GF_TIME] = now_us
    G_f[k, GF_COST] = cost_us
    C[C_NLOG] += 1
    C[C_LOG_SEQ] += 1
    return k


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def log_candidates(G, k, view, owner, alt_b, alt_s, n_alt):
    """Snapshot the victim and runners-up (``alt_b[:n_alt]``) of a tier into row ``k``.
    ``owner`` is the tier's side table (column 0 owner request, column 1 block index)."""
    G_i, G_f, GC_i, GC_f = G
    m = min(n_alt, GC_i.shape[1], alt_b.shape[0])
    for j in range(m):
        b = alt_b[j]
        GC_i[k, j, CI_HASH] = view.content_hash[b]
        GC_i[k, j, CI_REQ] = owner[b, 0]
        GC_i[k, j, CI_BI] = owner[b, 1]
        GC_i[k, j, CI_COUNT] = view.access_count[b]
        GC_i[k, j, CI_PRIO] = view.priority[b]
        GC_i[k, j, CI_RPRIO] = view.request_priority[b]
        GC_i[k, j, CI_DEADLINE] = view.deadline_us[b]
        GC_i[k, j, CI_SLACK] = view.slack_us[b]
        GC_i[k, j, CI_NEXT] = view.next_use[b]
        GC_i[k, j, CI_PHASE] = view.phase[b]
        GC_i[k, j, CI_PINNED] = 1 if view.pinned[b] else 0
        GC_f[k, j, CF_SCORE] = alt_s[j]
        GC_f[k, j, CF_LAST] = view.last_access_us[b]
        GC_f[k, j, CF_RECOMP] = view.recompute_cost_us[b]
    G_i[k, GI_NCAND] = m


# ---------------------------------------------------------------------------------------
# lower tiers
# ---------------------------------------------------------------------------------------

#: Fibonacci hashing multiplier (2**64 / golden ratio, as a signed int64).
_FIB = -7046029254386353131


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def hash_slot(hk, h):
    """Position of key ``h`` in the interleaved table ``hk`` (keys at even positions, each
    value right after its key: ``hk[i + 1]``), or of the empty key position where it would
    go.  Callers that only ask whether ``h`` is present test ``hk[hash_slot(hk, h)] == h``."""
    mask = (hk.shape[0] >> 1) - 1
    i = ((h * _FIB) >> 32) & mask
    while True:
        k = hk[2 * i]
        if k == h or k == 0:
            return 2 * i
        i = (i + 1) & mask


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def hash_put(hk, h, v):
    i = hash_slot(hk, h)
    hk[i] = h
    hk[i + 1] = v


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def hash_del(hk, h):
    """Remove key ``h`` (present), shifting later entries of its probe run back."""
    mask = (hk.shape[0] >> 1) - 1
    i = hash_slot(hk, h) >> 1
    j = i
    while True:
        j = (j + 1) & mask
        k = hk[2 * j]
        if k == 0:
            break
        home = ((k * _FIB) >> 32) & mask
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            hk[2 * i] = k
            hk[2 * i + 1] = hk[2 * j + 1]
            i = j
    hk[2 * i] = 0
    hk[2 * i + 1] = -1


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def tier_value(slot, tier):
    """The shared table's value for ``slot`` of tier ``tier`` (1..3)."""
    return slot * 4 + tier


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def lower_find(hk, h):
    """Value of content ``h`` in the lower tiers' shared table (``slot * 4 + tier``), or -1
    when it is in no lower tier.  Small enough for LLVM to inline into the replay's loops,
    so the table passed to it is not reference counted there."""
    i = hash_slot(hk, h)
    if hk[i] == h:
        return hk[i + 1]
    return -1


@njit(cache=True)
def tier_find(T, h):
    """Slot holding content ``h`` in tier T, or -1 (also -1 for a disabled tier)."""
    v = lower_find(T.L_h, h)
    if v >= 0 and (v & 3) == T.Lm[0]:
        return v >> 2
    return -1


@njit(cache=True)
def tier_used(T):
    return T.Lm[LM_USED]


def check_tier(T) -> None:
    """Raise AssertionError if a lower tier's invariants do not hold (tests, debugging)."""
    L_i, L_free, L_h, L_view, L_ps, Lm = T
    L_hk, L_hv = L_h[0::2], L_h[1::2]
    cap = int(Lm[LM_CAP])
    used = int(Lm[LM_USED])
    resident = np.flatnonzero(L_i[:cap, LI_STATE] == 1)
    assert used + int(Lm[LM_FREE_TOP]) == cap, "used + free != capacity"
    assert len(resident) == used, "resident slots != used count"
    tier = int(Lm[0])
    keys = np.flatnonzero((L_hk != 0) & (L_hv & 3 == tier))  # the shared table: this tier's
    assert len(keys) == used, "table size != used count"
    for i in keys:
        slot = int(L_hv[i]) >> 2
        assert L_i[slot, LI_STATE] == 1 and L_view.content_hash[slot] == L_hk[i], \
            "table mismatch"
        assert int(L_h[hash_slot(L_h, L_hk[i]) + 1]) == int(L_hv[i]), \
            "a key is not reachable by probing"
    free = set(int(x) for x in L_free[: int(Lm[LM_FREE_TOP])])
    assert not free.intersection(int(x) for x in resident), "a resident slot is free"
