"""The compiled step loop of the lowering: continuous batching that emits event rows.

:func:`run_steps` advances a vLLM-v1-like scheduler (docs/importers.md "Engine model") step
by step and appends MemoryIntent rows to two column-major buffers (``I``: 14 integer
columns, ``F``: 2 float columns; indices ``C_*`` / ``F_*``).  It returns at a step
boundary once ``flush_rows`` rows are buffered, so the caller streams them to the event
writer and calls again: memory grows with the running batch, never with the trace.

Per step, in this order (schema.py "Ordering inside a step"):

1. ``STEP`` (patched with ``num_tokens`` and ``duration_us`` once the batch is known);
2. ``ARRIVE`` of requests with ``arrival_us <= now``, then of forks created this step;
3. running decode sequences, in running order: ``FORK`` (first step of a fork), a
   request-level ``INTENT`` (first decode step), after a fork an ``ALLOCATE`` at the index of
   the shared partial last block when the sequence's first write lands in it (the replay
   copies it on write), decode ``ALLOCATE`` (a block is allocated
   in the step whose token starts it; speculative: DRAFT blocks for the k draft
   positions), ``ACCESS``; speculative steps then ``COMMIT`` the accepted draft blocks and
   ``FREE`` (block-level, tail first) the rejected ones;
4. running sequences still in (chunked) prefill: ``ACCESS`` of the next chunk;
5. admissions (FIFO, while fewer than ``max_num_seqs`` run, budget is left and the
   head's new prompt blocks fit the KV block budget): all prompt blocks ``ALLOCATE``d in
   block order, then the first chunk's ``ACCESS``;
6. finished or pruned sequences: request-level ``INTENT`` (post-finish intent), block-level
   ``INTENT`` for known-shared prefix blocks, request-level ``FREE``.

KV block budget (``num_gpu_blocks``, docs/importers.md "Engine model").  ``st[S_HELD]``
counts the blocks held by running sequences as the replay's pool (vLLM prefix caching)
holds them: a FULL, hashed prompt block is held once however many running sequences
reference it (refcount per content hash in the open-addressing table ``rk``/``rv``); every
other block (partial, unhashed, decode, draft, a fork's inherited copy) counts once per
sequence (``priv``).  A sequence's keyed blocks are a prefix of its prompt (``nkey``), so
releasing it re-derives their hashes instead of storing them.  Admission stops at the
first request whose new blocks do not fit ``num_gpu_blocks - held - watermark``
(head-of-line, vLLM FCFS); a decode that needs a block when none is free skips the step
(it waits; the schema has no clean way to express a lowering-side preemption).  When no
running sequence can advance and nothing can be admitted (every sequence waits for a
block), the oldest waiting decode is forced over the budget (``S_FORCED``) so the loop
never deadlocks; the replay then preempts, as vLLM would have.

Sequence slots: ``0..N-1`` are the Request-table rows (request id = row); forks (n > 1,
beams) take slots from ``N`` upward in creation order.  Clock: a step starts at ``now``
and lasts its step time (:func:`kvsim.engine.timing.step_time.step_duration_us`:
the roofline or the measured tables); when nothing runs or waits, ``now`` jumps to the next arrival.
"""

from __future__ import annotations

import numpy as np

# step durations and prefill costs (roofline or measured, chosen by fp)
from kvsim.engine.timing.step_time import (
    NUM_ACC,
    acc_chunk,
    acc_decode,
    acc_reset,
    prefill_cost_us,
    step_duration_us,
)
from kvsim.ingest.hashing import chain_hash, root_hash
from kvsim.jit.decorators import helper, njit

# integer columns of I (rows are I[:, r])
C_STEP, C_TIME, C_KIND, C_RID, C_BIDX, C_HASH, C_PARENT, C_NTOK = 0, 1, 2, 3, 4, 5, 6, 7
C_PHASE, C_PRIO, C_DEADLINE, C_SLACK, C_TARGET, C_PIN = 8, 9, 10, 11, 12, 13
NUM_INT_COLUMNS = 14
INT_COLUMN_NAMES = ("step", "time_us", "kind", "request_id", "block_index", "content_hash",
                    "parent_request_id", "num_tokens", "phase", "priority", "deadline_us",
                    "slack_us", "target_decode_step", "pin_requested")
