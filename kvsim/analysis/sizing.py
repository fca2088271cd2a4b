"""Sizing a deployment for a request trace before it is replayed: does every request fit
the model's context, and how many replicas does the offered load need under the step-time
model (docs/simulate.md, "Sizing").

* **Context**: a request whose ``prompt_tokens + output_tokens`` exceeds the model's
  ``max_position_embeddings`` cannot be served (vLLM rejects it: ``max_model_len``).
  :func:`context_check` counts them; :func:`drop_over_context` removes them (the CLI's
  ``--drop-over-context``).
* **Load**: :func:`estimate_load` is one replica's busy time for the whole trace under the
  roofline step model (:class:`kvsim.engine.engine_model.StepCostModel`), twice:

  - ``busy_s``, a lower bound: every repeated prompt block a cache hit (an infinite prefix
    cache); prefill compute (matmuls and attention, ``StepCostModel.prefill_us``) of the
    first-seen prompt blocks' tokens, in steps of ``max_num_batched_tokens`` (each step
    reads the weights once and pays the step overhead);
  - ``busy_upper_s``: no prefix hit at all (every prompt token computed);

  plus, in both, decode: the output tokens in steps of ``batch`` sequences, each step
  reading the weights, the batch's KV and paying the step overhead, where ``batch`` is
  what the KV pool can hold: ``min(max_num_seqs, pool_tokens / mean_context)`` with
  ``mean_context`` = the mean of ``prompt + output / 2`` tokens (a request's KV half-way
  through its decode) and ``pool_tokens`` the replica's HBM pool (``hbm_blocks`` x block
  size; unknown: ``max_num_seqs``).  A long-context trace on a small HBM decodes a few
  sequences per step, so its decode work grows as HBM shrinks.
  ``utilisation = busy / span`` (the lower bound: above 1 the deployment is certainly
  overloaded, :data:`OVERLOAD_UTILISATION`).  The proposed replica count is
  ``ceil(busy_upper / (span x TARGET_UTILISATION))``: enough replicas to keep each below
  70 % busy even with no prefix hit (a queue grows without bound as utilisation
  approaches 1; 0.7 leaves the headroom bursts need).  Why the no-hit bound and not the
  perfect cache: on the Mooncake conversation trace the perfect-cache rule proposed 2
  replicas, which served it with TTFT p99 1,740 s at 8 GB (HBM hit rate 5 %: a pool of a
  few requests keeps little of the reuse; docs/benchmarks.md, "Issue 33: answers to trust").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

#: Busy fraction per replica the proposed replica count aims at (module docstring).
TARGET_UTILISATION = 0.7

#: Utilisation of one replica above which a run is reported as overloaded.
OVERLOAD_UTILISATION = 1.0


@dataclass(frozen=True)
class ContextCheck:
    model: str
    context_tokens: int  # the model's max_position_embeddings (0 = unknown)
    over: int  # requests with prompt + output > context
    longest_tokens: int  # the longest request (prompt + output)
    requests: int


@dataclass(frozen=True)
class LoadEstimate:
    requests: int
    span_s: float  # last arrival - first arrival
    prefill_tokens: int  # tokens of first-seen prompt blocks (repeated blocks = hits)
    output_tokens: int
    busy_s: float  # one replica's busy time for the trace, perfect prefix cache (lower bound)
    utilisation: float  # busy_s / span_s for one replica
    replicas: int  # proposed: ceil(busy_upper / (span x TARGET_UTILISATION)), at least 1
    busy_upper_s: float = 0.0  # one replica's busy time with no prefix hit
    decode_batch: float = 0.0  # sequences per decode step the KV pool holds (mean)

def to_dict(self) -> dict:
        return asdict(self)


def context_check(table, model: str) -> ContextCheck:
    from kvsim.spec.kvsize import load_model

    spec = load_model(model)
    ctx = int(getattr(spec, "max_position_embeddings", 0) or 0)
    total = (np.asarray(table.column("prompt_tokens"), dtype=np.int64)
             + np.asarray(table.column("output_tokens"), dtype=np.int64))
    over = int((total > ctx).sum()) if ctx > 0 else 0
    return ContextCheck(spec.name, ctx, over, int(total.max()) if len(total) else 0,
                        len(table))


def hybrid_warning(model: str) -> dict | None:
    """A ``hybrid_model`` warning when ``model``'s layers are not all full attention: the
    replay's block pool charges every layer for every token (a block holds all layers'
    KV), where vLLM keeps one pool per layer group, frees sliding-window blocks that left
    the window and holds one linear-attention state per request
    (:mod:`kvsim.memory.hybrid`, docs/memory-model.md "Hybrid models"); None otherwise."""
    from kvsim.spec.kvsize import load_model

    spec = load_model(model)
    kinds = []
    if spec.num_sliding_layers:
        kinds.append(f"{spec.num_sliding_layers} sliding-window layers ({spec.sliding_window:,}"
                     " tokens)")
    if spec.num_linear_layers:
        kinds.append(f"{spec.num_linear_layers} linear-attention layers (a state per "
                     "request, no KV)")
    if not kinds:
        return None
    return {"code": "hybrid_model", "message": (
        f"{spec.name} has {' and '.join(kinds)}: this replay's pool treats every layer as "
        "full attention (sliding-window blocks are never freed, linear-attention state is "
        "not held), so its capacity and hits are not vLLM's; vLLM's per-group pool serves a "
        "request trace closed loop with --hybrid-pool auto|on (docs/memory-model.md, "
        "\"Hybrid models in the closed loop\")")}


#: Catalog models suggested for a trace over the model's context, shortest context first
#: (their max_position_embeddings: 131,072 and 1,010,000; kvsim/spec/models/catalog.toml).
LONG_CONTEXT_MODELS = ("llama-3.1-8b", "qwen2.5-7b-1m")


def longer_context_model(ctx: ContextCheck) -> str:
    """``e.g. NAME, N tokens``: the first of :data:`LONG_CONTEXT_MODELS` whose context holds
    the trace's longest request (the longest-context one when none does)."""
    from kvsim.spec.kvsize import load_model

    best = None
    for name in LONG_CONTEXT_MODELS:
        n = int(load_model(name).max_position_embeddings)
        best = (name, n)
        if name != ctx.model and n >= ctx.longest_tokens:
            break
    return f"e.g. {best[0]}, {best[1]:,} tokens"


