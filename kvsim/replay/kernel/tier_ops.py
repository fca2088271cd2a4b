"""Lower-tier operations that call the tier policy's hooks.

A tier ``T`` (:class:`kvsim.replay.kernel.tiers.Tier`; compiled, a :class:`kvsim.policy.hooks.TierRef`)
carries its policy as ``T.L_ps = (state, hooks)`` (:mod:`kvsim.policy.hooks`): the hooks
are first-class functions, so these functions are compiled once for every policy and
every tier (the three lower tiers have one numba type).  State layout and
invariants: :mod:`kvsim.replay.kernel.tiers`.
"""

import numpy as np

from kvsim.core.codes import (  # noqa: E402
    A_DEMOTE,
    A_EVICT,
    A_WRITE_THROUGH,
    PR_DECODE_CRITICAL,  # noqa: E402
    W_WT,
    W_WTS,
)
from kvsim.core.layout import (
    C_PEAK,
    C_USED,
    HI_BI,
    HI_HITS,
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
    M_WRITE_THROUGH,
    WP_VLLM_OFFLOAD,
    WP_WRITE_THROUGH,
)
from kvsim.jit.decorators import njit
from kvsim.policy.api import dll_contains, dll_move_to_tail
from kvsim.policy.hooks import H_HIT, H_INSERT, H_REMOVE, H_VICTIM
from kvsim.replay.kernel.bookkeeping import _first_lower
from kvsim.replay.kernel.links import spill_bytes
from kvsim.replay.kernel.tiers import (
    copy_view,
    hash_del,
    hash_put,
    log_candidates,
    log_row,
    lower_find,
    tier_value,
)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def touch(T, slot, now_us):
    """A resident block was read (promoted to HBM); it stays resident (inclusive tier)."""
    L_view = T.L_view
    L_view.last_access_us[slot] = now_us
    L_view.access_count[slot] += 1
    L_st, L_hooks = T.L_ps
    L_hooks[H_HIT](L_st, L_view, slot, now_us)


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _lru_hit(la, ac, prev, nxt, ends, slot, now_us):
    """:func:`touch` of a built-in lru tier on its fields and list, bound by the caller."""
    la[slot] = now_us
    ac[slot] += 1
    if dll_contains(prev, slot):  # lru's on_hit
        dll_move_to_tail(prev, nxt, ends, slot)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def touch_range(cr, lo, hi, now_us):
    """:func:`touch` for the promoted blocks ``lo .. hi-1`` of a placement (tier
    ``cr.scr[0, e]``, slot ``cr.scr[1, e]``), the tiers read once; a tier whose policy is
    the built-in lru (bit ``t`` of ``K[K_LOWER_LRU]``) has lru's ``on_hit`` run as its list
    operation (kvsim.replay.kernel.spill, "Built-in lru tiers").  Each lru tier's fields
    and list are bound once per call, not per block (a member read is a counted reference,
    and a tier chosen per block into one variable was another)."""
    scr = cr.scr
    mask = cr.K[K_LOWER_LRU]
    T1 = cr.T1
    T2 = cr.T2
    T3 = cr.T3
    lru1 = (mask >> 1) & 1 != 0
    lru2 = (mask >> 2) & 1 != 0
    lru3 = (mask >> 3) & 1 != 0
    V1, V2, V3 = T1.L_view, T2.L_view, T3.L_view
    la1, ac1, la2, ac2, la3, ac3 = (V1.last_access_us, V1.access_count, V2.last_access_us,
                                    V2.access_count, V3.last_access_us, V3.access_count)
    dummy = cr.alt_b  # a tier not run as lru: its list is not read
    S1, S2, S3 = T1.L_ps[0], T2.L_ps[0], T3.L_ps[0]
    # spill.LRU_PREV, LRU_NXT, LRU_ENDS (checked by the driver)
    if lru1:
        P1, N1, E1 = S1.i64[0], S1.i64[1], S1.i64[2]
    else:
        P1, N1, E1 = dummy, dummy, dummy
    if lru2:
        P2, N2, E2 = S2.i64[0], S2.i64[1], S2.i64[2]
    else:
        P2, N2, E2 = dummy, dummy, dummy
    if lru3:
        P3, N3, E3 = S3.i64[0], S3.i64[1], S3.i64[2]
    else:
        P3, N3, E3 = dummy, dummy, dummy
    for e in range(lo, hi):
        t = scr[0, e]
        slot = scr[1, e]
        if t == 1:
            if lru1:
                _lru_hit(la1, ac1, P1, N1, E1, slot, now_us)
            else:
                touch(T1, slot, now_us)
        elif t == 2:
            if lru2:
                _lru_hit(la2, ac2, P2, N2, E2, slot, now_us)
            else:
                touch(T2, slot, now_us)
        elif lru3:
            _lru_hit(la3, ac3, P3, N3, E3, slot, now_us)
        else:
            touch(T3, slot, now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def spill_step(T, src, s, ow, bi, tok, below, k, cr, step, now_us):
    """Write block ``src[s]`` (owner ``ow``, block index ``bi``, ``tok`` tokens) into tier
    ``T``.  A slot is a free one, else the policy's victim, removed from the map and the
    candidate set and copied into ``TMP[k]`` / ``TMP_i[k]`` (logged as DEMOTE to tier
    ``below``, the next enabled tier, when ``below > 0``, else EVICT); 1 is returned when
    it should go on down.  Then the block fills the slot and becomes a candidate.  0: the
    victim was dropped, or there was none, or the block itself was dropped (no room and
    no victim).

    The only code that changes ``Lm[LM_USED]``: it mirrors the new count into
    ``C[C_USED + t]`` (and the peak), which the step close copies into the step table
    (per-step occupancy).  Called by :func:`_spill` (write-through); the
    HBM demotions run the same statements written out per tier
    (:func:`kvsim.replay.kernel.spill._hbm_evicted_range`: an edit here must be made there too;
    kvsim.replay.kernel.spill, "Per-call cost").  ``cr``: the core's state
    (:class:`kvsim.replay.kernel.core_ref.CoreRef`: its scratch rows, counters and log)."""
    TMP = cr.TMP
    TMP_i = cr.TMP_i
    K = cr.K
    X = cr.X
    C = cr.C
    G = cr.G
    alt_b = cr.alt_b
    alt_s = cr.alt_s
    vo = cr.vo
    L_i = T.L_i
    L_view = T.L_view
    L_h = T.L_h
    Lm = T.Lm
    L_st, L_hooks = T.L_ps
    t = Lm[0]
    vo[0] = 0
    vo[1] = -1
    vo[2] = -1
    vo[3] = 0
    slot = -1
    if Lm[LM_CAP] != 0:
        if Lm[LM_FREE_TOP] > 0:
            Lm[LM_FREE_TOP] -= 1
            slot = T.L_free[Lm[LM_FREE_TOP]]
        else:
            v, reason, n_alt = L_hooks[H_VICTIM](L_st, L_view, now_us, alt_b, alt_s)
            if v >= 0:
                if L_i[v, LI_STATE] != 1:
                    raise ValueError("lower-tier policy: victim() named a block that is not "
                                     "resident")
                L_hooks[H_REMOVE](L_st, L_view, v)
                hash_del(L_h, L_view.content_hash[v])
                L_i[v, LI_STATE] = 0
                Lm[LM_USED] -= 1
                vo[0] = 1
                vo[1] = v
                vo[2] = reason
                vo[3] = n_alt
                slot = v
    if slot < 0:
        C[M_EVICT + t] += 1  # no room and no victim: the block is dropped
        return 0
    moved = 0
    if vo[0] == 1:
        v = vo[1]
        if below > 0:  # the victim goes on down: kept in TMP[k] until then
            copy_view(TMP, k, L_view, v)
            TMP_i[k, 0] = L_i[v, 0]
            TMP_i[k, 1] = L_i[v, 1]
            TMP_i[k, 2] = L_i[v, 2]
            C[M_DEMOTE + t] += 1
            moved = 1
            act = A_DEMOTE
            to = below
        else:
            C[M_EVICT + t] += 1
            act = A_EVICT
            to = -1
        if K[K_LOG] != 0:
            row = log_row(G, C, step, now_us, act, L_view.content_hash[v], L_i[v, 0],
                          L_i[v, 1], t, to, L_view.size_bytes[v] if moved else 0, 0.0,
                          L_view.priority[v] == PR_DECODE_CRITICAL, vo[2], -1)
            log_candidates(G, row, L_view, L_i, alt_b, alt_s, vo[3])
    # fill
    copy_view(L_view, slot, src, s)
    L_view.insert_us[slot] = now_us
    L_view.last_access_us[slot] = now_us
    L_i[slot, LI_OWNER] = ow
    L_i[slot, LI_BI] = bi
    L_i[slot, LI_TOKENS] = tok
    L_i[slot, LI_STATE] = 1
    hash_put(L_h, L_view.content_hash[slot], tier_value(slot, t))  # the shared table
    Lm[LM_USED] += 1
    L_hooks[H_INSERT](L_st, L_view, slot, now_us)
    C[M_BYTES_DOWN + t] += src.size_bytes[s]
    spill_bytes(K, X, t, now_us, src.size_bytes[s])
    used = Lm[LM_USED]
    C[C_USED + t] = used
    if used > C[C_PEAK + t]:
        C[C_PEAK + t] = used
    return moved


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _spill(src, s, ow, bi, tok, dest, cr, step, now_us):
    """Write a block into tier ``dest`` (1..3) or the first enabled tier below it; victims
    cascade down (DRAM -> CXL -> NVMe -> dropped)."""
    T1 = cr.T1
    T2 = cr.T2
    T3 = cr.T3
    TMP = cr.TMP
    TMP_i = cr.TMP_i
    cap2 = T2.Lm[LM_CAP] > 0
    cap3 = T3.Lm[LM_CAP] > 0
    # the next enabled tier below each tier (0 = none: its victims are dropped)
    below3 = np.int64(3) if cap3 else np.int64(0)
    below2 = np.int64(2) if cap2 else below3
    v = src
    vs = s
    if dest <= 1 and T1.Lm[LM_CAP] > 0:
        if spill_step(T1, v, vs, ow, bi, tok, below2, np.int64(1), cr, step,
                               now_us) == 0:
            return
        v = TMP
        vs = 1
        ow, bi, tok = TMP_i[1, 0], TMP_i[1, 1], TMP_i[1, 2]
    if dest <= 2 and cap2:
        if spill_step(T2, v, vs, ow, bi, tok, below3, np.int64(2), cr, step,
                               now_us) == 0:
            return
        v = TMP
        vs = 2
        ow, bi, tok = TMP_i[2, 0], TMP_i[2, 1], TMP_i[2, 2]
    if cap3:
        spill_step(T3, v, vs, ow, bi, tok, np.int64(0), np.int64(3), cr, step,
                            now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _write_through(b, r, cr, step, now_us):
    """HiCache write_through(_selective): back block ``b`` up once its hit count reaches
    the threshold (1, or 2 for selective), unless a lower copy exists.

    Callers test ``K[K_WRITE_POLICY] != WP_WRITE_BACK`` first, so under write_back (the
    default) it costs them one test.  It used to be wrapped in an inlined function doing
    that test (numba ``inline="always"``), but numba keeps a counted copy of each of an
    inlined function's 17 arguments: the Mooncake 16-token replay's core took 6.3 % more
    CPU (paired runs, docs/benchmarks.md)."""
    K = cr.K
    C = cr.C
    H_i = cr.H_i
    view = cr.H_view
    T1 = cr.T1
    T2 = cr.T2
    T3 = cr.T3
    wp = K[K_WRITE_POLICY]
    if wp == WP_VLLM_OFFLOAD:  # stores are made per step (kvsim.replay.kernel.offload)
        return
    thr = 1 if wp == WP_WRITE_THROUGH else 2
    h = view.content_hash[b]
    if h == 0 or H_i[b, HI_HITS] != thr or lower_find(T1.L_h, h) >= 0:  # a lower copy
        return
    dest = _first_lower(T1, T2, T3)
    if dest == 0:
        return
    C[M_WRITE_THROUGH] += 1
    if K[K_LOG] != 0:
        log_row(cr.G, C, step, now_us, A_WRITE_THROUGH, h, r, H_i[b, HI_BI], 0, dest,
                   view.size_bytes[b], 0.0, view.priority[b] == PR_DECODE_CRITICAL, -1,
                   W_WT if thr == 1 else W_WTS)
    _spill(view, b, H_i[b, HI_OWNER], H_i[b, HI_BI], H_i[b, HI_TOKENS], dest, cr, step,
           now_us)
