"""vLLM's native CPU offloading as the DRAM tier's write rule (``--write-policy
vllm_offload``): compiled, called once per engine step by the closed loop
(:func:`kvsim.replay.kernel.closed_step.advance`) after the step's rows were replayed.

It follows vLLM 0.33's ``OffloadingConnector`` scheduler side
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``) and its
``CPUOffloadingManager`` with the ``lru`` cache policy (``vllm/v1/kv_offload/cpu/manager.py``,
``vllm/v1/kv_offload/cpu/policies/lru.py``); the rules, each with its source, are in
docs/memory-model.md ("vLLM's native CPU offloading").  In short, per step:

1. a request that loaded blocks from the CPU tier in this step (its admission found them
   there: kvsim's promotions, vLLM's ``prepare_load``) gets its request rank, if it has none
   (``LRUCachePolicy._get_request_rank`` through ``on_request_access``);
2. each scheduled request, in the scheduler's order, offers its full prompt blocks from
   ``RI_OFF_NEXT`` up to the tokens computed after this step (``_build_store_jobs``,
   ``offload_prompt_only``): one ``prepare_store``: the blocks not in the tier are stored
   (evicting, if the tier is full, the evictable blocks of lowest rank: not stored or loaded
   in this step, not offered by this call; if there are too few, nothing is stored and the
   offer is made again next step), the ones there and ready get rank ``max(rank, (R, -end
   token))`` the first time this request offers them;
3. requests that finished in the previous step re-rank their blocks still in the tier,
   tail first, each with a fresh rank (``on_request_finished``: the head ends most recent);
4. this step's finished requests wait for step 3 of the next step.

A rank ``(R, -end_token)`` is stored as one int64, ``R * 2**22 + (2**21 - end_block)``, in the
tier view's ``slack_us`` (unused by the DRAM tier in this mode); the tier's own policy keeps
its state (inserts, removals) but does not choose victims in this mode.  A block stored in
this step has ``insert_us`` = the step's start; stored or loaded in this step:
``last_access_us`` = the step's start (``tier_ops.spill_step`` and ``tier_ops.touch``
write it), and is not evictable (vLLM: ``ref_cnt`` -1 or > 0 until the worker reports the
transfer done, at the end of the step).  Blocks offered by the current call carry its (negative) stamp in
``deadline_us`` (vLLM's ``protected`` set).
"""

from __future__ import annotations

import numpy as np

from kvsim.core.codes import A_EVICT, A_WRITE_THROUGH, W_WT
from kvsim.core.layout import (
    AI_HASH,
    AI_OFF_SEEN,
    C_OFF_HEAD,
    C_OFF_RANK,
    C_OFF_TAIL,
    C_STEP,
    C_STEP_START_US,
    C_USED,
    K_BLOCK_TOKENS,
    K_LOG,
    LI_STATE,
    LM_CAP,
    LM_FREE_TOP,
    LM_USED,
    M_EVICT,
    M_WRITE_THROUGH,
    RI_ADMIT_STEP,
    RI_BT_LEN,
    RI_BT_START,
    RI_HIT_TOK,
    RI_OFF_LINK,
    RI_OFF_NEXT,
    RI_OFF_PEND,
    RI_OFF_RANK,
    RI_PREFILLED,
    RI_PROMPT,
    RI_SEQ,
)
from kvsim.jit.decorators import njit
from kvsim.policy.hooks import H_REMOVE
from kvsim.replay.kernel import tier_ops
from kvsim.replay.kernel import tiers as tr

#: a rank (R, -end_block) as one int64: R * RANK_SCALE + (RANK_HALF - end_block); a
#: finish re-rank (R, 0) is R * RANK_SCALE + RANK_HALF.  end_block < 2**21 (a prompt of
#: under 2**21 blocks); R < 2**41.
RANK_SCALE = 1 << 22
RANK_HALF = 1 << 21


@njit(cache=True)
def _new_rank(C):
    """``LRUCachePolicy._next_rank += 1``: the next rank value."""
    C[C_OFF_RANK] += 1
    return np.int64(C[C_OFF_RANK])


@njit(cache=True)
def _tier_slot(LH, h):
    """The DRAM slot holding content ``h``, -1 if the DRAM tier does not hold it."""
    v = tr.lower_find(LH, h)
    if v < 0 or (v & 3) != 1:
        return np.int64(-1)
    return np.int64(v >> 2)


@njit(cache=True)
def _evict_one(T, v, cr, step, now_us):
    """Drop slot ``v`` from the DRAM tier (vLLM's ``evict``: the chunk is freed)."""
    C = cr.C
    L_i = T.L_i
    L_view = T.L_view
    Lm = T.Lm
    L_st, L_hooks = T.L_ps
    if cr.K[K_LOG] != 0:
        tr.log_row(cr.G, C, step, now_us, A_EVICT, L_view.content_hash[v], L_i[v, 0],
                   L_i[v, 1], 1, -1, 0, 0.0, False, 0, -1)
    L_hooks[H_REMOVE](L_st, L_view, v)
    tr.hash_del(T.L_h, L_view.content_hash[v])
    L_i[v, LI_STATE] = 0
    Lm[LM_USED] -= 1
    T.L_free[Lm[LM_FREE_TOP]] = v
    Lm[LM_FREE_TOP] += 1
    C[M_EVICT + 1] += 1
    C[C_USED + 1] = Lm[LM_USED]


