"""Sizing before a replay and warnings after it, as ``kvsim simulate`` / ``compare`` print
them (the rules: :mod:`kvsim.analysis.sizing`, :mod:`kvsim.results.warnings`;
docs/simulate.md, "Sizing" and "Warnings")."""

from __future__ import annotations

import os
import re
import sys

from kvsim.core.errors import KvsimInputError

#: What rich's ``print(text, markup=False, soft_wrap=True)`` would change in a line: an emoji
#: code (``:name:``), a tab, a character outside printable ASCII.  A line without them, to a
#: stderr that rich would not take for a terminal, is the same bytes written directly.
_RICH_WOULD_CHANGE = re.compile(r":\S*:|[^\x20-\x7e]")


def stderr_line(text: str) -> None:
    """Print one line (a warning, a note) on stderr as ``kvsim.cli.common.err_console``
    prints it with markup off and no wrapping: written directly when rich would write the
    same bytes (rich, ~0.04 CPU-s of imports, is then not imported), else through rich."""
    from kvsim.cli import common

    try:
        tty = sys.stderr.isatty()
    except ValueError:  # a closed stream: rich decides
        tty = True
    if ("err_console" not in vars(common) and not tty and not _RICH_WOULD_CHANGE.search(text)
            and not {"TTY_COMPATIBLE", "FORCE_COLOR"} & os.environ.keys()):
        sys.stderr.write(text + "\n")
        return
    common.err_console.print(text, markup=False, soft_wrap=True)


def size_table(table, opts, config, replicas, sched, drop: bool, warnings: list,
          strict: bool = True) -> tuple:
    """Sizing before a replay (kvsim.analysis.sizing): refuse a table with requests over
    the model's context (one line, exit 2) unless ``drop``; warn when the offered load
    overloads ``replicas`` and propose a count; resolve ``--replicas auto``.  Returns the
    table, the replica count and the trace's span in us."""
    start = len(warnings)
    out = _size_table(table, opts, config, replicas, sched, drop, warnings, strict)
    _show_now(warnings[start:])  # now, before a replay that may run for minutes (issue #33)
    return out


def _size_table(table, opts, config, replicas, sched, drop, warnings, strict):
    from kvsim.analysis import sizing

    if sched == "closed" and getattr(opts, "hybrid_pool", "off") != "off" and \
            sizing.hybrid_warning(opts.model) is not None:  # served by the hybrid pool
        if any(getattr(config, f"{t}_gb") is None for t in ("dram", "cxl", "nvme")):
            warnings.append({"code": "hybrid_pool_hbm_only", "message": (
                f"{opts.model} is served through vLLM's hybrid pool (one manager per layer "
                "group), HBM only: the hardware profile's DRAM / CXL / NVMe tiers are off "
                "(--hybrid-pool off: every layer alike, with tiers)")})
    else:
        hybrid = sizing.hybrid_warning(opts.model)
        if hybrid is not None:
            warnings.append(hybrid)
    ctx = sizing.context_check(table, opts.model)
    if ctx.over and not strict and not drop:  # a generated profile: warn, serve as is
        warnings.append({"code": "over_context", "message": (
            f"{ctx.over:,} of {ctx.requests:,} generated requests exceed {ctx.model}'s "
            f"context of {ctx.context_tokens:,} tokens (a real engine would reject them)")})
    elif ctx.over:
        if not drop:
            raise KvsimInputError(
                f"{ctx.over:,} of {ctx.requests:,} requests exceed {ctx.model}'s context of "
                f"{ctx.context_tokens:,} tokens (prompt + output; longest "
                f"{ctx.longest_tokens:,}): choose a longer-context --model "
                f"({sizing.longer_context_model(ctx)}) or pass --drop-over-context", None,
                None, "--model")
        table = sizing.drop_over_context(table, ctx.context_tokens)
        warnings.append({"code": "over_context", "message": (
            f"dropped {ctx.over:,} of {ctx.requests:,} requests over {ctx.model}'s context "
            f"of {ctx.context_tokens:,} tokens (--drop-over-context)")})
        if len(table) == 0:
            raise KvsimInputError(f"every request exceeds {ctx.model}'s context of "
                                  f"{ctx.context_tokens:,} tokens: nothing to serve", None,
                                  None, "--model")
    load = sizing.estimate_load(table, opts.model, config.hardware, opts.max_num_seqs,
                                opts.max_num_batched_tokens,
                                sizing.pool_blocks(config, opts.model, opts.block_size_tokens),
                                opts.block_size_tokens)
    upper = 100 * load.busy_upper_s / load.span_s if load.span_s > 0 else float("inf")
    if replicas == "auto":
        replicas = load.replicas if sched == "closed" else 1
        from kvsim.core.limits import check_replicas_memory

        check_replicas_memory(replicas, "--replicas auto")
        from kvsim.cli.common import err_console

        err_console.print(f"--replicas auto: {replicas} (one replica would be "
                          f"{100 * load.utilisation:.0f}-{upper:.0f}% busy, from a perfect "
                          f"prefix cache to none, decoding {load.decode_batch:.0f} sequences "
                          f"a step in its KV pool; target "
                          f"{100 * sizing.TARGET_UTILISATION:.0f}% with no hit)",
                          highlight=False)
    elif load.utilisation / replicas > sizing.OVERLOAD_UTILISATION:
        warnings.append({"code": "overload_predicted", "message": (
            f"this trace overloads {replicas} replica(s) of {opts.model} on "
            f"{config.hardware}: one replica would be {100 * load.utilisation:.0f}% busy "
            f"even with a perfect prefix cache (step-time model, {load.busy_s:,.0f} s of work "
            f"in {load.span_s:,.0f} s); TTFT will measure the queue.  Proposed: --replicas "
            f"{load.replicas} (or --replicas auto)")})
    span = load.span_s * 1e6
    return table, replicas, span


