"""The engine model: scheduler limits and the roofline step-time model of the lowering.

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
* The model and hardware numbers come from :mod:`kvsim.kvsize` (catalog) and
  :mod:`kvsim.hardware` (profiles), each with its own source.

``recompute_cost_us`` of a block of ``m`` tokens at positions ``[a, a+m)`` is its prefill
compute alone (prefill is compute-bound): ``(2 P m + 4 L d (m a + m (m+1) / 2)) / FLOP/s``.

The lowering does **not** model memory capacity: it never preempts or refuses a request
for lack of KV blocks.  Capacity, eviction and tiering are the replay's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvsim.errors import KvsimInputError

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

    def as_array(self) -> np.ndarray:
        """Packed for the compiled scheduler (order fixed by ``scheduler.P_*``)."""
        return np.array([self.step_overhead_us, self.weight_bytes, float(self.kv_bytes_per_token),
                         self.hbm_bytes_per_us, self.flops_per_us, self.active_params,
                         self.layers_x_hidden], dtype=np.float64)

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


def build_cost_model(model: str, hardware: str, kv_dtype: str | None = None,
                     step_overhead_us: float = DEFAULT_STEP_OVERHEAD_US) -> StepCostModel:
    """Load ``model`` (catalog name or config.json) and ``hardware`` (profile name or TOML).

    ``kv_dtype`` defaults to the model's serving dtype (bf16/fp16 KV, as vLLM's
    ``--kv-cache-dtype auto``).
    """
    from kvsim.hardware import load_hardware
    from kvsim.kvsize import kv_bytes_per_token, load_model

    spec = load_model(model)
    hw = load_hardware(hardware)
    if spec.num_params <= 0:
        raise KvsimInputError("the model's parameter count is unknown; the step-time model "
                              "needs it (give a catalog model or a config with num_params)",
                              None, None, "--model")
    dtype = kv_dtype or (spec.weights_dtype if spec.weights_dtype in ("fp16", "bf16") else "bf16")
    return StepCostModel(
        model=spec.name, hardware=hw.name,
        weight_bytes=float(spec.weights_bytes),
        kv_bytes_per_token=int(kv_bytes_per_token(spec, dtype)),
        active_params=float(spec.num_active_params or spec.num_params),
        layers_x_hidden=float(spec.num_layers * spec.hidden_size),
        flops_per_us=hw.effective_flops_per_s / 1e6,
        hbm_bytes_per_us=hw.effective_hbm_bandwidth_bytes_per_s / 1e6,
        step_overhead_us=float(step_overhead_us),
    )
