"""vLLM 0.33's scheduler over the hybrid KV-cache pool: the closed loop for models whose
layers fall in several KV-cache groups (gpt-oss: full attention + sliding window).

:class:`HybridVllmScheduler` is :class:`kvsim.engine.vllm_scheduler.VllmScheduler` (the
plain-Python port of ``Scheduler.schedule()`` / ``update_from_output()``) with vLLM's
``KVCacheManager`` replaced by :class:`kvsim.memory.hybrid.HybridPool` (vLLM's
``HybridKVCacheCoordinator``): a prefix hit is the coordinator's reconciled hit over every
group, an allocation asks every group's manager (sliding windows free the blocks that left
the window first), a finished or preempted request frees every group's blocks.

Groups: full attention, sliding window and Mamba (``mamba_cache_mode="align"``, with
vLLM's block-aligned prefill split, :meth:`HybridVllmScheduler._clip_prefill`).  KV events
are not emitted.  docs/memory-model.md, "Hybrid models".
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
        super().__init__(config, pool="reference", max_seqs=max_seqs)
        mamba = [g.block_size for g in groups if g.kind == MAMBA]
        if mamba and (len(set(mamba)) > 1 or mamba[0] != config.block_size):
            raise ValueError("Mamba groups need the engine's block size (vLLM's "
                             "mamba_cache_mode='align' sets mamba_block_size = block_size)")
        self.mamba_split = bool(mamba)
        self.pool = HybridPool(groups, config.num_gpu_blocks - 1, config.max_model_len,
                               max_in_flight_tokens=config.max_num_batched_tokens)
        self._hreqs: dict[int, HybridRequest] = {}
        self._junction: dict[int, int] = {}

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

    def _clip_prefill(self, r: SimRequest, num_new: int, num_hit: int) -> int:
        """vLLM 0.33 ``Scheduler._mamba_block_aligned_split`` (no EAGLE, no prefill
        checkpoints, no partial hash hits): a prefill chunk that does not reach the end of
        the prefill ends on a block boundary (a Mamba state is cached only there), a chunk
        starting inside a block stops at the next boundary, no chunk runs past the last
        boundary before the last token, nor past the block-floored end of a prefix another
        group cached (the request's ``shared_prefix_boundary``)."""
        if not self.mamba_split:
            return num_new
        start = r.num_computed + num_hit
        prefill_end = max(r.prompt_len, r.num_tokens - 1)
        if start >= prefill_end:
            return num_new
        bs = self.cfg.block_size
        last_cache_position = max((r.num_tokens - 1) // bs * bs, 0)
        end = start + num_new
        if end < prefill_end:
            max_prefill = self.cfg.max_num_batched_tokens
            if self.cfg.long_prefill_token_threshold > 0:
                max_prefill = min(max_prefill, self.cfg.long_prefill_token_threshold)
            aligned_end = end // bs * bs
            if aligned_end > start or bs <= max_prefill:
                end = aligned_end
        junction = self._junction.get(r.idx, 0)
        stops = ((start // bs + 1) * bs if start % bs else 0, last_cache_position,
                 # a prefix some group cached but the hit could not use: stop at its
                 # block-floored end so the Mamba state there gets cached
                 start + (junction - start) // bs * bs if start < junction < end else 0)
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    def _hit_tokens(self, hits) -> int:
        return hits.tokens if hits else 0

    def _lookup(self, r: SimRequest):
        if not self.cfg.enable_prefix_caching:
            return []
        blocks, tokens = self.pool.get_computed_blocks(self._hreq(r))
        uncached = self.pool.last_uncached_tokens
        # vLLM Request.shared_prefix_boundary, set at every lookup
        self._junction[r.idx] = tokens + uncached if uncached else 0
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
        if r.status in (WAITING, PREEMPTED):  # an admission: its whole table (StepResult)
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