def drop_over_context(table, context_tokens: int):
    """``table`` without the requests whose prompt + output exceed ``context_tokens``
    (request ids renumbered, as the reader numbers them)."""
    keep = (np.asarray(table.column("prompt_tokens"), dtype=np.int64)
            + np.asarray(table.column("output_tokens"), dtype=np.int64)) <= context_tokens
    return table.take(keep)


def pool_blocks(config, model: str, block_size_tokens: int) -> int:
    """One replica's HBM pool in blocks of ``block_size_tokens``: ``--hbm-gb`` /
    ``--hbm-blocks`` when given, else the replay's default (GPU memory x utilisation -
    weights, :func:`kvsim.engine.engine_model.default_num_gpu_blocks`)."""
    from kvsim.engine.engine_model import build_cost_model, default_num_gpu_blocks

    blocks = config.lowering_options(block_size_tokens, model).get("num_gpu_blocks")
    if blocks:
        return int(blocks)
    cost = build_cost_model(model, config.hardware, block_size_tokens=block_size_tokens)
    return int(default_num_gpu_blocks(cost, config.gpu_memory_utilization))


def _sum_in_order(values: np.ndarray) -> float:
    """``0.0 + values[0] + values[1] + ...``, left to right."""
    return float(np.add.accumulate(np.concatenate([[0.0], values]))[-1])


#: ids read at a time by :func:`_first_seen_per_request` (8 MiB of int64; its transient
#: memory is a few times this plus the distinct ids, whatever the trace's length)
FIRST_SEEN_CHUNK_IDS = 1 << 20


