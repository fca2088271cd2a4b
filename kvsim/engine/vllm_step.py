"""vLLM v1's scheduler step, compiled: the port of :mod:`kvsim.engine.vllm_scheduler`
(vLLM 0.33.0 ``Scheduler.schedule()`` / ``update_from_output()`` and
``KVCacheManager.allocate_slots()``) on array state, over the replay's compiled block pool
(:mod:`kvsim.memory.fast` + :mod:`kvsim.memory.pool_ops` with vLLM's free-queue order,
:mod:`kvsim.memory.fifo_order`).

The plain-Python port is its witness (tests/engine/test_vllm_step.py: identical step results
on every recording and on random workloads); Python drives it through
:class:`kvsim.engine.vllm_compiled.CompiledVllmScheduler`.

State (all int64 unless said):

* ``ip``: the engine config (``P_*``; ``P_LOOK``, ``P_SEED``: :mod:`kvsim.engine.vllm_spec`);
* ``R[N, K_*]``: one row per request: prompt and output length, priority, the rank of its
  (request id, index) among all requests (the heap's last tie-break), its hashes' range in
  ``hh`` (chain hashes of the full blocks of prompt + output - 1 tokens), status, computed
  and output tokens, preemptions, cached blocks (-1: vLLM's ``num_cached_block`` unset, no
  blocks held), its pool seq slot (-1: none), this step's scheduled tokens and new blocks,
  its drafts (``K_SPEC*``, ``K_ACCEPT``: :mod:`kvsim.engine.vllm_spec`), and ``K_EXT``:
  tokens a P/D prefill replica sent (:func:`_remote_tokens`); ``arr`` (float64): arrivals;
* ``sv`` (``V_*``): running count, the FCFS deque's head and length, the heap's length;
* ``run``: the running list; ``wq``: the FCFS waiting deque (a ring of N); ``heap``: the
  priority waiting queue (a binary heap on (priority, arrival, rank): a total order, so
  any heap pops in the order of Python's ``heapq``);
* the pool: ``st`` (:class:`kvsim.memory.pool_ref.PoolRef`), ``pol`` (the order policy
  value), ``view``, ``pout`` (its allocation scratch).

Outputs of one step (``oc`` counts, ``O_*``; the Python side reads them and zeroes ``oc``):
scheduled (request, tokens) in order; block lists (request, count) with their ids;
admissions (request, hit tokens, resumed?); preempted; finished; KV events rows
(``E_STORED`` request, first block, count / ``E_REMOVED`` hash / ``E_CLEARED``); reset
outcomes; free blocks after ``schedule()`` and after the step.

The state's constants (``P_*``, ``K_*``, ``V_*``, ``O_*``, ``E_*``) live in
:mod:`kvsim.engine.vllm_layout`, imported here whole.
"""

from __future__ import annotations

import numpy as np

# the state's layout: P_* (ip), K_* (R), status, V_* (sv), O_* (oc), E_* (oev[:, 0])
from kvsim.engine.vllm_layout import *
from kvsim.engine.vllm_spec import accepted_drafts
from kvsim.jit.decorators import helper, njit
from kvsim.memory import pool_ops
from kvsim.memory.fast import S_N_CAND, S_N_EMPTY, S_N_HELD, pool_lookup, seq_close, seq_open
from kvsim.replay.kernel.tiers import hash_slot