@njit(cache=True)
def _victims(L_i, L_view, cap, need, now_us, stamp):
    """The ``need`` evictable slots of lowest rank, in the order vLLM's LRU policy evicts
    them (rank ascending, ties by slot), or fewer when fewer are evictable (then nothing
    may be evicted).  Evictable: resident, not stored or loaded in this step, not offered
    in this call.  One pass over the tier, a selection and a sort of the ``need``: the same
    victims, in the same order, as picking the lowest rank ``need`` times over the whole
    tier (``need`` passes: 500 Mooncake requests took 33 s into a 64 GB tier, the time
    growing with the tier, docs/benchmarks.md "vLLM's CPU offloading: victims in one
    pass")."""
    slots = np.empty(cap, np.int64)
    n_ok = 0
    for v in range(cap):
        if (L_i[v, LI_STATE] == 1 and L_view.last_access_us[v] != now_us
                and L_view.deadline_us[v] != stamp):
            slots[n_ok] = v
            n_ok += 1
    if n_ok < need:
        return slots[:n_ok]
    slots = slots[:n_ok]
    ranks = L_view.slack_us[slots]
    pick = np.arange(n_ok)
    if need < n_ok:  # the need lowest: those below the need-th rank, then ties by slot
        t = np.partition(ranks.copy(), need - 1)[need - 1]
        k = 0
        for i in range(n_ok):
            if ranks[i] < t:
                pick[k] = i
                k += 1
        for i in range(n_ok):
            if k == need:
                break
            if ranks[i] == t:
                pick[k] = i
                k += 1
        pick = pick[:need]
    # stable: equal ranks keep the slots' ascending order
    order = np.argsort(ranks[pick], kind="mergesort")
    return slots[pick[order]]


