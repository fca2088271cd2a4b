"""The engine model: scheduler limits and the roofline step-time model of the lowering.

The roofline is one of the step-time models ``--timing`` chooses from (the default,
``auto``, uses AIConfigurator-measured tables where bundled for the model and GPU):
:mod:`kvsim.engine.timing.select`, :mod:`kvsim.engine.timing.step_time`,
docs/cost-model.md "Step time".

A step's compute time (``STEP.duration_us``, every scheduled token computed, no prefix
caching; schema rule 5) is a roofline (Williams, Waterman, Patterson, CACM 2009)::

    memory_us  = (weight_bytes + kv_bytes_per_token * sum(context tokens each scheduled
                  sequence reads)) / (HBM bandwidth * achievable fraction)
    compute_us = (2 * active_params * batched_tokens
                  + 4 * num_layers * hidden_size * sum(attended positions per token))
                 / (peak dense BF16 FLOP/s * achievable fraction)
    step_us    = max(memory_us, compute_us) + step_overhead_us

* ``2 * active params`` FLOPs per token: the forward pass of a decoder (Kaplan et al.,
  "Scaling Laws for Neural Language Models", 2020, Table 1: C_forward ~ 2N).  All batched
  tokens count (decode tokens too), not only prefill ones.
* Attention FLOPs ``4 * n_layers * d_model * ctx`` per token (same source, the
  ``2 n_layer n_ctx d_attn`` term for QK^T plus as much for AV); **included**, so long
  contexts cost what they should.  A prefill chunk of ``c`` tokens starting at position
  ``s`` attends ``c*s + c*(c+1)/2`` positions in total.
* Memory: every step reads all weights once and each scheduled sequence reads its own KV
  (PagedAttention reads a shared block once per sequence).  KV *writes* are neglected
  (one token per sequence per step in decode).
* ``step_overhead_us`` (default 500 us) is an **assumption**: the per-step CPU scheduling
  + sampling + launch time of a CUDA-graph'd vLLM v1 engine, of the order the vLLM V1
  announcement (blog.vllm.ai, 2025-01-27) says it tried to hide; configurable.
* The model and hardware numbers come from :mod:`kvsim.spec.kvsize` (catalog) and
  :mod:`kvsim.spec.hardware` (profiles), each with its own source.

``recompute_cost_us`` of a block of ``m`` tokens at positions ``[a, a+m)`` is its prefill
compute alone (prefill is compute-bound): ``(2 P m + 4 L d (m a + m (m+1) / 2)) / FLOP/s``.

KV capacity (``num_gpu_blocks``, vLLM's name): the scheduler admits a request only while
its prompt's new blocks fit the block budget (docs/importers.md "Engine model").  The
default budget is the replay's default HBM pool, computed by the same function
(:func:`default_num_gpu_blocks`): ``(gpu_memory_bytes x gpu_memory_utilization -
weight_bytes) // block_bytes``.  Eviction, tiering and preemption remain the replay's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.engine.timing.select import ROOFLINE, Timing
from kvsim.spec.sim_config import VLLM_GPU_MEMORY_UTILIZATION

#: Per-step overhead (assumption, see the module docstring).
DEFAULT_STEP_OVERHEAD_US = 500.0
#: vLLM v1 defaults for an online server on one GPU (vLLM SchedulerConfig / engine args:
#: max_num_seqs 256, max_num_batched_tokens 8192 for the OpenAI server with chunked prefill).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: Intent thresholds (kvsim's own rule, documented in docs/importers.md): a running
#: request's decode blocks are DECODE_CRITICAL (and pinned) when its request_priority is
#: at least this, or when it has a TPOT deadline at most :data:`CRITICAL_TPOT_US`.
CRITICAL_REQUEST_PRIORITY = 70
CRITICAL_TPOT_US = 100_000
#: Beam search: every this many decode steps the last beam is pruned and replaced by a
#: fresh fork of the first beam (a deterministic stand-in for top-k beam re-selection).
BEAM_PRUNE_INTERVAL_STEPS = 8
#: vLLM's admission watermark: a request is admitted only if at least this fraction of the
#: KV blocks stays free afterwards, so running sequences have room to grow (vLLM v0
#: ``CacheConfig``/``BlockSpaceManager``: ``watermark: float = 0.01``,
#: ``watermark_blocks = int(watermark * num_gpu_blocks)``).
VLLM_WATERMARK = 0.01


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler limits and intent thresholds of the lowering (frozen)."""

    block_size_tokens: int = field(default=16, metadata={"help": "tokens per KV block"})
    max_num_seqs: int = field(default=DEFAULT_MAX_NUM_SEQS,
                              metadata={"help": "max sequences running at once"})
    max_num_batched_tokens: int = field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                        metadata={"help": "token budget per engine step"})
    step_overhead_us: float = field(default=DEFAULT_STEP_OVERHEAD_US,
                                    metadata={"help": "fixed per-step time (assumption)"})
    critical_request_priority: int = CRITICAL_REQUEST_PRIORITY
    critical_tpot_us: int = CRITICAL_TPOT_US
    beam_prune_interval_steps: int = BEAM_PRUNE_INTERVAL_STEPS
    seed: int = field(default=0, metadata={"help": "seed of speculative-acceptance draws"})
    num_gpu_blocks: int | None = field(default=None, metadata={
        "help": "KV block budget of the scheduler (vLLM num_gpu_blocks); None = derived from "
                "the hardware and model like the replay's default HBM pool"})
    gpu_memory_utilization: float = field(default=VLLM_GPU_MEMORY_UTILIZATION, metadata={
        "help": "fraction of GPU memory for weights + KV when num_gpu_blocks is derived "
                "(vLLM's default 0.9; the replay's --gpu-memory-utilization)"})
    watermark: float = field(default=VLLM_WATERMARK, metadata={
        "help": "fraction of num_gpu_blocks kept free at admission (vLLM watermark 0.01)"})

    def __post_init__(self) -> None:
        for name, minimum in (("block_size_tokens", 1), ("max_num_seqs", 1),
                              ("max_num_batched_tokens", 1), ("beam_prune_interval_steps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                option = {"block_size_tokens": "--block-size"}.get(
                    name, "--" + name.replace("_", "-"))
                raise KvsimInputError(f"expected an integer >= {minimum}, got {value!r}",
                                      None, None, option)
        if self.step_overhead_us < 0:
            raise KvsimInputError(f"expected >= 0, got {self.step_overhead_us}", None, None,
                                  "step_overhead_us")
        g = self.num_gpu_blocks
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise bad_value(None, None, "--num-gpu-blocks", "an integer >= 1", g)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise bad_value(None, None, "--gpu-memory-utilization", "a fraction in (0, 1]",
                            self.gpu_memory_utilization)
        if not 0.0 <= self.watermark < 1.0:
            raise bad_value(None, None, "watermark", "a fraction in [0, 1)", self.watermark)

    def watermark_blocks(self, num_gpu_blocks: int) -> int:
        """Blocks kept free at admission: ``int(watermark * num_gpu_blocks)`` (vLLM)."""
        return int(self.watermark * num_gpu_blocks)


@dataclass(frozen=True)
class StepCostModel:
    """The roofline constants for one (model, hardware) pair."""

    model: str
    hardware: str
    weight_bytes: float
    kv_bytes_per_token: int
    active_params: float
    layers_x_hidden: float
    flops_per_us: float  # peak x achievable fraction / 1e6
    hbm_bytes_per_us: float  # bandwidth x achievable fraction / 1e6
    step_overhead_us: float
    gpu_memory_bytes: int = 0
    block_size_tokens: int = 16
    #: the step-time model the scheduler uses (kvsim.engine.timing.select): the roofline
    #: above, or measured tables packed after these constants
    timing: Timing = ROOFLINE

    @property
    def timing_model(self) -> str:
        """The step-time model's name in outputs (``roofline``, ``measured:...``)."""
        return self.timing.name

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size_tokens

    def as_array(self) -> np.ndarray:
        """Packed for the compiled scheduler (order fixed by ``scheduler.Q_*``), then the
        timing model's kind and tables (kvsim.engine.timing.step_time: ``Q_KIND``,
        ``T0``)."""
        from kvsim.engine.timing.step_time import KIND_FITTED, KIND_MEASURED, KIND_ROOFLINE

        kind = {"roofline": KIND_ROOFLINE, "measured": KIND_MEASURED,
                "fitted": KIND_FITTED}[self.timing.kind]
        head = np.array([self.step_overhead_us, self.weight_bytes, float(self.kv_bytes_per_token),
                         self.hbm_bytes_per_us, self.flops_per_us, self.active_params,
                         self.layers_x_hidden, kind], dtype=np.float64)
        return np.concatenate([head, np.asarray(self.timing.tables, dtype=np.float64)])

    def step_us(self, batched_tokens: int, attended_positions: float,
                kv_read_tokens: float) -> float:
        """The roofline of one step (Python twin of the compiled formula, for tests)."""
        mem = (self.weight_bytes + self.kv_bytes_per_token * kv_read_tokens) / self.hbm_bytes_per_us
        comp = (2.0 * self.active_params * batched_tokens
                + 4.0 * self.layers_x_hidden * attended_positions) / self.flops_per_us
        return max(mem, comp) + self.step_overhead_us

    def prefill_us(self, start: int, tokens: int) -> float:
        """Compute time of ``tokens`` prefill tokens at positions [start, start+tokens)."""
        m = float(tokens)
        attended = m * start + m * (m + 1) / 2.0
        return (2.0 * self.active_params * m + 4.0 * self.layers_x_hidden * attended) / self.flops_per_us

    def prefill_us_many(self, start: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """:meth:`prefill_us` of each pair of ``start`` / ``tokens`` (int64 arrays), equal to
        it bit for bit: the same float64 operations in the same order, element-wise."""
        m = np.asarray(tokens, dtype=np.int64).astype(np.float64)
        attended = m * np.asarray(start, dtype=np.int64) + m * (m + 1) / 2.0
        return (2.0 * self.active_params * m + 4.0 * self.layers_x_hidden * attended) / self.flops_per_us


def default_num_gpu_blocks(cost: StepCostModel, gpu_memory_utilization: float) -> int:
    """The replay's default HBM pool in blocks, by the replay's own function
    (:func:`kvsim.engine.cost_model.hbm_kv_capacity_bytes`, used by
    ``kvsim.replay.driver.resolve_tiers``): ``(gpu_memory x utilization - weights) //
    block_bytes``.  The ``1 - utilization`` share of GPU memory is the activation / CUDA
    context reserve (vLLM's own profiling run measures it; kvsim.spec.sim_config,
    VLLM_GPU_MEMORY_UTILIZATION), so the lowering's budget and the replay's default pool
    agree exactly."""
    from kvsim.engine.cost_model import hbm_kv_capacity_bytes

    return hbm_kv_capacity_bytes(cost.gpu_memory_bytes, int(cost.weight_bytes),
                                 gpu_memory_utilization) // cost.block_bytes


def resolve_num_gpu_blocks(cfg: EngineConfig, cost: StepCostModel) -> int:
    """``cfg.num_gpu_blocks`` when given, else :func:`default_num_gpu_blocks`; raises
    :class:`KvsimInputError` when the weights leave no room for a single block."""
    if cfg.num_gpu_blocks is not None:
        return int(cfg.num_gpu_blocks)
    blocks = default_num_gpu_blocks(cost, cfg.gpu_memory_utilization)
    if blocks < 1:
        raise KvsimInputError(
            f"expected GPU memory x {cfg.gpu_memory_utilization:g} to exceed the model "
            f"weights by at least one KV block ({cost.block_bytes} bytes) on {cost.hardware}"
            f" with {cost.model}; give a larger GPU or --num-gpu-blocks", None, None,
            "--num-gpu-blocks")
    return blocks


def build_cost_model(model: str, hardware: str, kv_dtype: str | None = None,
                     step_overhead_us: float = DEFAULT_STEP_OVERHEAD_US,
                     block_size_tokens: int = 16, timing: str | None = "auto",
                     spec_method: str = "none") -> StepCostModel:
    """Load ``model`` (catalog name or config.json) and ``hardware`` (profile name or TOML).

    ``kv_dtype`` defaults to the model's serving dtype (bf16/fp16 KV, as vLLM's
    ``--kv-cache-dtype auto``).  ``timing``: ``auto`` (measured tables where bundled for
    the pair, else the roofline), ``roofline``, ``measured`` or a timing profile path
    (:func:`kvsim.engine.timing.select.resolve_timing`).  ``spec_method="mtp"``: the KV of
    a token includes the model's MTP draft layers, as vLLM sizes it
    (:func:`kvsim.spec.models.with_speculative`).
    """
    from kvsim.engine.timing.select import resolve_timing
    from kvsim.spec.hardware import load_hardware
    from kvsim.spec.kvsize import kv_bytes_per_token, load_model, with_speculative

    spec = load_model(model)
    kv_spec = with_speculative(spec, spec_method, 1 if spec_method != "none" else 0)
    hw = load_hardware(hardware)
    if spec.num_params <= 0:
        raise KvsimInputError("the model's parameter count is unknown; the step-time model "
                              "needs it (give a catalog model or a config with num_params)",
                              None, None, "--model")
    dtype = kv_dtype or (spec.weights_dtype if spec.weights_dtype in ("fp16", "bf16") else "bf16")
    return StepCostModel(
        model=spec.name, hardware=hw.name,
        weight_bytes=float(spec.weights_bytes),
        kv_bytes_per_token=int(kv_bytes_per_token(kv_spec, dtype)),
        active_params=float(spec.num_active_params or spec.num_params),
        layers_x_hidden=float(spec.num_layers * spec.hidden_size),
        flops_per_us=hw.effective_flops_per_s / 1e6,
        hbm_bytes_per_us=hw.effective_hbm_bandwidth_bytes_per_s / 1e6,
        step_overhead_us=float(step_overhead_us),
        gpu_memory_bytes=int(hw.gpu_memory_bytes),
        block_size_tokens=int(block_size_tokens),
        timing=resolve_timing(timing, spec.name, hw.name),
    )
