"""The replay driver: ``simulate`` (one policy) and ``compare`` (many), the Python API
under ``kvsim simulate`` and ``kvsim compare``.

It opens the event file, sizes the tiers from the hardware profile, builds the state of
the compiled core (:mod:`kvsim.sim.core`), streams the trace through it batch by batch
(growing or flushing buffers when the core asks), and turns the counters into metrics
(:mod:`kvsim.sim.metrics`).

Streaming: memory grows with resident blocks and live requests, plus one pre-pass result
kept for the whole trace (:class:`TraceFacts`: 9 bytes per ALLOCATE row for ``next_use`` and
``seen``, the documented exception that Belady's offline bound and the recompute metric
need), plus per-request and per-step results (the outputs themselves).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from kvsim.errors import KvsimInputError
from kvsim.memory import fast as mem
from kvsim.policy_api import NEVER, new_block_view
from kvsim.schema import EventKind
from kvsim.sim import core, layout as L
from kvsim.sim.config import LOWER_TIERS, SimConfig, resolve_engine
from kvsim.sim.variants import core_for
from kvsim.sim.cost_model import GB, TierCosts, cost_array, hbm_kv_capacity_bytes, tier_costs
from kvsim.sim.metrics import request_table, step_table, summarize


@dataclass
class TraceFacts:
    """What one pre-pass over the event file learns (shared by every policy of a compare)."""

    num_rows: int
    first_step: int
    last_step: int
    max_request_id: int
    max_blocks_per_request: int
    max_concurrent_requests: int
    max_size_bytes: int
    next_use: np.ndarray  # int64 per ALLOCATE ordinal: ordinal of the next ALLOCATE of
    #                       the same (full, hashed) content, NEVER if none
    seen: np.ndarray  # int8 per ALLOCATE ordinal: 1 if the content was allocated before
    #: request ids in arrival order: by the time of the request's ARRIVE row (or, without
    #: one, of its first ALLOCATE / ACCESS / FORK row), ties by request id
    arrival_order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: step of that row, per entry of ``arrival_order``
    arrival_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_requests(self) -> int:
        return int(len(self.arrival_order))

    def warmup_step(self, warmup: int) -> int:
        """The step the measurement window starts at: the arrival step of request number
        ``warmup`` in arrival order (-1 = no warm-up)."""
        if warmup <= 0 or warmup >= len(self.arrival_order):
            return -1
        return int(self.arrival_step[warmup])

    def measured_requests(self, warmup: int) -> np.ndarray:
        """Ids of the requests measured after ``warmup`` warm-up requests."""
        return self.arrival_order[max(int(warmup), 0):]


@dataclass
class SimResult:
    """The outcome of one replay.  ``summary`` has the stable keys of docs/simulate.md."""

    policy: str
    offline: bool
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    config: dict
    trace: str
    tiers: list[TierCosts] = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # with SimConfig(check_invariants=True)


def _open(path):
    from kvsim.events import open_events

    return open_events(path)


def scan_trace(trace_path: str | Path, block_size_tokens: int,
               batch_rows: int = 1 << 20) -> TraceFacts:
    """One streaming pass: sizes for the core's buffers, and next_use / seen per ALLOCATE
    row (computed at the end from the hashes of full blocks: O(ALLOCATE rows) memory)."""
    hashes: list[np.ndarray] = []
    num_rows = 0
    first_step = -1
    last_step = -1
    max_req = -1
    max_blocks = 0
    max_size = 0
    live = 0
    max_live = 0
    started = np.zeros(0, dtype=np.bool_)
    known = np.zeros(0, dtype=np.bool_)
    first_req: list[np.ndarray] = []
    first_time: list[np.ndarray] = []
    first_step_l: list[np.ndarray] = []
    with _open(trace_path) as reader:
        for cols in reader.batches(batch_rows):
            n = len(cols["kind"])
            if n == 0:
                continue
            num_rows += n
            kind = cols["kind"]
            req = cols["request_id"]
            if first_step < 0:
                first_step = int(cols["step"][0])
            last_step = int(cols["step"][-1])
            top = int(max(req.max(), cols["parent_request_id"].max()))
            max_req = max(max_req, top)
            if top >= len(started):
                grown = np.zeros(max(top + 1, 2 * len(started)), dtype=np.bool_)
                grown[: len(started)] = started
                started = grown
                grown = np.zeros(len(started), dtype=np.bool_)
                grown[: len(known)] = known
                known = grown
            # arrival: a request's ARRIVE row, else its first ALLOCATE/ACCESS/FORK row
            # (ARRIVE precedes the others of its request in a valid trace)
            enters = np.flatnonzero((kind == EventKind.ARRIVE) | (kind == EventKind.ALLOCATE)
                                    | (kind == EventKind.ACCESS) | (kind == EventKind.FORK))
            if len(enters):
                uniq, first = np.unique(req[enters], return_index=True)
                new = ~known[uniq]
                rows = enters[first[new]]
                known[uniq] = True
                first_req.append(req[rows].astype(np.int64))
                first_time.append(cols["time_us"][rows].astype(np.int64))
                first_step_l.append(cols["step"][rows].astype(np.int64))
            alloc = kind == EventKind.ALLOCATE
            if alloc.any():
                max_blocks = max(max_blocks, int(cols["block_index"][alloc].max()) + 1)
                max_size = max(max_size, int(cols["size_bytes"][alloc].max()))
                full = alloc & (cols["num_tokens"] == block_size_tokens)
                h = np.where(full, cols["content_hash"], 0)[alloc]
                hashes.append(h.astype(np.int64))
            # concurrency: +1 at a request's first ALLOCATE/ACCESS/FORK, -1 at its FREE
            opens = (kind == EventKind.ALLOCATE) | (kind == EventKind.ACCESS) | \
                (kind == EventKind.FORK)
            frees = (kind == EventKind.FREE) & (cols["block_index"] < 0)
            idx = np.flatnonzero(opens | frees)
            if len(idx):
                delta = np.zeros(len(idx), dtype=np.int64)
                r = req[idx]
                is_open = opens[idx]
                # first occurrence of each request in this batch among open rows
                o_idx = np.flatnonzero(is_open)
                if len(o_idx):
                    uniq, first = np.unique(r[o_idx], return_index=True)
                    new = ~started[uniq]
                    delta[o_idx[first[new]]] = 1
                    started[uniq] = True
                delta[~is_open] = -1
                run = live + np.cumsum(delta)
                max_live = max(max_live, int(run.max()))
                live = int(run[-1])
    allh = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.int64)
    m = len(allh)
    next_use = np.full(m, NEVER, dtype=np.int64)
    seen = np.zeros(m, dtype=np.int8)
    elig = np.flatnonzero(allh != 0)
    if len(elig):
        order = elig[np.argsort(allh[elig], kind="stable")]
        same = allh[order[1:]] == allh[order[:-1]]
        next_use[order[:-1][same]] = order[1:][same]
        seen[order[1:][same]] = 1
    if first_req:
        fr = np.concatenate(first_req)
        ft = np.concatenate(first_time)
        fs = np.concatenate(first_step_l)
        order = np.lexsort((fr, ft))
        arrival_order, arrival_step = fr[order], fs[order]
    else:
        arrival_order = arrival_step = np.zeros(0, np.int64)
    return TraceFacts(num_rows, max(first_step, 0), max(last_step, 0), max_req,
                      max_blocks, max(max_live, 1), max_size, next_use, seen,
                      arrival_order, arrival_step)


def _lower_tier(tier: int, cap: int, policy, params: dict, max_blocks: int):
    """Arrays of one lower tier.  A lower tier holds hashed blocks only, at most one slot per
    distinct hash, so it never needs more slots than the trace has ALLOCATE rows
    (``max_blocks``): a capacity above that can never bind, and sizing the arrays by it
    would cost gigabytes for a multi-TB NVMe tier of small blocks."""
    cap = min(cap, max(max_blocks, 1))
    slots = max(cap, 1)
    L_i = np.zeros((slots, L.NLI), dtype=np.int64)
    L_free = np.arange(slots - 1, -1, -1, dtype=np.int64)
    table = 1 << max(1, int(2 * slots - 1).bit_length())  # power of two >= 2 x slots
    L_hk = np.zeros(table, dtype=np.int64)
    L_hv = np.full(table, -1, dtype=np.int64)
    L_view = new_block_view(slots)
    L_ps = policy.init(max(cap, 1), slots, dict(params))
    Lm = np.array([tier, cap, cap, 0], dtype=np.int64)
    return (L_i, L_free, L_hk, L_view, L_ps, Lm, L_hv)


def _resolve_policy(policy):
    from kvsim.policy_registry import Policy, get_policy, load_policy_file

    if isinstance(policy, Policy):
        return policy
    text = str(policy)
    if text.endswith(".py"):
        return load_policy_file(text)
    return get_policy(text)


def resolve_tiers(config: SimConfig, header, facts: TraceFacts) -> tuple[int, list[TierCosts]]:
    """(block bytes, per-tier costs) from the config, the header and the hardware."""
    from kvsim.hardware import load_hardware

    hw = load_hardware(config.hardware)
    block_bytes = int(header.kv_bytes_per_token) * int(header.block_size_tokens)
    if block_bytes <= 0:
        block_bytes = facts.max_size_bytes
    if block_bytes <= 0:
        raise KvsimInputError("expected the header's kv_bytes_per_token or size_bytes on "
                              "ALLOCATE rows to size blocks", None, None, "size_bytes")
    hbm_blocks = config.explicit_hbm_blocks(block_bytes)
    if hbm_blocks is None:
        model_name = config.model or header.model
        if not model_name:
            raise KvsimInputError("the trace header names no model, so the HBM KV capacity "
                                  "(GPU memory - weights) is unknown; expected --model, "
                                  "--hbm-gb or --hbm-blocks", None, None, "model")
        from kvsim.models import load_model

        weights = load_model(model_name).weights_bytes
        hbm_blocks = hbm_kv_capacity_bytes(hw.gpu_memory_bytes, weights,
                                           config.gpu_memory_utilization) // block_bytes
    if hbm_blocks < 1:
        raise KvsimInputError(f"HBM holds no KV block ({block_bytes} bytes each) after the "
                              "model weights; expected a larger GPU or --hbm-gb", None, None,
                              "hbm")
    caps = {}
    for name in LOWER_TIERS:
        gb = getattr(config, f"{name}_gb")
        caps[f"{name}_bytes"] = None if gb is None else int(gb * GB)
    hw = hw.with_capacities(**caps)
    return block_bytes, tier_costs(hw, block_bytes, hbm_blocks)


class _Run:
    """All state of one replay (arrays for the compiled core) plus the buffer plumbing."""

    def __init__(self, policy, config: SimConfig, header, facts: TraceFacts,
                 costs: list[TierCosts], block_bytes: int, log_writer):
        self.policy = policy
        self.config = config
        self.facts = facts
        bs = int(header.block_size_tokens)
        params = {"seed": config.seed}
        lower = [_resolve_policy(config.tier_policy(t)) for t in LOWER_TIERS]
        self.lower_policies = lower
        self.core = core_for(policy, lower, resolve_engine(config.engine, facts.num_rows))
        hbm_blocks = costs[0].capacity_blocks
        max_blocks = max(facts.max_blocks_per_request, 1) + 1
        pcfg = mem.PoolConfig(num_blocks=hbm_blocks + 1, block_size_tokens=bs,
                              max_seqs=facts.max_concurrent_requests + 8,
                              max_blocks_per_seq=max_blocks, block_bytes=block_bytes)
        self.st = mem.new_state(pcfg)
        self.out = self.core.mem.new_out(pcfg)
        self.view = new_block_view(hbm_blocks + 1)
        self.pst = policy.init(hbm_blocks, hbm_blocks + 1, dict(params))
        self.T = [_lower_tier(t + 1, costs[t + 1].capacity_blocks, lower[t], params,
                              len(facts.next_use))
                  for t in range(3)]
        K = np.zeros(L.NK, dtype=np.int64)
        K[L.K_WRITE_POLICY] = {"write_back": L.WP_WRITE_BACK,
                               "write_through": L.WP_WRITE_THROUGH,
                               "write_through_selective": L.WP_WRITE_THROUGH_SELECTIVE}[
            config.write_policy]
        K[L.K_PREEMPT_SWAP] = int(config.preemption == "swap")
        K[L.K_PRIO_SCHED] = int(config.priority_scheduling)
        K[L.K_LOG] = int(log_writer is not None)
        K[L.K_PREFETCH] = int(config.prefetch)
        K[L.K_BLOCK_TOKENS] = bs
        K[L.K_OFFLINE] = int(policy.offline)
        # the window starts at the step the first measured request arrives in
        K[L.K_WARMUP_STEP] = facts.warmup_step(config.warmup_count(facts.num_requests))
        K[L.K_LOG_LIFECYCLE] = int(config.log_lifecycle)
        self.K = K
        self.X = cost_array(costs)
        self.C = np.zeros(L.NC, dtype=np.float64)
        self.C[L.C_PEND_ADMIT] = -1
        self.C[L.C_STEP] = -1
        self.Cw = np.zeros(L.NC, dtype=np.float64)
        self.R_i, self.R_f = L.new_request_tables(max(facts.max_request_id + 1, 1))
        self.A_i = np.zeros((1 << 16, L.NAI), dtype=np.int64)
        self.A_f = np.zeros(1 << 16, dtype=np.float64)
        self.H_i = np.zeros((hbm_blocks + 1, L.NHI), dtype=np.int64)
        self.hbuf = np.zeros(max_blocks, dtype=np.int64)
        self.scr = np.zeros((2, max_blocks), dtype=np.int64)
        self.TMP = new_block_view(4)
        self.TMP_i = np.zeros((4, 3), dtype=np.int64)
        kc = config.log_candidates if log_writer is not None else 0
        cap = (1 << 16) if log_writer is not None else 1
        self.G = (np.zeros((cap, L.NGI), dtype=np.int64), np.zeros((cap, L.NGF)),
                  np.zeros((cap, max(kc, 1), L.NCI), dtype=np.int64),
                  np.zeros((cap, max(kc, 1), L.NCF)))
        self.S = np.zeros((1 << 15, L.NS), dtype=np.float64)
        self.P = np.zeros((4096, 3), dtype=np.int64)
        self.running = np.zeros(facts.max_concurrent_requests + 64, dtype=np.int64)
        self.alt_b = np.zeros(kc, dtype=np.int64)
        self.alt_s = np.zeros(kc, dtype=np.float64)
        self.vo = np.zeros(4, dtype=np.int64)
        self.log_writer = log_writer
        self.step_chunks: list[np.ndarray] = []
        self.last_batch: tuple | None = None

    # -- buffer plumbing ------------------------------------------------------------------
    def _flush_steps(self) -> None:
        k = int(self.C[L.C_NSTEP_BUF])
        if k:
            self.step_chunks.append(self.S[:k].copy())
            self.C[L.C_NSTEP_BUF] = 0

    def _flush_log(self) -> None:
        k = int(self.C[L.C_NLOG])
        if k and self.log_writer is not None:
            self.log_writer.write_buffer(self.G, k)
        self.C[L.C_NLOG] = 0
        need = int(16 * self.C[L.C_MAX_BT] + 8192)
        if self.G[0].shape[0] < need:
            kc = self.G[2].shape[1]
            self.G = (np.zeros((need, L.NGI), dtype=np.int64), np.zeros((need, L.NGF)),
                      np.zeros((need, kc, L.NCI), dtype=np.int64), np.zeros((need, kc, L.NCF)))

    def _grow_pending(self) -> None:
        if self.C[L.C_NPEND] >= self.P.shape[0]:
            self.P = L.grow_rows(self.P, 2 * self.P.shape[0])
        if self.C[L.C_NRUN] >= self.running.shape[0] - 1:
            self.running = L.grow_rows(self.running, 2 * self.running.shape[0])

    def _compact_arena(self) -> None:
        """Pack the block records of live requests at the arena start; grow if needed."""
        R_i = self.R_i
        live = np.flatnonzero((R_i[:, L.RI_STATE] == L.RS_RUNNING) |
                              (R_i[:, L.RI_STATE] == L.RS_PREEMPTED))
        live = live[np.argsort(R_i[live, L.RI_BT_START], kind="stable")]
        caps = R_i[live, L.RI_BT_CAP]
        used = int(caps.sum())
        size = self.A_i.shape[0]
        while size < 2 * used + 4 * int(caps.max(initial=0)) + (1 << 12):
            size *= 2
        new_i = np.zeros((size, L.NAI), dtype=np.int64)
        new_f = np.zeros(size, dtype=np.float64)
        starts = np.concatenate(([0], np.cumsum(caps)[:-1])) if len(live) else caps
        if len(live):
            src = np.repeat(R_i[live, L.RI_BT_START] - starts, caps) + np.arange(used)
            new_i[:used] = self.A_i[src]
            new_f[:used] = self.A_f[src]
            R_i[live, L.RI_BT_START] = starts
        self.A_i, self.A_f = new_i, new_f
        self.C[L.C_ARENA_TOP] = used

    def _grow_requests(self, top: int) -> None:
        if top < self.R_i.shape[0]:
            return
        n = max(top + 1, 2 * self.R_i.shape[0])
        ri, rf = L.new_request_tables(n)
        ri[: self.R_i.shape[0]] = self.R_i
        rf[: self.R_f.shape[0]] = self.R_f
        self.R_i, self.R_f = ri, rf

    # -- the loop -------------------------------------------------------------------------
    def _args_tail(self):
        T1, T2, T3 = self.T
        return (T1, T2, T3, self.TMP, self.TMP_i, self.G, self.S, self.P, self.running)

    def feed(self, cols: dict) -> None:
        batch = tuple(cols[name] for name in core.COLS)
        n = len(batch[0])
        if n == 0:
            return
        self.last_batch = batch  # finish() passes it again: same types, same compiled run
        self._grow_requests(int(max(cols["request_id"].max(), cols["parent_request_id"].max())))
        i = 0
        while True:
            with np.errstate(over="ignore"):  # hash mixing wraps by design (interpreted)
                status, i = self.core.run(
                    batch, i, n, self.K, self.X, self.C, self.Cw, self.R_i, self.R_f,
                    self.A_i, self.A_f, self.H_i, self.st, self.out, self.hbuf, self.scr,
                    self.pst, self.view, *self._args_tail(), self.facts.next_use,
                    self.facts.seen, self.alt_b, self.alt_s, self.vo)
            if status == core.ST_DONE:
                return
            if status == core.ST_NEED_REQ:
                self._grow_requests(int(max(batch[3][i], batch[6][i])))
            elif status == core.ST_NEED_ARENA:
                self._compact_arena()
            elif status == core.ST_NEED_LOG:
                self._flush_log()
            elif status == core.ST_NEED_STEP:
                self._flush_steps()
            elif status == core.ST_NEED_PEND:
                self._grow_pending()

    def finish(self) -> None:
        if self.C[L.C_NSTEP_BUF] >= self.S.shape[0]:
            self._flush_steps()
        self._flush_log()
        if self.last_batch is not None:  # else no row was replayed: nothing to close
            with np.errstate(over="ignore"):  # run(i0=-1): end of trace (core.run)
                self.core.run(
                    self.last_batch, -1, 0, self.K, self.X, self.C, self.Cw, self.R_i,
                    self.R_f, self.A_i, self.A_f, self.H_i, self.st, self.out, self.hbuf,
                    self.scr, self.pst, self.view, *self._args_tail(), self.facts.next_use,
                    self.facts.seen, self.alt_b, self.alt_s, self.vo)
        self._flush_steps()
        self._flush_log()

    def check(self) -> dict:
        """Invariants after the replay: the HBM pool's (kvsim.memory.fast.pool_check), each
        lower tier's (kvsim.sim.tiers.check_tier), and no tier above its capacity."""
        from kvsim.sim.tiers import check_tier

        code = int(self.core.mem.pool_check(self.st))
        out = {"pool_check": code, "pool_ok": code == 0}
        for T in self.T:
            check_tier(T)
        cap = [self.st.cfg[mem.F_NUM_BLOCKS] - 1] + [int(T[5][L.LM_CAP]) for T in self.T]
        out["peak_within_capacity"] = all(self.C[L.C_PEAK + t] <= cap[t] for t in range(4))
        out["held_blocks"] = int(self.st.sc[mem.S_N_HELD])
        out["running"] = int(self.C[L.C_NRUN])
        return out

    def steps(self) -> np.ndarray:
        if not self.step_chunks:
            return np.zeros((0, L.NS))
        return np.concatenate(self.step_chunks)


