"""Demotion of HBM blocks into the lower tiers: the part of the replay core that calls the
lower tiers' policy hooks (through :mod:`kvsim.sim.tier_ops`; each tier carries its policy
as ``T[4] = (state, hooks)``, so the three tiers share one compiled ``spill_into``).

Rules: docs/simulate.md (demotion, write-through) and docs/cost-model.md.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.sim import tier_ops
from kvsim.sim import tiers as tr
from kvsim.sim.bookkeeping import _below, _first_lower
from kvsim.sim.layout import (HI_BI, HI_HITS, HI_OWNER, HI_TOKENS, K_LOG, K_WRITE_POLICY,
                              LM_CAP, M_DEMOTE, M_EVICT, M_WRITE_THROUGH, WP_WRITE_BACK,
                              WP_WRITE_THROUGH)

# Values shared with kvsim.sim.core (which asserts they agree): Action codes
# (kvsim.results.log_schema.Action), the replay's own reasons (core.WHY) and Priority.
A_EVICT, A_DEMOTE, A_WRITE_THROUGH = 0, 1, 5
W_WT, W_WTS, W_BACKED = 4, 5, 15
PR_DECODE_CRITICAL = 3


# ---------------------------------------------------------------------------------------
# lower-tier spills
# ---------------------------------------------------------------------------------------

@njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _spill(src, s, ow, bi, tok, dest, T1, T2, T3, TMP, TMP_i, K, C, G, step, now_us, alt_b, alt_s, vo):
    """Write a block into tier ``dest`` (1..3) or the first enabled tier below it; victims
    cascade down (DRAM -> CXL -> NVMe -> dropped)."""
    cap2 = T2[5][LM_CAP] > 0
    cap3 = T3[5][LM_CAP] > 0
    # the next enabled tier below each tier (0 = none: its victims are dropped)
    below3 = np.int64(3) if cap3 else np.int64(0)
    below2 = np.int64(2) if cap2 else below3
    v = src
    vs = s
    if dest <= 1 and T1[5][LM_CAP] > 0:
        if tier_ops.spill_into(T1, v, vs, ow, bi, tok, below2, np.int64(1), TMP, TMP_i,
                               K, C, G, step, now_us, alt_b, alt_s, vo) == 0:
            return
        v = TMP
        vs = 1
        ow, bi, tok = TMP_i[1, 0], TMP_i[1, 1], TMP_i[1, 2]
    if dest <= 2 and cap2:
        if tier_ops.spill_into(T2, v, vs, ow, bi, tok, below3, np.int64(2), TMP, TMP_i,
                              K, C, G, step, now_us, alt_b, alt_s, vo) == 0:
            return
        v = TMP
        vs = 2
        ow, bi, tok = TMP_i[2, 0], TMP_i[2, 1], TMP_i[2, 2]
    if cap3:
        tier_ops.spill_into(T3, v, vs, ow, bi, tok, np.int64(0), np.int64(3), TMP, TMP_i,
                            K, C, G, step, now_us, alt_b, alt_s, vo)


@njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _hbm_evicted(b, h, reason, n_alt, e, r, K, C, H_i, view, out, T1, T2, T3, TMP, TMP_i, G, step, now_us, alt_b, alt_s, vo):
    """Cached HBM block ``b`` (content ``h``) was evicted by the policy for a new block:
    demote it (write_back and no lower copy) or drop it.  Its view is still intact."""
    dest = 0
    backed = _below(T1, T2, T3, h)
    if not backed and K[K_WRITE_POLICY] == WP_WRITE_BACK:
        dest = _first_lower(T1, T2, T3)
    if K[K_LOG] != 0:
        row = tr.log_row(G, C, step, now_us, A_DEMOTE if dest > 0 else A_EVICT, h,
                         H_i[b, HI_OWNER], H_i[b, HI_BI], 0, dest if dest > 0 else -1,
                         view.size_bytes[b] if dest > 0 else 0, 0.0,
                         view.priority[b] == PR_DECODE_CRITICAL, reason,
                         W_BACKED if backed else -1)
        # at most log_candidates of them (alt_b is sized by it), as for the lower tiers
        tr.log_candidates(G, row, view, H_i, out.alt_blocks[e], out.alt_scores[e],
                          min(n_alt, alt_b.shape[0]))
    if dest > 0:
        C[M_DEMOTE] += 1
        _spill(view, b, H_i[b, HI_OWNER], H_i[b, HI_BI], H_i[b, HI_TOKENS], dest, T1, T2, T3,
               TMP, TMP_i, K, C, G, step,
               now_us, alt_b, alt_s, vo)
    else:
        C[M_EVICT] += 1


@njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def _write_through(b, r, K, C, H_i, view, T1, T2, T3, TMP, TMP_i, G, step, now_us, alt_b, alt_s, vo):
    """HiCache write_through(_selective): back block ``b`` up once its hit count reaches
    the threshold (1, or 2 for selective), unless a lower copy exists."""
    wp = K[K_WRITE_POLICY]
    if wp == WP_WRITE_BACK:
        return
    thr = 1 if wp == WP_WRITE_THROUGH else 2
    h = view.content_hash[b]
    if h == 0 or H_i[b, HI_HITS] != thr or _below(T1, T2, T3, h):
        return
    dest = _first_lower(T1, T2, T3)
    if dest == 0:
        return
    C[M_WRITE_THROUGH] += 1
    if K[K_LOG] != 0:
        tr.log_row(G, C, step, now_us, A_WRITE_THROUGH, h, r, H_i[b, HI_BI], 0, dest,
                   view.size_bytes[b], 0.0, view.priority[b] == PR_DECODE_CRITICAL, -1,
                   W_WT if thr == 1 else W_WTS)
    _spill(view, b, H_i[b, HI_OWNER], H_i[b, HI_BI], H_i[b, HI_TOKENS], dest, T1, T2, T3,
           TMP, TMP_i, K, C, G, step, now_us,
           alt_b, alt_s, vo)