@njit(cache=True)
def _offer_end(R_i, r, B):
    """The block index a request's offer runs up to (exclusive): its full prompt blocks
    computed so far, within its block table (module docstring, 2)."""
    return min(min(R_i[r, RI_PREFILLED], R_i[r, RI_PROMPT]) // B, R_i[r, RI_BT_LEN])


@njit(cache=True)
def _offer(r, cr, stamp, step, now_us):
    """Request ``r``'s ``prepare_store`` of this step (module docstring, 2)."""
    C = cr.C
    R_i = cr.R_i
    A_i = cr.A_i
    T = cr.T1
    L_view = T.L_view
    L_i = T.L_i
    Lm = T.Lm
    LH = T.L_h
    B = cr.K[K_BLOCK_TOKENS]
    lo = R_i[r, RI_OFF_NEXT]
    hi = _offer_end(R_i, r, B)
    if hi <= lo:
        return
    base = R_i[r, RI_BT_START]
    n_store = 0
    n_new = 0  # keys this request records for the first time (on_request_access)
    for e in range(lo, hi):
        h = A_i[base + e, AI_HASH]
        if h == 0:
            continue
        s = _tier_slot(LH, h)
        if s >= 0:
            L_view.deadline_us[s] = stamp  # protected in this call
            if L_view.insert_us[s] != now_us and A_i[base + e, AI_OFF_SEEN] == 0:
                n_new += 1
        else:
            n_store += 1
            if A_i[base + e, AI_OFF_SEEN] == 0:
                n_new += 1
    if n_new > 0 and R_i[r, RI_OFF_RANK] == 0:
        R_i[r, RI_OFF_RANK] = _new_rank(C)
    R = R_i[r, RI_OFF_RANK]
    for e in range(lo, hi):
        h = A_i[base + e, AI_HASH]
        if h == 0:
            continue
        s = _tier_slot(LH, h)
        if s >= 0:
            if L_view.insert_us[s] != now_us and A_i[base + e, AI_OFF_SEEN] == 0:
                A_i[base + e, AI_OFF_SEEN] = 1
                rk = R * RANK_SCALE + (RANK_HALF - (e + 1))
                if rk > L_view.slack_us[s]:
                    L_view.slack_us[s] = rk
        else:
            A_i[base + e, AI_OFF_SEEN] = 1
    if n_store == 0:
        R_i[r, RI_OFF_NEXT] = hi
        return
    need = n_store - Lm[LM_FREE_TOP]
    if need > 0:
        victims = _victims(L_i, L_view, Lm[LM_CAP], need, now_us, stamp)
        if victims.shape[0] < need:
            return  # prepare_store returns None: nothing stored, offered again next step
        for v in victims:
            _evict_one(T, v, cr, step, now_us)
    st = cr.st
    view = cr.H_view
    TMP = cr.TMP
    seq = R_i[r, RI_SEQ]
    log_on = cr.K[K_LOG] != 0
    for e in range(lo, hi):
        h = A_i[base + e, AI_HASH]
        if h == 0 or _tier_slot(LH, h) >= 0:
            continue
        b = np.int64(st.tables[seq, e])
        C[M_WRITE_THROUGH] += 1
        if log_on:
            tr.log_row(cr.G, C, step, now_us, A_WRITE_THROUGH, h, r, e, 0, 1,
                       view.size_bytes[b], 0.0, False, -1, W_WT)
        # the block's row, with the request's hash: an HBM block computed while the same
        # content was already cached holds no hash in HBM (the pool keeps one copy), but
        # vLLM offloads by the request's block hashes
        tr.copy_view(TMP, 0, view, b)
        TMP.content_hash[0] = h
        tier_ops.spill_step(T, TMP, np.int64(0), r, e, B, np.int64(0), np.int64(1), cr,
                            step, now_us)
        s = _tier_slot(LH, h)
        if s >= 0:
            L_view.slack_us[s] = R * RANK_SCALE + (RANK_HALF - (e + 1))
            L_view.deadline_us[s] = stamp
    R_i[r, RI_OFF_NEXT] = hi


@njit(cache=True)
def _rerank(r, cr):
    """``on_request_finished``: the request's offered blocks still in the tier get fresh
    ranks, tail first (module docstring, 3)."""
    C = cr.C
    R_i = cr.R_i
    A_i = cr.A_i
    T = cr.T1
    base = R_i[r, RI_BT_START]
    for e in range(R_i[r, RI_BT_LEN] - 1, -1, -1):
        if A_i[base + e, AI_OFF_SEEN] == 0:
            continue
        s = _tier_slot(T.L_h, A_i[base + e, AI_HASH])
        if s >= 0:
            T.L_view.slack_us[s] = _new_rank(C) * RANK_SCALE + RANK_HALF


@njit(cache=True)
def idle(cr, run, nrun):
    """True when :func:`offload_step` changes nothing in a *quiet* step
    (:mod:`kvsim.replay.kernel.closed_ffwd`) whose scheduled requests are ``run[:nrun]``
    (vLLM's running list; its rows are the core's): no tier (``LM_CAP`` 0); or no finished
    request waits for its re-rank (3: ``C_OFF_HEAD`` 0) and every running request has
    offered every prompt block it computed (2: :func:`_offer` returns at once).  Step 1
    needs an admission and step 4 a finish, which a quiet step has not; a quiet step moves
    neither ``RI_PREFILLED`` nor ``RI_BT_LEN`` nor ``RI_OFF_NEXT`` nor ``C_OFF_HEAD``, so this
    holds for every step of a run of quiet steps once it holds for the first."""
    if cr.T1.Lm[LM_CAP] == 0:
        return True
    if cr.C[C_OFF_HEAD] != 0:
        return False
    R_i = cr.R_i
    B = cr.K[K_BLOCK_TOKENS]
    for k in range(nrun):
        r = run[k]
        if _offer_end(R_i, r, B) > R_i[r, RI_OFF_NEXT]:
            return False
    return True


@njit(cache=True)
def offload_step(cr, sched, n_sched, fin, n_fin):
    """One engine step of vLLM's native CPU offloading (module docstring).  ``sched``:
    the step's scheduled requests in the scheduler's order (column 0), ``fin``: the
    requests that finished in it (column 0), as vLLM's rows, which are the core's
    request-table rows (:func:`kvsim.engine.vllm_rows.slot_of`)."""
    T = cr.T1
    if T.Lm[LM_CAP] == 0:
        return
    C = cr.C
    R_i = cr.R_i
    step = int(C[C_STEP])
    now_us = C[C_STEP_START_US]
    for j in range(n_sched):  # 1. ranks of the requests that loaded from the tier
        r = sched[j, 0]
        if (R_i[r, RI_OFF_RANK] == 0 and R_i[r, RI_ADMIT_STEP] == step
                and R_i[r, RI_HIT_TOK + 1] > 0):
            R_i[r, RI_OFF_RANK] = _new_rank(C)
    for j in range(n_sched):  # 2. the stores, in the scheduler's order
        r = sched[j, 0]
        _offer(r, cr, -(np.int64(step) * 65536 + j + 2), step, now_us)
    q = int(C[C_OFF_HEAD])  # 3. last step's finished requests
    while q > 0:
        r = q - 1
        _rerank(r, cr)
        R_i[r, RI_OFF_PEND] = 0
        q = R_i[r, RI_OFF_LINK]
        R_i[r, RI_OFF_LINK] = 0
    C[C_OFF_HEAD] = 0
    C[C_OFF_TAIL] = 0
    for j in range(n_fin):  # 4. this step's finished requests wait for the next step
        r = fin[j]
        R_i[r, RI_OFF_PEND] = 1
        R_i[r, RI_OFF_LINK] = 0
        if C[C_OFF_TAIL] > 0:
            R_i[int(C[C_OFF_TAIL]) - 1, RI_OFF_LINK] = r + 1
        else:
            C[C_OFF_HEAD] = r + 1
        C[C_OFF_TAIL] = r + 1
