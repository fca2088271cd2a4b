"""vLLM v1's scheduler, step by step: a faithful port of ``Scheduler.schedule()`` /
``update_from_output()`` and ``KVCacheManager.allocate_slots()`` (vLLM 0.33.0, one
full-attention KV-cache group, synchronous scheduling, no speculative decoding, no
connector) whose state is one of kvsim's block pools: the compiled pool of the replay
(:mod:`kvsim.memory.fast` + :mod:`kvsim.memory.pool_ops` through
:class:`kvsim.memory.pool_handle.FastPool` with vLLM's FIFO order, ``pool="fast"``, the
default) or its plain-Python twin :class:`kvsim.memory.reference.BlockPool` (vLLM's
``BlockPool`` class for class, ``pool="reference"``).  Both give the same block ids.

What it models, as vLLM does (docs/simulate.md "Fidelity to vLLM"):

* one token budget over the running list in order (decode tokens and prefill chunks
  alike), ``long_prefill_token_threshold`` (ignored when one request is eligible),
  chunked prefill, then admissions from the waiting queue;
* when ``allocate_slots`` fails for a running request: recompute preemption of the last
  running request (``priority``: the first max of (priority, arrival time)), its blocks
  freed tail-first, re-queued at the front of waiting (the heap under priority), its
  computed tokens reset; no admission in a step that preempted;
* admission only when the whole prompt fits (``scheduler_reserve_full_isl``), counting
  evictable prefix hits; the hit is at most ``num_tokens - 1`` tokens, whole blocks;
* blocks are hashed and cached inside ``schedule()`` for the step that computes their last
  token (prompt and output blocks alike; the last sampled token is never computed);
  ``cache_salt`` is the first block's extra key; ``reset_prefix_cache`` (optionally
  preempting every running request first) clears every hash and emits AllBlocksCleared;
* KV events (stored / removed / cleared) in vLLM's order, with content hashes from
  :func:`kvsim.ingest.vllm_hashing.hash_block`.

The model runner is the recorder's fake one: a request whose scheduled chunk reaches the
end of its known tokens gets one output token; it finishes at ``output_len`` tokens.

This is the reference step function; the compiled closed loop
(:mod:`kvsim.engine.scheduler`) does not use it yet.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from kvsim.ingest.vllm_hashing import NONE_HASH, hash_block
from kvsim.memory.reference import BlockPool

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"

__all__ = ["EngineConfig", "SimRequest", "StepResult", "VllmScheduler", "chain_hashes"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def chain_hashes(tokens: list[int], block_size: int, salt: str | None) -> list[int]:
    """Chain hashes of the full blocks of ``tokens``; the salt keys the first block."""
    out, parent = [], NONE_HASH
    for i in range(len(tokens) // block_size):
        extra = (salt,) if (i == 0 and salt is not None) else ()
        parent = hash_block(parent, tokens[i * block_size:(i + 1) * block_size], extra)
        out.append(parent)
    return out


@dataclass(frozen=True)
class EngineConfig:
    """vLLM's scheduler and cache settings that the step function reads."""

    block_size: int = 16
    num_gpu_blocks: int = 10001          # vLLM's count: includes the null block 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"                 # fcfs | priority
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    max_model_len: int = 1 << 30
    # speculative decoding (kvsim.engine.vllm_spec): k drafts proposed after each sampled
    # token, each accepted with this probability (deterministic per seed); lookahead: the
    # drafter's k KV slots reserved past the scheduled tokens (EAGLE / MTP / draft model)
    num_speculative_tokens: int = 0
    spec_acceptance_rate: float = 0.0
    spec_lookahead: bool = False
    spec_seed: int = 0

    @classmethod
    def from_recording(cls, engine: dict) -> EngineConfig:
        kw = {k: engine[k] for k in cls.__dataclass_fields__ if engine.get(k) is not None}
        return cls(**kw)


@dataclass
class SimRequest:
    """One request: its tokens (prompt + all output tokens) and scheduler state."""

    idx: int
    request_id: str
    all_tokens: list[int]
    prompt_len: int
    output_len: int
    priority: int = 0
    arrival_time: float = 0.0
    cache_salt: str | None = None
    hashes: list[int] = field(default_factory=list)   # full blocks of all_tokens
    status: str = WAITING
    num_computed: int = 0
    num_output: int = 0
    num_preemptions: int = 0
    blocks: list[int] = field(default_factory=list)     # block table (block ids)
    num_cached_blocks: int | None = None     # vLLM num_cached_block (None: not admitted)
    seq: int = -1                            # the pool's seq slot while it holds blocks
    spec: int = 0                            # drafts proposed (vLLM's spec_token_ids)
    sspec: int = 0                           # drafts scheduled this step

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    def heap_key(self):
        return (self.priority, self.arrival_time, self.request_id, self.idx)