def _describe(config: SimConfig, costs: list[TierCosts], block_bytes: int) -> dict:
    d = config.to_dict()
    d["block_bytes"] = block_bytes
    for c in costs:
        d[f"{c.name}_capacity_blocks"] = c.capacity_blocks
    return d


def simulate(trace_path: str | Path, policy, config: SimConfig | None = None,
             decision_log: str | Path | None = None, *, facts: TraceFacts | None = None,
             on_progress: Callable[[int, int], None] | None = None,
             lowering=None) -> SimResult:
    """Replay ``trace_path`` under HBM policy ``policy`` (a name, a ``.py`` file or a
    :class:`kvsim.policy_registry.Policy`).  Writes the decision log to ``decision_log``
    (Parquet) when given.  Same inputs => identical result.

    ``config.mode == "cache"``: the requests of the trace are replayed one at a time in
    arrival order (:func:`kvsim.sim.cache_mode.simulate_cache`; ``lowering`` is a
    :class:`kvsim.ingest.serial.CacheLowering` made once for many policies)."""
    config = config or SimConfig()
    if config.mode == "cache":
        from kvsim.sim.cache_mode import simulate_cache

        return simulate_cache(trace_path, policy, config, decision_log, lowering=lowering,
                              on_progress=on_progress)
    if policy == "optimal":  # the offline bound on this schedule (kvsim.sim.optimum)
        from kvsim.sim.optimum import engine_bound

        return engine_bound(trace_path, config, facts)
    pol = _resolve_policy(policy)
    ex = execute(trace_path, pol, config, decision_log, facts, on_progress)
    facts = ex.facts
    warm = ex.run.C[L.C_WARM_DONE] != 0
    warmup = config.warmup_count(facts.num_requests)
    measured = facts.measured_requests(warmup) if warmup > 0 else None
    summary = summarize(pol.name, pol.offline, ex.run.C, ex.run.Cw if warm else None,
                        measured, int(ex.run.K[L.K_WARMUP_STEP]), ex.steps, ex.requests,
                        ex.costs, facts.num_rows, block_size_tokens=ex.block_size_tokens,
                        mode=config.mode, warmup_requests=warmup)
    summary["schedule"] = "recorded"  # the event file's steps, replayed open loop
    return SimResult(pol.name, bool(pol.offline), summary, ex.requests, ex.steps,
                     ex.config, str(trace_path), ex.costs, ex.checks)


