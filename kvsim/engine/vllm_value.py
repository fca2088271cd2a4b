"""The closed loop's vLLM scheduler value ``vs`` (:func:`build_value`): the members
that :func:`kvsim.engine.vllm_rows.vllm_rows` reads (``VS_*``), its per-step output lists
(:func:`new_outputs`), and its rows grown with the core's request tables
(:func:`grow_rows`)."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import numpy as np

from kvsim.core import row_store
from kvsim.engine import vllm_step as V
from kvsim.engine.vllm_pool import vllm_pool

__all__ = ["VS_IP", "VS_R", "VS_ARR", "VS_HH", "VS_SV", "VS_RUN", "VS_WQ", "VS_HEAP", "VS_POOL",
           "VS_HITS", "VS_HS", "VS_SCHED", "VS_BL", "VS_BLIDS", "VS_ADM", "VS_PRE", "VS_FIN",
           "VS_EV", "VS_RES", "VS_OC", "VS_FIRST", "VS_MARK", "VS_H0", "VS_H1", "VS_Q", "VS_QA",
           "VS_RSM", "VS_PCOST", "VS_RESETS", "Q_SPECK", "Q_ACCEPT", "Q_EXT", "RSM_ON", "RSM_ROW",
           "RSM_CLEARED", "RSM_NPRE", "build_value", "grow_rows", "new_outputs",
           "with_external_tokens"]

# members of the scheduler value ``vs`` (a tuple, :func:`build_value`)
(VS_IP, VS_R, VS_ARR, VS_HH, VS_SV, VS_RUN, VS_WQ, VS_HEAP, VS_POOL, VS_HITS, VS_HS,
 VS_SCHED, VS_BL, VS_BLIDS, VS_ADM, VS_PRE, VS_FIN, VS_EV, VS_RES, VS_OC, VS_FIRST,
 VS_MARK, VS_H0, VS_H1, VS_Q, VS_QA, VS_RSM, VS_PCOST, VS_RESETS) = range(29)
# vLLM's rows (``R``, ``VS_ARR``, the queues, ``VS_FIRST``, ``VS_MARK``) are the core's
# request-table rows (the closed loop's slot map, :func:`kvsim.engine.vllm_rows.slot_of`), filled at a request's
# arrival from its constants: ``VS_H0``/``VS_H1`` its hashes' slice (shared_hashes),
# ``VS_Q`` (request id x Q_*; no rows: none) its drafts, their acceptance and the tokens a
# prefill replica sends (P/D), ``VS_QA`` its arrival in seconds; shared by the replicas
Q_SPECK, Q_ACCEPT, Q_EXT = range(3)
# ``vs[VS_RSM]``: a step that stopped for row room (:func:`vllm_rows`): 1 when one is in
# flight (scheduled, its rows not written), its STEP row, resets that cleared, the resets'
# preemptions
RSM_ON, RSM_ROW, RSM_CLEARED, RSM_NPRE = range(4)
# ``vs[VS_PCOST]``: block ``b``'s prefill cost (its ALLOCATE row's recompute cost, the timing
# model's ``prefill_cost_us(fp, b * B, B)``, a function of ``b`` alone in a run), filled by
# :func:`kvsim.engine.vllm_rows.vllm_rows` at its first use (-1: not yet): computed per block,
# log2 / exp twice each, it was ~4 % of a 16-token closed loop (docs/benchmarks.md)


def build_value(cols: dict, off, ids, trace_block_tokens: int, block_size: int, num_blocks: int,
                   max_num_seqs: int, max_num_batched_tokens: int, *, priority: bool = False,
                   long_prefill_token_threshold: int = 0, watermark_blocks: int = 0,
                   reserve_full_isl: bool = True, enable_chunked_prefill: bool = True,
                   enable_caching: bool = True, spec_lookahead: bool = False,
                   seed: int = 0, hashes: tuple | None = None, rows: int | None = None,
                   compiled: bool = True) -> tuple:
    """The scheduler value ``vs`` of :func:`kvsim.engine.vllm_rows.vllm_rows` for a Request table (``cols``: name ->
    numpy array, :meth:`kvsim.ingest.requests.RequestTable.columns`; its block ids
    ``off``/``ids``): vLLM's waiting queue, running list and KV manager (a pool of
    ``num_blocks`` blocks, the null block included, like the replay's).  ``hashes``: the
    requests' block hashes (:func:`kvsim.engine.vllm_rows.shared_hashes`), shared by a
    cluster's replicas (:func:`kvsim.engine.vllm_rows.new_vllm_value` makes them when
    not given).
    ``rows``: vLLM's rows (the core's request-table rows,
    :func:`kvsim.engine.vllm_rows.slot_of`; grown with them,
    :func:`grow_rows`), one per request when None.  ``compiled`` False: the pool value for the
    interpreted twin (:func:`kvsim.replay.variants.closed_for`), the same members as plain
    Python objects (nothing compiles)."""
    from kvsim.memory import fifo_order
    from kvsim.memory.fast import PoolConfig, new_out, new_state
    from kvsim.memory.pool_ref import pool_ref
    from kvsim.policy.api import new_block_view
    from kvsim.policy.hooks import policy_value, view_ref

    N = len(cols["prompt_tokens"])
    i64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731
    prompt = i64(cols["prompt_tokens"])
    out = i64(cols["output_tokens"])
    h0, h1, hh = hashes
    vip = np.zeros(V.NUM_PARAMS, np.int64)
    vip[V.P_BS], vip[V.P_NGPU] = block_size, num_blocks
    vip[V.P_MAXSEQ], vip[V.P_MAXTOK] = max_num_seqs, max_num_batched_tokens
    vip[V.P_CHUNKED] = int(enable_chunked_prefill)
    vip[V.P_THR] = long_prefill_token_threshold
    vip[V.P_PRIO] = int(priority)
    vip[V.P_CACHING] = int(enable_caching)
    vip[V.P_RESERVE] = int(reserve_full_isl)
    vip[V.P_WMARK] = watermark_blocks
    vip[V.P_MAXLEN] = 1 << 62
    vip[V.P_LOOK], vip[V.P_SEED] = int(spec_lookahead), seed
    M = max(N if rows is None else rows, 1)
    R = np.zeros((M, V.NUM_COLS), np.int64)  # filled at arrival (_new_row)
    R[:, V.K_STATUS] = V.UNSEEN
    R[:, V.K_NCACHED] = -1
    R[:, V.K_SEQ] = -1
    varr = np.zeros(M, np.float64)
    Q, QA = _request_constants(cols, h0)
    spk = i64(cols["spec_draft_tokens"]) if "spec_draft_tokens" in cols else 0
    # drafts and their lookahead slots take blocks past prompt + output
    per_seq = int(((prompt + out + 2 * spk) // block_size).max()) + 3 if N else 4
    pc = PoolConfig(num_blocks=num_blocks, block_size_tokens=block_size,
                    enable_caching=enable_caching, max_seqs=max_num_seqs + 2,
                    max_blocks_per_seq=per_seq)
    pst = new_state(pc)
    fifo_order.use_inline(pst)  # vLLM's order run as the pool's inline list operations
    view = new_block_view(pc.num_blocks)
    order_state = fifo_order.init(pc.num_blocks - 1, pc.num_blocks, {})
    if compiled:
        pl = vllm_pool(pool_ref(pst), policy_value(fifo_order, order_state, True),
                       view_ref(view), new_out(pc, 0))
    else:  # the members vllm_step reads (VllmPool's), as the interpreted core passes them
        pl = SimpleNamespace(st=pst, pst=policy_value(fifo_order, order_state, False),
                             pview=view, out=new_out(pc, 0))
    outs = new_outputs(N, num_blocks, max_num_seqs, per_seq)
    return (vip, R, varr, hh, np.zeros(V.NUM_SV, np.int64), np.zeros(M, np.int64),
            np.zeros(M, np.int64), np.zeros(M, np.int64), pl, np.zeros(per_seq, np.int64),
            np.zeros(per_seq, np.int64), *outs, np.full(M, -1, np.int64),
            np.full(M, -1, np.int64), h0, h1, Q, QA, np.zeros(4, np.int64),
            np.full(per_seq, -1.0), np.zeros((0, 4), np.int64))


#: the last cluster's request constants (:func:`_request_constants`), kept while its
#: replicas are built (one entry: keyed on a weak reference to the hashes' ``h0`` they
#: share, and emptied when that array is freed: nothing of a run outlives it)
_SHARED: list = []


def _forget_shared() -> None:
    if _SHARED and _SHARED[0]() is None:
        _SHARED.clear()


def _request_constants(cols: dict, h0) -> tuple:
    """``(Q, QA)`` of ``vs`` (``VS_Q``, ``VS_QA``) for a Request table's columns: made once
    for the replicas of a cluster, which share the hashes (``h0``)."""
    from kvsim.engine.vllm_spec import acceptance_units

    if _SHARED and _SHARED[0]() is h0:
        return _SHARED[1], _SHARED[2]
    N = len(cols["prompt_tokens"])
    Q = np.zeros((0, 3), np.int64)
    if "spec_draft_tokens" in cols:  # speculative decoding (kvsim.engine.vllm_spec)
        Q = row_store.zeros((N, 3), np.int64)  # per request: the run's row store
        Q[:, Q_SPECK] = np.asarray(cols["spec_draft_tokens"], dtype=np.int64)
        Q[:, Q_ACCEPT] = acceptance_units(np.asarray(cols["spec_accept_prob"],
                                                     dtype=np.float64))
    QA = row_store.copy(np.asarray(cols["arrival_us"], dtype=np.float64) / 1e6)
    _SHARED[:] = [weakref.ref(h0), Q, QA]
    weakref.finalize(h0, _forget_shared)
    return Q, QA


def with_external_tokens(vs: tuple, ext) -> tuple:
    """``vs`` with request ``c``'s tokens a prefill replica sends (P/D, ``K_EXT``) set to
    ``ext[c]`` (its own ``VS_Q``, not the one the replicas share)."""
    N = len(ext)
    Q = vs[VS_Q]
    Q = Q.copy() if Q.shape[0] else np.zeros((N, 3), np.int64)
    Q[:, Q_EXT] = ext
    return (*vs[:VS_Q], Q, *vs[VS_Q + 1:])


def new_outputs(num_requests: int, num_gpu_blocks: int, max_num_seqs: int,
                max_blocks_per_seq: int) -> tuple:
    """Output buffers of one step, sized for the worst step.  The block lists
    (``VS_BLIDS``) hold, per step, the whole block table of every request admitted (or
    resumed) and the new blocks of the running ones: the new blocks are at most the pool,
    but an admitted table's prefix hits are shared blocks, listed once per request that
    holds them, so the worst step is the pool plus ``min(max_num_seqs, requests)`` tables
    of at most ``min(max_blocks_per_seq, pool)`` blocks each (a burst of requests sharing
    a long cached prefix; sized by the pool alone, ``reorder`` on a trace queued at t = 0
    overflowed it).  The per-request lists are sized by the requests one step can name,
    not by the trace (issue 38): a step schedules at most ``max_num_seqs`` requests (the
    running ones, then admissions while fewer than ``max_num_seqs`` run), so as many are
    admitted, listed in the block lists, or finish; preempted are at most the running ones,
    twice with ``reset_running_requests`` before the step; a stored event at most two a
    scheduled request (``allocate_slots``, and the verified drafts in
    ``update_from_output``), a removed one at most one a new block."""
    n = max(min(num_requests, max_num_seqs), 1)
    ev_cap = 2 * num_gpu_blocks + 4 * n + 64
    blids_cap = max(2 * num_gpu_blocks + 16, num_gpu_blocks + 16
                    + n * min(max_blocks_per_seq, num_gpu_blocks))
    return (np.zeros((n + 1, 2), np.int64), np.zeros((2 * n + 2, 2), np.int64),
            np.zeros(blids_cap, np.int64), np.zeros((n + 1, 3), np.int64),
            np.zeros((n + 1, 2), np.int64), np.zeros(n + 1, np.int64),
            np.zeros((ev_cap, 4), np.int64), np.zeros(64, np.int64),
            np.zeros(V.NUM_OC, np.int64))


def grow_rows(vs: tuple, rows: int) -> tuple:
    """``vs`` with ``rows`` rows (the core's request tables grew,
    :meth:`kvsim.modes.closed.closed_slots.ClosedSlots.grow`): its rows kept, the new ones
    unseen, the FIFO waiting ring unrolled from its head (the same order)."""
    M = vs[VS_R].shape[0]
    if rows <= M:
        return vs
    R = np.zeros((rows, V.NUM_COLS), np.int64)
    R[:M] = vs[VS_R]
    R[M:, V.K_STATUS] = V.UNSEEN
    R[M:, V.K_NCACHED] = -1
    R[M:, V.K_SEQ] = -1
    sv, wq = vs[VS_SV], vs[VS_WQ]
    ring = np.zeros(rows, np.int64)
    wlen = int(sv[V.V_WLEN])
    ring[:wlen] = wq[(int(sv[V.V_WHEAD]) + np.arange(wlen)) % M]
    sv[V.V_WHEAD] = 0

    def pad(a, fill):
        b = np.full(rows, fill, a.dtype)
        b[:M] = a
        return b

    new = list(vs)
    new[VS_R], new[VS_WQ] = R, ring
    new[VS_ARR] = pad(vs[VS_ARR], 0.0)
    new[VS_RUN], new[VS_HEAP] = pad(vs[VS_RUN], 0), pad(vs[VS_HEAP], 0)
    new[VS_FIRST], new[VS_MARK] = pad(vs[VS_FIRST], -1), pad(vs[VS_MARK], -1)
    return tuple(new)
