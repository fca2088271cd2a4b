"""What an import or a generation produced: :class:`ImportSummary` (the ``--json`` keys of
``kvsim import-request-trace`` and ``kvsim generate``, docs/cli.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ImportSummary:
    """What an import or generation produced (``--json`` keys, docs/cli.md)."""

    out_path: str
    format: str
    num_requests: int
    skipped_rows: int
    num_events: int
    num_steps: int
    num_forks: int
    block_size_tokens: int
    model: str
    hardware: str
    kv_bytes_per_token: int
    block_bytes: int
    total_prompt_tokens: int
    total_output_tokens: int
    prompt_blocks: int
    hashed_prompt_blocks: int
    #: share of PREFILL ALLOCATE rows whose non-zero hash appeared earlier (infinite cache)
    prefix_reuse_fraction: float
    makespan_us: int
    #: the step-time model of the engine steps (kvsim.engine.timing.select: "roofline",
    #: "measured:aiconfigurator-0.12.0/vllm-0.24.0", ...) and its profile; "" when the
    #: file was translated, not scheduled (kvmi)
    timing_model: str = ""
    timing_profile: str | None = None
    dropped_events: int = 0
    dropped_by_type: dict[str, int] = field(default_factory=dict)
    #: KV block budget of the scheduler and the admission watermark (0 when not lowered)
    num_gpu_blocks: int = 0
    watermark_blocks: int = 0
    #: most blocks held at once by running sequences (shared full prompt blocks once)
    max_held_blocks: int = 0
    #: most sequences running in one step (forks included)
    max_running_seqs: int = 0
    #: decode sequence-steps skipped because no KV block was free
    decode_stalls: int = 0
    #: steps whose admissions stopped because the head request's blocks did not fit
    admission_blocked_steps: int = 0
    #: steps in which the oldest waiting decode was forced over the budget because no
    #: sequence could advance (a deadlock; vLLM would preempt, and so does the replay)
    forced_decodes: int = 0
    #: requests never lowered, by reason (``prompt_exceeds_kv_blocks``)
    dropped_requests: int = 0
    dropped_requests_by_reason: dict[str, int] = field(default_factory=dict)
