"""The closed loop's quiet steps in one go (vLLM's scheduler): steps where only time moves.

A step of :func:`kvsim.replay.kernel.closed_step.advance` is *quiet* when vLLM's scheduler
has nothing to decide: no request arrives by the step's start, none is admitted (none
waits, or the first in the queue does not fit: ``schedule()`` stops there and changes
nothing), and every running request decodes one token inside the blocks it already holds (no new block, no
finish, no draft tokens), so ``schedule()`` can neither admit nor preempt.  A request whose
last block just filled has it cached by vLLM's ``allocate_slots`` (its hash registered in
vLLM's pool, one stored event), which changes nothing else of the step: such a step is quiet
too, unless that hash is the one the first waiting request's prefix lookup stops at
(:func:`_cache_moves_head`: then it could be admitted).  Such a
step's rows are one ``STEP`` row and one decode ``ACCESS`` row per running request (in the
running list's order), and all the replay core does with them is close the previous step
(:func:`kvsim.replay.kernel.bookkeeping._finalize_step`), open this one and queue each
request's token.

:func:`quiet_steps` runs such steps back to back without writing their rows or re-entering
``vllm_rows`` / ``schedule()`` / ``update_from_output()`` / ``core.run`` (about ten compiled
calls a step, each counting references to every array it unpacks: docs/benchmarks.md,
"vs NVIDIA AISimulate, warm").  It makes exactly the state changes those calls make on a
quiet step, with the same floating-point operations in the same order (the step time through
:mod:`kvsim.engine.timing.step_time`'s same accumulators, the clock as ``advance`` sets it),
so every output is the same byte for byte.  A step that is not quiet -- or one where a
buffer of the core would need room (steps, pending tokens, log, arena) -- is left to the
full path, which then runs it as usual.
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.engine import scheduler as S
from kvsim.engine import vllm_step as V
from kvsim.engine.scheduler_blocks import _token_deadline
from kvsim.engine.timing.step_time import acc_decode, acc_reset, step_duration_us
from kvsim.engine.vllm_rows import (
    VS_EV,
    VS_FIRST,
    VS_HEAP,
    VS_HH,
    VS_HITS,
    VS_IP,
    VS_MARK,
    VS_OC,
    VS_POOL,
    VS_R,
    VS_RUN,
    VS_SCHED,
    VS_SV,
    VS_WQ,
)
from kvsim.jit.decorators import njit
from kvsim.memory.fast import S_N_CAND, S_N_EMPTY, S_N_HELD
from kvsim.replay.kernel.bookkeeping import _finalize_step

# closed_step's aux columns (kvsim.replay.kernel.closed_step: X_NINSYS, X_ROWS, X_QUIET,
# X_QCACHE, X_QHEAD)
_X_NINSYS, _X_ROWS, _X_QUIET, _X_QCACHE, _X_QHEAD = 2, 5, 7, 8, 9


@njit(cache=True)
def pool_members(pl):
    """``pl.st`` of vLLM's pool value ``pl`` (``vs[VS_POOL]``) and the members of it that
    :func:`quiet_steps` and :func:`admission_blocked` read: ``(st, seq_len, sc, ref_cnt)``.
    Compiled, so that the interpreted twin of
    :func:`kvsim.replay.kernel.closed_step.advance` reads them too (the structref's Python
    proxy has no attributes)."""
    pst = pl.st
    return pst, pst.seq_len, pst.sc, pst.ref_cnt


@njit(cache=True, _nrt=False)
def admission_blocked(vip, R, hh, sv, wq, heap, pst, seq_len, ref_cnt, psc, hits, tk, nrun):
    """True when ``schedule()``'s admission loop, after ``nrun`` running requests took one
    token each, admits nothing and changes nothing: no waiting request, no budget or seq
    slot left, or its first attempt fails (:func:`kvsim.engine.vllm_step.allocate_slots`'s
    room checks, which come before any change; the lookups write only ``hits``, as the
    full path's would).  ``seq_len``, ``ref_cnt``, ``psc``: ``pst``'s members.  Called by
    :func:`kvsim.replay.kernel.closed_step.advance` when :func:`quiet_steps` asks (it returns
    -1), not by it.  Compiled without reference counting, like the lookups it calls (the
    pool's members are read without NRT: kvsim.policy.state_access.register_borrowed_members)."""
    nw = V.num_waiting(vip, sv)
    budget = vip[V.P_MAXTOK] - nrun
    if nw == 0 or budget <= 0 or nrun >= vip[V.P_MAXSEQ]:
        return True
    bs = vip[V.P_BS]
    maxlen = vip[V.P_MAXLEN]
    thr = vip[V.P_THR] if nrun + nw > 1 else 0
    i = V._peek(vip, sv, wq, heap)
    fresh = R[i, V.K_NCOMP] == 0
    nhits = V.lookup(vip, R, hh, i, pst, hits) if fresh else 0
    next_ = V.lookup_ext(vip, R, hh, i, nhits, tk) if fresh else 0
    num_hit = (nhits + next_) * bs
    remote = V._remote_tokens(R, i, num_hit) if fresh else 0
    num_new = R[i, V.K_PLEN] + R[i, V.K_NOUT] - num_hit - remote
    if 0 < thr < num_new:
        num_new = thr
    if vip[V.P_CHUNKED] == 0 and num_new > budget:
        return True
    num_new = min(num_new, budget)
    # allocate_slots(..., full_must_fit=P_RESERVE, has_sched=True) up to its failures
    total_computed = min(R[i, V.K_NCOMP] + remote + (nhits + next_) * bs, maxlen)
    status = R[i, V.K_STATUS]
    watermark = vip[V.P_WMARK] if (status == V.WAITING or status == V.PREEMPTED) else 0
    evictable = 0
    for k in range(nhits):
        if ref_cnt[hits[k]] == 0:
            evictable += 1
    seq = R[i, V.K_SEQ]
    have = seq_len[seq] if seq >= 0 else 0
    free = psc[S_N_EMPTY] + psc[S_N_CAND]  # V.free_blocks
    running = R[i, V.K_NCACHED] >= 0
    num_tokens = R[i, V.K_PLEN] + R[i, V.K_NOUT]
    if vip[V.P_RESERVE] != 0:
        full = min(num_tokens, maxlen)
        if running:
            need_full = max(V._cdiv(full, bs) - have, 0)
        else:
            need_full = max(V._cdiv(full, bs) - (nhits + have), 0) + evictable
        if need_full + watermark > free:
            return True
    need = min(total_computed + num_new + (R[i, V.K_SPECK] if vip[V.P_LOOK] else 0), maxlen)
    if running:
        n_alloc = max(V._cdiv(need, bs) - have, 0)
    else:
        n_alloc = max(V._cdiv(need, bs) - (nhits + have), 0) + evictable
    return n_alloc + watermark > free


@njit(cache=True, inline="always")
def _quiet(vip, R, sv, run, mark, st, stf, arr, order, K, C, R_i, A_i, S_, P, running, G,
           ncols, blocked, seq_len, srid):
    """``(nrun, ncache)``: the running requests' count when the next step is quiet and the
    core has room for its rows, else 0 (the full path runs it), or -1 when it is quiet if no
    request can be admitted and ``blocked`` is False (:func:`admission_blocked`, the caller's
    to check); ``ncache``: how many of them have a full block to cache (vLLM's
    ``allocate_slots`` caches it and changes nothing else: :func:`_cache_moves_head`).
    ``blocked``: admission is known to be blocked (the caller checked it, or a quiet step
    ran since, and a quiet step changes nothing the check reads: no arrival, no pool
    operation, the same running count).  ``seq_len``:
    ``pst.seq_len``, read by the caller; ``srid``: the core's request-table row (vLLM's
    row: :func:`kvsim.engine.vllm_rows.slot_of`) -> request id."""
    nrun = sv[V.V_NRUN]
    if nrun <= 0 or st[S.S_FINISHED] != 0:
        return 0, 0
    if nrun > vip[V.P_MAXTOK] or 1 + nrun > ncols:
        return 0, 0
    t_us = np.int64(stf[0])
    a0 = st[S.S_ARRIVE]
    if a0 < st[S.S_QN] and arr[order[a0]] <= t_us:
        return 0, 0
    # the core's room checks (kvsim.replay.kernel.core.run), for every row of the step
    if C[L.C_PEND_ADMIT] >= 0:
        return 0, 0
    if C[L.C_NSTEP_BUF] + 1 >= S_.shape[0]:
        return 0, 0
    if C[L.C_NPEND] + nrun + 1 >= P.shape[0] or C[L.C_NRUN] >= running.shape[0] - 1:
        return 0, 0
    if K[L.K_LOG] != 0 and C[L.C_NLOG] + 16 * C[L.C_MAX_BT] + 4096 > G[0].shape[0]:
        return 0, 0
    if (K[L.K_WARMUP_STEP] >= 0 and C[L.C_WARM_DONE] == 0
            and st[S.S_STEP] >= K[L.K_WARMUP_STEP]):
        return 0, 0
    top = C[L.C_ARENA_TOP]
    if top + 64 > A_i.shape[0]:  # closed_step's admission room check (need = 64)
        return 0, 0
    ncache = 0
    bs = vip[V.P_BS]
    maxlen = vip[V.P_MAXLEN]
    caching = vip[V.P_CACHING] != 0
    for k in range(nrun):
        i = run[k]
        if R[i, V.K_STATUS] != V.RUNNING or R[i, V.K_SPEC] != 0 or R[i, V.K_SPECK] != 0:
            return 0, 0
        plen = R[i, V.K_PLEN]
        nout = R[i, V.K_NOUT]
        ncomp = R[i, V.K_NCOMP]
        seq = R[i, V.K_SEQ]
        # one decode token: the known tokens all computed but the last sampled one
        if nout <= 0 or ncomp != plen + nout - 1 or mark[i] != -1 or seq < 0:
            return 0, 0
        if R[i, V.K_NCACHED] < 0 or maxlen - ncomp - 1 < 1:
            return 0, 0
        if (ncomp + 1 + bs - 1) // bs > seq_len[seq]:  # a new block
            return 0, 0
        if caching and R[i, V.K_NCACHED] < (plen + nout) // bs:  # a block to cache
            ncache += 1
        if nout + 1 >= R[i, V.K_OLEN] or plen + nout + 1 >= maxlen:  # finishes
            return 0, 0
        s = i  # vLLM's row is the core's
        if R_i[s, L.RI_STATE] != L.RS_RUNNING or R_i[s, L.RI_PHASE] < 2:
            return 0, 0
        if top + 24 + 2 * R_i[s, L.RI_BT_CAP] > A_i.shape[0]:
            return 0, 0
    if not blocked:
        return -1, ncache
    return nrun, ncache


@njit(cache=True, _nrt=False)
def _cache_moves_head(vip, R, hh, sv, wq, heap, run, nrun, pst, hits):
    """True when the blocks the running requests cache this step could let the first
    waiting request in: its prefix-cache lookup (:func:`kvsim.engine.vllm_step.lookup`)
    stops at its first missing hash, and caching only adds hashes (a hash already held
    keeps its first block: :func:`kvsim.memory.fast.pool_lookup`), so its hits change only
    if that hash is one of them.  Nothing else :func:`admission_blocked` reads changes when a
    running request's held block gets its hash (free and reference counts stay), so an
    admission known to be blocked stays blocked when this is False.  The lookup writes only
    ``hits``, as the full path's admission lookup does."""
    if V.num_waiting(vip, sv) == 0 or vip[V.P_CACHING] == 0:
        return False
    w = V._peek(vip, sv, wq, heap)
    if R[w, V.K_NCOMP] != 0:  # no lookup for it (schedule())
        return False
    nh = V.lookup(vip, R, hh, w, pst, hits)
    if nh >= R[w, V.K_H1] - R[w, V.K_H0]:
        return False
    x = hh[R[w, V.K_H0] + nh]
    if x == 0:  # the lookup stops at a hash of 0 (fast.pool_lookup)
        return False
    bs = vip[V.P_BS]
    for k in range(nrun):
        i = run[k]
        h0 = R[i, V.K_H0]
        full = min((R[i, V.K_PLEN] + R[i, V.K_NOUT]) // bs, hh.shape[0] - h0)
        for j in range(max(R[i, V.K_NCACHED], 0), full):
            if hh[h0 + j] == x:
                return True
    return False


@njit(cache=True, _nrt=False)
def quiet_steps(limit_us, max_steps, aux, insys, ip, fp, st, stf, arr, ttft, tpot, order,
                tk, ncols, vs, seq_len, psc, K, C, R_i, R_f, A_i, S_, P, G, running, sc, acc,
                blocked, srid):
    """Run quiet steps (module docstring) while the next one is quiet, the clock is before
    ``limit_us`` (-1: no limit), fewer than ``max_steps`` ran and ``insys`` has room.
    Returns how many ran, or -1 (none ran) when the first step is quiet only if no request
    can be admitted and ``blocked`` is False: the caller checks that
    (:func:`admission_blocked`) and calls again with ``blocked`` True.  ``seq_len``, ``psc``:
    the members of vLLM's pool ``vs[VS_POOL].st``; ``K`` ... ``sc``: the core's state's
    (``cr.K`` ... ``cr.st.sc``); ``acc``: the step time's accumulators (``NUM_ACC`` floats);
    ``srid``: the core's request-table row (vLLM's) -> request id; all read or made by the caller
    (:func:`kvsim.replay.kernel.closed_step.advance`, once per call).

    Compiled without reference counting (``_nrt=False``): it allocates nothing, returns no
    array and reads no structref member but vLLM's pool's (``vs[VS_POOL].st`` / ``.pst`` /
    ``.pview``, read borrowed: :func:`kvsim.policy.state_access.register_borrowed_members`),
    and neither does anything it calls (numba compiles a callee under its caller's
    setting), so every array it takes is borrowed from its caller (~60 counted references
    a call otherwise).  ``aux[_X_QUIET]`` counts the steps it ran, ``aux[_X_QCACHE]`` those
    of them that cached a block, ``aux[_X_QHEAD]`` the steps it left to the full path
    because their caching could admit the first waiting request."""
    vip = vs[VS_IP]
    R = vs[VS_R]
    sv = vs[VS_SV]
    run = vs[VS_RUN]
    osched = vs[VS_SCHED]
    oc = vs[VS_OC]
    first_us = vs[VS_FIRST]
    mark = vs[VS_MARK]
    # a step that caches a full block calls vLLM's pool as allocate_slots does (members
    # read borrowed: kvsim.engine.vllm_pool registers them for code without counting)
    pl = vs[VS_POOL]
    pst = pl.st
    pol = pl.pst
    pview = pl.pview
    hh = vs[VS_HH]
    oev = vs[VS_EV]
    bs = vip[V.P_BS]
    done = 0
    while done < max_steps:
        if limit_us >= 0 and stf[0] >= limit_us:
            break
        if aux[_X_NINSYS] >= insys.shape[0]:
            break
        nrun, ncache = _quiet(vip, R, sv, run, mark, st, stf, arr, order, K, C, R_i, A_i, S_,
                              P, running, G, ncols, blocked or done > 0, seq_len, srid)
        if nrun < 0:
            return -1
        if nrun == 0:
            break
        if ncache > 0 and _cache_moves_head(vip, R, hh, sv, vs[VS_WQ], vs[VS_HEAP], run, nrun,
                                            pst, vs[VS_HITS]):
            aux[_X_QHEAD] += 1
            break
        # --- kvsim.engine.vllm_rows: one step of schedule() + update_from_output() -------
        now = stf[0]
        st[S.S_NADM] = 0
        step = st[S.S_STEP]
        t_us = np.int64(now)
        for k in range(oc.shape[0]):
            oc[k] = 0
        tokens = 0
        attended = 0.0
        kv_read = 0.0
        acc_reset(acc)
        for k in range(nrun):
            i = run[k]
            if ncache > 0 and R[i, V.K_NCACHED] < (R[i, V.K_PLEN] + R[i, V.K_NOUT]) // bs:
                # schedule(): allocate_slots caches its full blocks (no new block, no hit)
                V._cache_blocks(vip, R, hh, i, R[i, V.K_PLEN] + R[i, V.K_NOUT], pst, pol,
                                pview, oev, oc)
            ntok = np.int64(1)
            osched[k, 0] = i
            osched[k, 1] = ntok
            R[i, V.K_SSPEC] = 0
            R[i, V.K_SPEC] = 0
            R[i, V.K_NEWB] = 0
            R[i, V.K_NCOMP] += ntok
            after = R[i, V.K_NCOMP]
            before = after - ntok
            nout = R[i, V.K_NOUT]
            c = srid[i]
            tdl = _token_deadline(arr[c], ttft[c], tpot[c], first_us[i], nout + 1)
            tokens += ntok
            attended += ntok * float(before) + ntok * (ntok + 1.0) / 2.0
            kv_read += before + ntok
            acc_decode(acc, ntok, before + ntok)
            # update_from_output: one token sampled, none finishes
            R[i, V.K_SCHED] = 0
            R[i, V.K_NOUT] = nout + 1
            R[i, V.K_SPEC] = R[i, V.K_SPECK]
            osched[k, 1] = tdl  # scratch: its ACCESS row's deadline, read back below
        oc[V.O_SCHED] = nrun
        held = psc[S_N_HELD]
        st[S.S_HELD] = held
        if held > st[S.S_MAXHELD]:
            st[S.S_MAXHELD] = held
        if nrun > st[S.S_MAXRUN]:
            st[S.S_MAXRUN] = nrun
        dur = step_duration_us(fp, acc, tokens, attended, kv_read)
        st[S.S_NRUN] = nrun
        st[S.S_ADMIT] = st[S.S_ARRIVE] - V.num_waiting(vip, sv)
        stf[0] = now + dur
        st[S.S_STEP] = step + 1
        # --- kvsim.replay.kernel.closed_step.advance + core.run: the STEP row ----------
        insys[aux[_X_NINSYS]] = st[S.S_ARRIVE] - st[S.S_DONE]
        aux[_X_NINSYS] += 1
        C[L.C_ALLOC_ORD] = 0
        if C[L.C_IN_STEP] != 0:
            _finalize_step(C, R_i, R_f, S_, P, sc)
        C[L.C_IN_STEP] = 1
        C[L.C_STEP] = step
        C[L.C_STEP_START_US] = max(float(t_us), C[L.C_CLOCK_US])
        C[L.C_STEP_DUR_US] = dur
        C[L.C_STEP_SAVED_US] = 0.0
        C[L.C_STEP_STALL_US] = 0.0
        C[L.C_STEP_EXTRA_US] = 0.0
        # the ACCESS rows: each request's token, pending until the step closes
        for k in range(nrun):
            i = osched[k, 0]  # the core's row of the request (vLLM's)
            dl = osched[k, 1]
            osched[k, 1] = 1
            if dl >= 0:
                R_i[i, L.RI_BOUND] = 1
            pk = 0
            if R_i[i, L.RI_NOUT] == 0 and R_i[i, L.RI_FT_PENDING] == 0:
                pk = 1
            elif R_i[i, L.RI_FT_PENDING] == 0:
                pk = 2
            if pk != 0:
                q = int(C[L.C_NPEND])
                P[q, 0] = i
                P[q, 1] = pk
                P[q, 2] = dl
                C[L.C_NPEND] = q + 1
                if pk == 1:
                    R_i[i, L.RI_FT_PENDING] = 1
        # the scheduler already left cached tokens out of the step: no credit on top
        C[L.C_STEP_SAVED_US] = 0.0
        stf[0] = (C[L.C_STEP_START_US] + C[L.C_STEP_DUR_US] + C[L.C_STEP_STALL_US]
                  + C[L.C_STEP_EXTRA_US])
        aux[_X_ROWS] += 1 + nrun
        aux[_X_QUIET] += 1
        if ncache > 0:
            aux[_X_QCACHE] += 1
        done += 1
    return done
