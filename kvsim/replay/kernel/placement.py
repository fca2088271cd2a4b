"""Placement of a request's blocks in HBM: the prefix lookup (HBM, then the chain continued
in the lower tiers), allocation with preemption, promotions, recomputation, write-through,
release at FREE and the caching of a block once it is full.

Called by the replay loop, :func:`kvsim.replay.kernel.core.run` (split from :mod:`kvsim.replay.kernel.core`
to keep each module under ~600 lines; compiled with it, once for every policy, and run by
its interpreted twin the same way: :func:`kvsim.replay.variants.interpreted`).  The rules are
written out in docs/simulate.md and docs/cost-model.md.  The reason codes ``W_*`` index
:data:`kvsim.replay.kernel.core.WHY`.
"""

from __future__ import annotations

import numpy as np

# the decision log's action and reason codes (kvsim.core.codes: Action, Reason)
from kvsim.core.codes import (  # noqa: E402,F401  # noqa: E402
    A_ALLOCATE,
    A_DEMOTE,
    A_EVICT,
    A_FREE,
    A_HIT,
    A_PREEMPT,
    A_PREFETCH,
    A_PROMOTE,
    A_RECOMPUTE,
    A_RELEASE,
    A_REVIVE,
    A_WRITE_THROUGH,
    PH_DECODE,
    PH_PREFILL,
    PH_VERIFY,
    PR_DECODE_CRITICAL,
    W_ALLOC,
    W_BACKED,
    W_COW,
    W_FREE,
    W_HIT,
    W_PRE_LAST,
    W_PRE_PRIO,
    W_PREFETCH,
    W_PROMOTE,
    W_PROMOTE_RERUN,
    W_RECOMP,
    W_RECOMP_RERUN,
    W_RELEASE,
    W_REVIVE,
    W_SWAP_IN,
    W_WT,
    W_WTS,
)
from kvsim.core.layout import (
    AI_DEADLINE,
    AI_FULL_HASH,
    AI_HASH,
    AI_NEXT,
    AI_PFOK,
    AI_PHASE,
    AI_PIN,
    AI_PRIO,
    AI_RPRIO,
    AI_SEEN,
    AI_SIZE,
    AI_SLACK,
    AI_TDS,
    AI_TOKENS,
    C_HBM_USED,
    C_NPEND,
    C_STEP,
    C_STEP_EXTRA_US,
    C_STEP_STALL_US,
    C_STEP_START_US,
    HI_BI,
    HI_HITS,
    HI_OWNER,
    HI_TOKENS,
    K_BLOCK_TOKENS,
    K_LINK_QUEUE,
    K_LOG,
    K_LOG_LIFECYCLE,
    K_PREEMPT_SWAP,
    K_PREFETCH,
    K_PRIO_SCHED,
    K_WRITE_POLICY,
    M_ALLOC_BLK,
    M_BYTES_UP,
    M_DC_MISS,
    M_FIRST_TOK,
    M_HIT_BLK,
    M_HIT_TOK,
    M_LOOKUP_BLK,
    M_LOOKUP_TOK,
    M_OVERFLOW,
    M_PREEMPT_RECOMP_TOK,
    M_PREEMPTIONS,
    M_PREFETCH,
    M_PREFETCH_USEFUL,
    M_PROMOTE,
    M_RECOMP_TOK,
    M_STALL_US,
    M_SWAP_IN_BYTES,
    M_SWAP_OUT_BYTES,
    RF_CREDIT_US,
    RF_PF_BUDGET_US,
    RF_QWAIT_US,
    RF_STALL_US,
    RF_XFERS,
    RI_ARRIVE_US,
    RI_BOUND,
    RI_BT_LEN,
    RI_BT_START,
    RI_DC_MISS,
    RI_HIT_TOK,
    RI_LATMASK,
    RI_LOOKUP_TOK,
    RI_NOUT,
    RI_PREEMPTS,
    RI_PROMPT,
    RI_RECOMP_TOK,
    RI_SEQ,
    RI_STATE,
    RI_TENANT,
    RS_PREEMPTED,
    RS_RUNNING,
    WP_WRITE_BACK,
    X_DOWN_BYTES_PER_US,
    X_DOWN_LAT_US,
    X_UP_BYTES_PER_US,
    X_UP_LAT_US,
)
from kvsim.jit.decorators import njit
from kvsim.jit.prefetch import prefetch
from kvsim.memory import fast as mem
from kvsim.memory import pool_ops as ops
from kvsim.replay.kernel import spill as lower
from kvsim.replay.kernel import tier_ops
from kvsim.replay.kernel import tiers as tr
from kvsim.replay.kernel.bookkeeping import _peak, _pick_victim, _run_remove
from kvsim.replay.kernel.links import submit_down, submit_up