@njit(cache=True, inline="always")
def _cdiv(a, b):
    return -(-a // b)


# ---- waiting queues ----------------------------------------------------------------------
@njit(cache=True, inline="always")
def _less(R, arr, a, b):
    """Heap order: (priority, arrival, rank) of request a below that of b."""
    if R[a, K_PRIO] != R[b, K_PRIO]:
        return R[a, K_PRIO] < R[b, K_PRIO]
    if arr[a] != arr[b]:
        return arr[a] < arr[b]
    return R[a, K_RANK] < R[b, K_RANK]


@njit(cache=True, _nrt=False)
def push_waiting(ip, R, arr, sv, wq, heap, i, front):
    """Waiting queue append (``front``: vLLM ``prepend_request``; the heap ignores it)."""
    if ip[P_PRIO] != 0:
        k = sv[V_HLEN]
        heap[k] = i
        sv[V_HLEN] = k + 1
        while k > 0:
            p = (k - 1) >> 1
            if _less(R, arr, heap[k], heap[p]):
                t = heap[k]
                heap[k] = heap[p]
                heap[p] = t
                k = p
            else:
                break
        return
    cap = wq.shape[0]
    if front:
        sv[V_WHEAD] = (sv[V_WHEAD] - 1 + cap) % cap
        wq[sv[V_WHEAD]] = i
    else:
        wq[(sv[V_WHEAD] + sv[V_WLEN]) % cap] = i
    sv[V_WLEN] += 1


@njit(cache=True, inline="always")
def num_waiting(ip, sv):
    return sv[V_HLEN] if ip[P_PRIO] != 0 else sv[V_WLEN]


@njit(cache=True, inline="always")
def _peek(ip, sv, wq, heap):
    return heap[0] if ip[P_PRIO] != 0 else wq[sv[V_WHEAD]]


@njit(cache=True, _nrt=False)
def _pop_waiting(ip, R, arr, sv, wq, heap):
    if ip[P_PRIO] == 0:
        i = wq[sv[V_WHEAD]]
        sv[V_WHEAD] = (sv[V_WHEAD] + 1) % wq.shape[0]
        sv[V_WLEN] -= 1
        return i
    top = heap[0]
    n = sv[V_HLEN] - 1
    sv[V_HLEN] = n
    if n > 0:
        heap[0] = heap[n]
        k = 0
        while True:
            c = 2 * k + 1
            if c >= n:
                break
            if c + 1 < n and _less(R, arr, heap[c + 1], heap[c]):
                c += 1
            if _less(R, arr, heap[c], heap[k]):
                t = heap[k]
                heap[k] = heap[c]
                heap[c] = t
                k = c
            else:
                break
    return top


# ---- the pool (vLLM BlockPool / KVCacheManager) ------------------------------------------
@njit(cache=True, inline="always")
def free_blocks(st):
    """vLLM ``get_num_free_blocks``: empty + cached blocks."""
    return st.sc[S_N_EMPTY] + st.sc[S_N_CAND]


@helper(_nrt=False)  # one compile for its constant kinds (kvsim.jit.decorators)
def _event(oev, oc, kind, a, b, c):
    k = oc[O_EV]
    if k >= oev.shape[0]:
        raise ValueError("vllm_step: KV event buffer full")
    oev[k, 0] = kind
    oev[k, 1] = a
    oev[k, 2] = b
    oev[k, 3] = c
    oc[O_EV] = k + 1


@njit(cache=True, _nrt=False)
def _cache_blocks(ip, R, hh, i, ntok, st, pol, view, oev, oc):
    """vLLM ``cache_blocks``: full blocks up to ``ntok`` tokens get their hashes; one
    stored event."""
    if ip[P_CACHING] == 0:
        return
    bs = ip[P_BS]
    num_cached = max(R[i, K_NCACHED], 0)
    num_tokens = R[i, K_PLEN] + R[i, K_NOUT]
    num_full = min(ntok, (num_tokens // bs) * bs) // bs
    if num_cached >= num_full:
        return
    h0 = R[i, K_H0]
    pool_ops.cache_blocks(st, pol, view, R[i, K_SEQ], num_cached,
                          hh[h0 + num_cached:h0 + num_full], 0.0)
    _event(oev, oc, E_STORED, i, num_cached, num_full - num_cached)
    R[i, K_NCACHED] = num_full


@njit(cache=True, _nrt=False)
def release(R, i, st, pol, view):
    """Free request i's blocks tail-first and its seq slot (vLLM ``free``)."""
    seq = R[i, K_SEQ]
    if seq >= 0:
        pool_ops.free(st, pol, view, seq, 0.0)
        seq_close(st, seq)
        R[i, K_SEQ] = -1
    R[i, K_NCACHED] = -1


@njit(cache=True, _nrt=False)
def lookup(ip, R, hh, i, st, hits):
    """vLLM ``get_computed_blocks``: hit blocks in ``hits``; their count (at most
    ``num_tokens - 1`` tokens)."""
    if ip[P_CACHING] == 0:
        return 0
    h0 = R[i, K_H0]
    n = R[i, K_H1] - h0
    if n == 0:
        return 0
    return pool_lookup(st, hh[h0:R[i, K_H1]], n, R[i, K_PLEN] + R[i, K_NOUT], hits)


@njit(cache=True, _nrt=False)
def lookup_ext(ip, R, hh, i, nhits, tk):
    """Blocks after the ``nhits`` HBM hits whose content a lower tier holds (``tk``: the
    replay's lower tiers' hash table, :func:`kvsim.replay.kernel.tiers.hash_slot`): vLLM's
    KV-connector tokens (``num_external_computed_tokens``), loaded rather than computed;
    the same ``num_tokens - 1`` cap."""
    if ip[P_CACHING] == 0 or tk.shape[0] <= 2:
        return 0
    h0 = R[i, K_H0]
    limit = min(R[i, K_H1] - h0, (R[i, K_PLEN] + R[i, K_NOUT] - 1) // ip[P_BS])
    k = nhits
    while k < limit:
        h = hh[h0 + k]
        if h == 0 or tk[hash_slot(tk, h)] != h:
            break
        k += 1
    return k - nhits


@njit(cache=True, inline="always")
def _remote_tokens(R, i, hit):
    """P/D: tokens past ``hit`` a prefill replica sent (``K_EXT``), vLLM's remote prefill's
    external tokens, less the last one (recomputed: ``_update_waiting_for_remote_kv``)."""
    T = R[i, K_PLEN] + R[i, K_NOUT]
    got = max(min(R[i, K_EXT], T) - hit, 0)
    return got - 1 if got > 0 and hit + got == T else got


@njit(cache=True, _nrt=False)
def allocate_slots(ip, R, hh, i, num_new, hits, nhits, next_, full_must_fit, has_sched, st,
                   pol, view, pout, hs, oev, oc):
    """vLLM ``KVCacheManager.allocate_slots`` (with its lookahead slots when ``P_LOOK``): the
    number of new blocks (their ids are the last ones of the request's table), or -1.  ``nhits`` prefix-hit
    blocks (``hits``), then ``next_`` blocks loaded from a lower tier (allocated as new
    blocks, counted as computed: vLLM's external computed tokens)."""
    bs = ip[P_BS]
    maxlen = ip[P_MAXLEN]
    total_computed = min(R[i, K_NCOMP] + (nhits + next_) * bs, maxlen)
    status = R[i, K_STATUS]
    watermark = 0
    if has_sched and (status == WAITING or status == PREEMPTED):
        watermark = ip[P_WMARK]
    evictable = 0
    for k in range(nhits):
        if st.ref_cnt[hits[k]] == 0:
            evictable += 1
    seq = R[i, K_SEQ]
    have = st.seq_len[seq] if seq >= 0 else 0
    free = free_blocks(st)
    running = R[i, K_NCACHED] >= 0
    num_tokens = R[i, K_PLEN] + R[i, K_NOUT]
    if full_must_fit:
        full = min(num_tokens, maxlen)
        if running:
            need_full = max(_cdiv(full, bs) - have, 0)
        else:
            need_full = max(_cdiv(full, bs) - (nhits + have), 0) + evictable
        if need_full + watermark > free:
            return -1
    need = min(total_computed + num_new + (R[i, K_SPECK] if ip[P_LOOK] else 0), maxlen)
    if running:
        n_alloc = max(_cdiv(need, bs) - have, 0)
    else:
        n_alloc = max(_cdiv(need, bs) - (nhits + have), 0) + evictable
    if n_alloc + watermark > free:
        return -1
    n_new = max(_cdiv(need, bs) - nhits - have, 0)
    first = seq < 0
    if first:
        seq = seq_open(st, 0)
        if seq < 0:
            raise ValueError("vllm_step: no free seq slot")
        R[i, K_SEQ] = seq
    nh = nhits if first else 0
    if nh > 0 or n_new > 0:
        h0 = R[i, K_H0]
        for k in range(nh):
            hs[k] = hh[h0 + k]
        for k in range(nh, nh + n_new):
            hs[k] = 0
        k = pool_ops.allocate(st, pol, view, seq, hs, nh + n_new,
                              num_tokens if first else 0, 0.0, pout)
        if k != nh:
            raise ValueError("vllm_step: the pool disagrees with its own lookup")
        for k in range(nh, nh + n_new):
            if pout.evicted_hash[k] != 0:
                _event(oev, oc, E_REMOVED, pout.evicted_hash[k], 0, 0)
    if not running:  # first allocation: the hits are adopted
        R[i, K_NCACHED] = nh
    _cache_blocks(ip, R, hh, i, min(total_computed + num_new, num_tokens), st, pol, view,
                  oev, oc)
    return n_new


@njit(cache=True, inline="always")
def _slots_unchanged(ip, R, i, num_new, seq_len):
    """True when :func:`allocate_slots` for running request ``i`` as ``schedule()``'s running
    loop calls it (no hits, ``full_must_fit`` False) would return 0 and change nothing: no
    new block, no full block to cache.  Its own arithmetic, without its call (each call
    counts references to its ~11 array arguments, and ``_cache_blocks``'s 8, per request
    and step: docs/benchmarks.md, "vs NVIDIA AISimulate, warm: where the CPU goes").  ``seq_len``:
    the pool's ``st.seq_len``, read once by the caller (each read of a member is a count)."""
    seq = R[i, K_SEQ]
    status = R[i, K_STATUS]
    if R[i, K_NCACHED] < 0 or seq < 0 or status == WAITING or status == PREEMPTED:
        return False
    bs = ip[P_BS]
    maxlen = ip[P_MAXLEN]
    total_computed = min(R[i, K_NCOMP], maxlen)
    need = min(total_computed + num_new + (R[i, K_SPECK] if ip[P_LOOK] else 0), maxlen)
    if _cdiv(need, bs) > seq_len[seq]:
        return False
    if ip[P_CACHING] == 0:
        return True
    num_tokens = R[i, K_PLEN] + R[i, K_NOUT]
    ntok = min(total_computed + num_new, num_tokens)
    return R[i, K_NCACHED] >= min(ntok, (num_tokens // bs) * bs) // bs


@njit(cache=True, _nrt=False)
def preempt(ip, R, arr, sv, wq, heap, i, st, pol, view, opre, oc):
    """Recompute preemption: blocks freed tail-first, re-queued at the front."""
    release(R, i, st, pol, view)
    R[i, K_STATUS] = PREEMPTED
    R[i, K_NCOMP] = 0
    R[i, K_SPEC] = R[i, K_SSPEC] = 0  # its drafts are dropped
    R[i, K_NPRE] += 1
    push_waiting(ip, R, arr, sv, wq, heap, i, np.bool_(True))  # typed: one compile
    k = oc[O_PRE]
    opre[k, 0] = i
    opre[k, 1] = oc[O_SCHED]  # where in this step's scheduled list it happened
    oc[O_PRE] = k + 1


@njit(cache=True)
def reset_prefix_cache(ip, R, arr, sv, run, wq, heap, reset_running, pl, opre, oev, ores,
                       oc):
    """vLLM ``Scheduler.reset_prefix_cache``; returns 1 when the hashes were cleared."""
    st = pl.st
    pol = pl.pst
    view = pl.pview
    pout = pl.out
    if reset_running:
        while sv[V_NRUN] > 0:
            sv[V_NRUN] -= 1
            preempt(ip, R, arr, sv, wq, heap, run[sv[V_NRUN]], st, pol, view, opre, oc)
    ok = 0
    if st.sc[S_N_HELD] == 0:
        ok = pool_ops.clear_cache(st, pol, view, 0.0, pout)
    if ok and ip[P_CACHING] != 0:
        _event(oev, oc, E_CLEARED, 0, 0, 0)
    ores[oc[O_RESET]] = ok
    oc[O_RESET] += 1
    return ok


@njit(cache=True, _nrt=False)
def _victim_priority(R, arr, run, nrun):
    """vLLM's ``max(running, key=(priority, arrival_time))``: the first maximum."""
    best = 0
    for k in range(1, nrun):
        a = run[k]
        b = run[best]
        if R[a, K_PRIO] > R[b, K_PRIO] or (R[a, K_PRIO] == R[b, K_PRIO]
                                          and arr[a] > arr[b]):
            best = k
    return best


@njit(cache=True, _nrt=False)
def step(ip, R, arr, hh, sv, run, wq, heap, pl, hits, hs,
         osched, obl, oblids, oadm, opre, ofin, oev, oc, tk):
    """One engine step: ``schedule()`` then ``update_from_output()`` (the recorder's fake
    runner: a request whose chunk reaches its known tokens samples one token).  Returns
    the number of scheduled requests."""
    st = pl.st
    pol = pl.pst
    view = pl.pview
    pout = pl.out
    schedule(ip, R, arr, hh, sv, run, wq, heap, st, pol, view, pout, hits, hs,
             osched, obl, oblids, oadm, opre, oev, oc, tk)
    oc[O_FREE_SCHED] = free_blocks(st)
    update_from_output(ip, R, hh, sv, run, st, pol, view, osched, ofin, oev, oc)
    oc[O_FREE] = free_blocks(st)
    return oc[O_SCHED]


@njit(cache=True, _nrt=False)
def _unschedule(R, osched, oc, i):
    """Drop request i from this step's scheduled list (a victim scheduled earlier)."""
    n = oc[O_SCHED]
    j = 0
    while j < n and osched[j, 0] != i:
        j += 1
    if j == n:
        return 0
    tok = osched[j, 1]
    for k in range(j, n - 1):
        osched[k, 0] = osched[k + 1, 0]
        osched[k, 1] = osched[k + 1, 1]
    oc[O_SCHED] = n - 1
    R[i, K_SCHED] = 0
    R[i, K_NEWB] = 0
    return tok


@njit(cache=True, _nrt=False)
def schedule(ip, R, arr, hh, sv, run, wq, heap, st, pol, view, pout, hits, hs,
             osched, obl, oblids, oadm, opre, oev, oc, tk):
    """vLLM ``Scheduler.schedule()``: the running list under one token budget, then
    admissions (none in a step that preempted); block lists as vLLM's SchedulerOutput
    orders them (new, resumed, then the running requests' new blocks).  ``tk``: the lower
    tiers' hash table (:func:`lookup_ext`; a 2-entry empty one for none)."""
    by_prio = ip[P_PRIO] != 0
    budget = ip[P_MAXTOK]
    maxlen = ip[P_MAXLEN]
    pre0 = oc[O_PRE]  # preemptions of a reset before this step are not this step's
    eligible = sv[V_NRUN] + num_waiting(ip, sv)
    thr = ip[P_THR] if eligible > 1 else 0
    req_index = 0
    seq_len = st.seq_len
    while req_index < sv[V_NRUN] and budget > 0:
        i = run[req_index]
        num_new = R[i, K_PLEN] + R[i, K_NOUT] + R[i, K_SPEC] - R[i, K_NCOMP]
        if 0 < thr < num_new:
            num_new = thr
        num_new = min(num_new, budget, maxlen - R[i, K_NCOMP] - 1)
        if num_new <= 0:
            req_index += 1
            continue
        got = -1
        while True:
            if _slots_unchanged(ip, R, i, num_new, seq_len):  # its common case, without a call
                got = 0
                break
            # typed constants, not literals: one compile of allocate_slots for both calls
            got = allocate_slots(ip, R, hh, i, num_new, hits, np.int64(0), np.int64(0),
                                 np.bool_(False), np.bool_(True), st, pol, view, pout, hs,
                                 oev, oc)
            if got >= 0:
                break
            nrun = sv[V_NRUN]
            if by_prio:
                vi = _victim_priority(R, arr, run, nrun)
                victim = run[vi]
                for k in range(vi, nrun - 1):
                    run[k] = run[k + 1]
                sv[V_NRUN] = nrun - 1
                if vi < req_index:
                    req_index -= 1
                budget += _unschedule(R, osched, oc, victim)
            else:
                victim = run[nrun - 1]
                sv[V_NRUN] = nrun - 1
            preempt(ip, R, arr, sv, wq, heap, victim, st, pol, view, opre, oc)
            if victim == i:
                break
        if got < 0:
            if by_prio and R[i, K_STATUS] == PREEMPTED:
                continue
            break
        k = oc[O_SCHED]
        osched[k, 0] = i
        osched[k, 1] = num_new
        oc[O_SCHED] = k + 1
        R[i, K_SCHED] = num_new
        R[i, K_NEWB] = got
        # drafts scheduled (past the known tokens); the proposals are consumed
        R[i, K_SSPEC] = min(R[i, K_SPEC], max(num_new + R[i, K_NCOMP] - R[i, K_PLEN]
                                                 - R[i, K_NOUT], 0))
        R[i, K_SPEC] = 0
        budget -= num_new
        req_index += 1
    n_run_sched = oc[O_SCHED]
    a0 = oc[O_ADM]
    if oc[O_PRE] == pre0:
        while budget > 0 and num_waiting(ip, sv) > 0:
            if sv[V_NRUN] >= ip[P_MAXSEQ]:
                break
            i = _peek(ip, sv, wq, heap)
            nhits = lookup(ip, R, hh, i, st, hits) if R[i, K_NCOMP] == 0 else 0
            next_ = lookup_ext(ip, R, hh, i, nhits, tk) if R[i, K_NCOMP] == 0 else 0
            num_hit = (nhits + next_) * ip[P_BS]
            remote = _remote_tokens(R, i, num_hit) if R[i, K_NCOMP] == 0 else 0
            num_new = R[i, K_PLEN] + R[i, K_NOUT] - num_hit - remote
            if 0 < thr < num_new:
                num_new = thr
            if ip[P_CHUNKED] == 0 and num_new > budget:
                break
            num_new = min(num_new, budget)
            R[i, K_NCOMP] += remote  # computed, for allocate_slots only
            got = allocate_slots(ip, R, hh, i, num_new, hits, nhits, next_,
                                 ip[P_RESERVE] != 0, sv[V_NRUN] > 0, st, pol, view, pout, hs,
                                 oev, oc)
            R[i, K_NCOMP] -= remote
            if got < 0:
                break
            _pop_waiting(ip, R, arr, sv, wq, heap)
            run[sv[V_NRUN]] = i
            sv[V_NRUN] += 1
            was_pre = R[i, K_STATUS] == PREEMPTED
            R[i, K_STATUS] = RUNNING
            R[i, K_NCOMP] = num_hit + remote
            R[i, K_EXT] = 0  # one transfer: a preempted request recomputes (vLLM)
            k = oc[O_SCHED]
            osched[k, 0] = i
            osched[k, 1] = num_new
            oc[O_SCHED] = k + 1
            R[i, K_SCHED] = num_new
            k = oc[O_ADM]
            oadm[k, 0] = i
            oadm[k, 1] = num_hit
            oadm[k, 2] = 1 if was_pre else 0
            oc[O_ADM] = k + 1
            budget -= num_new
    # block lists: new admissions' tables, resumed ones', then running requests' new blocks
    for resumed in range(2):
        for k in range(a0, oc[O_ADM]):
            if oadm[k, 2] == resumed:
                i = oadm[k, 0]
                seq = R[i, K_SEQ]
                _blocks_out(obl, oblids, oc, i, st, seq, 0, st.seq_len[seq] if seq >= 0 else 0)
    for k in range(n_run_sched):
        i = osched[k, 0]
        nb = R[i, K_NEWB]
        if nb > 0:
            seq = R[i, K_SEQ]
            m = st.seq_len[seq]
            _blocks_out(obl, oblids, oc, i, st, seq, m - nb, m)
        R[i, K_NEWB] = 0
    for k in range(oc[O_SCHED]):  # vLLM _update_after_schedule
        i = osched[k, 0]
        R[i, K_NCOMP] += osched[k, 1]


@njit(cache=True, _nrt=False)
def _blocks_out(obl, oblids, oc, i, st, seq, lo, hi):
    k = oc[O_BL]
    obl[k, 0] = i
    obl[k, 1] = hi - lo
    oc[O_BL] = k + 1
    m = oc[O_BLIDS]
    if m + hi - lo > oblids.shape[0]:
        raise ValueError("vllm_step: block id buffer full")
    for j in range(lo, hi):
        oblids[m] = st.tables[seq, j]
        m += 1
    oc[O_BLIDS] = m


@njit(cache=True, _nrt=False)
def update_from_output(ip, R, hh, sv, run, st, pol, view, osched, ofin, oev, oc):
    """vLLM ``update_from_output``, fake runner: a chunk that reached its known tokens
    samples one + its accepted drafts (:mod:`kvsim.engine.vllm_spec`); finished ones leave."""
    nfin0 = oc[O_FIN]
    for k in range(oc[O_SCHED]):
        i = osched[k, 0]
        R[i, K_SCHED] = 0
        if R[i, K_STATUS] != RUNNING or R[i, K_NCOMP] < R[i, K_PLEN] + R[i, K_NOUT]:
            continue
        s = R[i, K_SSPEC]  # rejected drafts roll num_computed back; their blocks stay
        a = (accepted_drafts(ip[P_SEED], R[i, K_ID], R[i, K_NOUT], s, R[i, K_ACCEPT])
             if s > 0 else 0)
        R[i, K_NCOMP] -= s - a
        R[i, K_NOUT] = min(R[i, K_NOUT] + 1 + a, R[i, K_OLEN]) if s > 0 else R[i, K_NOUT] + 1
        R[i, K_SPEC] = R[i, K_SPECK]
        if R[i, K_SPECK] > 0:  # vLLM caches the verified blocks now (as far as hh goes)
            _cache_blocks(ip, R, hh, i, min(R[i, K_NCOMP], R[i, K_PLEN] + R[i, K_OLEN] - 1),
                          st, pol, view, oev, oc)
        if R[i, K_NOUT] >= R[i, K_OLEN] or R[i, K_PLEN] + R[i, K_NOUT] >= ip[P_MAXLEN]:
            R[i, K_STATUS] = FINISHED
            release(R, i, st, pol, view)
            f = oc[O_FIN]
            ofin[f] = i
            oc[O_FIN] = f + 1
    if oc[O_FIN] > nfin0:
        m = 0
        for k in range(sv[V_NRUN]):
            i = run[k]
            if R[i, K_STATUS] != FINISHED:
                run[m] = i
                m += 1
        sv[V_NRUN] = m


@njit(cache=True, _nrt=False)
def add_request(ip, R, arr, sv, wq, heap, i):
    R[i, K_STATUS] = WAITING
    push_waiting(ip, R, arr, sv, wq, heap, i, np.bool_(False))
