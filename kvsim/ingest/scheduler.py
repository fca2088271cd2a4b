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
5. admissions (FIFO, while fewer than ``max_num_seqs`` run and budget is left): all
   prompt blocks ``ALLOCATE``d in block order, then the first chunk's ``ACCESS``;
6. finished or pruned sequences: request-level ``INTENT`` (post-finish intent), block-level
   ``INTENT`` for known-shared prefix blocks, request-level ``FREE``.

Sequence slots: ``0..N-1`` are the Request-table rows (request id = row); forks (n > 1,
beams) take slots from ``N`` upward in creation order.  Clock: a step starts at ``now``
and lasts its roofline time; when nothing runs or waits, ``now`` jumps to the next arrival.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.ingest.hashing import chain_hash, mix64, root_hash

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
P_B, P_T, P_MAXSEQ, P_MAXTOK, P_FLUSH, P_CRITPRIO, P_CRITTPOT, P_BEAMINT, P_SEED, P_N = range(10)
NUM_INT_PARAMS = 10
# float parameters (fp): see StepCostModel.as_array
Q_OVER, Q_WBYTES, Q_KVBPT, Q_BW, Q_FLOPS, Q_ACTIVE, Q_LH = range(7)
# loop state (st): step, arrive pointer, admit pointer, running count, next free slot,
# finished table requests, all done flag; clock in stf[0]
S_STEP, S_ARRIVE, S_ADMIT, S_NRUN, S_NEXTSLOT, S_DONE, S_FINISHED = range(7)
NUM_STATE = 7

# enum values (kvsim.schema), repeated here as compile-time constants
K_STEP, K_ARRIVE, K_ALLOCATE, K_ACCESS, K_INTENT, K_COMMIT, K_FORK, K_FREE = range(8)
PH_PREFILL, PH_DECODE, PH_VERIFY, PH_DRAFT, PH_ROLLBACK, PH_IDLE, PH_DONE = range(7)
PR_COLD, PR_WARM, PR_HOT, PR_CRIT = range(4)

# slot status
ST_WAIT, ST_RUN, ST_DONE, ST_PRUNED = 0, 1, 2, 3


@njit(cache=True)
def _ensure(I, F, n, need):
    """Buffers with room for ``need`` more rows after ``n`` (doubling)."""
    cap = I.shape[1]
    if n + need <= cap:
        return I, F
    new_cap = max(2 * cap, n + need + 1024)
    I2 = np.empty((I.shape[0], new_cap), dtype=np.int64)
    F2 = np.empty((F.shape[0], new_cap), dtype=np.float64)
    I2[:, :n] = I[:, :n]
    F2[:, :n] = F[:, :n]
    return I2, F2


@njit(cache=True)
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
    """Compute time of m prefill tokens at positions [start, start+m) (engine.py)."""
    mf = float(m)
    att = mf * start + mf * (mf + 1.0) / 2.0
    return (2.0 * fp[Q_ACTIVE] * mf + 4.0 * fp[Q_LH] * att) / fp[Q_FLOPS]