assert (lower.A_EVICT, lower.A_DEMOTE, tier_ops.A_WRITE_THROUGH, tier_ops.W_WT,
        tier_ops.W_WTS, lower.W_BACKED, lower.PR_DECODE_CRITICAL) == (
            A_EVICT, A_DEMOTE, A_WRITE_THROUGH, W_WT, W_WTS, W_BACKED, PR_DECODE_CRITICAL)

NEVER = np.iinfo(np.int64).max

MODE_ADMIT = 0
MODE_RERUN = 1
MODE_APPEND = 2



# Functions that compiled code never takes as a value are compiled without numba's
# C-callable wrapper (kvsim.jit.decorators: decided at decoration time, FIRST_CLASS lists
# the exceptions).  numba's CPython wrapper is kept (since #31 kvsim no longer patches
# numba to drop it: docs/jit.md).
#
# Constant arguments are passed as ``np.int64(...)`` (and ``not cap3`` for False): numba
# specialises a callee on the literal value of a constant argument, so ``_place(r, 0, ...,
# MODE_ADMIT)`` and ``_place(r, e, 1, MODE_APPEND)`` were three separate compilations of
# the biggest function after ``run`` (and two of ``_allocate``, ``pool_ops.allocate``,
# ``spill._hbm_evicted``, three of ``spill_into``): ~25 of ~120 CPU-s per policy.
#
# Array copies are element loops: a row or slice assignment (``Cw[:] = C[:]``) pulls in
# numba's shape-mismatch error path (string-formatting overloads that numba never caches
# on disk, ~4 CPU-s in every process that compiles a new core).

# ---------------------------------------------------------------------------------------
# HBM: allocation with preemption, placement of a request's blocks
# ---------------------------------------------------------------------------------------

