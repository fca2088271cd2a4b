"""``kvsim validate``: kvsim's pool against a real engine's KV events
(API: :func:`kvsim.analysis.validate.validate`, returns :class:`ValidationResult`), or
kvsim's engine step function against a vLLM scheduler recording, step by step
(``--sched-recording``; API: :func:`kvsim.analysis.sched_validate.validate_sched`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvsim.analysis.sched_validate import FIELDS, SchedValidation, validate_sched
from kvsim.analysis.validate import ValidationResult, validate
from kvsim.cli import app
from kvsim.cli.common import JsonOption, emit_json, out_console
from kvsim.core.errors import KvsimInputError


@app.command("validate", short_help="Check kvsim against vLLM: its block pool against a "
             "KV-event recording, or its scheduler step by step against a scheduler "
             "recording.")
def validate_command(
    events: Annotated[Path | None, typer.Option(
        "--events", help="vLLM KV-event recording: msgpack payloads back to back (*.msgpack) "
        "or JSONL, one KVEventBatch a line (.gz/.zst read too).",
        show_default=False)] = None,
    sched_recording: Annotated[Path | None, typer.Option(
        "--sched-recording", help="vLLM scheduler recording (kvsim-vllm-sched, "
        "docs/vllm-recordings.md): replay its requests through kvsim's vLLM step function "
        "with the recorded engine config and arrivals, and compare every step (scheduled "
        "set and tokens, preemptions, hits, block ids, free blocks, KV events).",
        show_default=False)] = None,
    requests: Annotated[Path | None, typer.Option(
        "--requests", help="Request log of the same run (JSONL: prompt_token_ids, optional "
        "output_token_ids, start_step, finish_step; docs/cli.md).  Required with --events: "
        "the recording holds only full blocks' token ids, so requests rebuilt from it would "
        "lack their partial last block and output.", show_default=False)] = None,
    num_gpu_blocks: Annotated[int | None, typer.Option(
        "--num-gpu-blocks", min=2, help="The engine's pool size, null block included (vLLM's "
        "num_gpu_blocks).  Default: large enough that kvsim never evicts.",
        show_default=False)] = None,
    dp_rank: Annotated[int | None, typer.Option(
        "--dp-rank", min=0, help="Data-parallel rank to check when the recording holds "
        "several.", show_default=False)] = None,
    engine: Annotated[str, typer.Option(
        "--engine", help="With --sched-recording: the step function to check, 'compiled' "
        "(kvsim.engine.vllm_step, the one the closed loop runs) or 'python' (its "
        "plain-Python witness).")] = "compiled",
    pool: Annotated[str, typer.Option(
        "--pool", help="With --sched-recording --engine python: the block pool under it, "
        "'fast' (the replay's compiled pool) or 'reference' (the plain-Python twin of "
        "vLLM's BlockPool).")] = "fast",
    closed_loop: Annotated[bool, typer.Option(
        "--closed-loop", help="With --sched-recording: replay the recording's requests "
        "through kvsim's closed loop (scheduler vllm, policy lru, HBM only, the recording's "
        "engine config and step clock) instead of the bare step function, and compare every "
        "step, including the replay's free HBM blocks.")] = False,
    json_: JsonOption = False,
) -> None:
    """Replay the requests of a recorded vLLM run through kvsim's vLLM-faithful block pool
    and compare, event by event, with what the engine published: stored blocks, removed
    blocks and their order, the resident set after each batch, the block hit rate.  Prints
    the agreement (0 to 1) and the first divergence with its context.

    With ``--sched-recording``: run kvsim's engine step function (vLLM 0.33's
    ``schedule()``) over a recording of vLLM's own scheduler and report, per compared
    field, the fraction of steps that agree, and the first divergence (step, field,
    requests, both values)."""
    if (events is None) == (sched_recording is None):
        raise KvsimInputError("give exactly one of --events (KV-event recording) and "
                              "--sched-recording (scheduler recording)", field="--events")
    if sched_recording is not None:
        if requests is not None or num_gpu_blocks is not None or dp_rank is not None:
            raise KvsimInputError("--requests, --num-gpu-blocks and --dp-rank go with "
                                  "--events; a scheduler recording holds its own requests "
                                  "and engine config", field="--sched-recording")
        if closed_loop:
            from kvsim.analysis.sched_closed import validate_sched_closed

            sres = validate_sched_closed(sched_recording)
        else:
            sres = validate_sched(sched_recording, pool=pool, engine=engine)
        if json_:
            emit_json(sres.to_json_dict())
        else:
            _render_sched(sres)
        return
    result = validate(events, requests, num_gpu_blocks=num_gpu_blocks, data_parallel_rank=dp_rank)
    if json_:
        emit_json(result.to_json_dict())
    else:
        _render(result)


def _render(r: ValidationResult) -> None:
    table = Table(title=f"{r.events_path} vs kvsim", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("requests", f"{r.num_requests:,} ({r.requests_source})"),
        ("pool blocks / block size", f"{r.num_gpu_blocks:,} / {r.block_size_tokens}"),
        ("engine batches", f"{r.engine_batches:,}"),
        ("events engine / kvsim / matched",
         f"{r.engine_events:,} / {r.kvsim_events:,} / {r.matched_events:,}"),
        ("agreement", f"{r.agreement:.4f}"),
        ("stored engine / kvsim / common",
         f"{r.stored['engine']:,} / {r.stored['kvsim']:,} / {r.stored['common']:,}"),
        ("removed engine / kvsim / common",
         f"{r.removed['engine']:,} / {r.removed['kvsim']:,} / {r.removed['common']:,}"),
        ("removal order identical", "yes" if r.removed["same_order"] else "no"),
        ("resident set equal after batch",
         f"{r.resident_steps_equal:,} of {r.resident_steps:,}"),
        ("block hit rate engine / kvsim",
         f"{r.engine_block_hit_rate:.4f} / {r.kvsim_block_hit_rate:.4f}"),
        ("kvsim allocation failures", f"{r.alloc_failures:,}"),
    ]
    for k, v in r.skipped_events.items():
        rows.append((f"skipped: {k}", f"{v:,}"))
    for k, v in rows:
        table.add_row(k, v)
    out_console.print(table)
    d = r.first_divergence
    if d is None:
        out_console.print("no divergence: kvsim emits exactly the engine's events")
    else:
        where = f"batch {d.batch} event {d.event_in_batch}" if d.batch >= 0 else "after the end"
        out_console.print(f"first divergence at per-block event {d.index} ({where}):\n"
                          f"  expected (kvsim): {d.expected}\n  found (engine):   {d.found}",
                          markup=False, highlight=False)


def _render_sched(r: SchedValidation) -> None:
    table = Table(title=f"{r.path} (vLLM {r.vllm_version}) vs kvsim", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [("case / requests", f"{r.case} / {r.num_requests:,}"),
            ("kvsim code checked", r.engine if r.engine == "compiled"
             else f"{r.engine}: {r.pool}" if r.engine == "closed-loop"
             else f"{r.engine} over the {r.pool} pool"),
            ("steps vLLM / kvsim", f"{r.steps_vllm:,} / {r.steps_kvsim:,}")]
    names = {"sched": "step agreement (scheduled set + tokens)",
             "preempted": "preemption agreement", "events": "KV-event agreement",
             "hits": "prefix-hit agreement", "blocks": "block-id agreement",
             "finished": "finished agreement", "free": "free-block agreement",
             "reset": "reset agreement"}
    for f in FIELDS:
        if f in r.agree:
            rows.append((names[f], f"{r.agreement(f):.4f}"))
    rows += [("preemptions vLLM / kvsim", f"{r.preemptions['vllm']:,} / "
              f"{r.preemptions['kvsim']:,}"),
             ("hit tokens (new) vLLM / kvsim", f"{r.hit_tokens['new']['vllm']:,} / "
              f"{r.hit_tokens['new']['kvsim']:,}"),
             ("hit tokens (resumed) vLLM / kvsim", f"{r.hit_tokens['resumed']['vllm']:,} / "
              f"{r.hit_tokens['resumed']['kvsim']:,}")]
    for k, v in r.events.items():
        rows.append((f"{k.replace('_', ' ')} vLLM / kvsim", f"{v['vllm']:,} / {v['kvsim']:,}"))
    for k, v in r.replay.items():
        rows.append((f"replay: {k.replace('_', ' ')}", f"{v:,}"))
    for k, v in rows:
        table.add_row(k, v)
    out_console.print(table)
    d = r.first_divergence
    if d is None:
        out_console.print("no divergence: kvsim's scheduler made vLLM's every step")
    else:
        out_console.print("first divergence: " + d.describe(), markup=False, highlight=False)
