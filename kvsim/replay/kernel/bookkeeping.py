"""Hook-free bookkeeping of the replay core: compiled once, shared by every policy.

These functions never call a policy hook: the replay core (:mod:`kvsim.replay.kernel.core`) calls
them, and numba compiles and caches them once, as it does the core (docs/architecture.md,
"One compiled core for every policy").  State layout: :mod:`kvsim.core.layout`.
"""

from __future__ import annotations

import numpy as np

from kvsim.core.layout import *  # noqa: F401,F403  (column names of the state arrays)
from kvsim.jit.decorators import njit
from kvsim.memory.fast import S_N_CAND, S_N_HELD  # the HBM pool's scalars (st.sc)

NEVER = np.iinfo(np.int64).max
from kvsim.core.codes import PR_DECODE_CRITICAL  # noqa: E402


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _peak(C, tier, used):
    if used > C[C_PEAK + tier]:
        C[C_PEAK + tier] = used


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _set_view_from_record(view, b, A_i, A_f, a, now_us):
    """The block's intent fields as the serving layer last stated them (its record)."""
    view.phase[b] = A_i[a, AI_PHASE]
    view.priority[b] = A_i[a, AI_PRIO]
    view.request_priority[b] = A_i[a, AI_RPRIO]
    view.deadline_us[b] = A_i[a, AI_DEADLINE]
    view.slack_us[b] = A_i[a, AI_SLACK]
    view.target_decode_step[b] = A_i[a, AI_TDS]
    view.pinned[b] = A_i[a, AI_PIN] != 0 or A_i[a, AI_PRIO] == PR_DECODE_CRITICAL
    view.recompute_cost_us[b] = A_f[a]
    view.size_bytes[b] = A_i[a, AI_SIZE]
    view.next_use[b] = A_i[a, AI_NEXT]
    view.last_access_us[b] = now_us


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _run_remove(running, C, r):
    n = int(C[C_NRUN])
    j = 0
    while j < n and running[j] != r:
        j += 1
    if j == n:
        return
    for q in range(j, n - 1):
        running[q] = running[q + 1]
    C[C_NRUN] = n - 1


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _run_add(running, C, r):
    running[int(C[C_NRUN])] = r
    C[C_NRUN] += 1


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _pick_victim(running, C, R_i, exclude, by_priority):
    """vLLM v1: the last running request; under priority scheduling vLLM's
    ``max(running, key=(priority, arrival_time))``: the lowest request_priority, ties to
    the latest arrival, then the first in running order (Python's ``max`` keeps the first
    of equal keys; kvsim.memory.fast.pick_preemption_victim is the same rule).  Never
    ``exclude``.  -1 if none."""
    n = int(C[C_NRUN])
    best = -1
    if not by_priority:
        for j in range(n - 1, -1, -1):
            if running[j] != exclude:
                return running[j]
        return -1
    for j in range(n):
        r = running[j]
        if r == exclude:
            continue
        if best < 0 or R_i[r, RI_PRIO] < R_i[best, RI_PRIO] or (
                R_i[r, RI_PRIO] == R_i[best, RI_PRIO]
                and R_i[r, RI_ARRIVE_US] > R_i[best, RI_ARRIVE_US]):
            best = r
    return best


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _first_lower(T1, T2, T3):
    if T1.Lm[LM_CAP] > 0:
        return 1
    if T2.Lm[LM_CAP] > 0:
        return 2
    if T3.Lm[LM_CAP] > 0:
        return 3
    return 0


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _resumed_token(R_i, r, added):
    """True when ``added`` prefilled tokens complete the recompute of a request resumed
    after a preemption (its prompt and every output so far): as in vLLM, that step samples
    the request's next output token, a decode token (no TPOT deadline is charged to it).
    True once per resumption: the count crosses prompt + outputs exactly once."""
    target = R_i[r, RI_PROMPT] + R_i[r, RI_NOUT]
    after = R_i[r, RI_PREFILLED]
    return R_i[r, RI_NOUT] > 0 and after - added < target <= after


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def _finalize_step(C, R_i, R_f, S, P, sc=None):
    """Close the current step: latency, clock, the tokens its requests produced, and each
    tier's occupancy as the step ends (``S_USED + t``, ``S_HBM_CACHED``).

    ``sc`` is the HBM pool's scalar array ``st.sc`` (held and cached counts).  Without it
    the held count comes from ``C[C_HBM_USED]`` (kept current by the core after every pool
    operation) and the cached count is recorded as -1 (unknown): the core must pass
    ``st.sc`` for the cached column."""
    lat = C[C_STEP_DUR_US] - C[C_STEP_SAVED_US]
    if lat < 0.0:
        lat = 0.0
    lat += C[C_STEP_STALL_US] + C[C_STEP_EXTRA_US]
    end = C[C_STEP_START_US] + lat
    C[C_CLOCK_US] = end
    k = int(C[C_NSTEP_BUF])
    S[k, S_STEP] = C[C_STEP]
    S[k, S_START_US] = C[C_STEP_START_US]
    S[k, S_LATENCY_US] = lat
    S[k, S_STALL_US] = C[C_STEP_STALL_US]
    S[k, S_SAVED_US] = min(C[C_STEP_SAVED_US], C[C_STEP_DUR_US])
    S[k, S_DURATION_US] = C[C_STEP_DUR_US]
    S[k, S_EXTRA_US] = C[C_STEP_EXTRA_US]
    if sc is None:
        S[k, S_USED] = C[C_USED]
        S[k, S_HBM_CACHED] = -1.0
    else:
        S[k, S_USED] = sc[S_N_HELD]
        S[k, S_HBM_CACHED] = sc[S_N_CAND]
    S[k, S_USED + 1] = C[C_USED + 1]
    S[k, S_USED + 2] = C[C_USED + 2]
    S[k, S_USED + 3] = C[C_USED + 3]
    C[C_NSTEP_BUF] = k + 1
    C[M_SAVED_US] += min(C[C_STEP_SAVED_US], C[C_STEP_DUR_US])
    for j in range(int(C[C_NPEND])):
        r = P[j, 0]
        kind = P[j, 1]
        dl = P[j, 2]
        if kind == 1:  # first token
            R_f[r, RF_FIRST_US] = end
            R_f[r, RF_LAST_US] = end
            R_i[r, RI_NOUT] += 1
            R_i[r, RI_FT_PENDING] = 0
            if R_i[r, RI_TTFT_DL] >= 0 and end > R_i[r, RI_TTFT_DL]:
                R_i[r, RI_TTFT_MISS] = 1
        elif kind == 2:  # a decode token
            R_f[r, RF_LAST_US] = end
            R_i[r, RI_NOUT] += 1
            if dl >= 0:
                R_i[r, RI_TPOT_DL] += 1
                if end > dl:
                    R_i[r, RI_TPOT_MISS] += 1
    C[C_NPEND] = 0


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def _grow_records(r, R_i, A_i, A_f, C):
    """Request ``r``'s block records are full: relocate them to the arena top with twice
    the room.  The record itself is written by :func:`kvsim.replay.kernel.core.run` (an ALLOCATE
    row's fields, from the batch's columns it has unpacked)."""
    start = R_i[r, RI_BT_START]
    n = R_i[r, RI_BT_LEN]
    top = int(C[C_ARENA_TOP])
    cap = max(2 * n, 4)
    for e in range(n):
        for c in range(A_i.shape[1]):  # not a row assignment: see kvsim.replay.kernel.core
            A_i[top + e, c] = A_i[start + e, c]
        A_f[top + e] = A_f[start + e]
    R_i[r, RI_BT_START] = top
    R_i[r, RI_BT_CAP] = cap
    C[C_ARENA_TOP] = top + cap


@njit(cache=True)
def pack_records(A_i, A_f, new_i, new_f, R_i, live, in_place):
    """Copy the block records of the requests ``live`` (sorted by ``RI_BT_START``) to the
    start of ``new_i`` / ``new_f``, back to back, each with its whole room
    (``RI_BT_CAP`` rows), and point their ``RI_BT_START`` there; returns the rows used.
    ``in_place``: ``new_i`` / ``new_f`` are ``A_i`` / ``A_f`` themselves: a record only
    moves down and the rows are copied in order, so no row is overwritten before it is
    read (a record already in place is not copied).  The
    driver's arena compaction (kvsim.replay.driver._Run._compact_arena), row by row
    instead of numpy's gathered copy of every live row."""
    top = 0
    for k in range(live.shape[0]):
        r = live[k]
        s = R_i[r, RI_BT_START]
        cap = R_i[r, RI_BT_CAP]
        if s != top or not in_place:
            for e in range(cap):
                for c in range(A_i.shape[1]):
                    new_i[top + e, c] = A_i[s + e, c]
                new_f[top + e] = A_f[s + e]
        R_i[r, RI_BT_START] = top
        top += cap
    return top

