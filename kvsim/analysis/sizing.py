"""Sizing a deployment for a request trace before it is replayed: does every request fit
the model's context, and how many replicas does the offered load need under the step-time
model (docs/simulate.md, "Sizing").

* **Context**: a request whose ``prompt_tokens + output_tokens`` exceeds the model's
  ``max_position_embeddings`` cannot be served (vLLM rejects it: ``max_model_len``).
  :func:`context_check` counts them; :func:`drop_over_context` removes them (the CLI's
  ``--drop-over-context``).
* **Load**: :func:`estimate_load` is one replica's busy time for the whole trace under the
  roofline step model (:class:`kvsim.engine.engine_model.StepCostModel`), assuming every
  repeated prompt block is a cache hit (an infinite prefix cache), so it is a lower bound
  on the work: prefill compute (matmuls and attention,
  ``StepCostModel.prefill_us``) of the first-seen prompt blocks' tokens, in steps of
  ``max_num_batched_tokens`` (each step reads the weights once), plus decode: the output
  tokens in steps of ``max_num_seqs`` sequences (each step reads the weights and pays the
  step overhead).  ``utilisation = busy / span``.  The proposed replica count is
  ``ceil(busy / (span x TARGET_UTILISATION))``: the fewest replicas that keep each below
  70 % busy even if the cache were perfect (a queue grows without bound as utilisation
  approaches 1; 0.7 leaves the headroom bursts need).  It is a minimum: real hit rates are
  lower than an infinite cache's.
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
    busy_s: float  # one replica's busy time for the trace (a lower bound)
    utilisation: float  # busy_s / span_s for one replica
    replicas: int  # proposed: ceil(busy / (span x TARGET_UTILISATION)), at least 1

    def to_dict(self) -> dict:
        return asdict(self)


def context_check(table, model: str) -> ContextCheck:
    from kvsim.spec.kvsize import load_model

    spec = load_model(model)
    ctx = int(getattr(spec, "max_position_embeddings", 0) or 0)
    df = table.df
    total = (df["prompt_tokens"].to_numpy(np.int64) + df["output_tokens"].to_numpy(np.int64))
    over = int((total > ctx).sum()) if ctx > 0 else 0
    return ContextCheck(spec.name, ctx, over, int(total.max()) if len(total) else 0, len(df))


def drop_over_context(table, context_tokens: int):
    """``table`` without the requests whose prompt + output exceed ``context_tokens``
    (request ids renumbered, as the reader numbers them)."""
    import dataclasses

    df = table.df
    keep = (df["prompt_tokens"] + df["output_tokens"]) <= context_tokens
    kept = df[keep].reset_index(drop=True).copy()
    kept["request_id"] = np.arange(len(kept), dtype=np.int64)
    return dataclasses.replace(table, df=kept)


def estimate_load(table, model: str, hardware: str, max_num_seqs: int,
                  max_num_batched_tokens: int) -> LoadEstimate:
    """One replica's busy time for ``table`` (module docstring)."""
    from kvsim.engine.engine_model import build_cost_model

    cost = build_cost_model(model, hardware)
    df = table.df
    bs = int(table.block_size_tokens)
    seen: set[int] = set()
    prefill = 0
    compute_us = 0.0
    for prompt, ids in zip(df["prompt_tokens"].to_numpy(np.int64), df["block_ids"]):
        new = 0
        for h in ids:
            h = int(h)
            if h not in seen:
                seen.add(h)
                new += 1
        covered = len(ids) * bs
        # tokens past the identified blocks are never hits; the reused blocks are the
        # leading ones (a prefix), so the new tokens sit at the prompt's end
        fresh = min(int(prompt), new * bs) + max(int(prompt) - covered, 0)
        prefill += fresh
        compute_us += cost.prefill_us(int(prompt) - fresh, fresh)
    out = int(df["output_tokens"].sum())
    weights_us = cost.weight_bytes / cost.hbm_bytes_per_us
    steps_prefill = math.ceil(prefill / max(max_num_batched_tokens, 1))
    prefill_us = compute_us + steps_prefill * (weights_us + cost.step_overhead_us)
    steps_decode = math.ceil(out / max(max_num_seqs, 1))
    decode_us = steps_decode * (weights_us + cost.step_overhead_us)
    busy_s = (prefill_us + decode_us) / 1e6
    arr = df["arrival_us"].to_numpy(np.int64)
    span_s = float(arr.max() - arr.min()) / 1e6 if len(arr) else 0.0
    util = busy_s / span_s if span_s > 0 else float("inf")
    replicas = max(1, math.ceil(busy_s / (span_s * TARGET_UTILISATION))) if span_s > 0 else 1
    return LoadEstimate(len(df), span_s, int(prefill), out, busy_s, util, replicas)


__all__ = ["ContextCheck", "LoadEstimate", "OVERLOAD_UTILISATION", "TARGET_UTILISATION",
           "context_check", "drop_over_context", "estimate_load"]
