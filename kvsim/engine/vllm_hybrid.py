"""vLLM 0.33's scheduler over the hybrid KV-cache pool: the closed loop for models whose
layers fall in several KV-cache groups (gpt-oss: full attention + sliding window).

:class:`HybridVllmScheduler` is :class:`kvsim.engine.vllm_scheduler.VllmScheduler` (the
plain-Python port of ``Scheduler.schedule()`` / ``update_from_output()``) with vLLM's
``KVCacheManager`` replaced by :class:`kvsim.memory.hybrid.HybridPool` (vLLM's
``HybridKVCacheCoordinator``): a prefix hit is the coordinator's reconciled hit over every
group, an allocation asks every group's manager (sliding windows free the blocks that left
the window first), a finished or preempted request frees every group's blocks.

Scope: full-attention and sliding-window groups.  Mamba groups are refused: vLLM's
scheduler clips prefill chunks at block boundaries for them
(``Scheduler._mamba_block_aligned_split``), which is not ported yet.  KV events are not
emitted.  docs/memory-model.md, "Hybrid models".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.engine.vllm_scheduler import (
    PREEMPTED,
    WAITING,
    EngineConfig,
    SimRequest,
    StepResult,
    VllmScheduler,
)
from kvsim.memory.hybrid import MAMBA, GroupSpec, HybridPool, HybridRequest


class _Hit(list):
    """A hybrid prefix hit: the blocks per group, and its length in tokens."""

    def __init__(self, blocks, tokens: int):
        super().__init__(blocks)
        self.tokens = tokens


class HybridVllmScheduler(VllmScheduler):
    """vLLM's scheduler whose KV-cache manager keeps one manager per layer group."""

    def __init__(self, config: EngineConfig, groups: list[GroupSpec], max_seqs: int = 4096):
        if any(g.kind == MAMBA for g in groups):
            raise ValueError("the closed loop does not run Mamba groups yet (vLLM's "
                             "block-aligned prefill split is not ported)")
        super().__init__(config, pool="reference", max_seqs=max_seqs)
        self.pool = HybridPool(groups, config.num_gpu_blocks - 1, config.max_model_len,
                               max_in_flight_tokens=config.max_num_batched_tokens)
        self._hreqs: dict[int, HybridRequest] = {}

    def _hreq(self, r: SimRequest) -> HybridRequest:
        h = self._hreqs.get(r.idx)
        if h is None:
            h = self._hreqs[r.idx] = HybridRequest(r.request_id, [], r.prompt_len)
        if len(h.tokens) != r.num_tokens:
            h.tokens = r.all_tokens[:r.num_tokens]
        h.num_computed = r.num_computed
        return h

    def add_request(self, r: SimRequest) -> None:
        if r.cache_salt:
            raise ValueError("the hybrid pool does not salt hashes yet")
        r.hashes = [0]  # the hybrid pool hashes the tokens itself
        super().add_request(r)

    def step(self) -> StepResult:
        self.pool.new_step_starts()  # Scheduler.schedule(): kv_cache_manager.new_step_starts()
        return super().step()

    def _hit_tokens(self, hits) -> int:
        return hits.tokens if hits else 0

    def _lookup(self, r: SimRequest):
        if not self.cfg.enable_prefix_caching:
            return []
        blocks, tokens = self.pool.get_computed_blocks(self._hreq(r))
        return _Hit(blocks, tokens) if any(blocks) else []

    def _allocate_slots(self, r: SimRequest, num_new: int, hits=None,
                        full_sequence_must_fit: bool = False,
                        has_scheduled_reqs: bool = True) -> list[int] | None:
        h = self._hreq(r)
        watermark = self.watermark_blocks if has_scheduled_reqs and r.status in (
            WAITING, PREEMPTED) else 0
        hit_tokens = hits.tokens if hits else 0
        ok = self.pool.allocate_slots(h, num_new, hit_tokens, list(hits) if hits else None,
                                      full_sequence_must_fit=full_sequence_must_fit,
                                      watermark_blocks=watermark)
        if not ok:
            return None
        r.num_cached_blocks = 0 if r.num_cached_blocks is None else r.num_cached_blocks
        r.blocks = [b for group in self.pool.block_ids(r.request_id) for b in group if b]
        return list(self.pool.last_new_ids)

    def _cache_blocks(self, r: SimRequest, num_tokens: int) -> None:  # done by the pool
        return None

    def _free_blocks(self, r: SimRequest) -> None:
        self.pool.free(r.request_id)
        r.blocks = []
        r.num_cached_blocks = None


@dataclass
class HybridServeResult:
    """What :func:`serve_hybrid` measured: per request its hit tokens (first admission),
    and per step the free blocks and the blocks the windows freed so far."""

    steps: int = 0
    hit_tokens: dict[int, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    min_free_blocks: int = 0
    freed_by_window: int = 0

    @property
    def hit_rate(self) -> float:
        return sum(self.hit_tokens.values()) / self.prompt_tokens if self.prompt_tokens else 0.0


def serve_hybrid(config: EngineConfig, groups: list[GroupSpec], requests: list[SimRequest],
                 max_steps: int = 1_000_000) -> HybridServeResult:
    """Serve ``requests`` (all arrived) to completion with vLLM's scheduler over the hybrid
    pool; one engine step per iteration."""
    sched = HybridVllmScheduler(config, groups)
    out = HybridServeResult(min_free_blocks=sched.num_free_blocks())
    for r in requests:
        sched.add_request(r)
        out.prompt_tokens += r.prompt_len
    while sched.has_requests():
        if out.steps >= max_steps:
            raise RuntimeError(f"serve_hybrid: not done after {max_steps} steps")
        res = sched.step()
        out.steps += 1
        for i, hit in res.new:
            out.hit_tokens.setdefault(i, hit)
        out.preemptions += len(res.preempted)
        out.finished += len(res.finished)
        out.min_free_blocks = min(out.min_free_blocks, res.free_sched)
        if not res.sched and not res.finished:
            raise RuntimeError("serve_hybrid: a step scheduled nothing (a request can "
                               "never fit the pool)")
    out.freed_by_window = sched.pool.freed_by_window
    return out