# float columns of F
F_DUR, F_RC = 0, 1
FLOAT_COLUMN_NAMES = ("duration_us", "recompute_cost_us")

# integer parameters (ip)
# P_VLLM: the closed loop's steps are vLLM's scheduler's (kvsim.engine.vllm_rows), not run_steps
(P_B, P_T, P_MAXSEQ, P_MAXTOK, P_FLUSH, P_CRITPRIO, P_CRITTPOT, P_BEAMINT, P_SEED, P_N,
 P_NGPU, P_WMARK, P_CLOSED, P_PRIOSCHED, P_VLLM) = range(15)
NUM_INT_PARAMS = 15
# float parameters (fp): see StepCostModel.as_array; fp[7] is the timing model's kind and
# fp[8:] its tables (kvsim.engine.timing.step_time.Q_KIND, T0)
Q_OVER, Q_WBYTES, Q_KVBPT, Q_BW, Q_FLOPS, Q_ACTIVE, Q_LH = range(7)
# loop state (st): step, arrive pointer, admit pointer, running count, next free slot,
# finished table requests, all done flag; KV accounting: held blocks, peak held, peak
# running sequences, decode sequence-steps skipped for lack of a block, steps whose
# admission stopped for lack of blocks, forced over-budget decodes, the request whose
# prompt hashes are in the head buffer; clock in stf[0]
(S_STEP, S_ARRIVE, S_ADMIT, S_NRUN, S_NEXTSLOT, S_DONE, S_FINISHED, S_HELD, S_MAXHELD,
 S_MAXRUN, S_STALLS, S_BLOCKED, S_FORCED, S_HEADC, S_QN, S_NADM, S_HIT_TOK) = range(17)
NUM_STATE = 17

# enum values as compile-time constants (kvsim.core.codes)
from kvsim.core.codes import (  # noqa: E402
    EK_ACCESS,
    EK_ALLOCATE,
    EK_ARRIVE,
    EK_COMMIT,
    EK_FORK,
    EK_FREE,
    EK_INTENT,
    EK_STEP,
    PH_DECODE,
    PH_DONE,
    PH_DRAFT,
    PH_IDLE,
    PH_PREFILL,
    PH_ROLLBACK,
    PH_VERIFY,
    PR_COLD,
    PR_DECODE_CRITICAL,
    PR_HOT,
    PR_WARM,
)

# slot status
ST_WAIT, ST_RUN, ST_DONE, ST_PRUNED = 0, 1, 2, 3


@njit(cache=True)
def _ensure(I, F, n, need):
    """Buffers with room for ``need`` more rows after ``n`` (doubling).  The copy is an
    element loop: a slice assignment (``I2[:, :n] = I[:, :n]``) pulls in numba's
    shape-mismatch error message (string formatting, ~1,500 LLVM instructions linked into
    every caller; kvsim.replay.kernel.placement's note)."""
    cap = I.shape[1]
    if n + need <= cap:
        return I, F
    new_cap = max(2 * cap, n + need + 1024)
    I2 = np.empty((I.shape[0], new_cap), dtype=np.int64)
    F2 = np.empty((F.shape[0], new_cap), dtype=np.float64)
    for k in range(I.shape[0]):
        for j in range(n):
            I2[k, j] = I[k, j]
    for k in range(F.shape[0]):
        for j in range(n):
            F2[k, j] = F[k, j]
    return I2, F2


# _ensure and _row are called from compiled code only: no CPython or C wrapper to build;
# _row with constant codes at most of its call sites, so typed once (kvsim.jit.decorators)
@helper(_nrt=False)
def _row(I, F, n, step, t, kind, rid, bidx, h, parent, ntok, phase, prio, deadline, slack,
         target, pin, rc):
    I[C_STEP, n] = step
    I[C_TIME, n] = t
    I[C_KIND, n] = kind
    I[C_RID, n] = rid
    I[C_BIDX, n] = bidx
    I[C_HASH, n] = h
    I[C_PARENT, n] = parent
    I[C_NTOK, n] = ntok
    I[C_PHASE, n] = phase
    I[C_PRIO, n] = prio
    I[C_DEADLINE, n] = deadline
    I[C_SLACK, n] = slack
    I[C_TARGET, n] = target
    I[C_PIN, n] = pin
    F[F_DUR, n] = 0.0
    F[F_RC, n] = rc
    return n + 1


