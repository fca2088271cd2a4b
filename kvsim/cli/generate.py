"""``kvsim generate``: a synthetic workload profile -> MemoryIntent events.

API: :func:`kvsim.workload.generate` (returns :class:`kvsim.events.import_summary.ImportSummary`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli import app, compat
from kvsim.cli.common import (
    JsonOption,
    check_limit,
    check_outputs,
    emit_json,
    out_console,
    quiet_progress,
)
from kvsim.cli.importing import (
    BlockSizeOption,
    GpuMemUtilOption,
    HardwareOption,
    MaxSeqsOption,
    MaxTokensOption,
    ModelOption,
    NumGpuBlocksOption,
    TimingOption,
    render_summary,
    run_with_progress,
)
from kvsim.spec.models.catalog import DEFAULT_MODEL
from kvsim.workload import generate, list_profiles, load_profile


def _list_callback(value: bool) -> None:
    if value:
        for name in list_profiles():
            out_console.print(f"{name:24s} {load_profile(name).description}")
        raise typer.Exit()


# kv_deadline_scheduler's generate options kvsim has no use for (kvsim.cli.compat).
_DecodeStepsOpt = compat.kvmi_only_option("--decode-steps")
_BlocksPerRequestOpt = compat.kvmi_only_option("--blocks-per-request")
_BlockKbOpt = compat.kvmi_only_option("--block-kb")


@app.command("generate")
def generate_command(
    profile: Annotated[str, typer.Option(
        "--profile", help="Workload profile: a bundled name (" + ", ".join(list_profiles())
        + ") or a .toml path (format: docs/profiles.md).", show_default=False)],
    requests: Annotated[int, typer.Option(
        "--requests", min=1, help="Number of requests to generate.", show_default=False)],
    out: Annotated[Path, typer.Option(
        "--out", help="Event file to write: Parquet, or JSONL when the name ends in "
        ".jsonl.  Written atomically.", show_default=False)],
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed of the numpy Generator: same seed -> byte-identical "
        "file.")] = 0,
    model: ModelOption = DEFAULT_MODEL,
    hardware: HardwareOption = "h100-sxm",
    timing: TimingOption = "auto",
    block_size: BlockSizeOption = 16,
    max_num_seqs: MaxSeqsOption = 256,
    max_num_batched_tokens: MaxTokensOption = 8192,
    num_gpu_blocks: NumGpuBlocksOption = None,
    gpu_memory_utilization: GpuMemUtilOption = None,
    list_: Annotated[bool, typer.Option(
        "--list", callback=_list_callback, is_eager=True,
        help="List the bundled profiles with their descriptions and exit.")] = False,
    decode_steps: _DecodeStepsOpt = None,
    blocks_per_request: _BlocksPerRequestOpt = None,
    block_kb: _BlockKbOpt = None,
    json_: JsonOption = False,
) -> None:
    """Generate a synthetic workload from a TOML profile (sessions, SLOs, priorities, shared
    prefixes, RAG documents, speculative decoding, beams) and lower it through the engine
    model to MemoryIntent block events.  Deterministic for a given --seed."""
    check_outputs(("--out", out, "events"))
    check_limit("--requests", requests, "max_concurrency")
    for flag, value in (("--decode-steps", decode_steps),
                        ("--blocks-per-request", blocks_per_request), ("--block-kb", block_kb)):
        compat.kvmi_only(flag, value)
    summary = run_with_progress(
        "generating", generate, quiet=quiet_progress(json_), profile=profile,
        num_requests=requests, seed=seed,
        out_path=out, model=model, hardware=hardware, block_size_tokens=block_size,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        num_gpu_blocks=num_gpu_blocks, gpu_memory_utilization=gpu_memory_utilization,
        timing=timing)
    if json_:
        emit_json(summary)
    else:
        render_summary(summary)