def _first_seen_per_request(off: np.ndarray, ids: np.ndarray, N: int,
                            chunk: int | None = None) -> np.ndarray:
    """Per request, how many of its block ids no earlier request named (a block repeated
    within one request counts once): the first occurrence of each id in the flattened ids,
    counted by owner.  Read ``chunk`` ids at a time against the sorted distinct ids seen so
    far, so the transient memory follows the distinct ids, not the trace's length (a
    whole-array ``np.unique(return_index=True)`` sorted a copy and a permutation of every
    id: ~0.7 GiB at 100x the Mooncake trace, issue 38)."""
    chunk = max(int(chunk or FIRST_SEEN_CHUNK_IDS), 1)
    news = np.zeros(N, dtype=np.int64)
    seen = np.zeros(0, dtype=np.int64)
    for lo in range(0, len(ids), chunk):
        part = np.asarray(ids[lo:lo + chunk], dtype=np.int64)
        u, first = np.unique(part, return_index=True)
        if len(seen):
            at = np.minimum(np.searchsorted(seen, u), len(seen) - 1)
            fresh = seen[at] != u
            u, first = u[fresh], first[fresh]
        if len(u):
            # owner of position p: the last request whose ids start at or before p
            owner = np.searchsorted(off, first + lo, side="right") - 1
            news += np.bincount(owner, minlength=N)
            # both sorted, no id in both: a merge (np.union1d re-sorts all of it, and numpy
            # 2.4's hashing unique made that 0.15-0.2 CPU-s on the Mooncake trace's ids)
            seen = np.insert(seen, np.searchsorted(seen, u), u) if len(seen) else u
    return news


def estimate_load(table, model: str, hardware: str, max_num_seqs: int,
                  max_num_batched_tokens: int, hbm_blocks: int | None = None,
                  block_size_tokens: int = 16) -> LoadEstimate:
    """One replica's busy time for ``table`` (module docstring); ``hbm_blocks`` of
    ``block_size_tokens`` tokens: the replica's KV pool (None: decode batches are
    ``max_num_seqs`` full)."""
    from kvsim.engine.engine_model import build_cost_model

    cost = build_cost_model(model, hardware)
    N = len(table)
    bs = int(table.block_size_tokens)
    prompts = np.asarray(table.column("prompt_tokens"), dtype=np.int64)
    outputs = np.asarray(table.column("output_tokens"), dtype=np.int64)
    # blocks first seen in each request (arrival order; a block repeated within one request
    # counts once): the first occurrence of each id in the flattened ids, by owner
    off, ids = table.flat_block_ids()
    lens = np.diff(off)
    news = _first_seen_per_request(off, ids, N)
    # tokens past the identified blocks are never hits; the reused blocks are the leading
    # ones (a prefix), so the new tokens sit at the prompt's end
    fresh = np.minimum(prompts, news * bs) + np.maximum(prompts - lens * bs, 0)
    prefill = int(fresh.sum())
    # summed in request order, one addition at a time, as a loop over the requests would
    # (np.add.accumulate is sequential; np.sum's pairwise order could differ in the last bit)
    compute_us = _sum_in_order(cost.prefill_us_many(prompts - fresh, fresh))
    cold_us = _sum_in_order(cost.prefill_us_many(np.zeros_like(prompts), prompts))
    out = int(outputs.sum())
    step_us = cost.weight_bytes / cost.hbm_bytes_per_us + cost.step_overhead_us
    batches = max(max_num_batched_tokens, 1)
    prefill_us = compute_us + math.ceil(prefill / batches) * step_us
    cold_prefill_us = cold_us + math.ceil(int(prompts.sum()) / batches) * step_us
    mean_ctx = float(np.mean(prompts + outputs / 2.0)) if N else 1.0
    batch = float(max(max_num_seqs, 1))
    if hbm_blocks:
        batch = min(batch, max(1.0, hbm_blocks * block_size_tokens / max(mean_ctx, 1.0)))
    kv_read_us = batch * mean_ctx * cost.kv_bytes_per_token / cost.hbm_bytes_per_us
    decode_us = math.ceil(out / batch) * (step_us + kv_read_us)
    busy_s = (prefill_us + decode_us) / 1e6
    upper_s = (cold_prefill_us + decode_us) / 1e6
    arr = np.asarray(table.column("arrival_us"), dtype=np.int64)
    span_s = float(arr.max() - arr.min()) / 1e6 if len(arr) else 0.0
    util = busy_s / span_s if span_s > 0 else float("inf")
    replicas = max(1, math.ceil(upper_s / (span_s * TARGET_UTILISATION))) if span_s > 0 else 1
    return LoadEstimate(N, span_s, int(prefill), out, busy_s, util, replicas, upper_s,
                        batch)


__all__ = ["ContextCheck", "LONG_CONTEXT_MODELS", "LoadEstimate", "OVERLOAD_UTILISATION",
           "TARGET_UTILISATION", "context_check", "drop_over_context", "estimate_load",
           "hybrid_warning", "longer_context_model", "pool_blocks"]
