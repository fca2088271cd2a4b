"""The compiled replay loop: event rows in, tier state, metrics and decisions out.

:func:`run` consumes one batch of event rows (numpy columns, see ``COLS``) and keeps all its
state in the arrays it is given, so the driver (:mod:`kvsim.replay.driver`) can stream a trace
batch by batch.  It returns ``(status, row)``: ``ST_DONE`` when the batch is consumed, or a
``ST_NEED_*`` code *before* processing ``row`` when a buffer must be grown or flushed (the
driver does that and calls again from ``row``).

The rules it implements are written out in docs/simulate.md and docs/cost-model.md; in
short:

* HBM is :mod:`kvsim.memory.fast` (vLLM v1 prefix caching, exact), ordered by the HBM
  policy's hooks.  A request's prompt ALLOCATE rows are gathered and placed at once: the
  HBM prefix hit (vLLM rules), then the chain continued in DRAM, CXL, NVMe (promoted:
  latency + bytes / slowest hop, hidden behind the request's queueing time when
  ``prefetch_ok``), then computed.  Hits save their ``recompute_cost_us`` from the
  request's PREFILL steps.
* A cached HBM block evicted by the policy is demoted (write_back, no lower copy yet) or
  dropped; lower tiers cascade their own victims downwards.
* No room in HBM even after evicting every candidate: preemption (recompute or swap) of the
  last running request (or the lowest ``request_priority``), never the requester.
* A running request's blocks are held, so an ACCESS row is O(1) (DESIGN.md §1).

Policies are values, not code: the HBM policy arrives as ``pst = (state, hooks)`` and each
lower tier's as ``T.L_ps`` (:mod:`kvsim.policy.hooks`: hooks are numba first-class
functions), so this module is compiled ONCE for every policy and cached on disk by numba.

The same source runs interpreted (plain-Python policies): :func:`kvsim.replay.variants.interpreted`
re-executes this module with ``njit`` as the identity.
"""

from __future__ import annotations

import numpy as np

from kvsim.core.layout import (
    AI_DEADLINE,
    AI_FULL_HASH,
    AI_HASH,
    AI_NEXT,
    AI_OFF_SEEN,
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
    C_ALLOC_ORD,
    C_ARENA_NEED,
    C_ARENA_TOP,
    C_CLOCK_US,
    C_HBM_USED,
    C_IN_STEP,
    C_MAX_BT,
    C_NLOG,
    C_NPEND,
    C_NRUN,
    C_NSTEP_BUF,
    C_PEND_ADMIT,
    C_STEP,
    C_STEP_DUR_US,
    C_STEP_EXTRA_US,
    C_STEP_SAVED_US,
    C_STEP_STALL_US,
    C_STEP_START_US,
    C_WARM_DONE,
    C_WARM_US,
    HI_BI,
    HI_HITS,
    HI_OWNER,
    HI_TOKENS,
    K_BLOCK_TOKENS,
    K_LOG,
    K_LOG_LIFECYCLE,
    K_OFFLINE,
    K_PREFETCH,
    K_PRIO_SCHED,
    K_WARMUP_STEP,
    M_COW_COPIES,
    RF_ADMIT_US,
    RF_CREDIT_RATE,
    RF_CREDIT_US,
    RF_PF_BUDGET_US,
    RI_ADMIT_STEP,
    RI_ARRIVE_US,
    RI_BOUND,
    RI_BT_CAP,
    RI_BT_LEN,
    RI_BT_START,
    RI_FT_PENDING,
    RI_HIT_TOK,
    RI_LATMASK,
    RI_NOUT,
    RI_OFF_NEXT,
    RI_PHASE,
    RI_PREEMPTS,
    RI_PREFILLED,
    RI_PRIO,
    RI_PROMPT,
    RI_SEQ,
    RI_STATE,
    RI_TENANT,
    RI_TTFT_DL,
    RS_DONE,
    RS_PREEMPTED,
    RS_RUNNING,
    RS_WAITING,
)
from kvsim.jit.decorators import njit
from kvsim.memory import fast as mem
from kvsim.memory import pool_ops as ops
from kvsim.replay.kernel import spill as lower
from kvsim.replay.kernel import tiers as tr
from kvsim.replay.kernel.bookkeeping import (
    _finalize_step,
    _grow_records,
    _peak,
    _pick_victim,
    _resumed_token,
    _run_add,
    _run_remove,
    _set_view_from_record,
)
from kvsim.replay.kernel.placement import (
    A_ALLOCATE,
    A_FREE,
    A_RELEASE,
    MODE_ADMIT,
    MODE_APPEND,
    MODE_RERUN,
    W_COW,
    W_FREE,
    W_RELEASE,
    _fill_at_finish,
    _fill_last,
    _place,
    _preempt,
    _release_all,
    _reset_cache,
)

