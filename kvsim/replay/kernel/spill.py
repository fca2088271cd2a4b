"""Demotion of HBM blocks into the lower tiers: the part of the replay core that calls the
lower tiers' policy hooks (through :mod:`kvsim.replay.kernel.tier_ops`; each tier carries its policy
as ``T.L_ps = (state, hooks)``, so the three tiers share one compiled ``spill_step``).

Rules: docs/simulate.md (demotion, write-through) and docs/cost-model.md.
"""

from __future__ import annotations

import numpy as np

# Values shared with kvsim.replay.kernel.core (which asserts they agree): Action codes
# (kvsim.results.log_schema.Action) and the replay's own reasons (core.WHY).
from kvsim.core.codes import (  # noqa: E402
    A_DEMOTE,
    A_EVICT,
    PR_DECODE_CRITICAL,  # noqa: E402
    W_BACKED,
)
from kvsim.core.layout import (
    C_PEAK,
    C_USED,
    HI_BI,
    HI_OWNER,
    HI_TOKENS,
    K_LOG,
    K_LOWER_LRU,
    K_WRITE_POLICY,
    LI_BI,
    LI_OWNER,
    LI_STATE,
    LI_TOKENS,
    LM_CAP,
    LM_FREE_TOP,
    LM_USED,
    M_BYTES_DOWN,
    M_DEMOTE,
    M_EVICT,
    RI_EV_CAUSED,
    RI_EV_SUFFERED,
    WP_WRITE_BACK,
)
from kvsim.jit.decorators import njit
from kvsim.jit.prefetch import prefetch, prefetch_row
from kvsim.memory.fast import KIND_EVICTED
from kvsim.policy.api import dll_push_tail, dll_remove, list_walk
from kvsim.policy.hooks import H_INSERT, H_REMOVE, H_VICTIM
from kvsim.replay.kernel import tiers as tr
from kvsim.replay.kernel.links import spill_bytes

#: How many evicted blocks ahead :func:`_hbm_evicted_range` prefetches the lower tiers'
#: shared table entry of (the home position of each evicted hash: its lower-copy test is
#: one random probe into a table of up to 4 M entries, a cache miss at 16-token blocks),
#: with the block's ``H_i`` row and view row (read when it is demoted); the first blocks of
#: a range are requested before the first is handled.  A tier's victim has its entry
#: (rewritten where it lands below, or removed) prefetched as soon as it is named, before
#: its policy's ``on_remove``.  Prefetches change no result (kvsim.jit.prefetch).  4 was
#: chosen, not tuned (no other distance was measured); the effect of both prefetches on
#: the Mooncake 16-token import: docs/benchmarks.md, "Speed: tiered replay of 16-token
#: traces".
PREFETCH_AHEAD = 4

#: The built-in lru's list in its state's ``i64`` group (policies/lru.py ``STATE``: links
#: ``prev``, ``nxt``, ends ``[head, tail, size]``; checked by kvsim.replay.driver).
LRU_PREV, LRU_NXT, LRU_ENDS = 0, 1, 2


# ---------------------------------------------------------------------------------------
# lower-tier spills
# ---------------------------------------------------------------------------------------

# Per-call cost.  numba reference-counts every array and structref a compiled function
# receives, on entry and on exit (NRT_incref / NRT_decref: an atomic update each).  At
# 16-token blocks the Mooncake import demotes 5.7 M HBM blocks and cascades 11 M more down
# the tiers; as one chain of calls per block (formerly ``_hbm_evicted`` -> ``_below`` ->
# ``tier_find`` x 3, ``_spill`` -> ``spill_into`` -> ``take_slot``, ``fill``,
# ``copy_view``), each passing the tiers, TMP, TMP_i, K, C, G ..., the counts were 36 % of
# the replay's samples (perf; docs/benchmarks.md, "Speed: tiered replay of 16-token
# traces").  So the HBM evictions of one allocation are handled in ONE call,
# :func:`_hbm_evicted_range`, which reads each tier's members once (a tier is one pointer,
# :class:`kvsim.policy.hooks.TierRef`) and runs the demotion cascade on local arrays: the
# tier step (:func:`kvsim.replay.kernel.tier_ops.spill_step`, which :func:`_spill` calls for
# write-through) is written out there once per tier, the same statements on ``L1_*``,
# ``L2_*``, ``L3_*``.  An edit of one must be made to all four.  Measured on the Mooncake
# 16-token import (paired runs, docs/benchmarks.md): calling ``spill_step`` per tier from
# here instead costs +12.5 % of the core's CPU, inlining it (numba ``inline="always"``,
# which keeps a counted copy of every argument) +3 %.  The rules are unchanged
# (tests/sim/test_compiled_reference.py checks them against the reference).