@dataclass
class StepResult:
    """What one engine step did (the same fields a recording step holds)."""

    sched: list[tuple[int, int]] = field(default_factory=list)
    blocks: list[tuple[int, list[int]]] = field(default_factory=list)
    new: list[tuple[int, int]] = field(default_factory=list)
    resumed: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    free_sched: int = 0
    free_blocks: int = 0
    #: ("S", parent, (hashes...), req, first_block) / ("R", hash) / ("C",)
    events: list[tuple] = field(default_factory=list)
    reset_ok: list[bool] = field(default_factory=list)


class _ReferencePool:
    """kvsim.memory.reference.BlockPool (vLLM's classes) behind the step function."""

    def __init__(self, cfg: EngineConfig, max_seqs: int):
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        self.bs = cfg.block_size

    def lookup(self, hashes: list[int], num_tokens: int) -> list[int]:
        out = []
        for h in hashes[:max(0, (num_tokens - 1) // self.bs)]:
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            out.append(block.block_id)
        return out

    def ref_cnt(self, b: int) -> int:
        return self.pool.blocks[b].ref_cnt

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def allocate(self, r: SimRequest, hits: list[int], n_new: int,
                 num_tokens: int) -> list[tuple[int, int]]:
        if hits:
            self.pool.touch([self.pool.blocks[b] for b in hits])
        return [(b.block_id, ev) for b, ev in self.pool.get_new_blocks(n_new)]

    def cache_blocks(self, r: SimRequest, first: int, hashes: list[int]) -> None:
        for k, h in enumerate(hashes):
            block = self.pool.blocks[r.blocks[first + k]]
            if block.block_hash != h:
                if block.block_hash:
                    raise AssertionError("a full block already holds another hash")
                self.pool.cache_block(block, h)

    def free(self, r: SimRequest) -> None:
        self.pool.free_blocks([self.pool.blocks[b] for b in reversed(r.blocks)])

    def clear_cache(self) -> bool:
        pool = self.pool
        if len(pool.blocks) - pool.get_num_free_blocks() != 1:
            return False
        pool.cached.clear()
        for block in pool.blocks:
            block.block_hash = 0
        return True


class _FastPool:
    """The replay's compiled pool (FastPool, FIFO order = vLLM's free queue)."""

    def __init__(self, cfg: EngineConfig, max_seqs: int):
        from kvsim.memory.fast import PoolConfig
        from kvsim.memory.pool_handle import FastPool
        per_seq = _cdiv(min(cfg.max_model_len, 1 << 24), cfg.block_size) + 1
        self.pool = FastPool(PoolConfig(num_blocks=cfg.num_gpu_blocks,
                                        block_size_tokens=cfg.block_size,
                                        enable_caching=cfg.enable_prefix_caching,
                                        max_seqs=max_seqs, max_blocks_per_seq=per_seq))

    def lookup(self, hashes: list[int], num_tokens: int) -> list[int]:
        return self.pool.lookup(hashes, num_tokens) if hashes else []

    def ref_cnt(self, b: int) -> int:
        return self.pool.ref_cnt(b)

    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks()

    def allocate(self, r: SimRequest, hits: list[int], n_new: int,
                 num_tokens: int) -> list[tuple[int, int]]:
        first = r.seq < 0
        if first:
            r.seq = self.pool.open_seq()
        if not hits and n_new == 0:
            return []
        hashes = (r.hashes[:len(hits)] if first else []) + [0] * n_new
        res = self.pool.allocate(r.seq, hashes, num_tokens if first else 0)
        if res is None or res.n_hit != len(hits) or res.blocks[:len(hits)] != hits:
            raise AssertionError("the compiled pool disagrees with its own lookup")
        return list(zip(res.blocks[len(hits):], res.evicted_hashes[len(hits):]))

    def cache_blocks(self, r: SimRequest, first: int, hashes: list[int]) -> None:
        self.pool.cache_blocks(r.seq, first, hashes)

    def free(self, r: SimRequest) -> None:
        if r.seq >= 0:
            self.pool.free(r.seq)
            self.pool.close_seq(r.seq)
            r.seq = -1

    def clear_cache(self) -> bool:
        return self.pool.clear_cache()


POOLS = {"fast": _FastPool, "reference": _ReferencePool}


class VllmScheduler:
    """vLLM 0.33's v1 scheduler over kvsim's reference block pool, one step at a time.

    ``add_request`` before a step, ``reset_prefix_cache`` between steps, ``step()`` runs
    ``schedule()`` plus ``update_from_output()`` and returns a :class:`StepResult`.
    """

    def __init__(self, config: EngineConfig, pool: str = "fast", max_seqs: int = 4096):
        if config.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be fcfs or priority, got {config.policy!r}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {sorted(POOLS)}, got {pool!r}")
        self.cfg = config
        self.bs = config.block_size
        #: seq slots: a slot is open while its request holds blocks (running ones)
        self.pool = POOLS[pool](config, max(max_seqs, config.max_num_seqs + 1))
        self.running: list[SimRequest] = []
        self._fcfs: deque[SimRequest] = deque()
        self._heap: list = []
        self.requests: dict[int, SimRequest] = {}
        self.watermark_blocks = int(config.watermark * config.num_gpu_blocks)
        self._events: list[tuple] = []
        self._pending_preempted: list[int] = []
        self._pending_reset: list[bool] = []

    # -- queues -------------------------------------------------------------------------
    @property
    def by_priority(self) -> bool:
        return self.cfg.policy == "priority"

    def _num_waiting(self) -> int:
        return len(self._heap) if self.by_priority else len(self._fcfs)

    def _peek(self) -> SimRequest:
        return self._heap[0][1] if self.by_priority else self._fcfs[0]

    def _pop_waiting(self) -> SimRequest:
        return heapq.heappop(self._heap)[1] if self.by_priority else self._fcfs.popleft()

    def _push_waiting(self, r: SimRequest, front: bool = False) -> None:
        if self.by_priority:
            heapq.heappush(self._heap, (r.heap_key(), r))
        elif front:
            self._fcfs.appendleft(r)
        else:
            self._fcfs.append(r)

    def add_request(self, r: SimRequest) -> None:
        if not r.hashes:
            r.hashes = chain_hashes(r.all_tokens[:r.prompt_len + r.output_len - 1],
                                    self.bs, r.cache_salt)
        self.requests[r.idx] = r
        r.status = WAITING
        self._push_waiting(r)

    def has_requests(self) -> bool:
        return bool(self.running) or self._num_waiting() > 0

    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks()

    # -- pool operations (vLLM BlockPool / KVCacheManager) --------------------------------
    def _cache_blocks(self, r: SimRequest, num_tokens: int) -> None:
        """vLLM cache_blocks -> BlockPool.cache_full_blocks, one BlockStored event."""
        if not self.cfg.enable_prefix_caching:
            return
        num_cached = r.num_cached_blocks or 0
        num_full = min(num_tokens, (r.num_tokens // self.bs) * self.bs) // self.bs
        if num_cached >= num_full:
            return
        self.pool.cache_blocks(r, num_cached, r.hashes[num_cached:num_full])
        parent = r.hashes[num_cached - 1] if num_cached else None
        self._events.append(("S", parent, tuple(r.hashes[num_cached:num_full]), r.idx,
                             num_cached))
        r.num_cached_blocks = num_full

    def _free_blocks(self, r: SimRequest) -> None:
        self.pool.free(r)
        r.blocks = []
        r.num_cached_blocks = None

    def _lookup(self, r: SimRequest) -> list[int]:
        """vLLM get_computed_blocks: longest cached prefix, at most num_tokens - 1."""
        if not self.cfg.enable_prefix_caching:
            return []
        return self.pool.lookup(r.hashes, r.num_tokens)

    def _clip_prefill(self, r: SimRequest, num_new: int, num_hit: int) -> int:
        """Where a prefill chunk must end (vLLM clips it only for Mamba models:
        :meth:`kvsim.engine.vllm_hybrid.HybridVllmScheduler._clip_prefill`)."""
        return num_new

    def _hit_tokens(self, hits) -> int:
        """Tokens of a prefix hit (whole blocks; the hybrid pool's hits know their length)."""
        return len(hits) * self.bs

    def _allocate_slots(self, r: SimRequest, num_new: int, hits: list[int] | None = None,
                        full_sequence_must_fit: bool = False,
                        has_scheduled_reqs: bool = True) -> list[int] | None:
        """vLLM KVCacheManager.allocate_slots: new block ids, or None (nothing changed)."""
        hits = hits or []
        num_hit_tokens = len(hits) * self.bs
        num_local_computed = r.num_computed + num_hit_tokens
        total_computed = min(num_local_computed, self.cfg.max_model_len)
        watermark = 0
        if has_scheduled_reqs and r.status in (WAITING, PREEMPTED):
            watermark = self.watermark_blocks
        evictable = sum(1 for b in hits if self.pool.ref_cnt(b) == 0)
        have = len(r.blocks)
        free = self.pool.num_free_blocks()
        running = r.num_cached_blocks is not None
        if full_sequence_must_fit:
            full = min(r.num_tokens, self.cfg.max_model_len)
            if running:
                need_full = max(_cdiv(full, self.bs) - have, 0)
            else:
                need_full = max(_cdiv(full, self.bs) - (len(hits) + have), 0) + evictable
            if need_full + watermark > free:
                return None
        look = self.cfg.num_speculative_tokens if self.cfg.spec_lookahead else 0
        need = min(total_computed + num_new + look, self.cfg.max_model_len)
        if running:
            n_alloc = max(_cdiv(need, self.bs) - have, 0)
        else:
            n_alloc = max(_cdiv(need, self.bs) - (len(hits) + have), 0) + evictable
        if n_alloc + watermark > free:
            return None
        n_new = max(_cdiv(need, self.bs) - len(hits) - have, 0)
        got = self.pool.allocate(r, [] if running else hits, n_new, r.num_tokens)
        if not running:                      # first allocation: the hits are adopted
            r.blocks.extend(hits)
            r.num_cached_blocks = len(r.blocks)
        new = []
        for b, evicted in got:
            if evicted:
                self._events.append(("R", evicted))
            new.append(b)
        r.blocks.extend(new)
        self._cache_blocks(r, min(total_computed + num_new, r.num_tokens))
        return new

    def _accepted(self, r: SimRequest) -> int:
        """Accepted prefix of r's scheduled drafts (kvsim.engine.vllm_spec, in Python)."""
        from kvsim.engine.vllm_spec import UNITS, acceptance_units, py_uniform_m

        units = int(acceptance_units(self.cfg.spec_acceptance_rate))
        a = 0
        while a < r.sspec and py_uniform_m(self.cfg.spec_seed, r.idx, r.num_output, a) < units:
            a += 1
        assert units <= UNITS
        return a

    def _preempt(self, r: SimRequest, preempted: list[int]) -> None:
        self._free_blocks(r)
        r.status = PREEMPTED
        r.num_computed = 0
        r.spec = r.sspec = 0
        r.num_preemptions += 1
        self._push_waiting(r, front=True)
        preempted.append(r.idx)

    # -- actions between steps ------------------------------------------------------------
    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM Scheduler.reset_prefix_cache: optionally preempt every running request
        (from the end of the running list), then clear every hash if no block is held."""
        if reset_running_requests:
            while self.running:
                self._preempt(self.running.pop(), self._pending_preempted)
        ok = self.pool.clear_cache()
        if ok and self.cfg.enable_prefix_caching:
            self._events.append(("C",))
        self._pending_reset.append(ok)
        return ok

    # -- one engine step ------------------------------------------------------------------
    def step(self) -> StepResult:
        res = StepResult(preempted=self._pending_preempted, reset_ok=self._pending_reset)
        self._pending_preempted, self._pending_reset = [], []
        self._schedule(res)
        res.free_sched = self.pool.num_free_blocks()
        self._update_from_output(res)
        res.free_blocks = self.pool.num_free_blocks()
        res.events, self._events = self._events, []
        return res

    def _schedule(self, res: StepResult) -> None:
        cfg = self.cfg
        token_budget = cfg.max_num_batched_tokens
        scheduled: dict[int, int] = {}
        new_blocks: dict[int, list[int]] = {}
        sched_running: list[SimRequest] = []
        preempted: list[int] = []
        eligible = len(self.running) + self._num_waiting()
        thr = cfg.long_prefill_token_threshold if eligible > 1 else 0

        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            r = self.running[req_index]
            num_new = r.num_tokens + r.spec - r.num_computed
            if 0 < thr < num_new:
                num_new = thr
            num_new = min(num_new, token_budget, cfg.max_model_len - r.num_computed - 1)
            num_new = self._clip_prefill(r, num_new, 0)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                got = self._allocate_slots(r, num_new)
                if got is not None:
                    break
                if self.by_priority:
                    victim = max(self.running, key=lambda q: (q.priority, q.arrival_time))
                    vi = self.running.index(victim)
                    del self.running[vi]
                    if vi < req_index:
                        req_index -= 1
                    if victim in sched_running:
                        sched_running.remove(victim)
                        token_budget += scheduled.pop(victim.idx)
                        new_blocks.pop(victim.idx, None)
                else:
                    victim = self.running.pop()
                self._preempt(victim, preempted)
                if victim is r:
                    break
            if got is None:
                if self.by_priority and r.status == PREEMPTED:
                    continue
                break
            sched_running.append(r)
            scheduled[r.idx] = num_new
            new_blocks[r.idx] = got
            r.sspec = min(r.spec, max(num_new + r.num_computed - r.num_tokens, 0))
            r.spec = 0
            token_budget -= num_new
            req_index += 1

        order: list[int] = list(scheduled)   # running first, in scheduling order
        admitted: list[tuple[SimRequest, int, bool]] = []
        if not preempted:
            while token_budget > 0 and self._num_waiting() > 0:
                if len(self.running) >= cfg.max_num_seqs:
                    break
                r = self._peek()
                hits = self._lookup(r) if r.num_computed == 0 else []
                num_hit = self._hit_tokens(hits)
                num_new = r.num_tokens - num_hit
                if 0 < thr < num_new:
                    num_new = thr
                if not cfg.enable_chunked_prefill and num_new > token_budget:
                    break
                num_new = min(num_new, token_budget)
                num_new = self._clip_prefill(r, num_new, num_hit)
                if num_new == 0:
                    break
                got = self._allocate_slots(r, num_new, hits,
                                           full_sequence_must_fit=cfg.scheduler_reserve_full_isl,
                                           has_scheduled_reqs=bool(self.running))
                if got is None:
                    break
                self._pop_waiting()
                self.running.append(r)
                was_preempted = r.status == PREEMPTED
                r.status = RUNNING
                r.num_computed = num_hit
                scheduled[r.idx] = num_new
                order.append(r.idx)
                admitted.append((r, num_hit, was_preempted))
                token_budget -= num_new
        res.preempted.extend(preempted)
        res.sched = [(i, scheduled[i]) for i in scheduled]
        for r, num_hit, was_preempted in admitted:
            (res.resumed if was_preempted else res.new).append((r.idx, num_hit))
        # vLLM's SchedulerOutput lists new requests, then resumed ones (whole tables)
        for resumed in (False, True):
            for r, _, was_preempted in admitted:
                if was_preempted == resumed:
                    res.blocks.append((r.idx, list(r.blocks)))
        for i in order:
            if i in new_blocks and new_blocks[i]:
                res.blocks.append((i, new_blocks[i]))
        for i, n in res.sched:           # vLLM _update_after_schedule
            self.requests[i].num_computed += n

    def _update_from_output(self, res: StepResult) -> None:
        stopped = []
        for i, _ in res.sched:
            r = self.requests[i]
            if r.status != RUNNING or r.num_computed < r.num_tokens:
                continue
            if r.sspec:  # the accepted drafts' tokens; the rejected roll back
                a = self._accepted(r)
                r.num_computed -= r.sspec - a
                r.num_output = min(r.num_output + 1 + a, r.output_len)
                r.sspec = 0
            else:
                r.num_output += 1
            r.spec = self.cfg.num_speculative_tokens
            if r.spec:  # vLLM caches the verified blocks now (as far as the hashes go)
                self._cache_blocks(r, min(r.num_computed, r.prompt_len + r.output_len - 1))
            if r.num_output >= r.output_len or r.num_tokens >= self.cfg.max_model_len:
                r.status = FINISHED
                self._free_blocks(r)
                stopped.append(r)
                res.finished.append(i)
        if stopped:
            gone = {r.idx for r in stopped}
            self.running = [r for r in self.running if r.idx not in gone]