#: Column order of the ``cols`` tuple :func:`run` takes (names of kvsim.core.schema.COLUMNS).
COLS = ("step", "time_us", "kind", "request_id", "block_index", "content_hash",
        "parent_request_id", "num_tokens", "duration_us", "phase", "priority",
        "request_priority", "deadline_us", "slack_us", "recompute_cost_us",
        "target_decode_step", "pin_requested", "prefetch_ok", "size_bytes", "tenant")

ST_DONE = 0
ST_NEED_REQ = 1
ST_NEED_ARENA = 2
ST_NEED_LOG = 3
ST_NEED_STEP = 4
ST_NEED_PEND = 5

from kvsim.core.codes import (  # noqa: E402
    EK_ACCESS,
    EK_ALLOCATE,
    EK_ARRIVE,
    EK_COMMIT,
    EK_FORK,
    EK_FREE,
    EK_INTENT,
    EK_STEP,
    FREE_PREEMPT_BLOCK,
    FREE_RESET_CACHE,
    PH_DECODE,
    PH_PREFILL,
    PH_VERIFY,
    PR_DECODE_CRITICAL,
)

#: The replay's own reasons (column ``why`` of the log buffer; -1 = the policy's reason),
#: indexed by the ``W_*`` codes of :mod:`kvsim.replay.kernel.placement`.
WHY = (
    "needed at admission; resident only in a lower tier, fetched on demand (the request "
    "stalled for it)",
    "needed at admission; fetched while the request queued, transfer hidden behind its "
    "queueing time",
    "needed at admission and seen before, but resident in no tier: its tokens are computed "
    "again",
    "the request was preempted and dropped this block: its tokens are computed again",
    "write_through: copied to the host tier on first use (SGLang HiCache)",
    "write_through_selective: copied to the host tier on its second use (SGLang HiCache)",
    "HBM full and no cached block to evict: preempted the last running request (vLLM v1)",
    "HBM full and no cached block to evict: preempted the lowest-priority running request "
    "(vLLM v1 priority scheduling)",
    "the preempted request resumed: its swapped-out block is swapped back in",
    "new block allocated in HBM",
    "prefix-cache hit on a block another request holds",
    "the last holder finished: the block stays cached as an eviction candidate",
    "prefix-cache hit on a cached block: revived",
    "released with no content identity: the slot is empty again",
    "the preempted request resumed: block found in a lower tier, fetched",
    "evicted from HBM; a copy is already in a lower tier, nothing written",
    "copy-on-write: a shared partial block was copied before a write",
)
assert len(WHY) == W_COW + 1

NEVER = np.iinfo(np.int64).max

#: Room for a request's decode blocks in its block records at admission: 1/8 of its prompt
#: blocks beyond them (and 2 more).  A request that outgrows its records has them copied to
#: the arena top with twice the room (bookkeeping._grow_records).  With room for the prompt
#: only, 10,770 of the 12,031 requests of the Mooncake 16-token import outgrew it (their
#: output: 23 blocks at the median, 70 at the 99th percentile), copying 8.05 M records and
#: taking 25.2 M arena rows (131 compactions); with 1/8 more, 2,579 copy 0.32 M and the
#: arena takes 10.8 M rows (docs/benchmarks.md, "The 16-token replay's per-block
#: calls").  Positions in the arena reach no output.
OUTPUT_ROOM_DIV = 8


