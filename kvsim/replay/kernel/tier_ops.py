"""Lower-tier operations that call the tier policy's hooks.

A tier ``T`` (:class:`kvsim.replay.kernel.tiers.Tier`; compiled, a :class:`kvsim.policy.hooks.TierRef`)
carries its policy as ``T.L_ps = (state, hooks)`` (:mod:`kvsim.policy.hooks`): the hooks
are first-class functions, so these functions are compiled once for every policy and
every tier (the three lower tiers have one numba type).  State layout and
invariants: :mod:`kvsim.replay.kernel.tiers`.
"""

from kvsim.core.codes import (  # noqa: E402
    A_DEMOTE,
    A_EVICT,
    PR_DECODE_CRITICAL,  # noqa: E402
)
from kvsim.core.layout import (
    C_PEAK,
    C_USED,
    K_LOG,
    K_LOWER_LRU,
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
)
from kvsim.jit.decorators import njit
from kvsim.policy.api import dll_contains, dll_move_to_tail
from kvsim.policy.hooks import H_HIT, H_INSERT, H_REMOVE, H_VICTIM
from kvsim.replay.kernel.links import spill_bytes
from kvsim.replay.kernel.tiers import (
    copy_view,
    hash_del,
    hash_put,
    log_candidates,
    log_row,
    tier_value,
)


@njit(cache=True)
def touch(T, slot, now_us):
    """A resident block was read (promoted to HBM); it stays resident (inclusive tier)."""
    L_view = T.L_view
    L_view.last_access_us[slot] = now_us
    L_view.access_count[slot] += 1
    L_st, L_hooks = T.L_ps
    L_hooks[H_HIT](L_st, L_view, slot, now_us)


@njit(cache=True)
def touch_range(cr, lo, hi, now_us):
    """:func:`touch` for the promoted blocks ``lo .. hi-1`` of a placement (tier
    ``cr.scr[0, e]``, slot ``cr.scr[1, e]``), the tiers read once; a tier whose policy is
    the built-in lru (bit ``t`` of ``K[K_LOWER_LRU]``) has lru's ``on_hit`` run as its list
    operation (kvsim.replay.kernel.spill, "Built-in lru tiers")."""
    scr = cr.scr
    mask = cr.K[K_LOWER_LRU]
    T1 = cr.T1
    T2 = cr.T2
    T3 = cr.T3
    for e in range(lo, hi):
        t = scr[0, e]
        T = T1 if t == 1 else (T2 if t == 2 else T3)
        slot = scr[1, e]
        if (mask >> t) & 1 == 0:
            touch(T, slot, now_us)
            continue
        L_view = T.L_view
        L_view.last_access_us[slot] = now_us
        L_view.access_count[slot] += 1
        L_st = T.L_ps[0]
        prev = L_st.i64[0]  # spill.LRU_PREV, LRU_NXT, LRU_ENDS (checked by the driver)
        if dll_contains(prev, slot):  # lru's on_hit
            dll_move_to_tail(prev, L_st.i64[1], L_st.i64[2], slot)


@njit(cache=True)
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
    (per-step occupancy).  Called by :func:`kvsim.replay.kernel.spill._spill` (write-through); the
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
