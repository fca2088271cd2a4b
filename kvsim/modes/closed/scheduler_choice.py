"""Which scheduler a closed-loop run uses (``--scheduler auto | kvsim | vllm``) and what
vLLM's scheduler refuses: what a trace or config asks that vLLM 0.33's scheduler does not
model, and the checks of ``--write-policy vllm_offload``.  Apart from
:mod:`kvsim.modes.closed.closed_loop` (the Engine) so that module fits in one sitting."""

from __future__ import annotations

import dataclasses

from kvsim.core.errors import KvsimInputError
from kvsim.ingest.requests import RequestTable
from kvsim.spec.sim_config import SimConfig

SCHEDULERS = ("auto", "kvsim", "vllm")


def vllm_unsupported(table: RequestTable, config: SimConfig) -> str | None:
    """What of ``table`` / ``config`` vLLM's scheduler (kvsim.engine.vllm_rows) does not
    model, in words, or None: n > 1, beams, ``--preemption swap`` (vLLM 0.33 only
    recomputes).  Speculative drafts it models (kvsim.engine.vllm_spec)."""
    for col, what in (("n", "n > 1 (parallel sampling)"), ("beam_width", "beam search")):
        limit = 1
        if len(table) and int(table.column(col).max()) > limit:
            return f"{what}: the trace has requests with {col} > {limit}"
    if config.preemption != "recompute":
        return (f"--preemption {config.preemption} (vLLM 0.33's scheduler only recomputes "
                "a preempted request)")
    return None


def check_vllm_offload(config: SimConfig, vllm: bool) -> None:
    """``--write-policy vllm_offload`` (kvsim.replay.kernel.offload): vLLM's scheduler, one
    CPU tier (DRAM; an explicit CXL or NVMe capacity is refused, the profile's are off)."""
    if not vllm:
        raise KvsimInputError("expected --write-policy vllm_offload with vLLM's scheduler "
                              "(--scheduler auto or vllm): its stores follow vLLM's steps",
                              None, None, "--write-policy")
    if config.shared_tier_gb is not None:
        raise KvsimInputError("expected --write-policy vllm_offload without --shared-tier-gb "
                              "(vLLM's native offloading is one private CPU tier)", None,
                              None, "--write-policy")
    for name in ("cxl", "nvme"):
        if (getattr(config, f"{name}_gb") or 0) > 0:
            raise KvsimInputError(f"expected --{name}-gb 0 with --write-policy vllm_offload "
                                  "(vLLM's native offloading has one CPU tier: --dram-gb)",
                                  None, None, f"--{name}-gb")
    if config.dram_gb == 0:
        raise KvsimInputError("expected --dram-gb > 0 with --write-policy vllm_offload (the "
                              "CPU tier vLLM offloads to)", None, None, "--dram-gb")


def resolve_scheduler(table: RequestTable, config: SimConfig,
                      opts) -> tuple:
    """``opts`` (a :class:`kvsim.modes.closed.closed_loop.EngineOptions`) with its
    scheduler decided, and why ``auto`` fell back to kvsim's (None when it did not).
    ``auto``: vLLM's scheduler unless :func:`vllm_unsupported` names something, then
    kvsim's; ``vllm`` with such a thing: a one-line error (exit 2)."""
    if opts.scheduler not in SCHEDULERS:
        raise KvsimInputError(f"--scheduler: expected one of {' | '.join(SCHEDULERS)}, got "
                              f"{opts.scheduler!r}", None, None, "--scheduler")
    if opts.scheduler == "kvsim":
        return opts, None
    why = vllm_unsupported(table, config)
    if why is None:
        return dataclasses.replace(opts, scheduler="vllm"), None
    if opts.scheduler == "vllm":
        raise KvsimInputError(f"--scheduler vllm does not model {why} (use --scheduler "
                              "kvsim or auto)", None, None, "--scheduler")
    return dataclasses.replace(opts, scheduler="kvsim"), why