@njit(cache=True, inline="always")
def _uniform(seed, slot, gen, j):
    z = mix64(np.uint64(seed) ^ mix64(np.uint64(slot) ^ mix64(np.uint64(gen * 64 + j))))
    return float(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _token_deadline(arr, ttft, tpot, first_us, g):
    """Absolute deadline of output token g (1-based): TTFT deadline + (g-1) TPOT, or the
    actual first-token time + (g-1) TPOT when only TPOT is set; -1 when none."""
    if tpot > 0:
        if ttft > 0:
            return arr + ttft + (g - 1) * tpot
        return first_us + (g - 1) * tpot
    if ttft > 0 and g <= 1:
        return arr + ttft
    return -1


@njit(cache=True)
def run_steps(ip, fp, st, stf,
              arr, prompt, out, ttft, tpot, nsamp, beam, rprio, cont, gap, shared, spk, spp,
              hashed, off, ids,
              src, par, computed, gen, nblk, lasth, status, first_us, dsteps, forked, blast,
              cow, run, run2, fin, I, F, n):
    """Run steps until ``n >= flush_rows`` at a step boundary or the trace is done.

    Returns ``(I, F, n)``; ``st[S_FINISHED] == 1`` once every request has finished.
    """
    B = ip[P_B]
    T = ip[P_T]
    max_seqs = ip[P_MAXSEQ]
    max_tok = ip[P_MAXTOK]
    flush = ip[P_FLUSH]
    N = ip[P_N]
    root = root_hash(0)
    while st[S_FINISHED] == 0:
        now = stf[0]
        nrun = st[S_NRUN]
        if nrun == 0 and st[S_ADMIT] == st[S_ARRIVE]:
            if st[S_ARRIVE] >= N:
                st[S_FINISHED] = 1
                break
            if arr[st[S_ARRIVE]] > now:
                now = float(arr[st[S_ARRIVE]])
        step = st[S_STEP]
        t_us = np.int64(now)
        # ---- 1. STEP placeholder, 2. arrivals
        a0 = st[S_ARRIVE]
        a1 = a0
        while a1 < N and arr[a1] <= t_us:
            a1 += 1
        I, F = _ensure(I, F, n, 1 + (a1 - a0))
        step_row = n
        n = _row(I, F, n, step, t_us, K_STEP, -1, -1, 0, -1, 0, PH_PREFILL, PR_WARM, -1, 0,
                 -1, 0, 0.0)
        for i in range(a0, a1):
            dl = arr[i] + ttft[i] if ttft[i] > 0 else -1
            est = _prefill_us(fp, 0, prompt[i]) + ((prompt[i] + max_tok - 1) // max_tok) * fp[Q_OVER]
            sl = dl - np.int64(now + est) if dl >= 0 else 0
            n = _row(I, F, n, step, t_us, K_ARRIVE, i, -1, 0, -1, prompt[i], PH_PREFILL,
                     PR_WARM, dl, sl, -1, 0, 0.0)
        st[S_ARRIVE] = a1
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
                forked[c] = -1  # children created (never again)
            elif (beam[c] > 1 and dsteps[c] > 0 and dsteps[c] % ip[P_BEAMINT] == 0
                  and blast[c] >= 0):
                status[blast[c]] = ST_PRUNED  # skipped below, freed at step end
                k = 1
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
                run2[m2] = c2
                m2 += 1
                I, F = _ensure(I, F, n, 1)
                dl = arr[c] + ttft[c] if ttft[c] > 0 else -1
                # a fork computes no prompt: its ARRIVE carries num_tokens 0
                n = _row(I, F, n, step, t_us, K_ARRIVE, c2, -1, 0, -1, 0, PH_DECODE,
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
        pf0 = nfin  # fin[pf0:] collects finishers; prefill completers tracked via gen
        # ---- 3. decode sequences
        for r in range(m2):
            c = run2[r]
            q = src[c] if c >= N else c  # table row owning the prompt and SLOs
            if computed[c] < prompt[q] or status[c] != ST_RUN:
                continue
            k = spk[q]
            need = 1 + k
            if need > budget:
                continue
            crit = rprio[q] >= ip[P_CRITPRIO] or (tpot[q] > 0 and tpot[q] <= ip[P_CRITTPOT])
            prio = PR_CRIT if crit else PR_WARM
            pin = 1 if crit else 0
            dl = _token_deadline(arr[q], ttft[q], tpot[q], first_us[c], gen[c] + 1)
            L = prompt[q] + gen[c] - 1
            hi = L + k
            nb_need = hi // B + 1
            I, F = _ensure(I, F, n, 5 + 2 * (nb_need - nblk[c]))
            if forked[c] == 1:
                n = _row(I, F, n, step, t_us, K_FORK, c, -1, 0, par[c], 0, PH_DECODE, prio,
                         dl, 0, step + 1, pin, 0.0)
                forked[c] = -1
            if dsteps[c] == 0:
                n = _row(I, F, n, step, t_us, K_INTENT, c, -1, 0, -1, 0, PH_DECODE, prio, dl,
                         0, step + 1, pin, 0.0)
            if cow[c] == 1:
                # first write since a fork: if it lands in the shared (partial) last block,
                # an ALLOCATE at that existing index tells the replay to copy it on write
                if L // B < nblk[c]:
                    n = _row(I, F, n, step, t_us, K_ALLOCATE, c, L // B, 0, -1,
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
                n = _row(I, F, n, step, t_us, K_ALLOCATE, c, b, h, -1, hi_b - lo,
                         PH_DRAFT if k > 0 else PH_DECODE, prio, dl, 0, step + 1, pin,
                         _prefill_us(fp, b * B, B))
            nblk[c] = nb_need
            n = _row(I, F, n, step, t_us, K_ACCESS, c, -1, 0, -1, need,
                     PH_VERIFY if k > 0 else PH_DECODE, prio, dl, 0, step + 1, pin, 0.0)
            tokens += need
            attended += need * (L + hi + 2) / 2.0
            kv_read += hi + 1
            budget -= need
            adv = 1
            if k > 0:
                a = 0
                while a < k and _uniform(ip[P_SEED], c, gen[c], a) < spp[q]:
                    a += 1
                adv = a + 1
                keep = (L + a) // B + 1  # blocks holding positions < L + 1 + a
                for b in range(old_nb, min(keep, nb_need)):
                    n = _row(I, F, n, step, t_us, K_COMMIT, c, b, 0, -1, 0, PH_DECODE, prio,
                             dl, 0, step + 1, pin, _prefill_us(fp, b * B, B))
                for b in range(nb_need - 1, keep - 1, -1):
                    n = _row(I, F, n, step, t_us, K_FREE, c, b, 0, -1, 0, PH_ROLLBACK,
                             PR_COLD, -1, 0, -1, 0, 0.0)
                if keep < nb_need:
                    nblk[c] = keep
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
            n = _row(I, F, n, step, t_us, K_ACCESS, c, -1, 0, -1, chunk, PH_PREFILL, PR_WARM,
                     dl, sl, step + (prompt[c] - computed[c] + max_tok - 1) // max_tok, 0, 0.0)
            tokens += chunk
            attended += chunk * float(computed[c]) + chunk * (chunk + 1.0) / 2.0
            kv_read += computed[c] + chunk
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
            c = st[S_ADMIT]
            st[S_ADMIT] += 1
            status[c] = ST_RUN
            run2[m2] = c
            m2 += 1
            nb = (prompt[c] + B - 1) // B
            I, F = _ensure(I, F, n, nb + 1)
            dl = arr[c] + ttft[c] if ttft[c] > 0 else -1
            est = _prefill_us(fp, 0, prompt[c]) + ((prompt[c] + max_tok - 1) // max_tok) * fp[Q_OVER]
            sl = dl - np.int64(now + est) if dl >= 0 else 0
            target = step + (prompt[c] + max_tok - 1) // max_tok
            h = root
            for b in range(nb):
                e = min((b + 1) * B, prompt[c])
                # hash by the block's full content when the trace knows it (synthetic
                # sessions know their outputs), else by the prompt part (Mooncake's
                # identified partial block); unidentified blocks break the chain
                he = (b + 1) * B if (b + 1) * B <= hashed[c] else e
                if h != 0 and he <= hashed[c]:
                    h = chain_hash(h, ids[off[c]:off[c + 1]], (b * B) // T, (he - 1) // T,
                                   (b * B) % T)
                else:
                    h = 0
                prio = PR_HOT if e <= shared[c] else PR_WARM
                n = _row(I, F, n, step, t_us, K_ALLOCATE, c, b, h, -1, e - b * B, PH_PREFILL,
                         prio, dl, sl, target, 0, _prefill_us(fp, b * B, e - b * B))
            lasth[c] = h
            nblk[c] = nb
            chunk = min(prompt[c], budget)
            n = _row(I, F, n, step, t_us, K_ACCESS, c, -1, 0, -1, chunk, PH_PREFILL, PR_WARM,
                     dl, sl, target, 0, 0.0)
            tokens += chunk
            attended += chunk * (chunk + 1.0) / 2.0
            kv_read += chunk
            budget -= chunk
            computed[c] = chunk
            if chunk == prompt[c]:
                gen[c] = 1
                first_us[c] = -2
                if out[c] <= 1:
                    status[c] = ST_DONE
                    fin[nfin] = c
                    nfin += 1
        # ---- step time (roofline), patch STEP row and decode slacks
        mem = (fp[Q_WBYTES] + fp[Q_KVBPT] * kv_read) / fp[Q_BW]
        comp = (2.0 * fp[Q_ACTIVE] * tokens + 4.0 * fp[Q_LH] * attended) / fp[Q_FLOPS]
        dur = max(mem, comp) + fp[Q_OVER]
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
            nbs = 0
            if c < N and shared[c] > 0 and not cont[c]:
                nbs = min(shared[c] // B, nblk[c])
            I, F = _ensure(I, F, n, 2 + nbs)
            if c < N and cont[c]:
                dl = end_us + gap[c] + (ttft[c] if ttft[c] > 0 else 0)
                n = _row(I, F, n, step, t_us, K_INTENT, c, -1, 0, -1, 0, PH_IDLE, PR_HOT, dl,
                         dl - end_us, -1, 0, 0.0)
            else:
                n = _row(I, F, n, step, t_us, K_INTENT, c, -1, 0, -1, 0, PH_DONE, PR_COLD, -1,
                         0, -1, 0, 0.0)
                for b in range(nbs):
                    n = _row(I, F, n, step, t_us, K_INTENT, c, b, 0, -1, 0, PH_IDLE, PR_HOT,
                             -1, 0, -1, 0, _prefill_us(fp, b * B, B))
            n = _row(I, F, n, step, t_us, K_FREE, c, -1, 0, -1, 0,
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
        if st[S_ARRIVE] >= N and st[S_ADMIT] >= N and m3 == 0:
            st[S_FINISHED] = 1
        if n >= flush:
            break
    return I, F, n
