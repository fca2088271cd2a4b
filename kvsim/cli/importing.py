"""``kvsim import-request-trace``: a real trace -> MemoryIntent events.

API: :func:`kvsim.engine.lowering.import_request_trace` (returns :class:`kvsim.events.import_summary.ImportSummary`).
Shared with ``kvsim generate``: :func:`render_summary` and the engine options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvsim.cli import app, compat
from kvsim.cli.closed_opts import SaltByTenantOpt
from kvsim.cli.common import JsonOption, emit_json, out_console, progress, quiet_progress
from kvsim.engine.lowering import import_request_trace
from kvsim.events.import_summary import ImportSummary
from kvsim.ingest import FORMATS
from kvsim.spec.models.catalog import DEFAULT_MODEL

ModelOption = Annotated[str, typer.Option(
    "--model", help="Model from the catalog (`kvsim estimate-kv --list-models`) or a "
    "config.json path: block bytes and step times come from it.")]
HardwareOption = Annotated[str, typer.Option(
    "--hardware", help="Hardware profile name (profiles/hardware) or a .toml path: peak "
    "FLOP/s and HBM bandwidth of the step-time roofline.")]
TimingOption = Annotated[str, typer.Option(
    "--timing", metavar="auto|roofline|measured|FILE.toml",
    help="Step-time model of the engine steps: measured (AIConfigurator's measured kernel "
    "tables, bundled for h100-sxm, h200, b200, a100-80g x llama-3(.1)-8b, llama-3(.1)-70b, "
    "qwen3-30b-a3b), roofline (--hardware's FLOP/s and bandwidth), a timing profile file, "
    "or auto: measured where bundled, else roofline.  docs/cost-model.md.")]
BlockSizeOption = Annotated[int, typer.Option(
    "--block-size", min=1, help="Tokens per KV block of the lowered events (vLLM: 16).")]
MaxSeqsOption = Annotated[int, typer.Option(
    "--max-num-seqs", min=1, help="Most sequences running in one engine step "
    "(vLLM max_num_seqs).")]
MaxTokensOption = Annotated[int, typer.Option(
    "--max-num-batched-tokens", min=1, help="Token budget of one engine step; prompts "
    "longer than what is left are prefilled in chunks (vLLM max_num_batched_tokens).")]
NumGpuBlocksOption = Annotated[int | None, typer.Option(
    "--num-gpu-blocks", min=1, help="KV block budget of the scheduler (vLLM "
    "num_gpu_blocks): a request is admitted only while its new prompt blocks fit, "
    "keeping a 1% watermark free.  Default: the replay's default HBM pool, (GPU memory x "
    "--gpu-memory-utilization - weights) / block bytes.", show_default=False)]
GpuMemUtilOption = Annotated[float | None, typer.Option(
    "--gpu-memory-utilization", min=0.0, max=1.0, help="Fraction of GPU memory for "
    "weights + KV when --num-gpu-blocks is derived (vLLM's default 0.9, the same as "
    "kvsim simulate's option).", show_default=False)]


def run_with_progress(label: str, fn, quiet: bool = False, **kwargs) -> ImportSummary:
    """Call ``fn(progress=callback, **kwargs)`` with a rich progress bar on stderr (its
    total: the events to lower; silent when ``quiet``)."""
    with progress(quiet=quiet) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return fn(progress=update, **kwargs)


def render_summary(s: ImportSummary) -> None:
    """The summary as a two-column rich table on stdout."""
    table = Table(title=f"{s.out_path}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("format", s.format),
        ("requests", f"{s.num_requests:,}"),
        ("skipped bad rows", f"{s.skipped_rows:,}"),
        ("events", f"{s.num_events:,}"),
        ("engine steps", f"{s.num_steps:,}"),
        ("forks", f"{s.num_forks:,}"),
        ("model / hardware", f"{s.model or '-'} / {s.hardware or '-'}"),
        ("step-time model", (s.timing_model or "-").split(":", 1)[0]),
        *((("step-time data", s.timing_model.split(":", 1)[1]),)
          if ":" in s.timing_model else ()),
        ("block size (tokens)", f"{s.block_size_tokens:,}"),
        ("block bytes", f"{s.block_bytes:,}"),
        ("prompt / output tokens", f"{s.total_prompt_tokens:,} / {s.total_output_tokens:,}"),
        ("prompt blocks (hashed)", f"{s.prompt_blocks:,} ({s.hashed_prompt_blocks:,})"),
        ("prefix reuse (infinite cache)", f"{s.prefix_reuse_fraction:.4f}"),
        ("content identity", "yes" if s.hashed_prompt_blocks else
         "none (no prompt content)"),
        ("makespan (s)", f"{s.makespan_us / 1e6:,.3f}"),
    ]
    if s.num_gpu_blocks:
        rows += [
            ("KV block budget (watermark)", f"{s.num_gpu_blocks:,} ({s.watermark_blocks:,})"),
            ("max held blocks", f"{s.max_held_blocks:,}"),
            ("max running sequences", f"{s.max_running_seqs:,}"),
            ("decode stalls / blocked admission steps",
             f"{s.decode_stalls:,} / {s.admission_blocked_steps:,}"),
            ("forced over-budget decodes", f"{s.forced_decodes:,}"),
        ]
    if s.dropped_requests:
        detail = ", ".join(f"{k} {v}" for k, v in s.dropped_requests_by_reason.items())
        rows.append(("dropped requests", f"{s.dropped_requests:,} ({detail})"))
    if s.dropped_events or s.format == "kvmi":
        detail = ", ".join(f"{k} {v}" for k, v in s.dropped_by_type.items())
        rows.append(("dropped kvmi decisions", f"{s.dropped_events:,}"
                     + (f" ({detail})" if detail else "")))
    for k, v in rows:
        table.add_row(k, v)
    out_console.print(table)


#: Options of the 2026 formats (issue 37), shared with ``kvsim reorder``.
OutputTokensOpt = Annotated[int | None, typer.Option(
    "--output-tokens", min=1, metavar="N", help="ServeGen content-hash batch jobs record no "
    "output length: generate N tokens per request (default 128, an assumption; "
    "docs/importers.md).", show_default=False)]
SubmissionRateOpt = Annotated[float | None, typer.Option(
    "--submission-rate", metavar="R", help="ServeGen batch job: submit request k at k/R "
    "seconds (default: all queued at t = 0).", show_default=False)]


# kv_deadline_scheduler's import options kvsim has no use for (kvsim.cli.compat).
_LogicalBlockMbOpt = compat.kvmi_only_option("--logical-block-mb", "MB")
_MaxBlocksPerRequestOpt = compat.kvmi_only_option("--max-blocks-per-request")


@app.command("import-request-trace")
def import_request_trace_command(
    requests: Annotated[Path, typer.Option(
        "--requests", help="Trace file or directory (agentic conversations).  .gz and .zst "
        "are read transparently.", show_default=False)],
    out: Annotated[Path, typer.Option(
        "--out", help="Event file to write: Parquet, or JSONL when the name ends in "
        ".jsonl (.jsonl.gz).  Written atomically.", show_default=False)],
    format: Annotated[str | None, typer.Option(
        "--format", help="Force the reader: " + ", ".join(FORMATS) + ".  Default: detected "
        "from the name and first line (docs/importers.md).", show_default=False)] = None,
    model: ModelOption = DEFAULT_MODEL,
    hardware: HardwareOption = "h100-sxm",
    timing: TimingOption = "auto",
    block_size: BlockSizeOption = 16,
    max_num_seqs: MaxSeqsOption = 256,
    max_num_batched_tokens: MaxTokensOption = 8192,
    num_gpu_blocks: NumGpuBlocksOption = None,
    gpu_memory_utilization: GpuMemUtilOption = None,
    map_: Annotated[str | None, typer.Option(
        "--map", help="Column mapping for the generic reader, e.g. "
        "'arrival_ms=ts,prompt_tokens=in,output_tokens=out' (implies --format generic); "
        "'kvmi' reads kv_deadline_scheduler's request traces (generated_tokens, "
        "deadline_ms).",
        show_default=False)] = None,
    trace_block_size: Annotated[int, typer.Option(
        "--trace-block-size", min=1, help="Tokens per block of a generic trace's "
        "block_ids column.")] = 16,
    skip_bad_rows: Annotated[bool, typer.Option(
        "--skip-bad-rows", help="Skip malformed rows and count them in the summary "
        "instead of failing on the first one.")] = False,
    arrival_rate: Annotated[float | None, typer.Option(
        "--arrival-rate", help="Agentic: conversations start as a Poisson process of this "
        "many conversations per second (seeded by --seed).", show_default=False)] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", min=1, help="Agentic: K conversations in flight; the next starts "
        "when one ends (default 8 when --arrival-rate is not given).",
        show_default=False)] = None,
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed of every random choice (agentic start times, speculative "
        "acceptance).")] = 0,
    kvmi_step_us: Annotated[int, typer.Option(
        "--kvmi-step-us", min=1, help="kvmi: microseconds per kvmi step (kvmi records "
        "no time).")] = 1000,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Refuse input that is otherwise read with a warning (Mooncake "
        "hash_ids that do not form a prefix tree).")] = False,
    limit: Annotated[list[str] | None, typer.Option(
        "--limit", metavar="NAME=VALUE", help="Raise or lower a size limit (repeatable): "
        "max_prompt_tokens, max_output_tokens, max_fanout, max_time_us, max_epoch_us, "
        "max_total_tokens (defaults in docs/cli.md).", show_default=False)] = None,
    output_tokens: OutputTokensOpt = None,
    submission_rate: SubmissionRateOpt = None,
    salt_by_tenant: SaltByTenantOpt = False,
    logical_block_mb: _LogicalBlockMbOpt = None,
    max_blocks_per_request: _MaxBlocksPerRequestOpt = None,
    json_: JsonOption = False,
) -> None:
    """Read a request trace (Mooncake, Azure, OpenAI proxy log, agentic conversations,
    kvmi events, RAGPulse, Bailian, BurstGPT, a vLLM KV-event recording, or any
    JSONL/CSV/Parquet with --map) and lower it through the engine model
    (continuous batching, chunked prefill, step times of --timing) to MemoryIntent block
    events.  Prints a summary (requests, events, prefix reuse, skipped rows)."""
    compat.kvmi_only("--logical-block-mb", logical_block_mb)
    compat.kvmi_only("--max-blocks-per-request", max_blocks_per_request)
    if map_ is None and format is None and (logical_block_mb is not None
                                            or max_blocks_per_request is not None):
        map_ = "kvmi"  # kvmi's own flags: its import reads kvmi request traces only
    map_ = compat.KVMI_REQUEST_MAP if map_ == "kvmi" else map_
    from kvsim.core.limits import set_limit_overrides

    set_limit_overrides(limit)
    from kvsim.core.fsutil import spooled_input

    with spooled_input(requests) as source:  # a pipe: read once, from its first byte
        summary = _run_import(source, out, format, json_, strict, map_, skip_bad_rows, model,
                              hardware, block_size, max_num_seqs, max_num_batched_tokens,
                              arrival_rate, concurrency, seed, trace_block_size,
                              kvmi_step_us, num_gpu_blocks, gpu_memory_utilization, timing,
                              extra=dict(output_tokens=output_tokens,
                                         submission_rate=submission_rate,
                                         salt_by_tenant=salt_by_tenant))
    if json_:
        emit_json(summary)
    else:
        render_summary(summary)


def _run_import(requests, out, format, json_, strict, map_, skip_bad_rows, model, hardware,
                block_size, max_num_seqs, max_num_batched_tokens, arrival_rate, concurrency,
                seed, trace_block_size, kvmi_step_us, num_gpu_blocks, gpu_memory_utilization,
                timing, extra):
    return run_with_progress(
        "importing", import_request_trace, quiet=quiet_progress(json_), strict=strict,
        path=requests, out_path=out, format=format,
        mapping=map_, skip_bad_rows=skip_bad_rows, model=model, hardware=hardware,
        block_size_tokens=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, arrival_rate=arrival_rate,
        concurrency=concurrency, seed=seed, trace_block_tokens=trace_block_size,
        kvmi_step_us=kvmi_step_us, num_gpu_blocks=num_gpu_blocks,
        gpu_memory_utilization=gpu_memory_utilization, timing=timing,
        output_tokens=extra["output_tokens"], submission_rate=extra["submission_rate"],
        salt_by_tenant=extra["salt_by_tenant"])
