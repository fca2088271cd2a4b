"""The closed loop: the engine's scheduler runs inside the replay, step by step.

:func:`serve` takes a Request table (arrivals, prompts as block hashes, output lengths,
SLOs), not an event file.  Each engine step is decided by the continuous-batching
scheduler of :mod:`kvsim.engine.scheduler` (the same code the lowering runs) *on the replay's
memory state*, then replayed by the policy's core (:mod:`kvsim.replay.kernel.core`, unchanged) before
the next step is decided:

1. the scheduler admits a waiting request only when its blocks fit the KV budget (the HBM
   pool), and starts it with its cached prefix computed: the longest chain of its prompt
   blocks in the replay's HBM prefix index (:func:`kvsim.memory.fast.pool_lookup`'s rule),
   continued in DRAM, CXL and NVMe (vLLM v1's ``get_computed_blocks`` before
   ``allocate_slots``; LMCache / HiCache lookups below HBM).  Only the rest is prefill work,
   so the step's roofline time (``StepCostModel``, kvsim.engine.engine_model) counts only tokens
   actually computed;
2. the core places the step's rows (hits, promotions, evictions, preemptions, decision
   log exactly as in the open-loop replay).  A promotion adds its transfer time to the
   step (not overlapped with compute unless the transfer was hidden behind the request's
   queueing time: docs/cost-model.md, "What overlaps what"); a block the scheduler counted
   as cached but another admission of the same step evicted before the core placed it is
   recomputed in that step (its prefill time is added to the step);
3. the step's actual end (roofline + stalls + swap / preemption recompute) is the
   scheduler's clock for the next step, so shorter steps drain the queue faster.

With ``replicas > 1`` (:mod:`kvsim.modes.closed.cluster`) several such engines, each with its own
pool and lower tiers, serve one table behind a router.  Outputs say which schedule produced
them: ``summary["schedule"] == "closed"`` here, ``"recorded"`` for an event file replayed
open loop (:func:`kvsim.replay.driver.replay`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from kvsim.core import layout as L
from kvsim.core import row_store
from kvsim.core.errors import KvsimInputError
from kvsim.core.limits import check_planned_bytes
from kvsim.engine import scheduler as S
from kvsim.engine.cost_model import hbm_kv_capacity_bytes
from kvsim.engine.engine_model import EngineConfig, build_cost_model
from kvsim.engine.scheduler_state import as_writable, new_schedule
from kvsim.ingest.requests import RequestTable
from kvsim.memory.fast import index_keys_values
from kvsim.modes.closed.closed_slots import FIRST_ROWS, ClosedSlots, one_slot_each
from kvsim.modes.closed.scheduler_choice import (  # noqa: F401 (re-exported)
    SCHEDULERS,
    check_vllm_offload,
    resolve_scheduler,
    vllm_unsupported,
)
from kvsim.replay.kernel import closed_step as CS
from kvsim.replay.kernel.engine_ref import new_engine_ref
from kvsim.replay.variants import (
    TypedTuple,
    closed_for,
    core_run_ref,
    core_run_ref_type,
    core_run_value,
    python_kvsim,
    python_vllm,
)
from kvsim.results.step_records import StepRecords
from kvsim.spec.models.catalog import DEFAULT_MODEL
from kvsim.spec.sim_config import SimConfig

NEVER = np.iinfo(np.int64).max
#: Engine steps one compiled call of :meth:`Engine.advance` runs before it returns to Python
#: (``R_YIELD``; any other bound gives the same results): Ctrl-C and SIGTERM are served
#: only between compiled calls, so this bounds the compiled work a signal waits for (it was
#: 2^16, 16 times more; docs/benchmarks.md, "Ctrl-C latency").
YIELD_STEPS = 1 << 12


@dataclass(frozen=True)
class EngineOptions:
    """The serving engine of the closed loop (vLLM's scheduler limits)."""

    block_size_tokens: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_overhead_us: float | None = None
    model: str = DEFAULT_MODEL
    #: the step-time model (kvsim.engine.timing.select): auto, roofline, measured, a path
    timing: str | None = "auto"
    #: who decides each step: ``vllm`` (vLLM 0.33's scheduler, kvsim.engine.vllm_rows:
    #: recompute preemption, chunk-wise allocation), ``kvsim`` (kvsim.engine.scheduler) or
    #: ``auto`` (vllm unless the run needs what it does not model: :func:`resolve_scheduler`)
    scheduler: str = "auto"
    #: vLLM's ``long_prefill_token_threshold`` (0: none; scheduler ``vllm`` only)
    long_prefill_token_threshold: int = 0
    #: vLLM's ``scheduler_reserve_full_isl`` (scheduler ``vllm`` only)
    reserve_full_isl: bool = True
    #: vLLM's admission watermark, a fraction of the pool (None: the engine model's 0.01)
    watermark: float | None = None
    #: speculative decoding under vLLM's scheduler: the drafter's k KV slots reserved past
    #: the scheduled tokens (vLLM's num_lookahead_tokens: EAGLE, MTP, a draft model; False:
    #: n-gram, none).  k and the acceptance are the trace's spec_draft_tokens /
    #: spec_accept_prob (docs/simulate.md, "Speculative decoding under vLLM's scheduler")
    spec_lookahead: bool = False
    #: the drafter as vLLM sizes the KV cache (kvsim.spec.models.with_speculative): ``none``
    #: / ``ngram``, or ``mtp``: the model's MTP layers hold KV too (fewer blocks) and, as
    #: vLLM's MTP drafter, reserve the k lookahead slots (``spec_lookahead`` implied)
    spec_method: str = "none"
    #: the hybrid pool (kvsim.modes.closed.hybrid_serve): auto (a model with several layer
    #: groups is served through vLLM's per-group pool), on, off (every layer alike)
    hybrid_pool: str = "auto"

    def __post_init__(self):
        if self.spec_method == "mtp":
            object.__setattr__(self, "spec_lookahead", True)

    def identity(self) -> dict:
        """The options as a dict for keys and outputs; ``spec_lookahead`` and
        ``spec_method`` only when set, so every output without them is as before."""
        d = dataclasses.asdict(self)
        if not d["spec_lookahead"]:
            del d["spec_lookahead"]
        if d["spec_method"] == "none":
            del d["spec_method"]
        if d["hybrid_pool"] in ("auto", "off"):  # keys as before unless forced on
            del d["hybrid_pool"]
        return d

    def engine_config(self, num_gpu_blocks: int, seed: int) -> EngineConfig:
        from kvsim.engine.engine_model import DEFAULT_STEP_OVERHEAD_US

        extra = {} if self.watermark is None else {"watermark": float(self.watermark)}
        return EngineConfig(block_size_tokens=self.block_size_tokens,
                            max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens,
                            step_overhead_us=(DEFAULT_STEP_OVERHEAD_US
                                              if self.step_overhead_us is None
                                              else float(self.step_overhead_us)),
                            seed=seed, num_gpu_blocks=num_gpu_blocks, **extra)


class Engine:
    """One serving engine of the closed loop: a scheduler and a replay (``_Run``) sharing
    the memory state.  :meth:`advance` decides and replays engine steps."""

    def __init__(self, table: RequestTable, off, ids, policy, config: SimConfig,
                 opts: EngineOptions, cost, hbm_blocks: int, costs, block_bytes: int,
                 log_writer=None, order: np.ndarray | None = None, replica: int = 0,
                 hashes: tuple | None = None, step_table: bool = True):
        from kvsim.replay.driver import TraceFacts, _Run

        N = len(table)
        opts, _why = resolve_scheduler(table, config, opts)  # auto: vllm or kvsim
        cfg = opts.engine_config(hbm_blocks, config.seed)
        self.cost, self.N = cost, N
        wmark = cfg.watermark_blocks(hbm_blocks)
        self.sched = new_schedule(table.columns(), off, ids, table.block_size_tokens, cfg, cost,
                                  hbm_blocks, wmark, 1, closed=True,
                                  priority_scheduling=config.priority_scheduling,
                                  order=order)
        sc = self.sched
        B = opts.block_size_tokens
        prompt, out = sc.req_args[1], sc.req_args[2]
        spk = sc.req_args[11] * (2 if opts.spec_lookahead else 1)  # drafts (+ lookahead)
        slots = len(sc.src)
        if opts.scheduler == "vllm":  # kvsim's scheduler's per-slot state: one entry each
            one_slot_each(sc)
        max_blocks = int(((prompt + out + spk) // B + 2).max()) if N else 2
        # every block the run can allocate: the lower tiers' capacity as their policies
        # see it (kvsim.replay.lower_tiers); their slots follow the distinct hashes below
        bound = int(((prompt + out + spk) // B + 2).sum()) + 2 * (slots - N) * max_blocks
        if opts.scheduler == "vllm" and hashes is None:
            hashes = vllm_hashes(table, off, ids, opts)
        if opts.scheduler == "vllm":  # its step reads the hashes, never the block ids:
            # not held here (kvsim.modes.closed.cluster.serve's release_block_ids); a
            # step's admissions (adm) are at most its output list's (vllm_value.new_outputs)
            sc.req_args = _vllm_req_args(sc.req_args)
            sc.adm = np.zeros(max(min(N, opts.max_num_seqs), 1) + 1, np.int64)
        # the hashed blocks of the distinct request contents (shared_hashes): no more
        # distinct hashes reach a lower tier (vLLM's scheduler writes no other hash)
        distinct = -1 if hashes is None else int(np.count_nonzero(hashes[2]))
        self.cols = _new_cols(1 << 14)
        # next_use / seen of the ALLOCATE ordinals of ONE step (the core indexes them by
        # ordinal; the closed loop restarts the ordinal at every step, refills them per
        # step and grows them with the columns: R_NEED_COLS), not of the whole trace
        self.nu = np.full(len(self.cols[0]), NEVER, dtype=np.int64)
        self.seen = np.zeros(len(self.nu), dtype=np.int8)
        self.aux = np.zeros(CS.NUM_AUX, dtype=np.int64)
        self.insys = np.zeros(1 << 16, dtype=np.int64)
        # the core's request tables: rows for the requests held at once (closed_slots);
        # the pool's sequence table, int32 (kvsim.memory.fast.new_state), checked first
        check_planned_bytes(4 * (2 * opts.max_num_seqs + 72) * (max_blocks + 1), "the "
                            "pool's sequence table (2 x --max-num-seqs + 72 rows)",
                            "--max-num-seqs")
        facts = TraceFacts(num_rows=int(prompt.sum() // B + out.sum()), first_step=0,
                           last_step=0, max_request_id=min(slots, FIRST_ROWS) - 1,
                           max_blocks_per_request=max_blocks,
                           max_concurrent_requests=2 * opts.max_num_seqs + 64,
                           max_size_bytes=block_bytes, num_allocs=max(bound, 1 << 14),
                           next_use=self.nu, max_distinct_hashes=distinct)
        header = SimpleNamespace(block_size_tokens=B, kv_bytes_per_token=cost.kv_bytes_per_token,
                                 model=cost.model)
        # the warm-up is the cluster driver's (start_measuring), not the trace pre-pass's
        nowarm = dataclasses.replace(config, warmup_fraction=0.0, warmup_requests=None,
                                     engine=closed_engine(config, policy, facts.num_rows,
                                                            opts.scheduler))
        self.run = _Run(policy, nowarm, header, facts, costs, block_bytes, log_writer)
        self.run.K[L.K_WARMUP_STEP] = -1
        self.run.step_rows = StepRecords(step_table, self.run.K, config.warmup_count(N) > 0)
        # rows = request ids when the decision log may name another replica's row (a lower
        # tier shared by the replicas: kvsim.modes.closed.shared_tier)
        ident = log_writer is not None and getattr(config, "shared_tier_gb", None) is not None
        self.slots = self.run.slots = ClosedSlots(slots, self.run.R_i.shape[0], ident)
        if ident:
            self.run._grow_requests(slots - 1)
        # the pool's prefix index as keys and values, and the lower tiers' shared table
        sc.lookup = (*index_keys_values(self.run.st.hidx), self.run.T[0].L_h)
        self.pb_off = self.pb_next = self.pb_seen = None  # set_block_facts, before advance
        # typed once, not at every advance call (kvsim.replay.variants.TypedTuple)
        self.py_vllm = python_vllm(self.run.core)
        self.vs = TypedTuple(_vllm_value(table, off, ids, opts, config, int(self.run.st.cfg[0]),
                                         wmark, hashes, self.slots.rid_of.shape[0],
                                         not self.py_vllm))
        self.slots.vllm = self if opts.scheduler == "vllm" else None  # vLLM's rows: the core's
        sc.ip[S.P_VLLM] = int(opts.scheduler == "vllm")
        self.rprio = as_writable(table.column("request_priority"), np.int8)
        self.tenant = as_writable(table.column("tenant"), np.int32)
        self.block_bytes, self.replica = block_bytes, replica
        # pending first tokens per step <= running sequences: never grown mid-step
        need = 4 * (opts.max_num_seqs + 64) + 4096
        if self.run.P.shape[0] < need:
            self.run.P = L.grow_rows(self.run.P, need)
        self.py_kvsim = opts.scheduler == "kvsim" and python_kvsim(self.run.core)
        self.step_mod = closed_for(self.run.core, self.py_vllm, self.py_kvsim)
        self._args = None
        self._core_run = None  # core.run as advance() takes it (types fixed per run)
        self._call = None  # advance's compiled entry for self._args' types (_entry)
        self._retry = True  # after a call of the dispatcher itself: look the entry up again
        # typed now: a cold compile split over processes starts core.run's compile here
        # (kvsim.replay.precompile), before the block facts and advance compile
        self._core_args()

    def set_block_facts(self, facts_pb) -> None:
        """The prompt-block facts :func:`prepare`'s caller computed with
        :func:`kvsim.modes.closed.closed_facts.block_facts` (``(offsets, next_use, seen)``): needed
        from the first :meth:`advance` on; computed after the engines are built, so that a
        cold compile of ``core.run`` starts first."""
        self.pb_off, self.pb_next, self.pb_seen = facts_pb

    def set_resets(self, resets) -> None:
        """vLLM ``reset_prefix_cache()`` calls to make, before :meth:`advance`: a list of
        ``{"at_step": k}`` (before engine step ``k``'s schedule(); steps that schedule
        nothing are not steps) or ``{"before_arrival_of": row}`` (a table row), each with
        ``reset_running_requests`` (default false), as a vLLM scheduler recording's
        actions (kvsim.engine.vllm_rows.reset_table).  vLLM's rule: a reset succeeds only
        when no block is held (``reset_running_requests`` first preempts every running
        request); then both the scheduler's pool and the replay's HBM pool drop every
        cached block.  Scheduler ``vllm`` only."""
        from kvsim.engine.vllm_rows import VS_RESETS, reset_table

        if not self.sched.ip[S.P_VLLM]:
            raise KvsimInputError("prefix-cache resets are replayed by vLLM's scheduler only "
                                  "(--scheduler vllm)", field="--scheduler")
        self.vs = self.vs[:VS_RESETS] + (reset_table(resets, self.N),)
        self._args = None

    # -- state the router reads ------------------------------------------------------------
    @property
    def clock_us(self) -> float:
        return float(self.sched.stf[0])

    def has_work(self) -> bool:
        st = self.sched.st
        return st[S.S_NRUN] > 0 or st[S.S_ADMIT] < st[S.S_QN]

    def outstanding(self) -> int:
        """Requests routed here and not finished (waiting + running)."""
        st = self.sched.st
        return int(st[S.S_QN] - st[S.S_DONE])

    def enqueue(self, r: int) -> None:
        st = self.sched.st
        if st[S.S_QN] >= self.sched.order.shape[0]:
            self.grow_order()
        self.sched.order[st[S.S_QN]] = r
        st[S.S_QN] += 1
        st[S.S_FINISHED] = 0

    def grow_order(self) -> np.ndarray:
        """The router's queue (``sched.order``, the rows routed here in arrival order)
        doubled: it starts small and grows with the requests routed here, not with the
        trace (issue 38, "Memory"); the steps read only ``order[:S_QN]``."""
        sc = self.sched
        sc.order = L.grow_rows(sc.order, 2 * sc.order.shape[0])
        self._args = None  # the EngineRef holds the array
        return sc.order

    def oldest_unfinished(self) -> int:
        """The lowest row held here and not finished (queued, running, preempted), else
        ``N``: no per-request row below it is read again (``RowStore.release_below``)."""
        n = self.slots.top
        rid = self.slots.rid_of[:n]
        live = rid[(rid >= 0) & (self.run.R_i[:n, L.RI_STATE] != L.RS_DONE)]
        return int(live.min()) if live.shape[0] else self.N

    # -- running steps -----------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self.run.step_rows.insys_taken + int(self.aux[CS.X_NINSYS])

    @property
    def rows(self) -> int:
        return int(self.aux[CS.X_ROWS])

    @property
    def lost_hit_tokens(self) -> int:
        return int(self.aux[CS.X_LOST])

    @property
    def in_system(self) -> np.ndarray:
        return self.run.step_rows.in_system(self.insys[:int(self.aux[CS.X_NINSYS])])

    def advance(self, limit_us: float = -1.0, max_steps: int = YIELD_STEPS,
                on_yield: Callable[[], None] | None = None) -> None:
        """Run steps until the clock reaches ``limit_us`` (-1: until idle)."""
        run, sc = self.run, self.sched
        while True:
            args = self._args
            if args is None:  # rebuilt only after a buffer changed (cheap calls per arrival)
                er = self._engine_ref()
                args = self._args = (er, self._run_ref(er))
                self._call, self._retry = None, True
            call = self._call
            if call is None:
                call = self._call = _entry(self.step_mod.advance,
                                           (float(limit_us), max_steps, *args))
            if call is self.step_mod.advance:
                with np.errstate(over="ignore"):  # hash mixing wraps by design (interpreted)
                    code, I, F = call(float(limit_us), max_steps, *args)
                if self._retry:  # compiled or loaded by this call: its entry, once
                    self._call, self._retry = None, False
            else:
                code, I, F = call(float(limit_us), max_steps, *args)
            if I is not sc.I or F is not sc.F:
                sc.I, sc.F = I, F
                self._args = None
            if code in (CS.R_LIMIT, CS.R_IDLE):
                return
            from kvsim.replay.kernel import core  # not on the path of the calls that return

            if code == CS.R_YIELD:  # in_system emptied in place: the arguments stay
                run.step_rows.take_in_system(self.insys, self.aux, CS.X_NINSYS)
                if on_yield is not None:
                    on_yield()
                continue
            if code == core.ST_NEED_STEP:  # the step buffer emptied in place: args stay
                run._flush_steps()
                continue
            if code == CS.R_NEED_SLOTS and not self.slots.make_room(run):
                continue  # rows freed in place: the arguments (and entry) stay
            self._args = None  # a buffer grown or replaced below
            if code == CS.R_NEED_COLS:
                cap = 2 * max(len(self.cols[0]), int(self.aux[CS.X_PENDING]))
                self.cols = _new_cols(cap)
                self.nu = np.full(cap, NEVER, dtype=np.int64)
                self.seen = np.zeros(cap, dtype=np.int8)
            elif code == CS.R_NEED_ARENA:
                run._compact_arena()
                need = int(self.aux[CS.X_ARENA])
                while run.A_i.shape[0] - int(run.C[L.C_ARENA_TOP]) < need:
                    run.A_i = L.grow_rows(run.A_i, 2 * run.A_i.shape[0])
                    run.A_f = L.grow_rows(run.A_f, 2 * run.A_f.shape[0])
            elif code == CS.R_NEED_SLOTS:
                pass  # the request tables were grown above (make_room)
            elif code == core.ST_NEED_REQ:
                self.slots.grow(run, 2 * run.R_i.shape[0])
            elif code == core.ST_NEED_ARENA:
                run._compact_arena()
            elif code == core.ST_NEED_LOG:
                run._flush_log()
            elif code == core.ST_NEED_PEND:
                run._grow_pending()
            else:
                raise RuntimeError(f"closed loop: unexpected code {code}")

    def _sched(self) -> tuple:
        """The scheduler as ``advance`` takes it, ``(ks, vs, vo, rs)``: only what it runs
        (:func:`kvsim.replay.kernel.closed_step.scheduler_args`; one compile each)."""
        return self.step_mod.scheduler_args(bool(self.sched.ip[S.P_VLLM]), self.vs,
                                            int(self.run.K[L.K_WRITE_POLICY])
                                            == L.WP_VLLM_OFFLOAD)

    def _core_args(self) -> tuple:
        """The core's state (made again on each call: after a buffer was grown or replaced)
        and ``core.run`` as a function value (:func:`kvsim.replay.variants.core_run_value`)."""
        run = self.run
        cr = run.core_value(self.nu, self.seen)
        if self._core_run is None:  # buffers grow, their types do not: typed once
            self._core_run = core_run_value(run.core, (self.cols, np.int64(0), np.int64(0),
                                                       cr))
        return (cr, self._core_run)

    def _engine_ref(self):
        """``advance``'s arguments but the limits and ``core.run``, as one value
        (:mod:`kvsim.replay.kernel.engine_ref`; made again after a buffer changed)."""
        sc = self.sched
        return new_engine_ref(self.step_mod is CS, (
            self.aux, self.insys, sc.ip, sc.fp, sc.st, sc.stf, sc.req_args, sc.slot_args,
            sc.order, sc.lookup, sc.hitk, sc.adm, sc.I, sc.F, self.cols, self.rprio,
            self.tenant, self.block_bytes, self.pb_off, self.pb_next, self.pb_seen,
            self.slots.args, *self._sched(), self._core_args()[0]))

    def _run_ref(self, er):
        """``core.run`` as ``advance`` takes it after ``er``: :func:`kvsim.replay.variants.core_run_ref`,
        the function value unboxed once.  While ``run`` still compiles in a worker (a cold
        compile split over processes, :mod:`kvsim.replay.precompile`), ``advance`` is
        compiled here first, for exactly the types it is called with, since making the ref
        waits for ``run``."""
        rv = self._core_run
        if getattr(rv, "future", None) is not None:
            from kvsim.jit.disk_cache import compile_once as once

            t = self.step_mod.advance.typeof_pyval  # each type as numba's dispatcher makes it
            once(self.step_mod.advance, (t(0.0), t(0), t(er), core_run_ref_type(rv)))
        return core_run_ref(rv)

    def start_measuring(self) -> None:
        """The warm-up ends now: the core snapshots its counters at the next step (the
        first one that can hold the first measured request), as the open-loop replay does
        at ``K_WARMUP_STEP``."""
        self.run.K[L.K_WARMUP_STEP] = int(self.sched.st[S.S_STEP])

    def finish(self) -> None:
        """Close the last step and flush the buffers (as ``_Run.finish``)."""
        run = self.run
        if run.C[L.C_NSTEP_BUF] >= run.S.shape[0]:
            run._flush_steps()
        run._flush_log()
        if self.steps:
            with np.errstate(over="ignore"):
                self.step_mod.advance(-1.0, -1, self._engine_ref(),
                                      core_run_ref(self._core_args()[1]))
        run._flush_steps()
        run._flush_log()
        run.step_rows.take_in_system(self.insys, self.aux, CS.X_NINSYS, last=True)


#: the scheduler's request arguments (kvsim.engine.scheduler_state.new_schedule's
#: ``req_args``) vLLM's step never reads (kvsim's scheduler's: n, beam width, drafts,
#: acceptance, hashed tokens, the block ids as CSR): a one-entry placeholder each (the same
#: types, the same compiled ``advance``) once the engine is built
_VLLM_UNREAD_ARGS = (5, 6, 11, 12, 13, 14, 15)


def _vllm_req_args(req_args: tuple) -> tuple:
    def stub(v):
        out = v[:1].copy()
        out.setflags(write=v.flags.writeable)  # read-only is another type to numba
        return out

    return tuple(stub(v) if k in _VLLM_UNREAD_ARGS else v for k, v in enumerate(req_args))


def _entry(advance, args: tuple):
    """What :meth:`Engine.advance` calls with ``args``: the compiled ``advance``'s overload
    for exactly these argument types (``overloads[types].entry_point``, numba's wrapper
    that unboxes the arguments and calls the compiled code), looked up once per argument
    tuple (compiled or loaded first, by one process at a time: compile_for), or ``advance``
    itself (interpreted).  numba's dispatcher types every argument at every call (~9,400
    calls in an 8-replica closed loop of the Mooncake trace); the argument types of an
    engine never change (buffers grow, their types do not), so they are typed here only
    when the argument tuple (its EngineRef) is made again."""
    overloads = getattr(advance, "overloads", None)
    if overloads is None:
        return advance
    from kvsim.jit.disk_cache import compile_for  # another process compiling: wait, load

    cres = overloads.get(compile_for(advance, args))
    return advance if cres is None else cres.entry_point


_TINY: dict = {}


def vllm_hashes(table: RequestTable, off, ids, opts: EngineOptions, python: bool = False):
    """The block hashes vLLM's scheduler reads (:func:`kvsim.engine.vllm_rows.shared_hashes`,
    ``python``: for the interpreted engine), one copy for every replica; None for kvsim's."""
    from kvsim.engine.vllm_rows import shared_hashes

    if opts.scheduler != "vllm":
        return None
    # the tenant is vLLM's cache_salt only when salted by tenant (--salt-by-tenant, a
    # scheduler recording's cache_salt): unsalted, tenants share blocks, as in the replay
    tenant = (table.column("tenant") if table.source.get("salt_by_tenant")
              else np.zeros(len(table), np.int64))
    h0, h1, hh = shared_hashes(table.column("prompt_tokens"), table.column("output_tokens"),
                               table.column("hashed_tokens"), tenant, off, ids,
                               table.block_size_tokens, opts.block_size_tokens, python)
    # per request: in the run's row store when one is current (kvsim.core.row_store)
    return row_store.copy(h0), row_store.copy(h1), hh


def _vllm_value(table: RequestTable, off, ids, opts: EngineOptions, config: SimConfig,
                num_blocks: int, wmark: int, hashes: tuple | None = None, rows: int = 0,
                compiled: bool = True) -> tuple:
    """vLLM's scheduler for ``opts.scheduler == "vllm"`` (its own KV manager, sized as the
    replay's HBM pool), else a tiny unused one of the same type; ``compiled`` False: Python's."""
    from kvsim.engine.vllm_rows import new_vllm_value

    if opts.scheduler != "vllm":
        if compiled not in _TINY:
            z, cols = np.zeros(1, np.int64), {k: v[:0] for k, v in table.columns().items()}
            _TINY[compiled] = new_vllm_value(cols, z, z, 1, opts.block_size_tokens, 2, 1, 1,
                                             compiled=compiled)
        return _TINY[compiled]
    if hashes is None:  # the tenant salts them only when salted by tenant (vllm_hashes)
        hashes = vllm_hashes(table, off, ids, opts)
    return new_vllm_value(table.columns(), off, ids, table.block_size_tokens, opts.block_size_tokens,
                          num_blocks, opts.max_num_seqs, opts.max_num_batched_tokens,
                          priority=config.priority_scheduling,
                          long_prefill_token_threshold=opts.long_prefill_token_threshold,
                          watermark_blocks=wmark, reserve_full_isl=opts.reserve_full_isl,
                          spec_lookahead=opts.spec_lookahead, seed=config.seed,
                          hashes=hashes, rows=rows or None, compiled=compiled)


def closed_engine(config: SimConfig, policy, num_rows: int, scheduler: str | None = None) -> str:
    """The engine of a closed-loop run (:func:`kvsim.replay.variants.auto_engine` with the
    closed loop's step driver counted in the cache check: for ``scheduler``, ``vllm`` or
    ``kvsim``, when given, as ``advance`` is compiled once per scheduler)."""
    from kvsim.policy.registry import resolve_policy, resolve_tier_policy
    from kvsim.replay.variants import auto_engine
    from kvsim.spec.sim_config import LOWER_TIERS

    if config.engine != "auto":
        return config.engine
    lower = [resolve_tier_policy(config.tier_policy(t), t) for t in LOWER_TIERS]
    return auto_engine("auto", num_rows, resolve_policy(policy), lower,
                       closed=scheduler or True)


#: dtypes of the core's event columns (kvsim.replay.kernel.core.COLS order; kvsim.core.schema types)
_COL_DTYPES = (np.int64, np.int64, np.int8, np.int64, np.int32, np.int64, np.int64, np.int32,
               np.float64, np.int8, np.int8, np.int8, np.int64, np.int64, np.float64, np.int64,
               np.bool_, np.bool_, np.int64, np.int32)


def _new_cols(cap: int) -> tuple:
    return tuple(np.zeros(cap, dtype=d) for d in _COL_DTYPES)


def hbm_pool_blocks(config: SimConfig, cost) -> int:
    """The HBM pool (and scheduler KV budget) in blocks, as the open-loop replay sizes it
    (:func:`kvsim.replay.driver.resolve_tiers`)."""
    blocks = config.explicit_hbm_blocks(cost.block_bytes)
    if blocks is None:
        blocks = hbm_kv_capacity_bytes(cost.gpu_memory_bytes, int(cost.weight_bytes),
                                       config.gpu_memory_utilization) // cost.block_bytes
    if blocks < 1:
        raise KvsimInputError(f"HBM holds no KV block ({cost.block_bytes} bytes each) after "
                              "the model weights; expected a larger GPU or --hbm-gb", None,
                              None, "hbm_gb")
    return int(blocks)


def prepare(table: RequestTable, config: SimConfig, opts: EngineOptions):
    """(cost model, HBM blocks, tier costs, block bytes, CSR block ids, the table without
    never-admissible requests, dropped count).  The prompt-block facts are the caller's
    (:func:`kvsim.modes.closed.closed_facts.block_facts`, :meth:`Engine.set_block_facts`)."""
    from kvsim.engine.cost_model import GB, tier_costs
    from kvsim.engine.lowering import _drop_unadmittable
    from kvsim.spec.hardware import load_hardware
    from kvsim.spec.sim_config import LOWER_TIERS

    if config.mode != "engine":
        raise KvsimInputError("expected --mode engine with the closed-loop schedule", None,
                              None, "--mode")
    cost = build_cost_model(config.model or opts.model, config.hardware,
                            step_overhead_us=opts.engine_config(1, 0).step_overhead_us,
                            block_size_tokens=opts.block_size_tokens, timing=opts.timing,
                            spec_method=opts.spec_method)
    hbm_blocks = hbm_pool_blocks(config, cost)
    cfg = opts.engine_config(hbm_blocks, config.seed)
    vllm = resolve_scheduler(table, config, opts)[0].scheduler == "vllm"
    if config.write_policy == "vllm_offload":
        check_vllm_offload(config, vllm)
    table, dropped = _drop_unadmittable(table, opts.block_size_tokens,
                                        hbm_blocks - cfg.watermark_blocks(hbm_blocks),
                                        whole_sequence=vllm)
    hw = load_hardware(config.hardware)
    caps = {}
    for name in LOWER_TIERS:
        gb = getattr(config, f"{name}_gb")
        if config.write_policy == "vllm_offload" and name != "dram":
            gb = 0.0  # vLLM's native offloading has one CPU tier
        caps[f"{name}_bytes"] = None if gb is None else int(gb * GB)
    costs = tier_costs(hw.with_capacities(**caps), cost.block_bytes, hbm_blocks)
    off, ids = table.flat_block_ids()
    return cost, hbm_blocks, costs, cost.block_bytes, off, ids, table, dropped