@dataclass
class Execution:
    """A finished replay before its summary: the core's state and the tables."""

    run: _Run
    facts: TraceFacts
    steps: pd.DataFrame
    requests: pd.DataFrame
    costs: list[TierCosts]
    config: dict
    block_size_tokens: int
    checks: dict


def execute(trace_path: str | Path, pol, config: SimConfig,
            decision_log: str | Path | None = None, facts: TraceFacts | None = None,
            on_progress: Callable[[int, int], None] | None = None) -> Execution:
    """Stream ``trace_path`` through the replay core under policy ``pol`` (resolved)."""
    from kvsim.results.decision_log import DecisionLogWriter

    with _open(trace_path) as reader:
        header = reader.header
    bs = int(header.block_size_tokens)
    if facts is None:
        facts = scan_trace(trace_path, bs, config.batch_rows)
    block_bytes, costs = resolve_tiers(config, header, facts)
    cfg_dict = _describe(config, costs, block_bytes)
    writer = None
    if decision_log is not None:
        reasons = [pol.reasons] + [_resolve_policy(config.tier_policy(t)).reasons
                                   for t in LOWER_TIERS]
        writer = DecisionLogWriter(decision_log, policy=pol.name, trace=str(trace_path),
                                   config=cfg_dict, reasons_by_tier=reasons,
                                   why=core.WHY)
    run = _Run(pol, config, header, facts, costs, block_bytes, writer)
    done = 0
    try:
        if writer is not None:
            writer.__enter__()
        with _open(trace_path) as reader:
            for cols in reader.batches(config.batch_rows):
                run.feed(cols)
                done += len(cols["kind"])
                if on_progress is not None:
                    on_progress(done, facts.num_rows)
        run.finish()
    except BaseException as exc:
        if writer is not None:
            writer.__exit__(type(exc), exc, exc.__traceback__)
        raise
    if writer is not None:
        writer.__exit__(None, None, None)
    checks = run.check() if config.check_invariants else {}
    steps = step_table(run.steps(), block_bytes)
    requests = request_table(run.R_i, run.R_f, facts.max_request_id + 1)
    return Execution(run, facts, steps, requests, costs, cfg_dict, bs, checks)


def compare(*args, **kwargs) -> pd.DataFrame:
    """:func:`kvsim.sim.comparison.compare` (kept here for callers of this module)."""
    from kvsim.sim.comparison import compare as _compare

    return _compare(*args, **kwargs)


def default_policies() -> list[str]:
    """:func:`kvsim.sim.comparison.default_policies`."""
    from kvsim.sim.comparison import default_policies as _default

    return _default()


__all__ = ["SimResult", "TraceFacts", "compare", "scan_trace", "simulate", "default_policies"]
