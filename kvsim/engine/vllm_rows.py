"""The closed loop's vLLM scheduler: one engine step of :mod:`kvsim.engine.vllm_step`
(vLLM 0.33's ``schedule()`` + ``update_from_output()``) written as event rows.

:func:`vllm_rows` is what :func:`kvsim.replay.kernel.closed_step.advance` calls instead of
:func:`kvsim.engine.scheduler.run_steps` when the engine's scheduler is ``vllm``
(``ip[P_VLLM]``).  It keeps the same loop state (``st``/``stf``: step, arrivals, running
count, clock, admissions of the step with their assumed cached tokens in ``hitk``/``adm``)
and writes the same row format (``I``/``F``, columns ``C_*`` of
:mod:`kvsim.engine.scheduler`), so the replay core, the metrics and the decision log are
unchanged.  Per step, in this order:

1. ``STEP`` (patched with tokens and duration at the end), ``ARRIVE`` of each request
   whose arrival time has come (added to vLLM's waiting queue);
2. vLLM's ``schedule()`` on the scheduler's own block pool (vLLM's KV manager: the
   replay's compiled pool with vLLM's free-queue order, sized as the replay's HBM pool);
3. rows in vLLM's order: for each scheduled request, the preemptions that happened just
   before it (a ``FREE`` row with ``block_index`` ``FREE_PREEMPT_BLOCK``: the replay
   releases the victim's blocks, which stay cached, and re-admits it later with a prefix
   lookup), then its ``ALLOCATE`` rows -- an admission (new or resumed) its whole block
   table, gathered and placed at once with the replay's prefix lookup; a running request
   the blocks ``allocate_slots`` appended -- each with the hash of its full content (the
   replay caches a block once it is full: ``_fill_last``), then its ``ACCESS`` (a prefill
   chunk, or one decode token; the first decode since an admission is preceded by a
   request-level ``INTENT``: decode, critical and pinned when the request's priority or
   TPOT SLO says so, as kvsim's scheduler states it);
4. ``update_from_output()``; finished requests: ``INTENT`` (done, or idle until the next
   turn of a session) and request-level ``FREE``;
5. the step's duration from its prefill chunks and decodes
   (:mod:`kvsim.engine.timing.step_time`, the same models as the kvsim scheduler).

Hashes (``hh``, one array for all requests, :func:`request_hashes`): the chain hashes of
each request's full blocks of prompt + output - 1 tokens, as far as the trace knows their
content (0 after), rooted at the request's tenant (vLLM's ``cache_salt``: tenants never
share blocks; tenant 0 is the unsalted root).
"""

from __future__ import annotations

import numpy as np

from kvsim.core.codes import (
    EK_ACCESS,
    EK_ALLOCATE,
    EK_ARRIVE,
    EK_FREE,
    EK_INTENT,
    EK_STEP,
    FREE_PREEMPT_BLOCK,
    FREE_RESET_CACHE,
    PH_DECODE,
    PH_DONE,
    PH_IDLE,
    PH_PREFILL,
    PH_VERIFY,
    PR_COLD,
    PR_DECODE_CRITICAL,
    PR_HOT,
    PR_WARM,
)
from kvsim.engine import vllm_step as V
from kvsim.engine.scheduler import (
    C_DEADLINE,
    C_NTOK,
    C_PHASE,
    C_SLACK,
    F_DUR,
    P_B,
    P_CRITPRIO,
    P_CRITTPOT,
    P_FLUSH,
    P_MAXTOK,
    S_ADMIT,
    S_ARRIVE,
    S_DONE,
    S_FINISHED,
    S_HELD,
    S_HIT_TOK,
    S_MAXHELD,
    S_MAXRUN,
    S_NADM,
    S_NRUN,
    S_QN,
    S_STEP,
    _prefill_us,
    _row,
)
from kvsim.engine.scheduler_blocks import _token_deadline
from kvsim.engine.timing.step_time import (
    acc_chunk,
    acc_decode,
    acc_reset,
    step_duration_us,
)
from kvsim.engine.vllm_resets import RS_AT_STEP, RS_BEFORE, RS_DONE, RS_RUNNING, reset_table
from kvsim.engine.vllm_value import *  # vs' layout (VS_*, Q_*, RSM_*) and its makers
from kvsim.ingest.hashing import chain_hash, mix64, root_hash
from kvsim.jit.decorators import njit
from kvsim.memory.fast import S_N_HELD

