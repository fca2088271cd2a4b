"""``kvsim inspect``: summarize an event file (API: :func:`kvsim.analysis.trace_summary.summarize_trace`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvsim.analysis.trace_summary import TraceSummary, head_events, summarize_trace
from kvsim.cli import app
from kvsim.cli.common import JsonOption, emit_json, out_console, progress
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import DEFAULTS, ENUM_COLUMNS


@app.command("inspect", short_help="Validate an event file and summarize it: requests, blocks, "
             "bytes, steps, tokens, prefix reuse.")
def inspect_command(
    trace: Annotated[Path | None, typer.Argument(
        help="Event file to inspect: Parquet, or JSONL when named *.jsonl "
             "(also *.jsonl.gz / *.jsonl.zst).  See docs/trace-format.md.  A request "
             "trace (Mooncake, Weka, ServeGen, Dynamo, ...; docs/importers.md) is read "
             "and its requests, sessions, tenants and infinite-cache reuse reported.",
        show_default=False, metavar="TRACE")] = None,
    trace_opt: Annotated[Path | None, typer.Option(
        "--trace", metavar="TRACE", help="The event file, as an option "
        "(kv_deadline_scheduler's spelling; same as the TRACE argument).",
        show_default=False)] = None,
    head: Annotated[int | None, typer.Option(
        "--head", min=0, metavar="N",
        help="Print the first N events (validated) instead of the summary.",
        show_default=False)] = None,
    json_: JsonOption = False,
) -> None:
    """Validate an event file in one streaming pass and summarize it: requests, events by
    kind, unique blocks, allocated bytes, steps, tokens and the prefix-reuse fraction (the
    block hit rate of an infinite prefix cache).  Exit 2 with one `error:` line on the
    first invalid row."""
    if (trace is None) == (trace_opt is None):
        raise KvsimInputError("expected the event file once: TRACE or --trace TRACE", None,
                              None, "--trace")
    trace = trace if trace is not None else trace_opt
    fmt = None if head is not None else _request_trace_format(trace)
    if fmt is not None:
        from kvsim.analysis.request_facts import request_facts
        from kvsim.ingest import read_requests

        facts = request_facts(read_requests(trace, fmt))
        if json_:
            emit_json(facts.to_dict())
        else:
            _render_requests(trace, facts)
        return
    if head is not None:
        df = head_events(trace, head)
        if json_:
            emit_json(df.to_dict(orient="records"))
        else:
            # Plain aligned text, never truncated (a wide terminal or `less -S` shows it all).
            shown = df[[c for c in df.columns if c in _ALWAYS_SHOWN or not
                        (df[c] == _DEFAULT_SHOWN[c]).all()]]
            out_console.print(f"{trace}: first {len(df)} events (columns at their default "
                              "value in every shown row are left out)", markup=False,
                              highlight=False, soft_wrap=True)
            out_console.print(shown.to_string(index=False), markup=False, highlight=False,
                              soft_wrap=True)
        return
    with progress() as bar:
        task = bar.add_task(f"inspect {trace.name}", total=None)
        summary = summarize_trace(
            trace, on_progress=lambda done, total: bar.update(task, completed=done, total=total))
    if json_:
        emit_json(summary)
    else:
        _render(trace, summary)


def _request_trace_format(trace: Path) -> str | None:
    """The reader of ``trace`` when it is a request trace, None for an event file (or a
    file that is neither: the event reader's error then names what is wrong)."""
    from kvsim.events import open_events
    from kvsim.ingest.detect import detect_format

    try:
        with open_events(trace) as reader:
            reader.header  # noqa: B018 - reading it is the check
        return None
    except (KvsimInputError, OSError):
        try:
            fmt = detect_format(trace)
        except (KvsimInputError, OSError):
            return None
        return None if fmt in ("generic", "kvmi") else fmt


def _render_requests(trace: Path, f) -> None:
    table = Table(title=f"{trace} (request trace, {f.format})", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("requests", f"{f.requests:,}" + (f" ({f.skipped_rows:,} bad rows skipped)"
                                                   if f.skipped_rows else ""))
    table.add_row("sessions", f"{f.sessions:,} ({f.requests_in_sessions:,} requests)")
    table.add_row("tenants", f"{f.tenants:,}")
    table.add_row("models", ", ".join(f.models) or "-")
    table.add_row("prompt / output tokens", f"{f.prompt_tokens:,} / {f.output_tokens:,}")
    table.add_row("arrivals", "one batch job (all at t = 0)" if f.batch_job else
                  f"over {f.arrival_span_s:,.3f} s")
    table.add_row("trace block size (tokens)", f"{f.block_size_tokens:,}")
    table.add_row("identified prompt blocks", f"{f.prompt_blocks:,}")
    table.add_row("prefix reuse (infinite cache)",
                  f"{f.prefix_reuse_fraction:.4f} ({f.reused_blocks:,} reused, "
                  f"{f.reused_tokens:,} tokens)")
    out_console.print(table)


_ALWAYS_SHOWN = ("step", "time_us", "kind", "request_id", "block_index")
_DEFAULT_SHOWN = {name: (ENUM_COLUMNS[name](value).name if name in ENUM_COLUMNS else value)
                  for name, value in DEFAULTS.items()}


def _render(trace: Path, s: TraceSummary) -> None:
    h = s.header
    table = Table(title=f"{trace}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("model / hardware", f"{h.get('model') or '-'} / {h.get('hardware') or '-'}")
    table.add_row("block size (tokens)", f"{h['block_size_tokens']:,}")
    table.add_row("KV bytes per token", f"{h['kv_bytes_per_token']:,}")
    table.add_row("requests", f"{s.requests:,}")
    table.add_row("events", f"{s.events:,}")
    for kind, count in s.events_by_kind.items():
        if count:
            table.add_row(f"  {kind}", f"{count:,}")
    table.add_row("steps", f"{s.steps:,} ({s.first_step} .. {s.last_step})")
    table.add_row("time span (s)", f"{s.time_span_us / 1e6:,.3f}")
    table.add_row("step compute (s)", f"{s.step_compute_us / 1e6:,.3f}")
    table.add_row("prompt tokens", f"{s.prompt_tokens:,}")
    table.add_row("prefill tokens computed", f"{s.prefill_tokens_computed:,}")
    table.add_row("decode tokens", f"{s.decode_tokens:,}")
    table.add_row("allocated blocks", f"{s.allocated_blocks:,}")
    table.add_row("unique blocks", f"{s.unique_blocks:,}")
    table.add_row("allocated bytes", f"{s.bytes['total']:,}")
    for phase, value in s.bytes["by_phase"].items():
        if value:
            table.add_row(f"  phase {phase}", f"{value:,}")
    for prio, value in s.bytes["by_priority"].items():
        if value:
            table.add_row(f"  priority {prio}", f"{value:,}")
    table.add_row("prompt block refs", f"{s.prompt_block_refs:,}")
    table.add_row("prefix reuse (infinite cache)",
                  f"{s.prefix_reuse_fraction:.4f} ({s.prompt_block_reuses:,} reused)")
    if s.chunk_reuse:
        c = s.chunk_reuse
        table.add_row("chunk tokens reused: prefix / position-independent",
                      f"{c['prefix_reuse_token_fraction']:.4f} / "
                      f"{c['position_independent_reuse_token_fraction']:.4f}")
        table.add_row("extra reuse a CacheBlend-style chunk cache finds",
                      f"{c['extra_position_independent_reuse_fraction']:.4f}")
    out_console.print(table)