# One table, entries moved in place.  The three tiers share one hash table
# (kvsim.replay.kernel.tiers): a victim carried from one tier into the next keeps its entry, whose
# value is rewritten at the fill below (``slot * 4 + tier``), so a demotion through the
# three tiers costs one insertion (the HBM block's), two rewrites and one removal (the
# block dropped at the bottom) where three tables cost three insertions and three
# removals; paired runs on the Mooncake 16-token import: docs/benchmarks.md, "Speed:
# tiered replay of 16-token traces".  Until its fill below, a carried victim's entry still
# names its old slot, which the block entering that tier already holds: nothing reads the
# table in between (policy hooks do not).
#
# Deferred table removals.  A block dropped from the lower tiers leaves the table when the
# next one is dropped (or when the range ends), not at once: its entry is a random line of
# a table of up to 4 M entries, and its address is known only once the victim's hash has
# been read (victim -> its row -> its table entry: two dependent misses), so a removal done
# at once waits for a line whose prefetch was just issued (perf at the record-layout
# commit: the three removals' probes were ~11 % of the replay's samples).  Deferred, the
# prefetched line has the rest of the block's cascade to arrive.  The table answers as
# before: until it goes, the pending key counts as absent in the lower-copy test, and a
# fill of the same content (an HBM block whose lower copy was just dropped) removes it
# first; the table's positions may differ from an immediate removal's, never its keys or
# values (positions reach no output).  tests/sim/test_compiled_reference.py checks the
# rules against the reference.

# Built-in lru tiers.  A lower tier running the built-in lru (bit ``t`` of
# ``K[K_LOWER_LRU]``, set by the driver) has its three hooks of a tier step (victim,
# on_remove, on_insert) run here as their list operations (kvsim.policy.api ``dll_*``,
# ``list_walk``) on the policy's arrays, read once per range: a hook call passes counted
# structrefs and loads those arrays again (NRT_incref / NRT_decref: ~19 % of an end-to-end
# replay's samples on the Mooncake 16-token import, ~50 M hook calls).  Same state, same
# results; other callers still call the hooks.  docs/benchmarks.md, "Speed: tiered replay
# of 16-token traces".

# Victims asked for ahead.  A full built-in lru tier's victim is its list's head, so the
# blocks it demotes next are known in order: the head, then the block after it.  Each
# demotion reads the victim's state row, view row (hash, fields copied), links (and the
# links of the block after it, the new head) and the table entry of its hash: at
# 16-token blocks each a random line of a tier of 10^5-10^6 rows, ~7 dependent misses per
# tier per demoted block when asked for only once the victim is named.  So when a victim
# leaves the head, :func:`_lru_ahead` asks for the lines of the next two: the new head's
# table entry (its hash read from a row asked for one demotion earlier) and the rows and
# links of the block after it.  Prefetches change no result (kvsim.jit.prefetch).