@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _preempt(v, cr, step, now_us):
    K = cr.K
    X = cr.X
    C = cr.C
    R_i = cr.R_i
    A_i = cr.A_i
    st = cr.st
    pst = cr.pst
    view = cr.H_view
    running = cr.running
    G = cr.G
    seq = R_i[v, RI_SEQ]
    for e in range(st.seq_len[seq]):  # per-request recency: its blocks were in use until now
        view.last_access_us[st.tables[seq, e]] = now_us
    n = ops.preempt(st, pst, view, seq, K[K_PREEMPT_SWAP], now_us)
    start = R_i[v, RI_BT_START]
    nbytes = 0
    for e in range(R_i[v, RI_BT_LEN]):
        nbytes += A_i[start + e, AI_SIZE]
    C[C_HBM_USED] = st.sc[mem.S_N_HELD]
    cost = 0.0
    if K[K_PREEMPT_SWAP] != 0:
        C[M_SWAP_OUT_BYTES] += nbytes
        cost = X[1, X_DOWN_LAT_US] + nbytes / X[1, X_DOWN_BYTES_PER_US]
        if K[K_LINK_QUEUE] != 0:  # on the DRAM down link, behind what is queued there
            end = submit_down(X, 1, now_us, cost) + cost
            ready = now_us + C[C_STEP_EXTRA_US]
            cost = end - ready if end > ready else 0.0
        C[C_STEP_EXTRA_US] += cost
    _run_remove(running, C, v)
    R_i[v, RI_STATE] = RS_PREEMPTED
    R_i[v, RI_PREEMPTS] += 1
    C[M_PREEMPTIONS] += 1
    if K[K_LOG] != 0:
        tr.log_row(G, C, step, now_us, A_PREEMPT, 0, v, -1, 0,
                   1 if K[K_PREEMPT_SWAP] != 0 else -1,
                   nbytes if K[K_PREEMPT_SWAP] != 0 else 0, cost, R_i[v, RI_BOUND] != 0, -1,
                   W_PRE_PRIO if K[K_PRIO_SCHED] != 0 else W_PRE_LAST)
    return n


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _allocate(r, n, num_tokens, cr, step, now_us):
    """pool_allocate, preempting other running requests until it fits.  -1: it cannot fit
    even alone (HBM smaller than the request)."""
    C = cr.C
    R_i = cr.R_i
    st = cr.st
    pst = cr.pst
    view = cr.H_view
    out = cr.out
    hbuf = cr.hbuf
    seq = R_i[r, RI_SEQ]
    while True:
        k = ops.allocate(st, pst, view, seq, hbuf, n, num_tokens, now_us, out)
        if k >= 0:
            C[C_HBM_USED] = st.sc[mem.S_N_HELD]
            _peak(C, 0, C[C_HBM_USED])
            return k
        v = _pick_victim(cr.running, C, R_i, r, cr.K[K_PRIO_SCHED] != 0)
        if v < 0:
            return -1
        _preempt(v, cr, step, now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _queued_promotion(X, C, R_i, R_f, r, t, now_us, xfer, first, pf):
    """``--link-model queue``: one promoted block's ``xfer`` (its bytes over the link, plus
    the batch's latency when ``first``) queued on tier ``t``'s up link; returns (stall,
    hidden).  Issued at the request's arrival when it may be prefetched (``pf``: the
    lower-tier KV of a waiting request is loaded while it waits, as SGLang HiCache does),
    else at the step start ``now_us``.  The step waits until the block has arrived: its
    stall is how far the block's arrival passes the step's start plus the stall charged so
    far (the step waits for all its transfers, on every link, at once); ``hidden`` the part
    of the transfer before the step start."""
    issue = float(R_i[r, RI_ARRIVE_US]) if pf else now_us
    if issue > now_us:
        issue = now_us
    start = submit_up(X, t, issue, xfer, first)
    end = start + xfer
    if first:
        R_f[r, RF_QWAIT_US] += start - issue
        R_f[r, RF_XFERS] += 1.0
    ready = now_us + C[C_STEP_STALL_US]
    stall = end - ready if end > ready else 0.0
    hidden = (min(end, now_us) - start) if start < now_us else 0.0
    return stall, hidden


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _place(r, e0, nb, mode, cr):
    """Put blocks ``e0 .. e0+nb-1`` of request ``r`` (its records) into HBM.

    MODE_ADMIT: the prompt at admission (prefix lookup in HBM, then the chain continued in
    the lower tiers, then compute).  MODE_RERUN: a preempted request resumes (its whole
    table).  MODE_APPEND: one new block (decode) with no lookup.  ``cr``: the core's state
    (:class:`kvsim.replay.kernel.core_ref.CoreRef`), its members read once here."""
    K = cr.K
    X = cr.X
    C = cr.C
    R_i = cr.R_i
    R_f = cr.R_f
    A_i = cr.A_i
    A_f = cr.A_f
    H_i = cr.H_i
    st = cr.st
    out = cr.out
    hbuf = cr.hbuf
    scr = cr.scr
    pst = cr.pst
    view = cr.H_view
    G = cr.G
    step = int(C[C_STEP])
    now_us = C[C_STEP_START_US]
    bs = K[K_BLOCK_TOKENS]
    base = R_i[r, RI_BT_START] + e0
    ntok_total = 0
    for e in range(nb):
        hbuf[e] = A_i[base + e, AI_HASH]
        ntok_total += A_i[base + e, AI_TOKENS]
    if mode == MODE_ADMIT:
        # prompt + output so far: a request the scheduler preempted (core.py,
        # FREE_PREEMPT_BLOCK) is admitted again with its output tokens (vLLM num_tokens)
        num_tokens = R_i[r, RI_PROMPT] + R_i[r, RI_NOUT]
    elif mode == MODE_RERUN:
        num_tokens = ntok_total + 1  # every full block may hit
    else:
        num_tokens = 0
    # 1. the chain in HBM, then continued below (not for appended blocks)
    n_hbm = 0
    k = 0
    if mode != MODE_APPEND:
        n_hbm = mem.pool_lookup(st, hbuf, nb, num_tokens, out.blocks)
        limit = min(nb, (num_tokens - 1) // bs) if num_tokens > 0 else 0
        k = n_hbm
        LH = cr.T1.L_h  # the lower tiers' shared table (kvsim.replay.kernel.tiers)
        m = (LH.shape[0] >> 1) - 1  # entries - 1 (tiers.hash_slot)
        while k < limit and hbuf[k] != 0:
            f = k + lower.PREFETCH_AHEAD  # a later block's probe, requested now
            if f < limit:
                prefetch(LH, 2 * (((hbuf[f] * tr._FIB) >> 32) & m))  # as tiers.hash_slot
            v = tr.lower_find(LH, hbuf[k])  # slot * 4 + tier, or -1
            if v < 0:
                break
            t = v & 3
            s = v >> 2
            scr[0, k] = t
            scr[1, k] = s
            k += 1
    # 2. room in HBM (preempting others if needed)
    n_hit = _allocate(r, nb, num_tokens, cr, step, now_us)
    if n_hit < 0:
        C[M_OVERFLOW] += nb
        return -1
    if k < n_hit:
        k = n_hit  # preemption released more of the chain into the HBM cache
    # 3a. promotions touch their lower copies before any spill can evict them
    if n_hit < k:
        tier_ops.touch_range(cr, n_hit, k, now_us)
    # 3b. cached blocks the policy evicted for the new ones (views still intact)
    lower._hbm_evicted_range(n_hit, nb, r, cr, step, now_us)  # one call, not one per block
    # 3c. accounting, views, decisions
    log_on = K[K_LOG] != 0
    life = log_on and K[K_LOG_LIFECYCLE] != 0
    bound = R_i[r, RI_BOUND] != 0
    # the view's fields bound once per call: bookkeeping._set_view_from_record written out
    # below (a call per block passed the view and two arrays, counted references each, and
    # read 11 of the view's members again; 9.3 M blocks on the Mooncake 16-token import)
    v_ph, v_pr, v_rp, v_pin = view.phase, view.priority, view.request_priority, view.pinned
    v_dl, v_sl, v_tds, v_nu = view.deadline_us, view.slack_us, view.target_decode_step, \
        view.next_use
    v_rc, v_sz, v_la, v_ac = view.recompute_cost_us, view.size_bytes, view.last_access_us, \
        view.access_count
    v_ins, v_ch, v_ten, o_b, o_k = view.insert_us, view.content_hash, view.tenant, out.blocks, \
        out.kind
    for e in range(nb):
        a = base + e
        b = o_b[e]
        tok = A_i[a, AI_TOKENS]
        size = A_i[a, AI_SIZE]
        h = A_i[a, AI_HASH]
        bi = e0 + e
        # the block's intent fields as the serving layer last stated them (its record)
        pr = A_i[a, AI_PRIO]
        v_ph[b] = A_i[a, AI_PHASE]
        v_pr[b] = pr
        v_rp[b] = A_i[a, AI_RPRIO]
        v_dl[b] = A_i[a, AI_DEADLINE]
        v_sl[b] = A_i[a, AI_SLACK]
        v_tds[b] = A_i[a, AI_TDS]
        v_pin[b] = A_i[a, AI_PIN] != 0 or pr == PR_DECODE_CRITICAL
        v_rc[b] = A_f[a]
        v_sz[b] = size
        v_nu[b] = A_i[a, AI_NEXT]
        v_la[b] = now_us
        if e < n_hit:  # HBM prefix hit
            v_ac[b] += 1
            H_i[b, HI_HITS] += 1
            if mode == MODE_ADMIT:
                C[M_HIT_TOK] += tok
                C[M_HIT_BLK] += 1
                R_i[r, RI_HIT_TOK] += tok
                R_f[r, RF_CREDIT_US] += A_f[a]
            if life:
                tr.log_row(G, C, step, now_us,
                           A_REVIVE if o_k[e] == mem.KIND_REVIVED else A_HIT, h, r, bi,
                           0, 0, 0, 0.0, False, -1,
                           W_REVIVE if o_k[e] == mem.KIND_REVIVED else W_HIT)
            if K[K_WRITE_POLICY] != WP_WRITE_BACK:  # not a call under write_back
                tier_ops._write_through(b, r, cr, step, now_us)
            continue
        # a new HBM block: its identity
        v_ins[b] = now_us
        v_ac[b] = 1
        v_ch[b] = h
        v_ten[b] = R_i[r, RI_TENANT]
        H_i[b, HI_OWNER] = r
        H_i[b, HI_BI] = bi
        H_i[b, HI_TOKENS] = tok
        H_i[b, HI_HITS] = 1 if h != 0 else 0
        C[M_ALLOC_BLK] += 1
        if life:
            tr.log_row(G, C, step, now_us, A_ALLOCATE, h, r, bi, -1, 0, 0, 0.0, False, -1,
                       W_ALLOC)
        if e < k:  # found in a lower tier: transfer it up
            t = scr[0, e]
            lat = 0.0
            first = (R_i[r, RI_LATMASK] >> t) & 1 == 0
            if first:
                lat = X[t, X_UP_LAT_US]
                R_i[r, RI_LATMASK] |= 1 << t
            xfer = lat + size / X[t, X_UP_BYTES_PER_US]
            hidden = 0.0
            pf = K[K_PREFETCH] != 0 and A_i[a, AI_PFOK] != 0 and mode == MODE_ADMIT
            if K[K_LINK_QUEUE] != 0:  # the link's FIFO queue (kvsim.replay.kernel.links)
                stall, hidden = _queued_promotion(X, C, R_i, R_f, r, t, now_us, xfer, first,
                                                  pf)
            else:
                if pf:
                    hidden = min(xfer, R_f[r, RF_PF_BUDGET_US])
                    R_f[r, RF_PF_BUDGET_US] -= hidden
                stall = xfer - hidden
            C[C_STEP_STALL_US] += stall
            C[M_STALL_US] += stall
            R_f[r, RF_STALL_US] += stall
            C[M_BYTES_UP + t] += size
            if hidden > 0.0:
                C[M_PREFETCH] += 1
                if stall == 0.0:
                    C[M_PREFETCH_USEFUL] += 1
            else:
                C[M_PROMOTE] += 1
            if mode == MODE_ADMIT:
                C[M_HIT_TOK + t] += tok
                C[M_HIT_BLK + t] += 1
                R_i[r, RI_HIT_TOK + t] += tok
                R_f[r, RF_CREDIT_US] += A_f[a]
            if bound:
                C[M_DC_MISS] += 1
                R_i[r, RI_DC_MISS] += 1
            if log_on:
                if mode == MODE_RERUN:
                    why = W_PROMOTE_RERUN
                elif hidden > 0.0:
                    why = W_PREFETCH
                else:
                    why = W_PROMOTE
                tr.log_row(G, C, step, now_us, A_PREFETCH if hidden > 0.0 else A_PROMOTE, h,
                           r, bi, t, 0, size, stall, bound, -1, why)
        elif mode == MODE_RERUN:
            if K[K_PREEMPT_SWAP] != 0:  # swapped out: bring it back
                lat = 0.0
                if (R_i[r, RI_LATMASK] >> 1) & 1 == 0:
                    lat = X[1, X_UP_LAT_US]
                    R_i[r, RI_LATMASK] |= 2
                cost = lat + size / X[1, X_UP_BYTES_PER_US]
                if K[K_LINK_QUEUE] != 0:  # on the DRAM up link, behind what is queued there
                    end = submit_up(X, 1, now_us, cost, lat > 0.0) + cost
                    ready = now_us + C[C_STEP_EXTRA_US]
                    cost = end - ready if end > ready else 0.0
                C[C_STEP_EXTRA_US] += cost
                C[M_SWAP_IN_BYTES] += size
                if log_on:
                    tr.log_row(G, C, step, now_us, A_PROMOTE, h, r, bi, 1, 0, size, cost,
                               bound, -1, W_SWAP_IN)
            else:
                C[C_STEP_EXTRA_US] += A_f[a]
                C[M_PREEMPT_RECOMP_TOK] += tok
                R_i[r, RI_RECOMP_TOK] += tok
                if log_on:
                    tr.log_row(G, C, step, now_us, A_RECOMPUTE, h, r, bi, -1, 0, 0, A_f[a],
                               bound, -1, W_RECOMP_RERUN)
            if bound:
                C[M_DC_MISS] += 1
                R_i[r, RI_DC_MISS] += 1
        elif mode == MODE_ADMIT and h != 0:
            if A_i[a, AI_SEEN] != 0:  # computed before, resident nowhere now
                C[M_RECOMP_TOK] += tok
                R_i[r, RI_RECOMP_TOK] += tok
                if bound:
                    C[M_DC_MISS] += 1
                    R_i[r, RI_DC_MISS] += 1
                if log_on:
                    tr.log_row(G, C, step, now_us, A_RECOMPUTE, h, r, bi, -1, 0, 0, A_f[a],
                               bound, -1, W_RECOMP)
            else:
                C[M_FIRST_TOK] += tok
        if K[K_WRITE_POLICY] != WP_WRITE_BACK:  # not a call under write_back
            tier_ops._write_through(b, r, cr, step, now_us)
    ops.admit(st, pst, view, out, n_hit, nb, now_us)  # new content enters the HBM policy
    if mode == MODE_ADMIT:
        C[M_LOOKUP_TOK] += num_tokens
        C[M_LOOKUP_BLK] += nb
        R_i[r, RI_LOOKUP_TOK] += num_tokens
    return n_hit


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _release_all(r, cr, step, now_us):
    """Request-level FREE: stamp the per-request recency on its blocks, free tail-first."""
    K = cr.K
    C = cr.C
    st = cr.st
    pst = cr.pst
    view = cr.H_view
    seq = cr.R_i[r, RI_SEQ]
    m = st.seq_len[seq]
    row = st.tables[seq]
    la = view.last_access_us  # bound once, not per block
    for e in range(m):
        la[row[e]] = now_us
    life = K[K_LOG] != 0 and K[K_LOG_LIFECYCLE] != 0
    ops.free_tail(st, pst, view, seq, m, now_us)  # = ops.free; one pool op compiled, not two
    if life:
        for e in range(m - 1, -1, -1):
            b = st.tables[seq, e]
            if st.ref_cnt[b] == 0:
                cached = st.in_cand[b]
                tr.log_row(cr.G, C, step, now_us, A_RELEASE if cached else A_FREE,
                           view.content_hash[b] if cached else 0, r, e, 0, 0, 0, 0.0, False,
                           -1, W_RELEASE if cached else W_FREE)
    C[C_HBM_USED] = st.sc[mem.S_N_HELD]


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _fill_last(r, e, cr, step, now_us):
    """Request ``r`` appends block ``e``: its block ``e - 1`` is full now.  If that block was
    allocated partial (a decode block, or a prompt's partial last block) and its ALLOCATE
    row named the hash of its full content, it gets that hash now and enters the prefix
    cache, as vLLM's ``cache_full_blocks`` does once a block's last slot is written (one
    step earlier there; nothing in between can look it up but the request itself)."""
    if e < 1:
        return
    R_i = cr.R_i
    if R_i[r, RI_STATE] != RS_RUNNING:
        return
    seq = R_i[r, RI_SEQ]
    st = cr.st
    if st.seq_len[seq] != e:
        return
    a = R_i[r, RI_BT_START] + e - 1
    A_i = cr.A_i
    h = A_i[a, AI_FULL_HASH]
    if A_i[a, AI_HASH] != 0 or h == 0:
        return
    K = cr.K
    view = cr.H_view
    H_i = cr.H_i
    A_i[a, AI_HASH] = h
    A_i[a, AI_TOKENS] = K[K_BLOCK_TOKENS]
    b = np.int64(st.tables[seq, e - 1])  # int32 table: one signature of _write_through
    ops.cache_block(st, cr.pst, view, seq, e - 1, h, now_us)
    if view.content_hash[b] != h:  # caching off, or the pool did not take it
        return
    H_i[b, HI_TOKENS] = K[K_BLOCK_TOKENS]
    H_i[b, HI_HITS] = 1
    if K[K_WRITE_POLICY] != WP_WRITE_BACK:  # not a call under write_back
        tier_ops._write_through(b, r, cr, step, now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _fill_at_finish(r, cr, step, now_us):
    """Request ``r`` is done (its request-level FREE row, before its blocks are released):
    if its computed tokens fill its last block exactly, that block enters the prefix cache
    as :func:`_fill_last` would have cached it on the next append, which never comes.
    vLLM caches a block in the step that computes its last slot (``cache_full_blocks``),
    so a later turn whose prompt holds it hits it (before this, the replay lost those
    B tokens: ``test_last_full_output_block_is_cached_at_finish``).  Computed tokens:
    prompt + output tokens produced (the ones of this step still pending included) - 1,
    the last output token being sampled, never computed.  Blocks whose full-content hash
    the ALLOCATE row did not name (unknown content, drafts) stay uncached, as before."""
    R_i = cr.R_i
    e = R_i[r, RI_BT_LEN]
    if e < 1:
        return
    C = cr.C
    P = cr.P
    nout = R_i[r, RI_NOUT]
    for j in range(int(C[C_NPEND])):
        if P[j, 0] == r:
            nout += 1
    if R_i[r, RI_PROMPT] + nout - 1 >= e * cr.K[K_BLOCK_TOKENS]:
        _fill_last(r, e, cr, step, now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _reset_cache(cr, now_us):
    """A FREE row with ``block_index`` ``FREE_RESET_CACHE``: vLLM's ``reset_prefix_cache()``
    succeeded in the scheduler's pool (no block held there, so none here: the scheduler's
    pool holds what the replay's holds).  Every cached HBM block loses its hash and
    becomes free, in the policy's victim order (:func:`kvsim.memory.pool_ops.clear_cache`,
    vLLM's ``BlockPool.reset_prefix_cache``); nothing is spilled (the KV is dropped, not
    evicted) and lower tiers keep their copies (a KV connector's store is not reset)."""
    st = cr.st
    view = cr.H_view
    if ops.clear_cache(st, cr.pst, view, now_us, cr.out) == 0:
        raise ValueError("reset_prefix_cache: the replay's HBM pool holds blocks")
    for b in range(view.content_hash.shape[0]):
        view.content_hash[b] = 0
    cr.C[C_HBM_USED] = st.sc[mem.S_N_HELD]
