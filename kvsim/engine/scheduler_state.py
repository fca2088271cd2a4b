"""The state of the compiled scheduler (:mod:`kvsim.engine.scheduler`) for one engine.

:func:`new_schedule` turns a Request table and an engine configuration into the flat
arrays :func:`kvsim.engine.scheduler.run_steps` advances; the lowering
(:func:`kvsim.engine.lowering.lower_requests`, open loop: steps written to an event file) and
the closed loop (:mod:`kvsim.modes.closed.closed_loop`: steps replayed as they are decided) build
it the same way, so both run the same scheduler on the same state.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from kvsim.core import row_store
from kvsim.engine import scheduler as S
from kvsim.memory.fast import index_keys_values, new_index


@dataclass
class Schedule:
    """Arrays of one scheduler (names as in :func:`kvsim.engine.scheduler.run_steps`)."""

    ip: np.ndarray
    fp: np.ndarray
    st: np.ndarray
    stf: np.ndarray
    req_args: tuple
    slot_args: tuple
    order: np.ndarray
    lookup: tuple  # (phk, phv, tk): the replay's hash tables (closed loop)
    hitk: np.ndarray
    adm: np.ndarray
    I: np.ndarray
    F: np.ndarray
    src: np.ndarray
    N: int
    #: run the steps as Python while the compiled scheduler is cold (a small lowering:
    #: :func:`kvsim.jit.disk_cache.setup_func`)
    python: bool = False

    def step(self) -> int:
        """Advance until ``ip[P_FLUSH]`` rows are buffered at a step boundary; rows in
        ``I[:, :n]``, ``F[:, :n]``; returns ``n``."""
        from kvsim.jit.disk_cache import setup_func

        run_steps = setup_func(S.run_steps, self.python)
        self.I, self.F, n = run_steps(self.ip, self.fp, self.st, self.stf, *self.req_args,
                                      *self.slot_args, self.order, *self.lookup, self.hitk,
                                      self.adm, self.I, self.F, 0)
        return n


#: (id of a request column, dtype) -> (weak reference to it, it converted): the
#: conversions :func:`new_schedule` makes, made once while the column lives (the replicas
#: of a cluster read the same table; the scheduler never writes these columns)
_CONVERTED: dict[tuple, tuple] = {}


def as_writable(x, dtype) -> np.ndarray:
    """``x`` as a writable contiguous array of ``dtype``: ``x`` itself when it is one, else
    one copy shared by every schedule built from this ``x`` (8 bytes a request per replica
    saved per converted column).  A read-only column (a Parquet table's, a constant
    column) is copied too: numba types a read-only array apart, so passing it as it is
    compiled the scheduler's step and vLLM's rows once more for each mix of read-only and
    writable columns a run happened to get (5 specialisations of ``vllm_rows``, ~12 CPU-s
    each, in the default tests)."""
    x = np.asarray(x)
    dt = np.dtype(dtype)
    if x.dtype == dt and x.flags.c_contiguous and x.flags.writeable:
        return x
    key = (id(x), dt.str)
    hit = _CONVERTED.get(key)
    if hit is not None and hit[0]() is x:
        return hit[1]
    # writable, C-contiguous: the type the scheduler compiled for; per request: in the
    # run's row store when one is current (kvsim.core.row_store)
    out = row_store.copy(np.array(x, dtype=dt))
    _CONVERTED[key] = (weakref.ref(x, lambda _r, k=key: _CONVERTED.pop(k, None)), out)
    return out


_NO_TABLE = np.zeros(2, dtype=np.int64)
# no pool: an empty prefix index, as keys and values views of one interleaved array like
# the closed loop's (kvsim.memory.fast.index_keys_values), so the scheduler's step compiles
# for one signature whichever it gets
_NO_LOOKUP = (*index_keys_values(new_index(2)), _NO_TABLE)


def new_schedule(cols: dict, off: np.ndarray, ids: np.ndarray, trace_block_tokens: int, cfg,
                 cost, ngpu: int, wmark: int, flush_rows: int, *, closed: bool = False,
                 priority_scheduling: bool = False, order: np.ndarray | None = None,
                 ) -> Schedule:
    """The scheduler of ``cfg`` (:class:`kvsim.engine.engine_model.EngineConfig`) over the
    Request-table columns ``cols`` (name -> numpy array,
    :meth:`kvsim.ingest.requests.RequestTable.columns`; ``off``/``ids``: its block ids as CSR), with a KV budget
    of ``ngpu`` blocks.  ``order``: the rows this engine serves (default all; a cluster
    replica starts empty and its router appends)."""
    from kvsim.jit.disk_cache import seal_all

    seal_all()  # before the scheduler's first compile: one signature each, sealed stamps
    N = len(cols["arrival_us"])
    a = cols
    i64 = lambda x: as_writable(x, np.int64)  # noqa: E731
    arr, prompt, out = i64(a["arrival_us"]), i64(a["prompt_tokens"]), i64(a["output_tokens"])
    nsamp, beam = i64(a["n"]), i64(a["beam_width"])
    fork_children = np.maximum(nsamp, beam) - 1
    prunes = np.where(beam > 1, out // cfg.beam_prune_interval_steps + 1, 0)
    C = N + int(fork_children.sum()) + int(prunes.sum()) + 1
    ip = np.zeros(S.NUM_INT_PARAMS, dtype=np.int64)
    ip[S.P_B], ip[S.P_T] = cfg.block_size_tokens, trace_block_tokens
    ip[S.P_MAXSEQ], ip[S.P_MAXTOK] = cfg.max_num_seqs, cfg.max_num_batched_tokens
    ip[S.P_FLUSH], ip[S.P_CRITPRIO] = flush_rows, cfg.critical_request_priority
    ip[S.P_CRITTPOT], ip[S.P_BEAMINT] = cfg.critical_tpot_us, cfg.beam_prune_interval_steps
    ip[S.P_SEED], ip[S.P_N] = cfg.seed, N
    ip[S.P_NGPU], ip[S.P_WMARK] = ngpu, wmark
    ip[S.P_CLOSED], ip[S.P_PRIOSCHED] = int(closed), int(priority_scheduling)
    st = np.zeros(S.NUM_STATE, dtype=np.int64)
    st[S.S_NEXTSLOT] = N
    st[S.S_HEADC] = -1
    if order is None:  # every row in arrival order: position = row (kvsim.core.row_store)
        order = row_store.copy(np.arange(N, dtype=np.int64))
        st[S.S_QN] = N
    else:
        order = np.ascontiguousarray(order, dtype=np.int64)
        st[S.S_QN] = 0
    stf = np.zeros(1, dtype=np.float64)
    slot = lambda fill=0: np.full(C, fill, dtype=np.int64)  # noqa: E731
    src, par = slot(-1), slot(-1)
    computed, gen, nblk, lasth, status = slot(), slot(), slot(), slot(), slot()
    first_us, dsteps, forked, blast, cow = slot(-1), slot(), slot(), slot(-1), slot()
    run, run2, fin = slot(), slot(), slot()
    nkey, priv, stall = slot(), slot(), slot(-1)
    B = cfg.block_size_tokens
    nb_prompt = (prompt + B - 1) // B
    max_nb = int(nb_prompt.max()) if N else 1
    hb, hb2 = np.zeros(max_nb, np.int64), np.zeros(max_nb, np.int64)
    # held keys <= min(budget, all prompt blocks); load factor <= 1/2
    keys = min(ngpu, int(nb_prompt.sum())) + 1
    rk = np.zeros(1 << int(2 * keys - 1).bit_length(), np.int64)
    rv = np.zeros_like(rk)
    req_args = (arr, prompt, out, i64(a["ttft_deadline_us"]), i64(a["tpot_deadline_us"]),
                nsamp, beam, i64(a["request_priority"]), as_writable(a["session_continues"], np.bool_),
                i64(a["next_turn_gap_us"]), i64(a["shared_prefix_tokens"]),
                i64(a["spec_draft_tokens"]),
                as_writable(a["spec_accept_prob"], np.float64),
                i64(a["hashed_tokens"]), i64(off), i64(ids))
    slot_args = (src, par, computed, gen, nblk, lasth, status, first_us, dsteps, forked, blast,
                 cow, run, run2, fin, nkey, priv, stall, hb, hb2, rk, rv)
    I = np.empty((S.NUM_INT_COLUMNS, flush_rows + 4096), dtype=np.int64)
    F = np.empty((2, flush_rows + 4096), dtype=np.float64)
    return Schedule(ip=ip, fp=cost.as_array(), st=st, stf=stf, req_args=req_args,
                    slot_args=slot_args, order=order, lookup=_NO_LOOKUP, hitk=row_store.zeros(C, np.int64),
                    adm=slot(), I=I, F=F, src=src, N=N)