@njit(cache=True, inline="always")
def admit_records(prompt_blocks):
    """Block records a request is given at admission (see OUTPUT_ROOM_DIV)."""
    return max(4, prompt_blocks + 2 + prompt_blocks // OUTPUT_ROOM_DIV)

# ---------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------

@njit(cache=True, nogil=True, _nrt=False)  # C-callable: closed_step.advance calls it as a value
def run(cols, i0, n, cr):
    """Replay rows ``i0 .. n-1`` of one batch on the core's state ``cr`` (a
    :class:`kvsim.replay.kernel.core_ref.CoreRef`; interpreted, its :class:`CoreState`).  Returns
    ``(status, row)``.

    ``i0 < 0``: end of trace instead (place a gathered admission, close the last step;
    ``cols`` is any batch of the trace, only its types matter).  One entry point rather
    than a second jitted ``finish``: that one re-optimised and re-linked all of
    :func:`_place` (~9 CPU-s of every policy's compile)."""
    # the members this loop uses, read once (borrowed: this function and every one it
    # calls are compiled _nrt=False, core_ref.py; the driver replaces a grown buffer
    # between calls, never during one)
    K = cr.K
    C = cr.C
    Cw = cr.Cw
    R_i = cr.R_i
    R_f = cr.R_f
    A_i = cr.A_i
    A_f = cr.A_f
    H_i = cr.H_i
    st = cr.st
    out = cr.out
    pst = cr.pst
    view = cr.H_view
    G = cr.G
    S = cr.S
    P = cr.P
    running = cr.running
    next_use = cr.next_use
    seen = cr.seen
    if i0 < 0:
        pa = int(C[C_PEND_ADMIT])
        if pa >= 0:
            C[C_PEND_ADMIT] = -1
            _place(pa, np.int64(0), R_i[pa, RI_BT_LEN], np.int64(MODE_ADMIT), cr)
        if C[C_IN_STEP] != 0:
            _finalize_step(C, R_i, R_f, S, P, st.sc)
            C[C_IN_STEP] = 0
        return ST_DONE, n
    (c_step, c_time, c_kind, c_req, c_bi, c_hash, c_parent, c_ntok, c_dur, c_phase, c_prio,
     c_rprio, c_dl, c_slack, c_rcost, c_tds, c_pin, c_pfok, c_size, c_tenant) = cols
    log_on = K[K_LOG] != 0
    i = i0
    while i < n:
        kind = c_kind[i]
        r = c_req[i]
        p = c_parent[i]
        # --- room checks (before touching any state for this row) ----------------------
        if r >= R_i.shape[0] or p >= R_i.shape[0]:
            return ST_NEED_REQ, i
        if C[C_NSTEP_BUF] >= S.shape[0]:
            return ST_NEED_STEP, i
        if C[C_NPEND] >= P.shape[0] or C[C_NRUN] >= running.shape[0] - 1:
            return ST_NEED_PEND, i
        if log_on and C[C_NLOG] + 16 * C[C_MAX_BT] + 4096 > G[0].shape[0]:
            return ST_NEED_LOG, i
        need = 16
        if r >= 0:
            need += 2 * R_i[r, RI_BT_CAP] + 8
            if R_i[r, RI_STATE] != RS_RUNNING and R_i[r, RI_STATE] != RS_PREEMPTED:
                # this row may admit r: its records take admit_records(prompt // B) rows
                need += admit_records(R_i[r, RI_PROMPT] // K[K_BLOCK_TOKENS])
        if p >= 0:
            need += 2 * R_i[p, RI_BT_LEN] + 8
        if C[C_ARENA_TOP] + need > A_i.shape[0]:
            C[C_ARENA_NEED] = need
            return ST_NEED_ARENA, i
        # --- a gathered admission is placed once its ALLOCATE rows end -----------------
        pa = int(C[C_PEND_ADMIT])
        if pa >= 0 and not (kind == EK_ALLOCATE and r == pa):
            C[C_PEND_ADMIT] = -1
            _place(pa, np.int64(0), R_i[pa, RI_BT_LEN], np.int64(MODE_ADMIT), cr)
            R_i[pa, RI_PHASE] = 1
            continue  # re-check room: placing may have logged rows
        now_us = C[C_STEP_START_US]
        step = int(C[C_STEP])
        if kind == EK_STEP:
            if C[C_IN_STEP] != 0:
                _finalize_step(C, R_i, R_f, S, P, st.sc)
            C[C_IN_STEP] = 1
            C[C_STEP] = c_step[i]
            C[C_STEP_START_US] = max(float(c_time[i]), C[C_CLOCK_US])
            C[C_STEP_DUR_US] = c_dur[i]
            C[C_STEP_SAVED_US] = 0.0
            C[C_STEP_STALL_US] = 0.0
            C[C_STEP_EXTRA_US] = 0.0
            if K[K_WARMUP_STEP] >= 0 and C[C_WARM_DONE] == 0 and c_step[i] >= K[K_WARMUP_STEP]:
                for j in range(C.shape[0]):  # not Cw[:] = C[:]: see the note above
                    Cw[j] = C[j]
                C[C_WARM_DONE] = 1
                C[C_WARM_US] = C[C_STEP_START_US]
        elif kind == EK_ARRIVE:
            R_i[r, RI_STATE] = RS_WAITING
            R_i[r, RI_PROMPT] = c_ntok[i]
            R_i[r, RI_ARRIVE_US] = c_time[i]
            R_i[r, RI_PRIO] = c_rprio[i]
            R_i[r, RI_TTFT_DL] = c_dl[i]
            R_i[r, RI_TENANT] = c_tenant[i]
            if c_dl[i] >= 0 or c_prio[i] == PR_DECODE_CRITICAL:
                R_i[r, RI_BOUND] = 1
        elif kind == EK_ALLOCATE or kind == EK_ACCESS or kind == EK_FORK:
            state = R_i[r, RI_STATE]
            if state == RS_PREEMPTED:  # resume: its whole table comes back first
                R_i[r, RI_STATE] = RS_RUNNING
                _run_add(running, C, r)
                R_i[r, RI_LATMASK] = 0
                _place(r, np.int64(0), R_i[r, RI_BT_LEN], np.int64(MODE_RERUN), cr)
                state = RS_RUNNING
            if state != RS_RUNNING:  # admission starts
                seq = mem.seq_open(st, 0)
                if seq < 0:
                    raise ValueError("HBM pool: no free seq slot (raise max_seqs)")
                R_i[r, RI_SEQ] = seq
                if R_i[r, RI_PREEMPTS] > 0:  # re-admitted after a scheduler preemption
                    st.seq_rerun[seq] = True
                R_i[r, RI_STATE] = RS_RUNNING
                R_i[r, RI_PHASE] = 0
                R_i[r, RI_ADMIT_STEP] = step
                R_i[r, RI_OFF_NEXT] = 0  # vLLM offers every block again after (re)admission
                R_i[r, RI_LATMASK] = 0
                R_f[r, RF_ADMIT_US] = now_us
                if state == 0:  # no ARRIVE row: arrival = admission
                    R_i[r, RI_ARRIVE_US] = int(now_us)
                wait = now_us - R_i[r, RI_ARRIVE_US]
                R_f[r, RF_PF_BUDGET_US] = wait if (K[K_PREFETCH] != 0 and wait > 0) else 0.0
                _run_add(running, C, r)
                cap = admit_records(R_i[r, RI_PROMPT] // K[K_BLOCK_TOKENS])
                R_i[r, RI_BT_START] = int(C[C_ARENA_TOP])
                R_i[r, RI_BT_LEN] = 0
                R_i[r, RI_BT_CAP] = cap
                C[C_ARENA_TOP] += cap
                if kind == EK_FORK:
                    R_i[r, RI_PHASE] = 2
                else:
                    R_i[r, RI_PHASE] = 0
            if kind == EK_ALLOCATE:
                bi = c_bi[i]
                e = R_i[r, RI_BT_LEN]
                gather = R_i[r, RI_PHASE] == 0 and bi >= e  # a prompt block at admission
                cow = not gather and bi < e  # a write into an existing (shared) block
                if not gather and not cow:  # appended after admission: e - 1 is full now
                    _fill_last(r, e, cr, step, now_us)
                # the row's block record, written out here on the unpacked columns (a
                # call passing the 20-column batch cost 27 counted arguments per ALLOCATE
                # row; docs/benchmarks.md)
                if e == R_i[r, RI_BT_CAP]:
                    _grow_records(r, R_i, A_i, A_f, C)
                a = R_i[r, RI_BT_START] + (bi if bi < e else e)
                if bi >= e:
                    R_i[r, RI_BT_LEN] = e + 1
                    A_i[a, AI_OFF_SEEN] = 0
                ntok = c_ntok[i]
                A_i[a, AI_HASH] = c_hash[i] if ntok == K[K_BLOCK_TOKENS] else 0
                A_i[a, AI_FULL_HASH] = c_hash[i]
                A_i[a, AI_SIZE] = c_size[i]
                A_i[a, AI_TOKENS] = ntok
                A_i[a, AI_PHASE] = c_phase[i]
                A_i[a, AI_PRIO] = c_prio[i]
                A_i[a, AI_RPRIO] = c_rprio[i]
                A_i[a, AI_DEADLINE] = c_dl[i]
                A_i[a, AI_SLACK] = c_slack[i]
                A_i[a, AI_TDS] = c_tds[i]
                A_i[a, AI_PIN] = c_pin[i]
                A_i[a, AI_PFOK] = c_pfok[i]
                o = int(C[C_ALLOC_ORD])
                A_i[a, AI_SEEN] = seen[o] if o < seen.shape[0] else 0
                A_i[a, AI_NEXT] = next_use[o] if (K[K_OFFLINE] != 0
                                                  and o < next_use.shape[0]) else NEVER
                A_f[a] = c_rcost[i]
                C[C_ALLOC_ORD] = o + 1
                if R_i[r, RI_BT_LEN] > C[C_MAX_BT]:
                    C[C_MAX_BT] = R_i[r, RI_BT_LEN]
                if c_prio[i] == PR_DECODE_CRITICAL:
                    R_i[r, RI_BOUND] = 1
                if gather:
                    C[C_PEND_ADMIT] = r  # gathered; placed when its rows end
                elif cow:
                    seq = R_i[r, RI_SEQ]
                    if bi == st.seq_len[seq] - 1:
                        res = ops.write_last(st, pst, view, seq, now_us,
                                                  out)
                        while res < 0:
                            v = _pick_victim(running, C, R_i, r, K[K_PRIO_SCHED] != 0)
                            if v < 0:
                                break
                            _preempt(v, cr, step, now_us)
                            res = ops.write_last(st, pst, view, seq,
                                                      now_us, out)
                        if res == 1:
                            b = out.blocks[0]
                            lower._hbm_evicted_range(np.int64(0), np.int64(1), r, cr,
                                                     step, now_us)
                            _set_view_from_record(view, b, A_i, A_f, a, now_us)
                            view.content_hash[b] = 0
                            view.insert_us[b] = now_us
                            view.tenant[b] = R_i[r, RI_TENANT]
                            H_i[b, HI_OWNER] = r
                            H_i[b, HI_BI] = bi
                            H_i[b, HI_TOKENS] = c_ntok[i]
                            H_i[b, HI_HITS] = 0
                            C[M_COW_COPIES] += 1
                            C[C_HBM_USED] = st.sc[mem.S_N_HELD]
                            _peak(C, 0, C[C_HBM_USED])  # the copy is one more held block
                            if log_on:
                                tr.log_row(G, C, step, now_us, A_ALLOCATE, 0, r, bi, 0,
                                           0, c_size[i], 0.0, False, -1, W_COW)
                else:
                    _place(r, e, np.int64(1), np.int64(MODE_APPEND), cr)
            elif kind == EK_FORK:
                # child r shares every block of parent p (copy-on-write)
                if p >= 0 and R_i[p, RI_STATE] == RS_RUNNING and R_i[r, RI_BT_LEN] == 0:
                    mem.pool_fork(st, R_i[p, RI_SEQ], R_i[r, RI_SEQ])
                    ps = R_i[p, RI_BT_START]
                    top = int(C[C_ARENA_TOP])
                    m = R_i[p, RI_BT_LEN]
                    cap = max(4, 2 * m)
                    for e in range(m):
                        for c in range(A_i.shape[1]):
                            A_i[top + e, c] = A_i[ps + e, c]
                        A_f[top + e] = A_f[ps + e]
                    R_i[r, RI_BT_START] = top
                    R_i[r, RI_BT_LEN] = m
                    R_i[r, RI_BT_CAP] = cap
                    C[C_ARENA_TOP] = top + cap
                    R_i[r, RI_PROMPT] = R_i[p, RI_PROMPT]
                    R_i[r, RI_PREFILLED] = R_i[p, RI_PREFILLED]
                    R_i[r, RI_BOUND] = R_i[p, RI_BOUND]
                    R_i[r, RI_PHASE] = 2
            else:  # ACCESS: O(1), every block of a running request is held in HBM
                if R_i[r, RI_PHASE] < 2:
                    R_i[r, RI_PHASE] = 2
                    hit = R_i[r, RI_HIT_TOK] + R_i[r, RI_HIT_TOK + 1] + \
                        R_i[r, RI_HIT_TOK + 2] + R_i[r, RI_HIT_TOK + 3]
                    R_f[r, RF_CREDIT_RATE] = R_f[r, RF_CREDIT_US] / hit if hit > 0 else 0.0
                ph = c_phase[i]
                pk = 0
                if ph == PH_PREFILL:
                    credit = R_f[r, RF_CREDIT_US]
                    if credit > 0.0:
                        s = min(credit, c_ntok[i] * R_f[r, RF_CREDIT_RATE])
                        C[C_STEP_SAVED_US] += s
                        R_f[r, RF_CREDIT_US] = credit - s
                    R_i[r, RI_PREFILLED] += c_ntok[i]
                    if R_i[r, RI_PREFILLED] >= R_i[r, RI_PROMPT] and R_i[r, RI_NOUT] == 0 \
                            and R_i[r, RI_FT_PENDING] == 0:
                        pk = 1
                    elif _resumed_token(R_i, r, c_ntok[i]):
                        pk = 3
                elif ph == PH_DECODE or ph == PH_VERIFY:
                    if c_dl[i] >= 0:
                        R_i[r, RI_BOUND] = 1
                    if R_i[r, RI_NOUT] == 0 and R_i[r, RI_FT_PENDING] == 0:
                        pk = 1
                    elif R_i[r, RI_FT_PENDING] == 0:
                        pk = 2
                if pk != 0:
                    k = int(C[C_NPEND])
                    P[k, 0] = r
                    P[k, 1] = 2 if pk == 3 else pk
                    P[k, 2] = -1 if pk == 3 else c_dl[i]
                    C[C_NPEND] = k + 1
                    if pk == 1:
                        R_i[r, RI_FT_PENDING] = 1
        elif kind == EK_INTENT or kind == EK_COMMIT:
            if R_i[r, RI_STATE] == RS_RUNNING or R_i[r, RI_STATE] == RS_PREEMPTED:
                seq = R_i[r, RI_SEQ]
                running_now = R_i[r, RI_STATE] == RS_RUNNING
                start = R_i[r, RI_BT_START]
                if c_bi[i] < 0:
                    lo = 0
                    hi_e = R_i[r, RI_BT_LEN]
                else:
                    lo = c_bi[i]
                    hi_e = min(c_bi[i] + 1, R_i[r, RI_BT_LEN])
                # the intent on each block's record and, if held, its view: written out on
                # the unpacked columns (a call passing the 20-column batch per block cost
                # 22 counted arguments, up to 18.5 M times on the Mooncake 16-token import)
                ph, pr, rp, dl, sl = c_phase[i], c_prio[i], c_rprio[i], c_dl[i], c_slack[i]
                tds, pin = c_tds[i], c_pin[i]
                pinned = pin or pr == PR_DECODE_CRITICAL
                # the view's fields and the table bound once per row, not per block (each
                # member read in the loop was a counted reference per block)
                held = st.seq_len[seq] if running_now else 0
                tab = st.tables
                v_ph, v_pr, v_rp = view.phase, view.priority, view.request_priority
                v_dl, v_sl, v_tds, v_pin = (view.deadline_us, view.slack_us,
                                            view.target_decode_step, view.pinned)
                for e in range(lo, hi_e):
                    a = start + e
                    A_i[a, AI_PHASE] = ph
                    A_i[a, AI_PRIO] = pr
                    A_i[a, AI_RPRIO] = rp
                    A_i[a, AI_DEADLINE] = dl
                    A_i[a, AI_SLACK] = sl
                    A_i[a, AI_TDS] = tds
                    A_i[a, AI_PIN] = pin
                    b = tab[seq, e] if e < held else 0
                    if b > 0:
                        v_ph[b] = ph
                        v_pr[b] = pr
                        v_rp[b] = rp
                        v_dl[b] = dl
                        v_sl[b] = sl
                        v_tds[b] = tds
                        v_pin[b] = pinned
                if c_prio[i] == PR_DECODE_CRITICAL:
                    R_i[r, RI_BOUND] = 1
        elif kind == EK_FREE:
            state = R_i[r, RI_STATE]
            if c_bi[i] == FREE_RESET_CACHE:  # vLLM's reset_prefix_cache() (no request)
                _reset_cache(cr, now_us)
            elif c_bi[i] == FREE_PREEMPT_BLOCK:  # the scheduler preempts r (recompute)
                if state == RS_RUNNING:
                    _preempt(r, cr, step, now_us)
                    mem.seq_close(st, R_i[r, RI_SEQ])
                    R_i[r, RI_SEQ] = -1
                    R_i[r, RI_STATE] = RS_WAITING  # re-admitted by its next ALLOCATE rows
                    R_i[r, RI_BT_LEN] = 0
                    R_i[r, RI_PREFILLED] = 0
                    R_i[r, RI_PHASE] = 0
            elif c_bi[i] < 0:  # the request is done
                if state == RS_RUNNING:
                    _fill_at_finish(r, cr, step, now_us)  # a last block full at finish
                    _release_all(r, cr, step, now_us)
                    _run_remove(running, C, r)
                if state == RS_RUNNING or state == RS_PREEMPTED:
                    mem.seq_close(st, R_i[r, RI_SEQ])
                    R_i[r, RI_SEQ] = -1
                R_i[r, RI_STATE] = RS_DONE
            elif state == RS_RUNNING or state == RS_PREEMPTED:  # one block (draft rollback)
                seq = R_i[r, RI_SEQ]
                if c_bi[i] == R_i[r, RI_BT_LEN] - 1:
                    if state == RS_RUNNING and st.seq_len[seq] == R_i[r, RI_BT_LEN]:
                        b = st.tables[seq, c_bi[i]]
                        view.last_access_us[b] = now_us
                        ops.free_tail(st, pst, view, seq, np.int64(1), now_us)
                        C[C_HBM_USED] = st.sc[mem.S_N_HELD]
                        if log_on and K[K_LOG_LIFECYCLE] != 0 and st.ref_cnt[b] == 0:
                            cached = st.in_cand[b]
                            tr.log_row(G, C, step, now_us, A_RELEASE if cached else A_FREE,
                                       view.content_hash[b] if cached else 0, r, c_bi[i],
                                       0, 0, 0, 0.0, False, -1,
                                       W_RELEASE if cached else W_FREE)
                    R_i[r, RI_BT_LEN] -= 1
        i += 1
    return ST_DONE, n