@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _drop(hk, pend, h):
    """A block with hash ``h`` left the lower tiers: its entry goes when the next one does
    (or when the range ends), the pending one's now (see "Deferred table removals").
    Returns the new pending hash."""
    if pend != 0:
        tr.hash_del(hk, pend)
    return h


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _lru_ahead(hk, m, prev, nxt, li, ch, la, tds, pin, y):
    """Ask for the lines the next two demotions of a built-in lru tier read, now that ``y``
    heads its list (see "Victims asked for ahead" above): the table entry of ``y``'s hash
    (its row was asked for one demotion ago, so reading the hash waits for nothing new),
    and the links and rows of the block after it.  Returns nothing; changes nothing."""
    prefetch(hk, 2 * (((ch[y] * tr._FIB) >> 32) & m))  # as hash_slot
    z = nxt[y]
    if z >= 0:
        prefetch(prev, z)
        prefetch(nxt, z)
        prefetch_row(li, z)
        tr.prefetch_lines(la, tds, pin, z)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _hbm_evicted_range(lo, hi, r, cr, step, now_us):
    """Every block ``out.blocks[e]``, ``lo <= e < hi``, that the HBM pool evicted from the
    cache for a new block (``out.kind[e] == KIND_EVICTED``), in order: each is
    demoted under write_back unless a lower copy exists (then it is written to the first
    enabled lower tier, and victims cascade DRAM -> CXL -> NVMe -> dropped as in
    :func:`_spill`), else dropped; its view is still intact.  The tiers are unpacked once
    for the whole range (see the note above), as are the core's (``cr``,
    :class:`kvsim.replay.kernel.core_ref.CoreRef`), once a block of the range was evicted."""
    out = cr.out
    kind = out.kind
    o_b, o_ev = out.blocks, out.evicted_hash
    first_ev = lo
    while first_ev < hi and kind[first_ev] != KIND_EVICTED:
        first_ev += 1
    if first_ev == hi:  # nothing evicted (most allocations find a free block)
        return
    lo = first_ev  # the blocks before it were not evicted: nothing to do for them
    K = cr.K
    X = cr.X
    C = cr.C
    H_i = cr.H_i
    R_i = cr.R_i
    view = cr.H_view
    G = cr.G
    T1 = cr.T1
    T2 = cr.T2
    T3 = cr.T3
    TMP_i = cr.TMP_i
    alt_b = cr.alt_b
    alt_s = cr.alt_s
    vo = cr.vo
    # the views' rows (tiers.record_rows): a fill copies a row, not 12 fields
    H_rows = cr.H_rows
    TMP_rows = cr.TMP_rows
    L1_rows = cr.L1_rows
    L2_rows = cr.L2_rows
    L3_rows = cr.L3_rows
    H_la, H_tds, H_pin = view.last_access_us, view.target_decode_step, view.pinned
    # each tier's members, read once for the whole range (the tier step below is written
    # out per tier on these locals: see "Per-call cost" above)
    LH = T1.L_h  # the three tiers' shared table (kvsim.replay.kernel.tiers)
    L1_i, L1_free = T1.L_i, T1.L_free
    L1_view, L1m = T1.L_view, T1.Lm
    L1_ch, L1_la, L1_in, L1_sz = (L1_view.content_hash, L1_view.last_access_us,
                                  L1_view.insert_us, L1_view.size_bytes)
    L1_tds, L1_pin = L1_view.target_decode_step, L1_view.pinned
    L2_i, L2_free = T2.L_i, T2.L_free
    L2_view, L2m = T2.L_view, T2.Lm
    L2_ch, L2_la, L2_in, L2_sz = (L2_view.content_hash, L2_view.last_access_us,
                                  L2_view.insert_us, L2_view.size_bytes)
    L2_tds, L2_pin = L2_view.target_decode_step, L2_view.pinned
    L3_i, L3_free = T3.L_i, T3.L_free
    L3_view, L3m = T3.L_view, T3.Lm
    L3_ch, L3_la, L3_in, L3_sz = (L3_view.content_hash, L3_view.last_access_us,
                                  L3_view.insert_us, L3_view.size_bytes)
    L3_tds, L3_pin = L3_view.target_decode_step, L3_view.pinned
    L1_st, L1_hooks = T1.L_ps
    L2_st, L2_hooks = T2.L_ps
    L3_st, L3_hooks = T3.L_ps
    # the built-in lru tiers' lists (see "Built-in lru tiers" above; else unused)
    lru1 = (K[K_LOWER_LRU] >> 1) & 1 != 0
    lru2 = (K[K_LOWER_LRU] >> 2) & 1 != 0
    lru3 = (K[K_LOWER_LRU] >> 3) & 1 != 0
    if lru1:
        P1, N1, E1 = L1_st.i64[LRU_PREV], L1_st.i64[LRU_NXT], L1_st.i64[LRU_ENDS]
    else:
        P1, N1, E1 = alt_b, alt_b, alt_b
    if lru2:
        P2, N2, E2 = L2_st.i64[LRU_PREV], L2_st.i64[LRU_NXT], L2_st.i64[LRU_ENDS]
    else:
        P2, N2, E2 = alt_b, alt_b, alt_b
    if lru3:
        P3, N3, E3 = L3_st.i64[LRU_PREV], L3_st.i64[LRU_NXT], L3_st.i64[LRU_ENDS]
    else:
        P3, N3, E3 = alt_b, alt_b, alt_b
    cap1 = L1m[LM_CAP] > 0
    cap2 = L2m[LM_CAP] > 0
    cap3 = L3m[LM_CAP] > 0
    first = 1 if cap1 else (2 if cap2 else (3 if cap3 else 0))  # _first_lower
    below3 = np.int64(3) if cap3 else np.int64(0)
    below2 = np.int64(2) if cap2 else below3
    write_back = K[K_WRITE_POLICY] == WP_WRITE_BACK
    log_on = K[K_LOG] != 0
    m = (LH.shape[0] >> 1) - 1  # entries - 1 of the table (kvsim.replay.kernel.tiers.hash_slot)
    # the deferred removal (see "Deferred table removals" above): the hash of the last
    # block dropped from the tiers whose table entry is still there (0 = none)
    pend = np.int64(0)
    for g in range(lo, hi + PREFETCH_AHEAD):
        # block g's lines are requested PREFETCH_AHEAD blocks before it is handled (the
        # first ones before the first is): its lower-copy test's probes, its HBM row and,
        # for a demotion, its view's row (copied into the first tier)
        if g < hi and kind[g] == KIND_EVICTED:
            prefetch(LH, 2 * (((o_ev[g] * tr._FIB) >> 32) & m))  # as hash_slot
            prefetch_row(H_i, o_b[g])
            tr.prefetch_lines(H_la, H_tds, H_pin, o_b[g])  # the victim row's lines
        e = g - PREFETCH_AHEAD
        if e < lo or kind[e] != KIND_EVICTED:
            continue
        b = o_b[e]
        h = o_ev[e]
        # per-tenant accounting: evictions suffered by the request that brought the block
        # in, caused by the request the room is made for (kvsim.replay.metrics.tenant_table)
        if H_i[b, HI_OWNER] >= 0:
            R_i[H_i[b, HI_OWNER], RI_EV_SUFFERED] += 1
        R_i[r, RI_EV_CAUSED] += 1
        backed = tr.lower_find(LH, h) >= 0 and h != pend  # a lower copy (pending: gone)
        dest = first if (not backed and write_back) else 0
        if log_on:
            row = tr.log_row(G, C, step, now_us, A_DEMOTE if dest > 0 else A_EVICT, h,
                             H_i[b, HI_OWNER], H_i[b, HI_BI], 0, dest if dest > 0 else -1,
                             view.size_bytes[b] if dest > 0 else 0, 0.0,
                             view.priority[b] == PR_DECODE_CRITICAL, out.reason[e],
                             W_BACKED if backed else -1)
            tr.log_candidates(G, row, view, H_i, out.alt_blocks[e], out.alt_scores[e],
                              min(out.n_alt[e], alt_b.shape[0]))
        if dest == 0:
            C[M_EVICT] += 1
            continue
        C[M_DEMOTE] += 1
        # _spill(view, b, ...): the cascade
        ow = H_i[b, HI_OWNER]
        bi = H_i[b, HI_BI]
        tok = H_i[b, HI_TOKENS]
        vs = b  # the block's row (copied by rows: tiers.copy_row)
        tmp = False  # in H_rows; True: carried from the tier above, in TMP_rows
        hcar = np.int64(0)  # the hash of the block carried down from a tier above, if any
        if dest <= 1 and cap1:
            # tier 1: tier_ops.spill_step written out (no counted argument copies)
            t = L1m[0]
            vo[0] = 0
            vo[1] = -1
            vo[2] = -1
            vo[3] = 0
            slot = -1
            if L1m[LM_FREE_TOP] > 0:
                L1m[LM_FREE_TOP] -= 1
                slot = L1_free[L1m[LM_FREE_TOP]]
            else:
                if lru1:  # lru's victim(): the list's head
                    x, reason, n_alt = E1[0], 0, 0
                    if x >= 0:
                        n_alt = list_walk(P1, N1, E1, alt_b, alt_s, L1_la)
                else:
                    x, reason, n_alt = L1_hooks[H_VICTIM](L1_st, L1_view, now_us,
                                                            alt_b, alt_s)
                if x >= 0:
                    if L1_i[x, LI_STATE] != 1:
                        raise ValueError("lower-tier policy: victim() named a block that is "
                                         "not resident")
                    hx = L1_ch[x]
                    # its entry: rewritten at the next tier's fill, or removed (dropped)
                    prefetch(LH, 2 * (((hx * tr._FIB) >> 32) & m))
                    tr.prefetch_lines(L1_la, L1_tds, L1_pin, x)  # copied below
                    if lru1:
                        dll_remove(P1, N1, E1, x)
                        if E1[0] >= 0:  # the next victims' lines (see above)
                            _lru_ahead(LH, m, P1, N1, L1_i, L1_ch, L1_la, L1_tds,
                                       L1_pin, E1[0])
                    else:
                        L1_hooks[H_REMOVE](L1_st, L1_view, x)
                    L1_i[x, LI_STATE] = 0
                    L1m[LM_USED] -= 1
                    vo[0] = 1
                    vo[1] = x
                    vo[2] = reason
                    vo[3] = n_alt
                    slot = x
            if slot < 0:
                C[M_EVICT + t] += 1  # no room and no victim: the block is dropped
                if hcar != 0:  # carried from above: its entry goes (deferred)
                    pend = _drop(LH, pend, hcar)
                continue
            moved = 0
            if vo[0] == 1:
                x = vo[1]
                if below2 > 0:  # the victim goes on down: kept in TMP[1] until then
                    tr.copy_row(TMP_rows, 1, L1_rows, x)
                    TMP_i[1, 0] = L1_i[x, 0]
                    TMP_i[1, 1] = L1_i[x, 1]
                    TMP_i[1, 2] = L1_i[x, 2]
                    C[M_DEMOTE + t] += 1
                    moved = 1
                else:
                    C[M_EVICT + t] += 1
                    pend = _drop(LH, pend, hx)
                if log_on:
                    row = tr.log_row(G, C, step, now_us, A_DEMOTE if moved else A_EVICT,
                                     L1_view.content_hash[x], L1_i[x, 0], L1_i[x, 1], t,
                                     below2 if moved else -1,
                                     L1_view.size_bytes[x] if moved else 0, 0.0,
                                     L1_view.priority[x] == PR_DECODE_CRITICAL, vo[2], -1)
                    tr.log_candidates(G, row, L1_view, L1_i, alt_b, alt_s, vo[3])
            tr.copy_row(L1_rows, slot, H_rows, vs)  # the first tier's block is from HBM
            L1_in[slot] = now_us
            L1_la[slot] = now_us
            L1_i[slot, LI_OWNER] = ow
            L1_i[slot, LI_BI] = bi
            L1_i[slot, LI_TOKENS] = tok
            L1_i[slot, LI_STATE] = 1
            hin = L1_ch[slot]
            if hin == pend:  # its lower copy was dropped just before: the entry goes first
                tr.hash_del(LH, pend)
                pend = 0
            tr.hash_put(LH, hin, tr.tier_value(slot, 1))  # a carried block's: in place
            L1m[LM_USED] += 1
            if lru1:
                dll_push_tail(P1, N1, E1, slot)
            else:
                L1_hooks[H_INSERT](L1_st, L1_view, slot, now_us)
            C[M_BYTES_DOWN + t] += L1_sz[slot]  # as copied
            spill_bytes(K, X, t, now_us, L1_sz[slot])
            used = L1m[LM_USED]
            C[C_USED + t] = used
            if used > C[C_PEAK + t]:
                C[C_PEAK + t] = used
            if moved == 0:
                continue
            vs = np.int64(1)
            tmp = True
            ow, bi, tok = TMP_i[1, 0], TMP_i[1, 1], TMP_i[1, 2]
            hcar = hx
        if dest <= 2 and cap2:
            # tier 2: tier_ops.spill_step written out (no counted argument copies)
            t = L2m[0]
            vo[0] = 0
            vo[1] = -1
            vo[2] = -1
            vo[3] = 0
            slot = -1
            if L2m[LM_FREE_TOP] > 0:
                L2m[LM_FREE_TOP] -= 1
                slot = L2_free[L2m[LM_FREE_TOP]]
            else:
                if lru2:  # lru's victim(): the list's head
                    x, reason, n_alt = E2[0], 0, 0
                    if x >= 0:
                        n_alt = list_walk(P2, N2, E2, alt_b, alt_s, L2_la)
                else:
                    x, reason, n_alt = L2_hooks[H_VICTIM](L2_st, L2_view, now_us,
                                                            alt_b, alt_s)
                if x >= 0:
                    if L2_i[x, LI_STATE] != 1:
                        raise ValueError("lower-tier policy: victim() named a block that is "
                                         "not resident")
                    hx = L2_ch[x]
                    # its entry: rewritten at the NVMe tier's fill, or removed (dropped)
                    prefetch(LH, 2 * (((hx * tr._FIB) >> 32) & m))
                    tr.prefetch_lines(L2_la, L2_tds, L2_pin, x)  # copied below
                    if lru2:
                        dll_remove(P2, N2, E2, x)
                        if E2[0] >= 0:  # the next victims' lines (see above)
                            _lru_ahead(LH, m, P2, N2, L2_i, L2_ch, L2_la, L2_tds,
                                       L2_pin, E2[0])
                    else:
                        L2_hooks[H_REMOVE](L2_st, L2_view, x)
                    L2_i[x, LI_STATE] = 0
                    L2m[LM_USED] -= 1
                    vo[0] = 1
                    vo[1] = x
                    vo[2] = reason
                    vo[3] = n_alt
                    slot = x
            if slot < 0:
                C[M_EVICT + t] += 1  # no room and no victim: the block is dropped
                if hcar != 0:  # carried from above: its entry goes (deferred)
                    pend = _drop(LH, pend, hcar)
                continue
            moved = 0
            if vo[0] == 1:
                x = vo[1]
                if below3 > 0:  # the victim goes on down: kept in TMP[2] until then
                    tr.copy_row(TMP_rows, 2, L2_rows, x)
                    TMP_i[2, 0] = L2_i[x, 0]
                    TMP_i[2, 1] = L2_i[x, 1]
                    TMP_i[2, 2] = L2_i[x, 2]
                    C[M_DEMOTE + t] += 1
                    moved = 1
                else:
                    C[M_EVICT + t] += 1
                    pend = _drop(LH, pend, hx)
                if log_on:
                    row = tr.log_row(G, C, step, now_us, A_DEMOTE if moved else A_EVICT,
                                     L2_view.content_hash[x], L2_i[x, 0], L2_i[x, 1], t,
                                     below3 if moved else -1,
                                     L2_view.size_bytes[x] if moved else 0, 0.0,
                                     L2_view.priority[x] == PR_DECODE_CRITICAL, vo[2], -1)
                    tr.log_candidates(G, row, L2_view, L2_i, alt_b, alt_s, vo[3])
            if tmp:  # carried from the tier above (not one array variable for both: a
                tr.copy_row(L2_rows, slot, TMP_rows, vs)  # counted copy per block)
            else:
                tr.copy_row(L2_rows, slot, H_rows, vs)
            L2_in[slot] = now_us
            L2_la[slot] = now_us
            L2_i[slot, LI_OWNER] = ow
            L2_i[slot, LI_BI] = bi
            L2_i[slot, LI_TOKENS] = tok
            L2_i[slot, LI_STATE] = 1
            hin = L2_ch[slot]
            if hin == pend:  # its lower copy was dropped just before: the entry goes first
                tr.hash_del(LH, pend)
                pend = 0
            tr.hash_put(LH, hin, tr.tier_value(slot, 2))  # a carried block's: in place
            L2m[LM_USED] += 1
            if lru2:
                dll_push_tail(P2, N2, E2, slot)
            else:
                L2_hooks[H_INSERT](L2_st, L2_view, slot, now_us)
            C[M_BYTES_DOWN + t] += L2_sz[slot]  # as copied
            spill_bytes(K, X, t, now_us, L2_sz[slot])
            used = L2m[LM_USED]
            C[C_USED + t] = used
            if used > C[C_PEAK + t]:
                C[C_PEAK + t] = used
            if moved == 0:
                continue
            vs = np.int64(2)
            tmp = True
            ow, bi, tok = TMP_i[2, 0], TMP_i[2, 1], TMP_i[2, 2]
            hcar = hx
        if cap3:
            # tier 3: tier_ops.spill_step written out (no counted argument copies)
            t = L3m[0]
            vo[0] = 0
            vo[1] = -1
            vo[2] = -1
            vo[3] = 0
            slot = -1
            if L3m[LM_FREE_TOP] > 0:
                L3m[LM_FREE_TOP] -= 1
                slot = L3_free[L3m[LM_FREE_TOP]]
            else:
                if lru3:  # lru's victim(): the list's head
                    x, reason, n_alt = E3[0], 0, 0
                    if x >= 0:
                        n_alt = list_walk(P3, N3, E3, alt_b, alt_s, L3_la)
                else:
                    x, reason, n_alt = L3_hooks[H_VICTIM](L3_st, L3_view, now_us,
                                                            alt_b, alt_s)
                if x >= 0:
                    if L3_i[x, LI_STATE] != 1:
                        raise ValueError("lower-tier policy: victim() named a block that is "
                                         "not resident")
                    hx = L3_ch[x]
                    prefetch(LH, 2 * (((hx * tr._FIB) >> 32) & m))  # for its removal
                    tr.prefetch_lines(L3_la, L3_tds, L3_pin, x)  # copied below
                    if lru3:
                        dll_remove(P3, N3, E3, x)
                        if E3[0] >= 0:  # the next victims' lines (see above)
                            _lru_ahead(LH, m, P3, N3, L3_i, L3_ch, L3_la, L3_tds,
                                       L3_pin, E3[0])
                    else:
                        L3_hooks[H_REMOVE](L3_st, L3_view, x)
                    L3_i[x, LI_STATE] = 0
                    L3m[LM_USED] -= 1
                    vo[0] = 1
                    vo[1] = x
                    vo[2] = reason
                    vo[3] = n_alt
                    slot = x
            if slot < 0:
                C[M_EVICT + t] += 1  # no room and no victim: the block is dropped
                if hcar != 0:  # carried from above: its entry goes (deferred)
                    pend = _drop(LH, pend, hcar)
                continue
            if vo[0] == 1:
                x = vo[1]
                C[M_EVICT + t] += 1  # the last tier: its victim is dropped
                pend = _drop(LH, pend, hx)
                if log_on:
                    row = tr.log_row(G, C, step, now_us, A_EVICT,
                                     L3_view.content_hash[x], L3_i[x, 0], L3_i[x, 1], t,
                                     -1, 0, 0.0,
                                     L3_view.priority[x] == PR_DECODE_CRITICAL, vo[2], -1)
                    tr.log_candidates(G, row, L3_view, L3_i, alt_b, alt_s, vo[3])
            if tmp:  # carried from the tier above (not one array variable for both: a
                tr.copy_row(L3_rows, slot, TMP_rows, vs)  # counted copy per block)
            else:
                tr.copy_row(L3_rows, slot, H_rows, vs)
            L3_in[slot] = now_us
            L3_la[slot] = now_us
            L3_i[slot, LI_OWNER] = ow
            L3_i[slot, LI_BI] = bi
            L3_i[slot, LI_TOKENS] = tok
            L3_i[slot, LI_STATE] = 1
            hin = L3_ch[slot]
            if hin == pend:  # its lower copy was dropped just before: the entry goes first
                tr.hash_del(LH, pend)
                pend = 0
            tr.hash_put(LH, hin, tr.tier_value(slot, 3))  # a carried block's: in place
            L3m[LM_USED] += 1
            if lru3:
                dll_push_tail(P3, N3, E3, slot)
            else:
                L3_hooks[H_INSERT](L3_st, L3_view, slot, now_us)
            C[M_BYTES_DOWN + t] += L3_sz[slot]  # as copied
            spill_bytes(K, X, t, now_us, L3_sz[slot])
            used = L3m[LM_USED]
            C[C_USED + t] = used
            if used > C[C_PEAK + t]:
                C[C_PEAK + t] = used
    if pend != 0:  # the table is exact again when the range is done
        tr.hash_del(LH, pend)