@njit(cache=True, inline="always")
def _prefill_us(fp, start, m):
    """Compute time of m prefill tokens at positions [start, start+m): the timing model's
    (kvsim.engine.timing.step_time.prefill_cost_us; the roofline's is engine_model's)."""
    return prefill_cost_us(fp, start, m)


from kvsim.engine import scheduler_blocks as _sb  # noqa: E402
from kvsim.engine.scheduler_blocks import (  # noqa: E402
    _acquire,
    _cached_prefix,
    _decode_blocks,
    _load_head,
    _prompt_hashes,
    _release,
    _rslot,
    _token_deadline,
    _uniform,
    _walk,
)

assert (_sb.S_HELD, _sb.S_HEADC) == (S_HELD, S_HEADC)


@njit(cache=True)
def run_steps(ip, fp, st, stf,
              arr, prompt, out, ttft, tpot, nsamp, beam, rprio, cont, gap, shared, spk, spp,
              hashed, off, ids,
              src, par, computed, gen, nblk, lasth, status, first_us, dsteps, forked, blast,
              cow, run, run2, fin, nkey, priv, stall, hb, hb2, rk, rv,
              order, phk, phv, tk, hitk, adm, I, F, n):
    """Run steps until ``n >= flush_rows`` at a step boundary or the trace is done.

    Returns ``(I, F, n)``; ``st[S_FINISHED] == 1`` once every request has finished.

    ``order[:st[S_QN]]``: the table rows this engine serves, in arrival order (the
    lowering: every row; a replica of a cluster: the rows its router sent it, appended
    as they arrive).  ``ip[P_CLOSED]``: closed loop (kvsim.modes.closed.closed_loop): ARRIVE rows
    carry the request's own arrival time, and an admitted request starts with its cached
    prefix computed (:func:`_cached_prefix` on the replay's pool ``phk``/``phv`` and tier
    tables ``t*k``), so only the rest is prefill work of this and later steps; its cached
    tokens go to ``hitk`` and its row to ``adm[:st[S_NADM]]``.  ``ip[P_PRIOSCHED]``:
    waiting requests are admitted by ``request_priority`` (highest first, then arrival).
    """
    B = ip[P_B]
    T = ip[P_T]
    max_seqs = ip[P_MAXSEQ]
    max_tok = ip[P_MAXTOK]
    flush = ip[P_FLUSH]
    N = ip[P_N]
    ngpu = ip[P_NGPU]
    wmark = ip[P_WMARK]
    root = root_hash(0)
    closed = ip[P_CLOSED] != 0
    acc = np.empty(NUM_ACC, dtype=np.float64)  # the step's aggregates for its duration
    while st[S_FINISHED] == 0:
        now = stf[0]
        nrun = st[S_NRUN]
        qn = st[S_QN]
        st[S_NADM] = 0
        if nrun == 0 and st[S_ADMIT] == st[S_ARRIVE]:
            if st[S_ARRIVE] >= qn:
                st[S_FINISHED] = 1
                break
            if arr[order[st[S_ARRIVE]]] > now:
                now = float(arr[order[st[S_ARRIVE]]])
        step = st[S_STEP]
        t_us = np.int64(now)
        # ---- 1. STEP placeholder, 2. arrivals
        a0 = st[S_ARRIVE]
        a1 = a0
        while a1 < qn and arr[order[a1]] <= t_us:
            a1 += 1
        I, F = _ensure(I, F, n, 1 + (a1 - a0))
        step_row = n
        n = _row(I, F, n, step, t_us, EK_STEP, -1, -1, 0, -1, 0, PH_PREFILL, PR_WARM, -1, 0,
                 -1, 0, 0.0)
        for j in range(a0, a1):
            i = order[j]
            dl = arr[i] + ttft[i] if ttft[i] > 0 else -1
            est = _prefill_us(fp, 0, prompt[i]) + ((prompt[i] + max_tok - 1) // max_tok) * fp[Q_OVER]
            sl = dl - np.int64(now + est) if dl >= 0 else 0
            n = _row(I, F, n, step, arr[i] if closed else t_us, EK_ARRIVE, i, -1, 0, -1,
                     prompt[i], PH_PREFILL, PR_WARM, dl, sl, -1, 0, 0.0)
            if ip[P_PRIOSCHED] != 0:  # waiting queue by priority, then arrival (vLLM)
                x = j
                while x > st[S_ADMIT] and rprio[order[x - 1]] < rprio[order[x]]:
                    tmp = order[x - 1]
                    order[x - 1] = order[x]
                    order[x] = tmp
                    x -= 1
        st[S_ARRIVE] = a1
        # ---- KV deadlock check: every running sequence decodes and waits for blocks, and
        # the head cannot be admitted -> force the oldest waiting decode over the budget
        forced = -1
        if nrun > 0:
            free = ngpu - st[S_HELD]
            stuck = True
            first = -1
            for r in range(nrun):
                c = run[r]
                if status[c] != ST_RUN:
                    continue
                q = src[c] if c >= N else c
                if computed[c] < prompt[q]:
                    stuck = False  # a prefill chunk always advances (blocks allocated)
                    break
                need = _decode_blocks(c, q, B, prompt, gen, nblk, spk)
                if c < N and dsteps[c] == 0 and forked[c] == 0:
                    need += ((beam[c] if beam[c] > 1 else nsamp[c]) - 1) * priv[c]
                if need == 0 or need <= free:
                    stuck = False
                    break
                if first < 0:
                    first = c
            if stuck and st[S_ADMIT] < a1 and nrun < max_seqs:
                c = order[st[S_ADMIT]]
                nb = _load_head(c, st, B, T, prompt, hashed, off, ids, root, hb)
                s0, k0 = _walk(hb, nb, prompt[c], B, rk)
                if st[S_HELD] + nb - s0 <= ngpu - wmark:
                    stuck = False
            if stuck:
                forced = first
                st[S_FORCED] += 1
        # ---- forks and beam prunes (pre-pass builds run2)
        m2 = 0
        nfin = 0
        for r in range(nrun):
            c = run[r]
            if status[c] == ST_PRUNED:
                fin[nfin] = c
                nfin += 1
                continue
            run2[m2] = c
            m2 += 1
            if c >= N or status[c] != ST_RUN or computed[c] < prompt[c] or gen[c] >= out[c]:
                continue
            k = 0
            if dsteps[c] == 0 and forked[c] == 0:
                k = (beam[c] if beam[c] > 1 else nsamp[c]) - 1
                # the children inherit the parent's per-sequence blocks: fork (and decode)
                # only when they fit, else the parent waits a step
                if (k > 0 and c != forced and st[S_HELD] + k * priv[c]
                        + _decode_blocks(c, c, B, prompt, gen, nblk, spk) > ngpu):
                    stall[c] = step
                    continue
                forked[c] = -1  # children created (never again)
            elif (beam[c] > 1 and dsteps[c] > 0 and dsteps[c] % ip[P_BEAMINT] == 0
                  and blast[c] >= 0):
                # the re-fork replaces the pruned beam; skipped when it does not fit
                if c == forced or st[S_HELD] - priv[blast[c]] + priv[c] <= ngpu:
                    status[blast[c]] = ST_PRUNED  # skipped below, freed at step end
                    _release(blast[c], c, nkey, priv, B, T, prompt, hashed, off, ids, root,
                             hb2, rk, rv, st)
                    k = 1
            if k > 0 and nkey[c] > 0:
                _prompt_hashes(c, nkey[c], B, T, prompt, hashed, off, ids, root, hb2)
            for j in range(k):
                c2 = st[S_NEXTSLOT]
                st[S_NEXTSLOT] += 1
                src[c2] = c
                par[c2] = c
                computed[c2] = computed[c]
                gen[c2] = gen[c]
                nblk[c2] = nblk[c]
                lasth[c2] = 0
                status[c2] = ST_RUN
                first_us[c2] = first_us[c]
                dsteps[c2] = dsteps[c]
                forked[c2] = 1
                blast[c2] = -1
                blast[c] = c2
                cow[c2] = 1  # parent and child now share the partial last block
                cow[c] = 1
                nkey[c2] = nkey[c]  # shared full prompt blocks: one more reference
                for b in range(nkey[c]):
                    rv[_rslot(rk, hb2[b])] += 1
                priv[c2] = priv[c]  # the rest counts once per sequence
                st[S_HELD] += priv[c]
                run2[m2] = c2
                m2 += 1
                I, F = _ensure(I, F, n, 1)
                dl = arr[c] + ttft[c] if ttft[c] > 0 else -1
                # a fork computes no prompt: its ARRIVE carries num_tokens 0
                n = _row(I, F, n, step, t_us, EK_ARRIVE, c2, -1, 0, -1, 0, PH_DECODE,
                         PR_WARM, dl, 0, -1, 0, 0.0)
        # drop pruned beams that appear after their replacement was appended
        m3 = 0
        for r in range(m2):
            c = run2[r]
            if status[c] == ST_PRUNED:
                fin[nfin] = c
                nfin += 1
            else:
                run2[m3] = c
                m3 += 1
        m2 = m3
        budget = max_tok
        tokens = 0
        attended = 0.0
        kv_read = 0.0
        acc_reset(acc)
        # ---- 3. decode sequences
        for r in range(m2):
            c = run2[r]
            q = src[c] if c >= N else c  # table row owning the prompt and SLOs
            if computed[c] < prompt[q] or status[c] != ST_RUN:
                continue
            k = spk[q]
            need = 1 + k
            crit = rprio[q] >= ip[P_CRITPRIO] or (tpot[q] > 0 and tpot[q] <= ip[P_CRITTPOT])
            prio = PR_DECODE_CRITICAL if crit else PR_WARM
            pin = 1 if crit else 0
            dl = _token_deadline(arr[q], ttft[q], tpot[q], first_us[c], gen[c] + 1)
            if forked[c] == 1:
                # the replay forks here, whether or not the child decodes this step
                I, F = _ensure(I, F, n, 1)
                n = _row(I, F, n, step, t_us, EK_FORK, c, -1, 0, par[c], 0, PH_DECODE, prio,
                         dl, 0, step + 1, pin, 0.0)
                forked[c] = -1
            if stall[c] == step:  # waiting to fork
                st[S_STALLS] += 1
                continue
            if need > budget:
                continue
            L = prompt[q] + gen[c] - 1
            hi = L + k
            nb_need = hi // B + 1
            if (nb_need > nblk[c] and st[S_HELD] + nb_need - nblk[c] > ngpu
                    and c != forced):
                st[S_STALLS] += 1  # no free block: wait (vLLM would preempt)
                continue
            I, F = _ensure(I, F, n, 5 + 2 * (nb_need - nblk[c]))
            if dsteps[c] == 0:
                n = _row(I, F, n, step, t_us, EK_INTENT, c, -1, 0, -1, 0, PH_DECODE, prio, dl,
                         0, step + 1, pin, 0.0)
            if cow[c] == 1:
                # first write since a fork: if it lands in the shared (partial) last block,
                # an ALLOCATE at that existing index tells the replay to copy it on write
                if L // B < nblk[c]:
                    n = _row(I, F, n, step, t_us, EK_ALLOCATE, c, L // B, 0, -1,
                             min(hi + 1, (L // B + 1) * B) - L, PH_DECODE, prio, dl, 0,
                             step + 1, pin, _prefill_us(fp, (L // B) * B, B))
                    lasth[c] = 0  # its content diverges from the shared copy
                cow[c] = 0
            old_nb = nblk[c]
            for b in range(old_nb, nb_need):
                h = 0
                if k == 0 and c < N and lasth[c] != 0 and (b + 1) * B <= hashed[q]:
                    first = (b * B) // T
                    last = ((b + 1) * B - 1) // T
                    h = chain_hash(lasth[c], ids[off[q]:off[q + 1]], first, last, (b * B) % T)
                lasth[c] = h
                lo = max(L, b * B)
                hi_b = min(hi + 1, (b + 1) * B)
                n = _row(I, F, n, step, t_us, EK_ALLOCATE, c, b, h, -1, hi_b - lo,
                         PH_DRAFT if k > 0 else PH_DECODE, prio, dl, 0, step + 1, pin,
                         _prefill_us(fp, b * B, B))
            nblk[c] = nb_need
            n = _row(I, F, n, step, t_us, EK_ACCESS, c, -1, 0, -1, need,
                     PH_VERIFY if k > 0 else PH_DECODE, prio, dl, 0, step + 1, pin, 0.0)
            tokens += need
            attended += need * (L + hi + 2) / 2.0
            kv_read += hi + 1
            acc_decode(acc, need, hi + 1)
            budget -= need
            adv = 1
            if k > 0:
                a = 0
                while a < k and _uniform(ip[P_SEED], c, gen[c], a) < spp[q]:
                    a += 1
                adv = a + 1
                keep = (L + a) // B + 1  # blocks holding positions < L + 1 + a
                for b in range(old_nb, min(keep, nb_need)):
                    n = _row(I, F, n, step, t_us, EK_COMMIT, c, b, 0, -1, 0, PH_DECODE, prio,
                             dl, 0, step + 1, pin, _prefill_us(fp, b * B, B))
                for b in range(nb_need - 1, keep - 1, -1):
                    n = _row(I, F, n, step, t_us, EK_FREE, c, b, 0, -1, 0, PH_ROLLBACK,
                             PR_COLD, -1, 0, -1, 0, 0.0)
                if keep < nb_need:
                    nblk[c] = keep
            st[S_HELD] += nblk[c] - old_nb
            priv[c] += nblk[c] - old_nb
            gen[c] = min(gen[c] + adv, out[q])
            dsteps[c] += 1
            if gen[c] >= out[q]:
                status[c] = ST_DONE
                fin[nfin] = c
                nfin += 1
        # ---- 4. chunked prefill of running sequences
        for r in range(m2):
            c = run2[r]
            if c >= N or status[c] != ST_RUN or computed[c] >= prompt[c] or budget <= 0:
                continue
            chunk = min(prompt[c] - computed[c], budget)
            I, F = _ensure(I, F, n, 1)
            dl = arr[c] + ttft[c] if ttft[c] > 0 else -1
            est = _prefill_us(fp, computed[c], prompt[c] - computed[c])
            sl = dl - np.int64(now + est) if dl >= 0 else 0
            n = _row(I, F, n, step, t_us, EK_ACCESS, c, -1, 0, -1, chunk, PH_PREFILL, PR_WARM,
                     dl, sl, step + (prompt[c] - computed[c] + max_tok - 1) // max_tok, 0, 0.0)
            tokens += chunk
            attended += chunk * float(computed[c]) + chunk * (chunk + 1.0) / 2.0
            kv_read += computed[c] + chunk
            acc_chunk(fp, acc, chunk, computed[c])
            budget -= chunk
            computed[c] += chunk
            if computed[c] == prompt[c]:
                gen[c] = 1
                first_us[c] = -2  # set to the step end below
                if out[c] <= 1:
                    status[c] = ST_DONE
                    fin[nfin] = c
                    nfin += 1
        # ---- 5. admissions
        while st[S_ADMIT] < st[S_ARRIVE] and m2 < max_seqs and budget > 0:
            c = order[st[S_ADMIT]]
            nb = _load_head(c, st, B, T, prompt, hashed, off, ids, root, hb)
            s0, k0 = _walk(hb, nb, prompt[c], B, rk)
            if st[S_HELD] + nb - s0 > ngpu - wmark:
                st[S_BLOCKED] += 1  # head-of-line: nobody behind it is admitted either
                break
            if closed:  # before this request's own blocks join rk
                hitk[c] = B * _cached_prefix(hb, nb, prompt[c], B, rk, phk, phv, tk)
                adm[st[S_NADM]] = c
                st[S_NADM] += 1
                st[S_HIT_TOK] += hitk[c]
            _acquire(hb, s0, k0, rk, rv)
            st[S_HELD] += nb - s0
            nkey[c] = k0
            priv[c] = nb - k0
            st[S_ADMIT] += 1
            status[c] = ST_RUN
            run2[m2] = c
            m2 += 1
            I, F = _ensure(I, F, n, nb + 1)
            dl = arr[c] + ttft[c] if ttft[c] > 0 else -1
            est = _prefill_us(fp, 0, prompt[c]) + ((prompt[c] + max_tok - 1) // max_tok) * fp[Q_OVER]
            sl = dl - np.int64(now + est) if dl >= 0 else 0
            target = step + (prompt[c] + max_tok - 1) // max_tok
            h = 0
            for b in range(nb):
                e = min((b + 1) * B, prompt[c])
                h = hb[b]
                prio = PR_HOT if e <= shared[c] else PR_WARM
                n = _row(I, F, n, step, t_us, EK_ALLOCATE, c, b, h, -1, e - b * B, PH_PREFILL,
                         prio, dl, sl, target, 0, _prefill_us(fp, b * B, e - b * B))
            lasth[c] = h
            nblk[c] = nb
            hit = hitk[c] if closed else 0
            chunk = min(prompt[c] - hit, budget)
            n = _row(I, F, n, step, t_us, EK_ACCESS, c, -1, 0, -1, chunk, PH_PREFILL, PR_WARM,
                     dl, sl, target, 0, 0.0)
            tokens += chunk
            attended += chunk * float(hit) + chunk * (chunk + 1.0) / 2.0
            kv_read += hit + chunk
            acc_chunk(fp, acc, chunk, hit)
            budget -= chunk
            computed[c] = hit + chunk
            if computed[c] == prompt[c]:
                gen[c] = 1
                first_us[c] = -2
                if out[c] <= 1:
                    status[c] = ST_DONE
                    fin[nfin] = c
                    nfin += 1
        if st[S_HELD] > st[S_MAXHELD]:
            st[S_MAXHELD] = st[S_HELD]
        if m2 > st[S_MAXRUN]:
            st[S_MAXRUN] = m2
        # ---- step time (kvsim.engine.timing.step_time), patch STEP row and decode slacks
        dur = step_duration_us(fp, acc, tokens, attended, kv_read)
        end = now + dur
        end_us = np.int64(end)
        I[C_NTOK, step_row] = tokens
        F[F_DUR, step_row] = dur
        for r in range(step_row + 1, n):
            ph = I[C_PHASE, r]
            if (ph == PH_DECODE or ph == PH_VERIFY or ph == PH_DRAFT) and I[C_DEADLINE, r] >= 0:
                I[C_SLACK, r] = I[C_DEADLINE, r] - end_us
        for r in range(m2):
            c = run2[r]
            if first_us[c] == -2:
                first_us[c] = end_us
        # ---- 6. finishers: post-finish intent, then request-level FREE
        for x in range(nfin):
            c = fin[x]
            q = src[c] if c >= N else c
            _release(c, q, nkey, priv, B, T, prompt, hashed, off, ids, root, hb2, rk, rv, st)
            nbs = 0
            if c < N and shared[c] > 0 and not cont[c]:
                nbs = min(shared[c] // B, nblk[c])
            I, F = _ensure(I, F, n, 2 + nbs)
            if c < N and cont[c]:
                dl = end_us + gap[c] + (ttft[c] if ttft[c] > 0 else 0)
                n = _row(I, F, n, step, t_us, EK_INTENT, c, -1, 0, -1, 0, PH_IDLE, PR_HOT, dl,
                         dl - end_us, -1, 0, 0.0)
            else:
                n = _row(I, F, n, step, t_us, EK_INTENT, c, -1, 0, -1, 0, PH_DONE, PR_COLD, -1,
                         0, -1, 0, 0.0)
                for b in range(nbs):
                    n = _row(I, F, n, step, t_us, EK_INTENT, c, b, 0, -1, 0, PH_IDLE, PR_HOT,
                             -1, 0, -1, 0, _prefill_us(fp, b * B, B))
            n = _row(I, F, n, step, t_us, EK_FREE, c, -1, 0, -1, 0,
                     PH_DONE, PR_COLD, -1, 0, -1, 0, 0.0)
            if status[c] == ST_DONE and c < N:
                st[S_DONE] += 1
            status[c] = ST_DONE
            if c >= N and blast[q] == c:
                blast[q] = -1
        # ---- keep the still-running sequences, advance the clock
        m3 = 0
        for r in range(m2):
            c = run2[r]
            if status[c] == ST_RUN:
                run[m3] = c
                m3 += 1
        st[S_NRUN] = m3
        stf[0] = end
        st[S_STEP] = step + 1
        if st[S_ARRIVE] >= qn and st[S_ADMIT] >= qn and m3 == 0:
            st[S_FINISHED] = 1
        if n >= flush:
            break
    return I, F, n