def run_warnings(df, trace, span_us, config=None, single_run: bool = False) -> list[dict]:
    """Warnings about the result rows (kvsim.results.warnings): a DataFrame, or its rows
    as dicts (a single run's summary: no DataFrame built for ``--json``; ``single_run``:
    ``simulate``'s one run, also warned about when its policy never chose).  A run that served
    nothing is refused, naming the option that sized the pool (``config.hbm_blocks``:
    --hbm-blocks, else --hbm-gb)."""
    from kvsim.results.warnings import result_warnings

    budget = None
    if trace is not None:
        try:
            from kvsim.events import open_events

            with open_events(trace) as reader:
                budget = (reader.header.source or {}).get("engine", {}).get("num_gpu_blocks")
        except Exception:  # noqa: BLE001 - the header was read once already; best effort
            budget = None
    rows = df if isinstance(df, list) else df.to_dict(orient="records")
    online = [r for r in rows if not bool(r.get("offline"))]
    if online and all(int(r.get("requests") or 0) == 0 and int(r.get("dropped_requests") or 0)
                      for r in online):  # nothing served: refuse, never "0 requests", exit 0
        r = online[0]
        option = "--hbm-blocks" if getattr(config, "hbm_blocks", None) is not None \
            else "--hbm-gb"
        raise KvsimInputError(
            f"expected an HBM pool that holds at least one request: all "
            f"{int(r['dropped_requests']):,} requests were dropped (their prompt never fits "
            f"the {int(r.get('hbm_capacity_blocks') or 0):,}-block pool); raise --hbm-gb / "
            "--hbm-blocks or lower --block-size", None, None, option)
    return result_warnings(rows, span_us=span_us, schedule_budget_blocks=budget,
                           single_run=single_run)


#: sizing warnings already printed before the replay (by identity; print_warnings skips
#: them and forgets them)
_SHOWN: list[dict] = []


def _show_now(warnings: list[dict]) -> None:
    for w in warnings:
        stderr_line(f"warning: {w['message']}")
        _SHOWN.append(w)


def print_warnings(warnings: list[dict]) -> None:
    """Print the warnings on stderr, but those :func:`size_table` printed already."""
    for w in warnings:
        if not any(w is s for s in _SHOWN):
            stderr_line(f"warning: {w['message']}")
    _SHOWN.clear()
