"""The replay driver: ``simulate`` (one policy) and ``compare`` (many), the Python API
under ``kvsim simulate`` and ``kvsim compare``.

It opens the event file, sizes the tiers from the hardware profile, builds the state of
the compiled core (:mod:`kvsim.replay.kernel.core`), streams the trace through it batch by batch
(growing or flushing buffers when the core asks), and turns the counters into metrics
(:mod:`kvsim.replay.metrics`).

Streaming: memory grows with resident blocks and live requests; per-request and per-step
results are kept in bounded memory (:mod:`kvsim.replay.slots`, :mod:`kvsim.core.spill`).  Per row, the pre-pass
(:func:`kvsim.replay.prepass.scan_trace`) keeps one bit per ALLOCATE row (the recompute
metric's ``seen`` flag; the set of distinct content hashes it needs lives only during the
pre-pass).  One documented exception: an offline policy (Belady) reads ``next_use``, 8
bytes per ALLOCATE row for the whole trace (:func:`kvsim.replay.prepass.offline_next_use`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.core import layout as L
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import EventKind
from kvsim.core.spill import SpilledRows
from kvsim.engine.cost_model import GB, TierCosts, cost_array, hbm_kv_capacity_bytes, tier_costs
from kvsim.events.seen_set import SeenSet
from kvsim.jit.uncounted_call import call_uncounted
from kvsim.memory import fast as mem
from kvsim.memory.pool_ref import pool_arg
from kvsim.policy.hooks import is_uniform, tier_ref, view_ref
from kvsim.policy.registry import resolve_policy, resolve_tier_policy
from kvsim.replay.kernel import core
from kvsim.replay.kernel.bookkeeping import pack_records
from kvsim.replay.kernel.core_ref import CoreState, core_arg
from kvsim.replay.kernel.tiers import new_record_view, record_rows
from kvsim.replay.lower_tiers import (
    TierPrefault,
    _is_lru,
    _lower_slots,
    _lower_table,
    _lower_tier,
    _lru_mask,
)
from kvsim.replay.metrics import RequestLog, StepLog, summarize
from kvsim.replay.prepass import (
    SCAN_COLUMNS,
    BufferRelease,
    TraceFacts,
    _open,
    full_hashes,
    offline_next_use,
    release_read_buffers,
    scan_trace,
)
from kvsim.replay.slots import RequestSlots
from kvsim.replay.variants import (
    compiled_is_cached,
    core_for,
    core_is_warm,
    interpreted,
    is_compiled,
    policy_value,
    run_cols,
)
from kvsim.spec.sim_config import LOWER_TIERS, SimConfig, resolve_engine


class _Lazy:
    """A table field of :class:`SimResult`: a DataFrame, or a
    :class:`kvsim.replay.metrics.StepLog` / :class:`~kvsim.replay.metrics.RequestLog` (a
    replay's per-step and per-request results as kept in bounded memory or as the core's
    tables) turned into its DataFrame on first access, so that a run whose tables nobody
    reads never holds them as DataFrames."""

    def __set_name__(self, owner, name: str) -> None:
        self.attr = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            raise AttributeError("no default")  # dataclasses: the field has no default
        v = obj.__dict__[self.attr]
        if isinstance(v, (StepLog, RequestLog)):
            v = obj.__dict__[self.attr] = v.frame()
        return v

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.attr] = value


@dataclass
class SimResult:
    """The outcome of one replay.  ``summary`` has the stable keys of docs/simulate.md.
    ``requests`` and ``steps`` (one row per request, per engine step) are built when first
    read."""

    policy: str
    offline: bool
    summary: dict
    requests: pandas.DataFrame = _Lazy()  # noqa: F821 (pandas: imported when built)
    steps: pandas.DataFrame = _Lazy()  # noqa: F821
    config: dict
    trace: str
    tiers: list[TierCosts] = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # with SimConfig(check_invariants=True)


def choose_engine(engine: str, num_rows: int, policy, lower_policies) -> str:
    """The engine a replay runs on: :func:`kvsim.spec.sim_config.resolve_engine` (warm:
    :func:`kvsim.replay.variants.compiled_is_cached`; the core alone: ``core_is_warm``)."""
    return resolve_engine(engine, num_rows, 1, lambda: compiled_is_cached(policy, lower_policies),
                          lambda: core_is_warm(policy, lower_policies))


#: Rows of the block-record arena at the start, and the least room a compaction leaves
#: above twice the live records (it grows by doubling: :meth:`_Run._compact_arena`).
ARENA_ROWS = 1 << 16
ARENA_SLACK_ROWS = 1 << 12


def resolve_tiers(config: SimConfig, header, facts: TraceFacts) -> tuple[int, list[TierCosts]]:
    """(block bytes, per-tier costs) from the config, the header and the hardware."""
    from kvsim.spec.hardware import load_hardware

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
        from kvsim.spec.models import load_model

        weights = load_model(model_name).weights_bytes
        hbm_blocks = hbm_kv_capacity_bytes(hw.gpu_memory_bytes, weights,
                                           config.gpu_memory_utilization) // block_bytes
    if hbm_blocks < 1:
        raise KvsimInputError(f"HBM holds no KV block ({block_bytes} bytes each) after the "
                              "model weights; expected a larger GPU or --hbm-gb", None, None,
                              "hbm_gb")
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
        quotas = config.quota_params()
        if quotas:  # per-tenant quotas (quota_lru): every tier's policy learns its tier
            params["tenant_quotas"] = quotas
        lower = [resolve_tier_policy(config.tier_policy(t), t) for t in LOWER_TIERS]
        self.lower_policies = lower
        core_mod = core_for(policy, lower, choose_engine(config.engine, facts.num_rows,
                                                         policy, lower))
        hbm_blocks = costs[0].capacity_blocks
        max_blocks = max(facts.max_blocks_per_request, 1) + 1
        pcfg = mem.PoolConfig(num_blocks=hbm_blocks + 1, block_size_tokens=bs,
                              max_seqs=facts.max_concurrent_requests + 8,
                              max_blocks_per_seq=max_blocks, block_bytes=block_bytes)
        self.st = mem.new_state(pcfg)
        self.view = new_record_view(hbm_blocks + 1)  # one row per block (kvsim.replay.kernel.tiers)
        hbm_state = policy.init(hbm_blocks, hbm_blocks + 1,
                                dict(params, tier="hbm") if quotas else dict(params))
        caps = [costs[t + 1].capacity_blocks for t in range(3)]
        # slots: at most one per distinct hash (kvsim.replay.lower_tiers)
        most = facts.num_allocs if facts.max_distinct_hashes < 0 else min(
            facts.num_allocs, facts.max_distinct_hashes)
        table = _lower_table(sum(_lower_slots(min(c, facts.num_allocs), most) for c in caps))
        tiers = [_lower_tier(t + 1, caps[t], lower[t],
                             dict(params, tier=LOWER_TIERS[t]) if quotas else params,
                             facts.num_allocs, table, most)
                 for t in range(3)]
        if is_compiled(core_mod):
            odd = [p for p, s in zip([policy, *lower], [hbm_state] + [T[4] for T in tiers])
                   if not is_uniform(s)]
            if odd:  # njit hooks over a state of the old tuple form: run it interpreted
                warnings.warn(f"policy {odd[0].name!r}: init() does not return a "
                              "kvsim.policy.api.PolicyState, so the replay runs interpreted "
                              "(docs/policies.md, 'Compiled policies')", stacklevel=2)
                core_mod = interpreted()
        self.core = core_mod
        # runners-up per eviction: only the decision log reads them (fast.new_out)
        kc = config.log_candidates if log_writer is not None else 0
        self.out = self.core.mem.new_out(pcfg, kc)
        self.pst = policy_value(policy, hbm_state, core_mod)
        # compiled code takes each view as one pointer (kvsim.policy.hooks.ViewRef, same
        # arrays); Python code (check(), the interpreted twin) keeps the BlockViews
        vr = view_ref if is_compiled(core_mod) else (lambda v: v)
        self.views = (self.view,) + tuple(T[3] for T in tiers)  # BlockViews, for Python
        self.view = vr(self.view)
        self.T = [T._replace(L_view=vr(T.L_view), L_ps=policy_value(pol, T.L_ps, core_mod))
                  for T, pol in zip(tiers, lower)]
        # compiled code takes each tier as one pointer (kvsim.policy.hooks.TierRef)
        self.T_core = [tier_ref(T) for T in self.T] if is_compiled(core_mod) else self.T
        # and the HBM pool as one pointer (kvsim.memory.pool_ref.PoolRef, same arrays)
        self.st_core = pool_arg(self.st, is_compiled(core_mod))
        K = np.zeros(L.NK, dtype=np.int64)
        K[L.K_WRITE_POLICY] = {"write_back": L.WP_WRITE_BACK,
                               "write_through": L.WP_WRITE_THROUGH,
                               "write_through_selective": L.WP_WRITE_THROUGH_SELECTIVE,
                               "vllm_offload": L.WP_VLLM_OFFLOAD}[
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
        K[L.K_LINK_QUEUE] = int(config.link_model == "queue")
        K[L.K_LOWER_LRU] = _lru_mask(lower)  # kvsim.replay.kernel.spill: lists run inline
        self.st.cfg[mem.F_LRU] = int(_is_lru(policy))  # and kvsim.memory.pool_ops
        self.K = K
        self.X = cost_array(costs)
        self.C = np.zeros(L.NC, dtype=np.float64)
        self.C[L.C_PEND_ADMIT] = -1
        self.C[L.C_STEP] = -1
        self.Cw = np.zeros(L.NC, dtype=np.float64)
        # request slots (kvsim.replay.slots): recycled when no row names a finished request
        self.slots = RequestSlots(facts.max_request_id, facts.ids_final)
        self.R_i, self.R_f = L.new_request_tables(max(facts.max_request_id + 1, 1) if not
                                                  facts.ids_final else 256)
        self.A_i = np.zeros((ARENA_ROWS, L.NAI), dtype=np.int64)
        self.A_f = np.zeros(ARENA_ROWS, dtype=np.float64)
        self.H_i = np.zeros((hbm_blocks + 1, L.NHI), dtype=np.int64)
        self.hbuf = np.zeros(max_blocks, dtype=np.int64)
        self.scr = np.zeros((2, max_blocks), dtype=np.int64)
        # the cascade's scratch rows: a record view too (a victim copied by rows: tiers.copy_row)
        self.TMP_view = new_record_view(4)
        self.TMP = vr(self.TMP_view)
        # the views' rows (kvsim.replay.kernel.tiers.record_rows: the same memory, never regrown)
        h_rows, l1_rows, l2_rows, l3_rows = (record_rows(v) for v in self.views)
        self.rows = {"H_rows": h_rows, "TMP_rows": record_rows(self.TMP_view),
                     "L1_rows": l1_rows, "L2_rows": l2_rows, "L3_rows": l3_rows}
        self.TMP_i = np.zeros((4, 3), dtype=np.int64)
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
        self.step_rows = SpilledRows(L.NS)  # the per-step table, bounded (core/spill.py)
        self.last_batch: tuple | None = None
        self.block_tokens = bs
        # seen flags: 1 bit per ALLOCATE row from the pre-pass, else a set kept here
        self.seen = SeenSet() if facts.seen_bits is None else None
        self.alloc_base = 0  # ALLOCATE rows replayed before the current batch
        self.no_next = np.zeros(0, dtype=np.int64)
        self.no_seen = np.zeros(0, dtype=np.int8)
        self._core_value: tuple | None = None  # (CoreState, what core.run took): core_value

    # -- buffer plumbing ------------------------------------------------------------------
    def _flush_steps(self) -> None:
        k = int(self.C[L.C_NSTEP_BUF])
        if k:
            self.step_rows.append(self.S[:k])
            self.C[L.C_NSTEP_BUF] = 0

    def _flush_log(self) -> None:
        k = int(self.C[L.C_NLOG])
        if k and self.log_writer is not None:
            self.slots.translate_log(self.G, k)  # slots -> request ids
            self.log_writer.write_buffer(self.G, k)
        self.slots.log_mark = 0
        self.C[L.C_NLOG] = 0
        need = int(16 * self.C[L.C_MAX_BT] + 8192)
        # no log (K_LOG 0): the core writes no row, its one-row buffer is never grown
        # (~25 MB a replica at the Mooncake trace's batch, issue 38)
        if self.log_writer is not None and self.G[0].shape[0] < need:
            kc = self.G[2].shape[1]
            self.G = (np.zeros((need, L.NGI), dtype=np.int64), np.zeros((need, L.NGF)),
                      np.zeros((need, kc, L.NCI), dtype=np.int64), np.zeros((need, kc, L.NCF)))

    def _grow_pending(self) -> None:
        if self.C[L.C_NPEND] >= self.P.shape[0]:
            self.P = L.grow_rows(self.P, 2 * self.P.shape[0])
        if self.C[L.C_NRUN] >= self.running.shape[0] - 1:
            self.running = L.grow_rows(self.running, 2 * self.running.shape[0])

    def _compact_arena(self) -> None:
        """Pack the block records of live requests at the arena start; grow if needed.

        In place when the arena is big enough (every compaction of the Mooncake 16-token
        import: 131 of them), into new arrays only when it grows: a fresh arena of 262,144
        rows is 31 MiB of new pages for the core to fault in, ~4 GiB over that replay.
        The rows above the packed ones are left as they are: the core writes every field
        of a record before it reads it (the ALLOCATE row, a fork's copy, _grow_records)."""
        R_i = self.R_i
        live = np.flatnonzero((R_i[:, L.RI_STATE] == L.RS_RUNNING) |
                              (R_i[:, L.RI_STATE] == L.RS_PREEMPTED) |
                              (R_i[:, L.RI_OFF_PEND] != 0))  # vllm_offload: re-rank next step
        live = live[np.argsort(R_i[live, L.RI_BT_START], kind="stable")]
        caps = R_i[live, L.RI_BT_CAP]
        used = int(caps.sum())
        size = self.A_i.shape[0]
        need = int(self.C[L.C_ARENA_NEED])  # what the core asked room for
        while size < max(2 * used + 4 * int(caps.max(initial=0)) + ARENA_SLACK_ROWS,
                         used + need):
            size *= 2
        if size == self.A_i.shape[0]:
            new_i, new_f = self.A_i, self.A_f
        else:
            new_i = np.zeros((size, L.NAI), dtype=np.int64)
            new_f = np.zeros(size, dtype=np.float64)
        if len(live):  # row by row, compiled (kvsim.replay.kernel.bookkeeping)
            pack_records(self.A_i, self.A_f, new_i, new_f, R_i, live.astype(np.int64),
                         new_i is self.A_i)
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
    def core_state(self, next_use: np.ndarray, seen: np.ndarray) -> CoreState:
        """The core's state as it is now (:class:`kvsim.replay.kernel.core_ref.CoreState`: this
        run's current arrays, not copies), with the batch's ``next_use`` and ``seen``."""
        T1, T2, T3 = self.T_core
        return CoreState(K=self.K, X=self.X, C=self.C, Cw=self.Cw, R_i=self.R_i, R_f=self.R_f,
                         A_i=self.A_i, A_f=self.A_f, H_i=self.H_i, st=self.st_core,
                         out=self.out, hbuf=self.hbuf, scr=self.scr, pst=self.pst,
                         H_view=self.view, T1=T1, T2=T2, T3=T3, TMP=self.TMP, TMP_i=self.TMP_i,
                         G=self.G, S=self.S, P=self.P, running=self.running,
                         next_use=next_use, seen=seen, alt_b=self.alt_b, alt_s=self.alt_s,
                         vo=self.vo, **self.rows)

    def core_value(self, next_use: np.ndarray, seen: np.ndarray):
        """What ``core.run`` takes as its state: :meth:`core_state` as one
        :class:`kvsim.replay.kernel.core_ref.CoreRef` (compiled) or as it is (interpreted).
        Made again when any member is another array than the last one's (a buffer grown or
        replaced, a new batch's ``next_use`` and ``seen``), else the last one is passed
        again: a CoreRef costs ~1 ms to make (34 members boxed), and the core is re-entered
        after most buffer flushes with the same arrays (126 of the 178 calls of the
        Mooncake 16-token replay)."""
        cs = self.core_state(next_use, seen)
        last = self._core_value
        if last is not None and all(a is b for a, b in zip(cs.members(), last[0].members())):
            return last[1]
        value = core_arg(cs, is_compiled(self.core))
        self._core_value = (cs, value)  # cs keeps the members alive: no id is reused
        return value

    def feed(self, cols: dict) -> None:
        cols = self.slots.mapped(cols)  # request ids -> slots of the request tables
        batch = run_cols(tuple(cols[name] for name in core.COLS))  # one type of run
        n = len(batch[0])
        if n == 0:
            return
        self.last_batch = batch  # finish() passes it again: same types, same compiled run
        self._grow_requests(int(max(cols["request_id"].max(), cols["parent_request_id"].max())))
        # The core reads seen[o] and next_use[o] at ALLOCATE ordinal o = C[C_ALLOC_ORD]; it is
        # run with batch-local arrays and ordinals (C_ALLOC_ORD counts from 0 in each batch),
        # so no whole-trace array is needed.  next_use values stay global ordinals.
        base = self.alloc_base
        if self.seen is not None:
            seen = self.seen.mark(full_hashes(cols, self.block_tokens))
            m = seen.shape[0]
        else:  # the pre-pass's bits: only the batch's count of ALLOCATE rows is needed
            m = int(np.count_nonzero(cols["kind"] == EventKind.ALLOCATE))
            seen = self.facts.seen_at(base, m)
        next_use = self.facts.next_use[base:base + m] if self.policy.offline else self.no_next
        self.C[L.C_ALLOC_ORD] = 0
        i = 0
        while True:
            cr = self.core_value(next_use, seen)  # again after a buffer was grown
            with np.errstate(over="ignore"):  # hash mixing wraps by design (interpreted)
                status, i = call_uncounted(self.core.run, batch, i, n, cr)
            if status == core.ST_DONE:
                if int(self.C[L.C_ALLOC_ORD]) != m:
                    raise RuntimeError(f"the core replayed {int(self.C[L.C_ALLOC_ORD])} "
                                       f"ALLOCATE rows of a batch holding {m}")
                self.alloc_base = base + m
                self.C[L.C_ALLOC_ORD] = self.alloc_base
                self.slots.release(self)  # finished requests folded, their slots freed
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
                call_uncounted(self.core.run, self.last_batch, -1, 0,
                               self.core_value(self.no_next, self.no_seen))
        self._flush_steps()
        self._flush_log()

    def check(self) -> dict:
        """Invariants after the replay: the HBM pool's (kvsim.memory.fast.pool_check), each
        lower tier's (kvsim.replay.kernel.tiers.check_tier), and no tier above its capacity."""
        from kvsim.replay.kernel.tiers import check_tier

        code = int(self.core.mem.pool_check(self.st_core))
        out = {"pool_check": code, "pool_ok": code == 0}
        for T, v in zip(self.T, self.views[1:]):
            check_tier(T[:3] + (v, 0) + T[5:])  # the BlockView; the policy value (T[4]) is
            # not checked here, and the interpreted engine's (Python functions) has no type
        cap = [self.st.cfg[mem.F_NUM_BLOCKS] - 1] + [int(T[5][L.LM_CAP]) for T in self.T]
        out["peak_within_capacity"] = all(self.C[L.C_PEAK + t] <= cap[t] for t in range(4))
        out["held_blocks"] = int(self.st.sc[mem.S_N_HELD])
        out["running"] = int(self.C[L.C_NRUN])
        return out

    def steps(self) -> np.ndarray:
        """The per-step table as one array (memory grows with steps: the closed loop's
        serving metrics)."""
        return self.step_rows.to_array()


def _describe(config: SimConfig, costs: list[TierCosts], block_bytes: int) -> dict:
    d = config.to_dict()
    d["block_bytes"] = block_bytes
    for c in costs:
        d[f"{c.name}_capacity_blocks"] = c.capacity_blocks
    return d


def replay(trace_path: str | Path, policy, config: SimConfig,
           decision_log: str | Path | None = None, *, facts: TraceFacts | None = None,
           on_progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Replay the event file ``trace_path`` as recorded (its steps, open loop) under HBM
    policy ``policy`` (a name, a ``.py`` file or a :class:`kvsim.policy.registry.Policy`).
    Writes the decision log to ``decision_log`` (Parquet) when given.  Same inputs =>
    identical result.  Which run a :class:`SimConfig` asks for (cache mode, live offload,
    the offline bound, this replay) is decided by :func:`kvsim.modes.dispatch.simulate`."""
    pol = resolve_policy(policy)
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
    from kvsim.replay.link_metrics import link_summary

    summary.update(link_summary([ex.run], [float(ex.run.C[L.C_CLOCK_US])], measured=measured))
    summary["timing_model"] = ex.config.get("timing_model")  # who timed those steps
    if config.tenant_metrics:
        from kvsim.results.tenant_view import tenant_table

        summary["tenant_rows"] = tenant_table(ex.requests.frame(),
                                              warmup).to_dict("records")
    return SimResult(pol.name, bool(pol.offline), summary, ex.requests, ex.steps,
                     ex.config, str(trace_path), ex.costs, ex.checks)


def recorded_timing_model(header) -> str | None:
    """The step-time model that timed an event file's STEP rows: its header's
    ``source.engine.timing_model`` (kvsim.engine.lowering); ``roofline`` for a file
    lowered by kvsim before the model was recorded (the only one then); None when kvsim's
    engine did not lower it (a translated kvmi file, a recording)."""
    engine = (getattr(header, "source", None) or {}).get("engine")
    if not isinstance(engine, dict):
        return None
    return str(engine.get("timing_model", "roofline"))


@dataclass
class Execution:
    """A finished replay before its summary: the core's state and the tables."""

    run: _Run
    facts: TraceFacts
    steps: StepLog  # SimResult.steps builds its DataFrame when read
    requests: RequestLog  # and SimResult.requests
    costs: list[TierCosts]
    config: dict
    block_size_tokens: int
    checks: dict


def execute(trace_path: str | Path, pol, config: SimConfig,
            decision_log: str | Path | None = None, facts: TraceFacts | None = None,
            on_progress: Callable[[int, int], None] | None = None) -> Execution:
    """Stream ``trace_path`` through the replay core under policy ``pol`` (resolved).  On
    the interpreted engine (picked from the file's row count when its format gives it up
    front: Parquet), the pre-pass and the id maps run as Python while their compiled code
    is cold (:func:`kvsim.jit.disk_cache.python_while_cold`): a small first run compiles
    nothing for them."""
    from kvsim.jit.disk_cache import python_while_cold

    with _open(trace_path) as reader:
        header, rows = reader.header, reader.num_rows
    lower = [resolve_tier_policy(config.tier_policy(t), t) for t in LOWER_TIERS]
    python = rows is not None and choose_engine(config.engine, rows, pol, lower) == "interpreted"
    with python_while_cold(python):
        return _execute(trace_path, header, pol, config, decision_log, facts, on_progress)


def _execute(trace_path, header, pol, config: SimConfig, decision_log, facts,
             on_progress) -> Execution:
    """:func:`execute` on the file's ``header``."""
    from kvsim.results.decision_log import DecisionLogWriter

    bs = int(header.block_size_tokens)
    checked = SCAN_COLUMNS if facts is None else ()  # checked by this pre-pass: not again
    facts = facts or scan_trace(trace_path, bs, config.batch_rows, columns=SCAN_COLUMNS)
    if pol.offline and facts.next_use is None:  # kept on facts: later policies reuse it
        facts.next_use = offline_next_use(trace_path, bs, facts.num_allocs, config.batch_rows)
    block_bytes, costs = resolve_tiers(config, header, facts)
    cfg_dict = _describe(config, costs, block_bytes)
    cfg_dict["timing_model"] = recorded_timing_model(header)
    writer = None
    if decision_log is not None:
        reasons = [pol.reasons] + [resolve_tier_policy(config.tier_policy(t), t).reasons
                                   for t in LOWER_TIERS]
        writer = DecisionLogWriter(decision_log, policy=pol.name, trace=str(trace_path),
                                   config=cfg_dict, reasons_by_tier=reasons, why=core.WHY)
    done, prefault, buffers = 0, None, BufferRelease()
    reader = _open(trace_path)
    try:
        # the columns the core reads, the next batch while it (no GIL) replays this one,
        # the first while the replay is set up below (docs/benchmarks.md, "16-token replay:
        # the first batch read during the set-up")
        batches = reader.batches(config.batch_rows, read_ahead=True, columns=core.COLS,
                                 checked=checked)
        run = _Run(pol, config, header, facts, costs, block_bytes, writer)
        if is_compiled(run.core):  # the tiers' pages faulted in ahead, in a thread
            prefault = TierPrefault(run.T, run.views[1:])  # (lower_tiers.py)
        if writer is not None:
            writer.__enter__()
        for cols in batches:
            run.feed(cols)
            done += len(cols["kind"])
            del cols
            # buffers given back past a slack of resident growth (never: the peak drifts
            # up; after each batch: each faults them in again; prepass.BufferRelease)
            buffers.after_batch()
            if on_progress is not None:
                on_progress(done, facts.num_rows)
        reader.close()
        release_read_buffers()  # the pass's decoded batches, before the outputs (prepass.py)
        if prefault is not None:
            prefault.stop()
        run.finish()
        run.seen = None  # the outputs do not need it (when kept): freed before they are built
    except BaseException as exc:
        reader.close()
        if prefault is not None:
            prefault.stop()
        if writer is not None:
            writer.__exit__(type(exc), exc, exc.__traceback__)
        raise
    if writer is not None:
        writer.__exit__(None, None, None)
    checks = run.check() if config.check_invariants else {}
    steps = StepLog(run.step_rows, block_bytes)
    requests = RequestLog(run.slots.close(run))
    return Execution(run, facts, steps, requests, costs, cfg_dict, bs, checks)


__all__ = ["SimResult", "TraceFacts", "execute", "replay", "resolve_tiers", "scan_trace"]