__all__ = ["grow_rows", "new_outputs", "new_vllm_value", "request_hashes", "reset_table",
           "shared_hashes", "slot_of", "vllm_rows", "with_external_tokens"]



@njit(cache=True)
def _one_request(c, h0, n, B, T, hashed, tenant, off, ids, hh):
    """``hh[h0:h0 + n]``: request ``c``'s chain hashes of its ``n`` full blocks."""
    h = root_hash(tenant[c])
    for b in range(n):
        if h != 0 and (b + 1) * B <= hashed[c]:
            h = chain_hash(h, ids[off[c]:off[c + 1]], (b * B) // T, ((b + 1) * B - 1) // T,
                           (b * B) % T)
        else:
            h = 0
        hh[h0 + b] = h


@njit(cache=True)
def request_hashes(N, B, T, prompt, out, hashed, tenant, off, ids, hoff, hh):
    """``hh[hoff[c]:hoff[c + 1]]``: request ``c``'s chain hashes of its full blocks of
    ``prompt + output - 1`` tokens (``hoff`` given), 0 from the first block whose content
    the trace does not know (``hashed`` tokens), rooted at ``root_hash(tenant)``."""
    for c in range(N):
        _one_request(c, hoff[c], hoff[c + 1] - hoff[c], B, T, hashed, tenant, off, ids, hh)


