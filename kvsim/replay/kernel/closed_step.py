"""The compiled alternation of the closed loop: scheduler step, then the core, per step.

:func:`advance` runs engine steps of one replica until its clock reaches ``limit_us`` (the
next arrival the router must place; -1 = no limit), it has no work, ``max_steps`` steps
ran, or the core asks for a buffer (``ST_NEED_*`` of :mod:`kvsim.replay.kernel.core`: the driver,
:class:`kvsim.modes.closed.closed_loop.Engine`, grows or flushes it and calls again, and the step
in flight resumes at the row it stopped at).  Per step:

1. :func:`kvsim.engine.scheduler.run_steps` decides one step on the replay's memory state
   (closed-loop mode) and writes its rows to ``I``/``F``;
2. the rows are copied into the typed event columns the core reads (``cols``, the order of
   ``kvsim.replay.kernel.core.COLS``), with ``next_use`` / ``seen`` of each ALLOCATE row from the
   arrival-order facts (:mod:`kvsim.modes.closed.closed_facts`);
3. the core replays them (``core_mod.run``: placement, hits, promotions, evictions,
   preemptions, decision log);
4. each request admitted in the step has its cached prefix counted as prefilled; cached
   tokens that the core did not find after all (evicted by an earlier placement of the
   same step) are computed in this step (their prefill time is added);
5. the step's actual end (roofline + stalls + swap / recompute) becomes the scheduler's
   clock.

Compiled once for every policy, like :mod:`kvsim.replay.kernel.core` (policies are values it passes
through: ``pst`` and each lower tier's ``L_ps``), and cached on disk; the interpreted twin
runs the same source (:func:`kvsim.replay.variants.closed_for`).
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.engine import scheduler as S
from kvsim.engine import vllm_step as VL
from kvsim.engine.timing.step_time import NUM_ACC
from kvsim.engine.vllm_rows import (
    VS_FIN,
    VS_HEAP,
    VS_HH,
    VS_HITS,
    VS_IP,
    VS_OC,
    VS_POOL,
    VS_R,
    VS_RESETS,
    VS_RUN,
    VS_SCHED,
    VS_SV,
    VS_WQ,
    slot_of,
    vllm_rows,
)
from kvsim.jit.decorators import njit
from kvsim.replay.kernel import closed_ffwd as CF
from kvsim.replay.kernel import core as core_mod
from kvsim.replay.kernel import offload
from kvsim.replay.kernel.bookkeeping import _resumed_token

# aux (int64): step rows in flight (0 = none), row to resume at, steps recorded in insys,
# ALLOCATE rows of the step, lost cached tokens (recomputed), event rows replayed, arena
# rows the step's admissions need; steps run as quiet steps (closed_ffwd), of which cached
# a full block, and steps left to the full path because their caching could admit the
# first waiting request
(X_PENDING, X_RESUME, X_NINSYS, X_NALLOC, X_LOST, X_ROWS, X_ARENA, X_QUIET, X_QCACHE,
 X_QHEAD) = range(10)
NUM_AUX = 10
#: advance() results besides the core's ST_NEED_* codes (1..5); R_NEED_SLOTS: a request
#: of the step needs a row of the core's request tables and none is free
#: (:class:`kvsim.modes.closed.closed_slots.ClosedSlots` folds finished ones or grows them)
R_LIMIT, R_IDLE, R_YIELD, R_NEED_COLS, R_NEED_ARENA, R_NEED_SLOTS = 10, 11, 12, 13, 14, 15
NEVER = np.iinfo(np.int64).max


_slot = slot_of  # the core's row of a request (the slot map's one maker)


@njit(cache=True, _nrt=False)
def _fill(I, F, n, cols, src, N, rprio_tab, tenant_tab, block_bytes, nu, seen, pb_off,
          pb_next, pb_seen, smap, srid, sfree):
    """Copy the step's rows into the core's typed columns; next_use / seen per ALLOCATE.
    The core sees each request as its row of the request tables (:func:`_slot`; a parent
    with no row as -1: it ran here no more).  Returns the ALLOCATE rows, or -1 when a
    request has no row and none is free (nothing else changed: filled again later)."""
    (c_step, c_time, c_kind, c_req, c_bi, c_hash, c_parent, c_ntok, c_dur, c_phase, c_prio,
     c_rprio, c_dl, c_slack, c_rcost, c_tds, c_pin, c_pfok, c_size, c_tenant) = cols
    k = 0
    for r in range(n):
        rid = I[S.C_RID, r]
        c_step[r] = I[S.C_STEP, r]
        c_time[r] = I[S.C_TIME, r]
        c_kind[r] = I[S.C_KIND, r]
        if rid >= 0:
            s = _slot(smap, srid, sfree, rid)
            if s < 0:
                return -1
            c_req[r] = s
        else:
            c_req[r] = rid
        c_bi[r] = I[S.C_BIDX, r]
        c_hash[r] = I[S.C_HASH, r]
        par = I[S.C_PARENT, r]
        c_parent[r] = smap[par] if par >= 0 else par
        c_ntok[r] = I[S.C_NTOK, r]
        c_dur[r] = F[S.F_DUR, r]
        c_phase[r] = I[S.C_PHASE, r]
        c_prio[r] = I[S.C_PRIO, r]
        owner = rid
        if rid >= N:
            owner = src[rid]
        if owner >= 0:
            c_rprio[r] = rprio_tab[owner]
            c_tenant[r] = tenant_tab[owner]
        else:
            c_rprio[r] = 50
            c_tenant[r] = 0
        c_dl[r] = I[S.C_DEADLINE, r]
        c_slack[r] = I[S.C_SLACK, r]
        c_rcost[r] = F[S.F_RC, r]
        c_tds[r] = I[S.C_TARGET, r]
        c_pin[r] = I[S.C_PIN, r] != 0
        c_pfok[r] = True
        c_size[r] = block_bytes if I[S.C_BIDX, r] >= 0 else 0
        if I[S.C_KIND, r] == S.EK_ALLOCATE:
            pos = pb_off[rid] + I[S.C_BIDX, r] if 0 <= rid < N else -1
            if pos >= 0 and pos < pb_off[rid + 1]:  # a prompt or decode block (closed_facts)
                # empty when the policy does not read the future (closed_facts.block_facts)
                nu[k] = pb_next[pos] if pb_next.shape[0] > 0 else NEVER
                seen[k] = (pb_seen[pos >> 3] >> (pos & 7)) & 1  # a bit a block
            else:
                nu[k] = NEVER
                seen[k] = 0
            k += 1
    return k


def scheduler_args(vllm: bool, vs, offload: bool = False) -> tuple:
    """``(ks, vs, vo, rs)`` as :func:`advance` takes them: kvsim's scheduler ``(True, None,
    None, None)``; vLLM's ``(None, vs, vo, rs)`` with ``vo`` = ``vs`` under vLLM's native CPU
    offloading (``offload``: ``--write-policy vllm_offload``) else None, and ``rs`` the
    resets table ``vs[VS_RESETS]`` when it has a row (:func:`kvsim.engine.vllm_rows.reset_table`)
    else None.  Each None is a branch numba drops before typing: a run compiles the
    scheduler, the offload step and the resets it uses, nothing else."""
    if not vllm:
        return (True, None, None, None)
    rs = vs[VS_RESETS]
    return (None, vs, vs if offload else None, rs if rs.shape[0] else None)


@njit(cache=True, _nrt=False)
def _alloc_rows(I, n):
    k = 0
    for r in range(n):
        if I[S.C_KIND, r] == S.EK_ALLOCATE:
            k += 1
    return k


@njit(cache=True, _nrt=False)
def _prefill_rows(I, n):
    """True when the step's rows schedule a prefill chunk: the next step is then not quiet
    (that request prefills again, or decodes for the first time since its admission)."""
    for r in range(n):
        if I[S.C_KIND, r] == S.EK_ACCESS and I[S.C_PHASE, r] == S.PH_PREFILL:
            return True
    return False


@njit(cache=True)
def advance(limit_us, max_steps, er, run_ref):
    """Run steps of one replica (module docstring) on its state ``er``, an
    :class:`kvsim.replay.kernel.engine_ref.EngineRef` (one pointer for numba's C wrapper to
    unbox at each call, not ~65 arrays): :func:`_advance` on its members.  Returns
    ``(code, I, F)`` as :func:`_advance` does."""
    return _advance(limit_us, max_steps, er.aux, er.insys, er.ip, er.fp, er.st, er.stf,
                    *er.req, *er.slot, er.order, *er.lookup, er.hitk, er.adm, er.I, er.F,
                    er.cols, er.rprio_tab, er.tenant_tab, er.block_bytes, er.pb_off,
                    er.pb_next, er.pb_seen, er.sl, er.ks, er.vs, er.vo, er.rs, er.cr, run_ref)


@njit(cache=True)
def _advance(limit_us, max_steps, aux, insys,
            ip, fp, st, stf, arr, prompt, out, ttft, tpot, nsamp, beam, rprio, cont, gap,
            shared, spk, spp, hashed, off, ids, src, par, computed, gen, nblk, lasth, status,
            first_us, dsteps, forked, blast, cow, run, run2, fin, nkey, priv, stall, hb, hb2,
            rk, rv, order, phk, phv, tk, hitk, adm, I, F,
            cols, rprio_tab, tenant_tab, block_bytes, pb_off, pb_next, pb_seen, sl,
            ks, vs, vo, rs, cr, run_ref):
    """Run steps (module docstring).  Returns ``(code, I, F)``: ``R_*`` or a core
    ``ST_NEED_*`` code, and the scheduler's row buffers (it may have grown them).
    ``run_ref.run``: :func:`kvsim.replay.kernel.core.run` as a first-class function value
    (:func:`kvsim.replay.variants.core_run_value`), so compiling this function calls ``run``
    indirectly (once per engine step) instead of linking and re-optimising all of it; held
    in a :class:`kvsim.replay.kernel.run_ref.RunRef`, so a call unboxes one pointer, not the
    function value (:func:`kvsim.replay.variants.core_run_ref`).
    ``ks`` / ``vs``: the scheduler, exactly one of them None (:func:`scheduler_args`):
    ``vs`` vLLM's (:func:`kvsim.engine.vllm_rows.new_vllm_value`), or ``ks`` (True) kvsim's
    own (:func:`kvsim.engine.scheduler.run_steps`); ``vo``: ``vs`` again when vLLM's native
    CPU offloading runs (:mod:`kvsim.replay.kernel.offload`), else None; ``rs``: vLLM's
    resets table, None when there is no reset.  numba drops the branch of each None before
    typing (its dead-branch pruning of ``x is None`` on a ``none``-typed argument), so each
    combination is its own compiled specialisation of ``advance`` and a run compiles and
    loads only what it uses (docs/benchmarks.md, "Cold compile: one scheduler per
    compile").  ``cr``: the core's state
    (:class:`kvsim.replay.kernel.core_ref.CoreRef`; the members read here, once per call:
    the counters, request tables, arena, pending buffer, next_use, seen).  ``sl``: the slot
    map ``(smap, srid, sfree)`` of :func:`_slot`: the core's request tables hold the requests
    this replica holds, not the trace (:mod:`kvsim.modes.closed.closed_slots`)."""
    core_run = run_ref.run
    smap, srid, sfree = sl
    C = cr.C
    R_i = cr.R_i
    P = cr.P
    A_i = cr.A_i
    nu = cr.next_use
    seen = cr.seen
    N = ip[S.P_N]
    ncols = cols[0].shape[0]
    acc = np.empty(NUM_ACC, dtype=np.float64)  # the step time's accumulators (scratch)
    if vs is not None:
        # what the quiet steps read, read once per call: CF.quiet_steps is compiled
        # without reference counting and cannot read a structref's member itself
        pst, seq_len, psc, ref_cnt = CF.pool_members(vs[VS_POOL])
        # the admission check's members of vs, read once per call, not once per step (each
        # read of a tuple member here is a counted reference)
        v_ip = vs[VS_IP]
        v_r = vs[VS_R]
        v_hh = vs[VS_HH]
        v_sv = vs[VS_SV]
        v_wq = vs[VS_WQ]
        v_heap = vs[VS_HEAP]
        v_hits = vs[VS_HITS]
        v_run = vs[VS_RUN]
        K = cr.K
        R_f = cr.R_f
        S_ = cr.S
        G = cr.G
        running = cr.running
        sc = cr.st.sc
    busy = False  # the last step prefilled: the next one is not quiet (_prefill_rows)
    if max_steps < 0:  # end of the run: close the last step (core.run with i0 = -1)
        core_run(cols, -1, 0, cr)
        return R_IDLE, I, F
    steps = 0
    while True:
        if aux[X_PENDING] == 0:
            # vLLM's steps where only time moves, in one go (not right after a prefill:
            # the request prefills again or decodes for the first time, never quiet)
            if vs is not None:
                # under vLLM's CPU offloading only while its step would do nothing
                if vo is None or offload.idle(cr, v_run, v_sv[VL.V_NRUN]):
                    if rs is None and not busy:
                        # ``blocked`` as np.bool_: a constant True / False argument is typed
                        # as its literal, and numba compiled quiet_steps once for each
                        # (~4-5 CPU-s more per specialisation of advance, cold)
                        q = CF.quiet_steps(limit_us, max_steps - steps, aux, insys, ip, fp, st,
                                           stf, arr, ttft, tpot, order, tk, ncols, vs, seq_len,
                                           psc, K, C, R_i, R_f, A_i, S_, P, G, running, sc, acc,
                                           np.bool_(False), srid)
                        # quiet if no request can be admitted: that check looks the first
                        # waiting one up in vLLM's pool (admission_blocked)
                        if q < 0 and CF.admission_blocked(
                                v_ip, v_r, v_hh, v_sv, v_wq, v_heap, pst, seq_len, ref_cnt,
                                psc, v_hits, tk, v_sv[VL.V_NRUN]):
                            q = CF.quiet_steps(limit_us, max_steps - steps, aux, insys, ip, fp,
                                               st, stf, arr, ttft, tpot, order, tk, ncols, vs,
                                               seq_len, psc, K, C, R_i, R_f, A_i, S_, P, G,
                                               running, sc, acc, np.bool_(True), srid)
                        steps += max(q, 0)
            if limit_us >= 0 and stf[0] >= limit_us:
                return R_LIMIT, I, F
            if st[S.S_NRUN] == 0 and st[S.S_ADMIT] >= st[S.S_QN]:
                return R_IDLE, I, F
            if steps >= max_steps:
                return R_YIELD, I, F
            if aux[X_NINSYS] >= insys.shape[0]:
                return R_YIELD, I, F
            done_before = st[S.S_DONE]
            # int64, never Literal[int](0): where nothing else assigns ``n`` before the
            # call, numba typed it as the literal, one more vllm_rows specialisation
            n = np.int64(0)
            if vs is not None:  # vLLM's scheduler (kvsim.engine.vllm_rows), count-free:
                while True:  # it asks for row room, grown here, and resumes its step
                    need, n = vllm_rows(ip, fp, st, stf, arr, prompt, out, ttft, tpot, rprio,
                                        cont, gap, shared, order, tk, hitk, adm, I, F, n, vs,
                                        rs, acc, smap, srid, sfree)
                    if need == 0:
                        break
                    if need < 0:  # an arrival needs a row of the request tables
                        return R_NEED_SLOTS, I, F
                    I, F = S._ensure(I, F, n, need)
            if ks is not None:  # kvsim's own
                I, F, n = S.run_steps(ip, fp, st, stf, arr, prompt, out, ttft, tpot, nsamp,
                                      beam, rprio, cont, gap, shared, spk, spp, hashed, off,
                                      ids, src, par, computed, gen, nblk, lasth, status,
                                      first_us, dsteps, forked, blast, cow, run, run2, fin,
                                      nkey, priv, stall, hb, hb2, rk, rv, order, phk, phv, tk,
                                      hitk, adm, I, F, 0)
            if n == 0:
                return R_IDLE, I, F
            insys[aux[X_NINSYS]] = st[S.S_ARRIVE] - done_before
            aux[X_NINSYS] += 1
            aux[X_PENDING] = n
            aux[X_RESUME] = -1  # columns not filled yet
        n = aux[X_PENDING]
        if aux[X_RESUME] < 0:
            if n > ncols or _alloc_rows(I, n) > nu.shape[0]:
                return R_NEED_COLS, I, F
            # the core's per-row room check counts a request's block-record capacity only
            # once it has one; an admission takes max(4, prompt // B + 2) rows at once, so
            # the whole step's admissions must fit before its rows are replayed
            need = 64
            for j in range(st[S.S_NADM]):
                need += max(4, prompt[adm[j]] // ip[S.P_B] + 2) + 16
            if C[L.C_ARENA_TOP] + need > A_i.shape[0]:
                aux[X_ARENA] = need
                return R_NEED_ARENA, I, F
            k = _fill(I, F, n, cols, src, N, rprio_tab, tenant_tab, block_bytes, nu, seen,
                      pb_off, pb_next, pb_seen, smap, srid, sfree)
            if k < 0:
                return R_NEED_SLOTS, I, F
            aux[X_NALLOC] = k
            busy = _prefill_rows(I, n)
            C[L.C_ALLOC_ORD] = 0
            aux[X_RESUME] = 0
        code, i = core_run(cols, aux[X_RESUME], n, cr)
        if code != core_mod.ST_DONE:
            aux[X_RESUME] = i
            return code, I, F
        # admitted this step: cached prefix counts as prefilled (step 4 of the docstring)
        for j in range(st[S.S_NADM]):
            assumed = hitk[adm[j]]
            if assumed == 0:
                continue
            c = smap[adm[j]]
            actual = (R_i[c, L.RI_HIT_TOK] + R_i[c, L.RI_HIT_TOK + 1]
                      + R_i[c, L.RI_HIT_TOK + 2] + R_i[c, L.RI_HIT_TOK + 3])
            R_i[c, L.RI_PREFILLED] += assumed
            if actual < assumed:
                C[L.C_STEP_EXTRA_US] += S._prefill_us(fp, actual, assumed - actual)
                aux[X_LOST] += assumed - actual
            if (R_i[c, L.RI_PREFILLED] >= R_i[c, L.RI_PROMPT] and R_i[c, L.RI_NOUT] == 0
                    and R_i[c, L.RI_FT_PENDING] == 0):
                q = int(C[L.C_NPEND])
                P[q, 0] = c
                P[q, 1] = 1
                P[q, 2] = -1
                C[L.C_NPEND] = q + 1
                R_i[c, L.RI_FT_PENDING] = 1
            elif _resumed_token(R_i, c, assumed):  # a resumed request's recompute is done
                q = int(C[L.C_NPEND])
                P[q, 0] = c
                P[q, 1] = 2
                P[q, 2] = -1
                C[L.C_NPEND] = q + 1
        if vo is not None and cr.K[L.K_WRITE_POLICY] == L.WP_VLLM_OFFLOAD:
            # vLLM's native CPU offloading: this step's stores, ranks, finishes
            oc = vo[VS_OC]
            offload.offload_step(cr, vo[VS_SCHED], oc[VL.O_SCHED], vo[VS_FIN], oc[VL.O_FIN])
        # the scheduler already left cached tokens out of the step: no credit on top
        C[L.C_STEP_SAVED_US] = 0.0
        stf[0] = (C[L.C_STEP_START_US] + C[L.C_STEP_DUR_US] + C[L.C_STEP_STALL_US]
                  + C[L.C_STEP_EXTRA_US])
        aux[X_ROWS] += n
        aux[X_PENDING] = 0
        steps += 1