@njit(cache=True)
def _content_keys(B, T, nfull, hashed, tenant, off, ids, key, used):
    """Per request: ``used[c]`` native ids its hashes read, ``key[c]`` a digest of all its
    hashes depend on (tenant, full blocks, hashed full blocks, those ids)."""
    for c in range(nfull.shape[0]):
        k = min(max(hashed[c], 0) // B, nfull[c])
        m = min(((k * B - 1) // T + 1) if k > 0 else 0, off[c + 1] - off[c])
        used[c] = m
        z = mix64(np.uint64(tenant[c]))
        z = mix64(z ^ np.uint64(nfull[c]))
        z = mix64(z ^ np.uint64(k))
        for j in range(m):
            z = mix64(z ^ np.uint64(ids[off[c] + j]))
        key[c] = np.int64(z >> np.uint64(1))


@njit(cache=True)
def _split_unequal(rep, B, nfull, hashed, tenant, off, ids, used):
    """``rep[c] = c`` where request ``c``'s content differs from ``rep[c]``'s (a digest
    collision), so every request shares hashes only with an equal one."""
    for c in range(rep.shape[0]):
        r = rep[c]
        if r == c:
            continue
        same = (tenant[c] == tenant[r] and nfull[c] == nfull[r] and used[c] == used[r]
                and min(max(hashed[c], 0) // B, nfull[c])
                == min(max(hashed[r], 0) // B, nfull[r]))
        j = 0
        while same and j < used[c]:
            same = ids[off[c] + j] == ids[off[r] + j]
            j += 1
        if not same:
            rep[c] = c


@njit(cache=True)
def _own_hashes(own, h0, nfull, B, T, hashed, tenant, off, ids, hh):
    for c in own:
        _one_request(c, h0[c], nfull[c], B, T, hashed, tenant, off, ids, hh)


def shared_hashes(prompt, out, hashed, tenant, off, ids, trace_block_tokens: int,
                  block_size: int, python: bool = False) -> tuple:
    """``(h0, h1, hh)``: request ``c``'s hashes (:func:`request_hashes`) are
    ``hh[h0[c]:h1[c]]``; requests of equal content (tenant, lengths, the native ids their
    hashes read) share one slice, so ``hh`` grows with the distinct request contents, not
    with how often they come, and one array serves every replica.  ``python``: for the
    interpreted engine (:func:`kvsim.jit.disk_cache.setup_call`)."""
    from kvsim.jit.disk_cache import setup_call  # one process compiles at a time

    def once(func, *args):
        return setup_call(func, *args, python=python)

    i64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731
    prompt, out, hashed, tenant, off, ids = (i64(x) for x in (prompt, out, hashed, tenant,
                                                               off, ids))
    N = len(prompt)
    nfull = np.maximum(prompt + out - 1, 0) // block_size
    key = np.zeros(N, np.int64)
    used = np.zeros(N, np.int64)
    once(_content_keys, block_size, trace_block_tokens, nfull, hashed, tenant, off, ids, key,
         used)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    rep = np.ascontiguousarray(first[inv.ravel()], dtype=np.int64)
    once(_split_unequal, rep, block_size, nfull, hashed, tenant, off, ids, used)
    own = np.flatnonzero(rep == np.arange(N)).astype(np.int64)
    start = np.zeros(N, np.int64)
    start[own] = np.cumsum(nfull[own]) - nfull[own]
    h0 = start[rep]
    hh = np.zeros(max(int(nfull[own].sum()), 1), np.int64)
    once(_own_hashes, own, h0, nfull, block_size, trace_block_tokens, hashed, tenant, off, ids,
         hh)
    return h0, h0 + nfull, hh


@njit(cache=True, _nrt=False)
def slot_of(smap, srid, sfree, rid):
    """The core's request-table row of request ``rid`` (the closed loop's slot map,
    :mod:`kvsim.modes.closed.closed_slots`: ``smap`` request id -> row, ``srid`` row ->
    request id, ``sfree`` [free rows, rows ever used, the free rows (lowest last)]),
    given a row now if it has none; -1 when no row is left."""
    s = smap[rid]
    if s >= 0:
        return s
    nf = sfree[0]
    if nf > 0:
        s = sfree[1 + nf]
        sfree[0] = nf - 1
    elif sfree[1] < srid.shape[0]:
        s = sfree[1]
        sfree[1] = s + 1
    else:
        return -1
    smap[rid] = s
    srid[s] = rid
    return s


@njit(cache=True, _nrt=False)
def _new_row(R, varr, first_us, mark, s, c, prompt, out, rprio, h0, h1, Q, QA):
    """vLLM's row ``s`` for request ``c`` arriving (a row may have held a finished one)."""
    for k in range(R.shape[1]):
        R[s, k] = 0
    R[s, V.K_PLEN] = prompt[c]
    R[s, V.K_OLEN] = out[c]
    # vLLM's priority: lower value first; kvsim's request_priority: higher is more important
    R[s, V.K_PRIO] = -rprio[c]
    R[s, V.K_RANK] = c
    R[s, V.K_ID] = c
    R[s, V.K_H0] = h0[c]
    R[s, V.K_H1] = h1[c]
    if Q.shape[0] > 0:
        R[s, V.K_SPECK] = Q[c, Q_SPECK]
        R[s, V.K_ACCEPT] = Q[c, Q_ACCEPT]
        R[s, V.K_EXT] = Q[c, Q_EXT]
    R[s, V.K_STATUS] = V.UNSEEN
    R[s, V.K_NCACHED] = -1
    R[s, V.K_SEQ] = -1
    varr[s] = QA[c]
    first_us[s] = -1
    mark[s] = -1


@njit(cache=True, _nrt=False)
def _alloc_rows(I, F, n, fp, pc, step, t_us, i, b0, b1, after, B, hh, h0, nh, dl, sl,
                target):
    """ALLOCATE rows of request i's blocks b0 .. b1-1 (``after`` tokens computed at the end
    of this step): each with its full content's hash, its tokens by then and its prefill
    cost (``pc``: ``vs[VS_PCOST]``, filled here at a block index's first use)."""
    for b in range(b0, b1):
        h = hh[h0 + b] if b < nh else 0
        tok = min(B, max(after - b * B, 1))
        cost = pc[b] if b < pc.shape[0] else -1.0
        if cost < 0.0:
            cost = _prefill_us(fp, b * B, B)
            if b < pc.shape[0]:
                pc[b] = cost
        n = _row(I, F, n, step, t_us, EK_ALLOCATE, i, b, h, -1, tok, PH_PREFILL, PR_WARM, dl,
                 sl, target, 0, cost)
    return n


@njit(cache=True)
def _resets(vip, R, varr, sv, run, wq, heap, pl, opre, oev, ores, oc, rs, step, before):
    """Run the resets due now: those before request ``before``'s arrival (``before`` >= 0),
    else those before step ``step``'s schedule(); vLLM's ``reset_prefix_cache`` each
    (:func:`kvsim.engine.vllm_step.reset_prefix_cache`).  Returns how many cleared."""
    ok = 0
    for k in range(rs.shape[0]):
        if rs[k, RS_DONE] != 0:
            continue
        due = rs[k, RS_BEFORE] == before if before >= 0 else (
            rs[k, RS_BEFORE] < 0 and 0 <= rs[k, RS_AT_STEP] <= step)
        if due:
            rs[k, RS_DONE] = 1
            ok += V.reset_prefix_cache(vip, R, varr, sv, run, wq, heap, rs[k, RS_RUNNING] != 0,
                                       pl, opre, oev, ores, oc)
    return ok


@njit(cache=True, _nrt=False)
def vllm_rows(ip, fp, st, stf, arr, prompt, out, ttft, tpot, rprio, cont, gap, shared,
              order, tk, hitk, adm, I, F, n, vs, rs, acc, smap, srid, sfree):
    """Run vLLM steps until ``n >= ip[P_FLUSH]`` at a step boundary or no work is left
    (module docstring).  ``tk``: the replay's lower tiers' hash table: an admission's
    prefix continued there counts as computed (loaded), as vLLM's KV connector's tokens.
    ``rs``: the resets table ``vs[VS_RESETS]``, or None when there is no reset (numba then
    drops the resets' code before typing it: kvsim.replay.kernel.closed_step.scheduler_args).
    ``acc``: the step time's accumulators (``NUM_ACC`` floats, the caller's scratch: one
    allocation per call of the caller, not per step).  Returns ``(need, n)``: ``need`` 0
    when done, else the rows ``I``/``F`` must have room for after ``n``: the caller grows
    them (:func:`kvsim.engine.scheduler._ensure`) and calls again with that ``n``; a step
    scheduled before it stopped resumes at its rows (``vs[VS_RSM]``); ``need`` -1 when an
    arriving request needs a row and none is free (the step starts again once the caller
    freed or added rows).  ``smap``/``srid``/``sfree``: the core's slot map
    (:func:`slot_of`): vLLM's rows are the core's request-table rows, ``srid`` their
    requests.

    Compiled without reference counting (``_nrt=False``, as :mod:`kvsim.engine.vllm_step`'s
    step): it allocates nothing and returns no array, so every array it reads (``vs``' 24
    members, the pool's through its borrowed member reads) is borrowed from its caller."""
    vip = vs[VS_IP]
    R = vs[VS_R]
    varr = vs[VS_ARR]
    hh = vs[VS_HH]
    sv = vs[VS_SV]
    run = vs[VS_RUN]
    wq = vs[VS_WQ]
    heap = vs[VS_HEAP]
    pl = vs[VS_POOL]
    hits = vs[VS_HITS]
    hs = vs[VS_HS]
    pc = vs[VS_PCOST]
    osched = vs[VS_SCHED]
    obl = vs[VS_BL]
    oblids = vs[VS_BLIDS]
    oadm = vs[VS_ADM]
    opre = vs[VS_PRE]
    ofin = vs[VS_FIN]
    oev = vs[VS_EV]
    oc = vs[VS_OC]
    first_us = vs[VS_FIRST]
    mark = vs[VS_MARK]
    ores = vs[VS_RES]
    rsm = vs[VS_RSM]
    pst = pl.st
    pol = pl.pst
    pview = pl.pview
    pout = pl.out
    B = ip[P_B]
    max_tok = ip[P_MAXTOK]
    flush = ip[P_FLUSH]
    cap = I.shape[1]
    while st[S_FINISHED] == 0:
        qn = st[S_QN]
        if rsm[RSM_ON] != 0:  # the step that stopped for row room: write its rows now
            rsm[RSM_ON] = 0
            now = stf[0]
            step = st[S_STEP]
            t_us = np.int64(now)
            step_row = rsm[RSM_ROW]
            cleared = rsm[RSM_CLEARED]
            npre_reset = rsm[RSM_NPRE]
            nsched = oc[V.O_SCHED]
            nbl = oc[V.O_BL]
        else:
            now = stf[0]
            st[S_NADM] = 0
            if sv[V.V_NRUN] == 0 and V.num_waiting(vip, sv) == 0:
                if st[S_ARRIVE] >= qn:
                    st[S_FINISHED] = 1
                    break
                if arr[order[st[S_ARRIVE]]] > now:
                    now = float(arr[order[st[S_ARRIVE]]])
            step = st[S_STEP]
            t_us = np.int64(now)
            a0 = st[S_ARRIVE]
            a1 = a0
            while a1 < qn and arr[order[a1]] <= t_us:
                a1 += 1
            if n + 2 + (a1 - a0) > cap:  # nothing changed yet: the step starts again
                return 2 + (a1 - a0), n
            for j in range(a0, a1):  # vLLM's rows: the core's rows, given now
                if slot_of(smap, srid, sfree, order[j]) < 0:
                    return -1, n  # none free: the caller folds finished ones or grows
            step_row = n
            n = _row(I, F, n, step, t_us, EK_STEP, -1, -1, 0, -1, 0, PH_PREFILL, PR_WARM, -1,
                     0, -1, 0, 0.0)
            for k in range(oc.shape[0]):
                oc[k] = 0
            cleared = 0
            for j in range(a0, a1):
                i = order[j]
                if rs is not None:
                    cleared += _resets(vip, R, varr, sv, run, wq, heap, pl, opre, oev, ores, oc,
                                       rs, step, i)
                dl = arr[i] + ttft[i] if ttft[i] > 0 else -1
                n = _row(I, F, n, step, arr[i], EK_ARRIVE, i, -1, 0, -1, prompt[i], PH_PREFILL,
                         PR_WARM, dl, 0, -1, 0, 0.0)
                s = smap[i]
                _new_row(R, varr, first_us, mark, s, i, prompt, out, rprio, vs[VS_H0],
                         vs[VS_H1], vs[VS_Q], vs[VS_QA])
                V.add_request(vip, R, varr, sv, wq, heap, s)
            st[S_ARRIVE] = a1
            if rs is not None:
                cleared += _resets(vip, R, varr, sv, run, wq, heap, pl, opre, oev, ores, oc, rs,
                                   step, -1)
            npre_reset = oc[V.O_PRE]  # the resets' preemptions come before this step's rows
            V.schedule(vip, R, varr, hh, sv, run, wq, heap, pst, pol, pview, pout, hits, hs,
                       osched, obl, oblids, oadm, opre, oev, oc, tk)
            nsched = oc[V.O_SCHED]
            if nsched == 0 and oc[V.O_PRE] == 0:
                # nothing fits and nothing runs: wait for the next arrival (vLLM idles)
                n = step_row
                if cleared > 0:  # a reset while idle: the replay clears its cache too
                    n = _row(I, F, n, step, t_us, EK_FREE, -1, FREE_RESET_CACHE, 0, -1, 0,
                             PH_DONE, PR_COLD, -1, 0, -1, 0, 0.0)
                if a1 < qn:
                    stf[0] = max(now, float(arr[order[a1]]))
                    continue
                raise ValueError("vLLM scheduler: waiting requests can never be scheduled "
                                 "(larger than the KV pool?)")
            nbl = oc[V.O_BL]
            # the step's rows: its preemptions, a reset's clear, each scheduled request's
            # blocks (entry k of obl has obl[k, 1]), intent and access, and each finished
            # one's intent and free (finished ones were scheduled)
            need = 5 + 2 * oc[V.O_PRE] + 5 * nsched + 2
            for k in range(nbl):
                need += obl[k, 1]
            if n + need > cap:  # the caller grows the rows; the step resumes here
                rsm[RSM_ON] = 1
                rsm[RSM_ROW] = step_row
                rsm[RSM_CLEARED] = cleared
                rsm[RSM_NPRE] = npre_reset
                stf[0] = now
                return need, n
        for k in range(oc[V.O_ADM]):
            i = oadm[k, 0]
            mark[i] = step
            hitk[srid[i]] = oadm[k, 1]
            adm[st[S_NADM]] = srid[i]
            st[S_NADM] += 1
            st[S_HIT_TOK] += oadm[k, 1]
        tokens = 0
        attended = 0.0
        kv_read = 0.0
        acc_reset(acc)
        p = 0
        while p < npre_reset:  # reset_running_requests: its victims, then the clear
            n = _row(I, F, n, step, t_us, EK_FREE, srid[opre[p, 0]], FREE_PREEMPT_BLOCK, 0,
                     -1, 0, PH_PREFILL, PR_COLD, -1, 0, -1, 0, 0.0)
            p += 1
        if cleared > 0:
            n = _row(I, F, n, step, t_us, EK_FREE, -1, FREE_RESET_CACHE, 0, -1, 0, PH_DONE,
                     PR_COLD, -1, 0, -1, 0, 0.0)
        for k in range(nsched):
            while p < oc[V.O_PRE] and opre[p, 1] <= k:
                n = _row(I, F, n, step, t_us, EK_FREE, srid[opre[p, 0]], FREE_PREEMPT_BLOCK,
                         0, -1, 0, PH_PREFILL, PR_COLD, -1, 0, -1, 0, 0.0)
                p += 1
            i = osched[k, 0]  # vLLM's row; c its request
            c = srid[i]
            ntok = osched[k, 1]
            after = R[i, V.K_NCOMP]
            before = after - ntok
            plen = R[i, V.K_PLEN]
            nout = R[i, V.K_NOUT]
            h0 = R[i, V.K_H0]
            nh = R[i, V.K_H1] - h0
            dl = arr[c] + ttft[c] if ttft[c] > 0 else -1
            target = step + (plen + nout - before + max_tok - 1) // max_tok
            e = -1
            for x in range(nbl):
                if obl[x, 0] == i:
                    e = x
                    break
            if e >= 0:
                cnt = obl[e, 1]
                if mark[i] == step:  # admitted now: its whole table
                    n = _alloc_rows(I, F, n, fp, pc, step, t_us, c, np.int64(0), cnt, after,
                                    B, hh, h0, nh, dl, 0, target)  # typed 0: one compile
                else:
                    m = pst.seq_len[R[i, V.K_SEQ]]
                    n = _alloc_rows(I, F, n, fp, pc, step, t_us, c, m - cnt, m, after, B, hh,
                                    h0, nh, dl, 0, target)
            sspec = R[i, V.K_SSPEC]  # draft tokens scheduled (verified this step)
            decode = ntok == 1 + sspec and before == plen + nout - 1 and nout > 0
            if decode:
                tdl = _token_deadline(arr[c], ttft[c], tpot[c], first_us[i], nout + 1)
                # the decode's intent, as kvsim's scheduler states it (critical: pinned)
                crit = rprio[c] >= ip[P_CRITPRIO] or (0 < tpot[c] <= ip[P_CRITTPOT])
                if mark[i] != -1:  # its first decode since (re-)admission: blocks decode
                    mark[i] = -1
                    n = _row(I, F, n, step, t_us, EK_INTENT, c, -1, 0, -1, 0, PH_DECODE,
                             PR_DECODE_CRITICAL if crit else PR_WARM, tdl, 0, step + 1,
                             1 if crit else 0, 0.0)
                n = _row(I, F, n, step, t_us, EK_ACCESS, c, -1, 0, -1, ntok,
                         PH_VERIFY if sspec > 0 else PH_DECODE,
                         PR_DECODE_CRITICAL if crit else PR_WARM, tdl, 0, step + 1,
                         1 if crit else 0, 0.0)
                # the step clock charges the verified tokens: 1 + drafts, each attending
                # to the KV before it
                tokens += ntok
                attended += ntok * float(before) + ntok * (ntok + 1.0) / 2.0
                kv_read += before + ntok
                acc_decode(acc, ntok, before + ntok)
            else:
                n = _row(I, F, n, step, t_us, EK_ACCESS, c, -1, 0, -1, ntok, PH_PREFILL,
                         PR_WARM, dl, 0, target, 0, 0.0)
                tokens += ntok
                attended += ntok * float(before) + ntok * (ntok + 1.0) / 2.0
                kv_read += before + ntok
                acc_chunk(fp, acc, ntok, before)
                if after >= plen + nout and nout == 0:
                    first_us[i] = -2  # first token at the end of this step
        while p < oc[V.O_PRE]:
            n = _row(I, F, n, step, t_us, EK_FREE, srid[opre[p, 0]], FREE_PREEMPT_BLOCK, 0,
                     -1, 0, PH_PREFILL, PR_COLD, -1, 0, -1, 0, 0.0)
            p += 1
        V.update_from_output(vip, R, hh, sv, run, pst, pol, pview, osched, ofin, oev, oc)
        held = pst.sc[S_N_HELD]
        st[S_HELD] = held
        if held > st[S_MAXHELD]:
            st[S_MAXHELD] = held
        nrun = sv[V.V_NRUN]
        if nrun + oc[V.O_FIN] > st[S_MAXRUN]:
            st[S_MAXRUN] = nrun + oc[V.O_FIN]
        dur = step_duration_us(fp, acc, tokens, attended, kv_read)
        end = now + dur
        end_us = np.int64(end)
        I[C_NTOK, step_row] = tokens
        F[F_DUR, step_row] = dur
        for r in range(step_row + 1, n):
            if I[C_PHASE, r] == PH_DECODE and I[C_DEADLINE, r] >= 0:
                I[C_SLACK, r] = I[C_DEADLINE, r] - end_us
        for k in range(nsched):
            i = osched[k, 0]
            if first_us[i] == -2:
                first_us[i] = end_us
        nfin = oc[V.O_FIN]
        for x in range(nfin):
            c = srid[ofin[x]]
            if cont[c]:
                dl = end_us + gap[c] + (ttft[c] if ttft[c] > 0 else 0)
                n = _row(I, F, n, step, t_us, EK_INTENT, c, -1, 0, -1, 0, PH_IDLE, PR_HOT, dl,
                         dl - end_us, -1, 0, 0.0)
            else:
                n = _row(I, F, n, step, t_us, EK_INTENT, c, -1, 0, -1, 0, PH_DONE, PR_COLD,
                         -1, 0, -1, 0, 0.0)
            n = _row(I, F, n, step, t_us, EK_FREE, c, -1, 0, -1, 0, PH_DONE, PR_COLD, -1, 0,
                     -1, 0, 0.0)
        st[S_DONE] += nfin
        st[S_NRUN] = nrun
        st[S_ADMIT] = st[S_ARRIVE] - V.num_waiting(vip, sv)
        stf[0] = end
        st[S_STEP] = step + 1
        if st[S_ARRIVE] >= qn and nrun == 0 and V.num_waiting(vip, sv) == 0:
            st[S_FINISHED] = 1
        if n >= flush:
            break
    return 0, n


def new_vllm_value(cols: dict, off, ids, trace_block_tokens: int, block_size: int,
                   *args, hashes: tuple | None = None, **kw) -> tuple:
    """The scheduler value ``vs`` of :func:`vllm_rows`
    (:func:`kvsim.engine.vllm_value.build_value`, which documents the arguments), with one
    replica's own hashes (:func:`shared_hashes`) when ``hashes`` is None."""
    if hashes is None:  # one replica's own; a cluster shares one
        hashes = shared_hashes(cols["prompt_tokens"], cols["output_tokens"],
                               cols["hashed_tokens"], cols["tenant"], off, ids,
                               trace_block_tokens, block_size,
                               python=not kw.get("compiled", True))
    return build_value(cols, off, ids, trace_block_tokens, block_size, *args, hashes=hashes,
                       **kw)
