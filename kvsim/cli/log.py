"""``kvsim log summary / show / explain / diff / timeline``: read decision logs.

Thin shells over :mod:`kvsim.results` (``log_reader.DecisionLog``, ``log_summary.summary``,
``log_query.show`` / ``timeline``, ``log_explain.explain``, ``log_diff.diff``): parse
options, call one function, render a rich table, ``--json`` or (show, timeline) ``--csv``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from kvsim.cli import app
from kvsim.cli.common import JsonOption, emit_json, out_console
from kvsim.core.errors import KvsimInputError
from kvsim.results.log_diff import LogDiff, diff
from kvsim.results.log_explain import Explanation, explain
from kvsim.results.log_query import parse_step_range, show, tiers_visited, timeline
from kvsim.results.log_reader import DecisionLog, parse_action, parse_block, parse_tier
from kvsim.results.log_summary import LogSummary, summary

log_app = typer.Typer(
    help="Read decision logs (written by `kvsim simulate --decision-log` / `kvsim compare "
         "--decision-log-dir`): summary, show, explain, diff, timeline.  Logs are streamed "
         "by row group, never loaded whole.  Schema: docs/decision-log.md.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(log_app, name="log", help="Read decision logs: why each eviction, what it cost, "
              "where two policies diverge (summary / show / explain / diff / timeline).")

LogArg = Annotated[Path, typer.Argument(
    help="Decision log (Parquet, decision-log schema version 1).", metavar="LOG",
    show_default=False)]
TopOption = Annotated[int, typer.Option(
    "--top", min=1, metavar="N", help="Length of every \"most\" list.")]
CsvOption = Annotated[bool, typer.Option(
    "--csv", help="Print the rows as CSV on stdout (same columns as --json).")]
BlockOption = Annotated[str | None, typer.Option(
    "--block", metavar="B", show_default=False,
    help="Block identity: its content hash (integer), or REQUEST:INDEX for a block "
         "without one (as printed in the `block` column).")]


def _one_line(text: str) -> str:
    return " ".join(text.split())


_HELP = {
    "summary": _one_line("""Decisions by action, reason and tier; the blocks and requests
        evicted most; stall time by the request that paid it and by the eviction that
        caused it; regret (evictions needed again, how soon, at what cost).  One streamed
        pass over the log."""),
    "show": _one_line("""Print the log rows matching every filter, in seq order.  Filters on
        request, block, action, tier and step are pushed down to Parquet row groups, so
        selective queries on huge logs read little; the scan stops after --limit rows.
        The table shows the main columns; --json and --csv give every column."""),
    "explain": _one_line("""Why this victim: the decision at step N (about --block B, else
        the step's first eviction), every candidate with its score terms (from the policy's
        explain(), else the logged score) and each candidate's next use, and what the
        eviction cost: when the victim was needed again, by which request, the stall, and
        whether its deadline was missed."""),
    "diff": _one_line("""Compare two policies' logs of the same trace: the first divergent
        decision and what each side's choice cost afterwards, the blocks one evicted while
        the other kept, and the regret (stall caused by evictions) of each."""),
    "timeline": _one_line("""A block's whole biography (--block): allocated, shared, cached
        while free, revived, evicted, demoted, promoted, with steps and the tiers holding it
        after each row; or a request's events (--request)."""),
}


def _table(frame: pd.DataFrame, title: str, columns: list[str] | None = None,
           headers: dict[str, str] | None = None) -> Table:
    table = Table(title=title)
    columns = columns or list(frame.columns)
    for col in columns:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                      for v in frame[col] if v is not None)
        table.add_column((headers or {}).get(col, col), justify="right" if numeric else "left",
                         no_wrap=col not in _WRAPPED, min_width=24 if col in _WRAPPED else None)
    for row in frame[columns].itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    return table


#: Free-text columns: they wrap; every other column keeps one line (ellipsis if narrow).
_WRAPPED = ("reason", "what")


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) < 10**12 else str(value)
    return "-" if value is None else str(value)


def _records(rows: list[dict], title: str, columns: list[str] | None = None,
             headers: dict[str, str] | None = None) -> Table:
    return (_table(pd.DataFrame(rows), title, columns, headers) if rows
            else Table(title=f"{title}: none"))


#: Short headers of the summary's costliest-evictions table, so that it fits 100 columns
#: (issue #33: 125 wide); --json keeps the field names.
_TOP_HEADERS = {"from_tier": "from", "cost_us": "cost us", "need_step": "needed at",
                "need_request_id": "by request", "need_decode_critical": "decode-crit"}


def _emit_frame(frame: pd.DataFrame, json_: bool, csv: bool) -> bool:
    if json_ and csv:
        raise KvsimInputError("expected at most one of --json and --csv", field="format")
    if json_:
        emit_json(frame.to_dict(orient="records"))
        return True
    if csv:
        sys.stdout.write(frame.to_csv(index=False, lineterminator="\n"))
        return True
    return False


@log_app.command("summary", help=_HELP["summary"])
def summary_command(log: LogArg, top: TopOption = 10, json_: JsonOption = False) -> None:
    """Shell over :func:`kvsim.results.log_summary.summary` (help text: ``_HELP``)."""
    result = summary(DecisionLog(log), top=top)
    if json_:
        emit_json(result)
        return
    _render_summary(result)


def _render_summary(s: LogSummary) -> None:
    head = Table(title=f"{s.path}: policy {s.policy}", show_header=False)
    head.add_column("what")
    head.add_column("value", justify="right")
    r = s.regret
    for name, value in [
        ("rows / decisions", f"{s.rows:,} / {s.decisions:,}"),
        ("steps", f"{s.first_step:,} .. {s.last_step:,}"),
        ("time charged (us)", f"{s.total_cost_us:,.1f}"),
        ("  of which decode-critical (us)", f"{s.critical_cost_us:,.1f}"),
        ("evictions (EVICT + DEMOTE)", f"{r['evictions']:,}"),
        ("  needed again", f"{r['needed_again']:,} ({r['needed_again_fraction']:.1%})"),
        ("  never needed again", f"{r['never_needed_again']:,}"),
        ("  reuse distance p50 / p90 / max (steps)",
         " / ".join(_cell(r[k]) for k in ("distance_steps_p50", "distance_steps_p90",
                                          "distance_steps_max"))),
        ("  needed again within 1 / 10 / 100 / 1000 steps",
         " / ".join(f"{v:,}" for v in r["within_steps"].values())),
        ("  regret cost (us)", f"{r['cost_us']:,.1f}"),
        ("  regret cost on decode-critical needs (us)", f"{r['decode_critical_cost_us']:,.1f}"),
        ("stall not caused by an eviction (needs / us)",
         f"{s.unattributed_needs:,} / {s.unattributed_cost_us:,.1f}"),
    ]:
        head.add_row(name, value)
    from kvsim.cli.render import print_view

    print_view(head, _records(s.by_action, "rows by action"),
               _records(s.by_reason, "decisions by reason"),
               _records(s.by_tier, "rows by tier move"),
               _records(s.stall_by_cause, "stall by the eviction that caused it"),
               _records(s.top_causes, "costliest evictions (--json: seq and reasons too)",
                        ["step", "block", "action", "from_tier", "cost_us",
                         "need_step", "need_request_id", "need_decode_critical"],
                        _TOP_HEADERS),
               _records(s.top_paying_requests, "requests that paid the most stall"),
               _records(s.top_evicted_blocks, "blocks evicted most"),
               _records(s.top_evicted_requests, "requests whose blocks were evicted most"))


@log_app.command("show", help=_HELP["show"])
def show_command(
    log: LogArg,
    request: Annotated[int | None, typer.Option(
        "--request", metavar="R", min=0, show_default=False,
        help="Only rows on behalf of request R.")] = None,
    block: BlockOption = None,
    action: Annotated[list[str] | None, typer.Option(
        "--action", metavar="NAME", show_default=False,
        help="Only these actions (repeat, or comma-separated): EVICT, DEMOTE, PROMOTE, "
             "PREFETCH, RECOMPUTE, WRITE_THROUGH, PREEMPT, ALLOCATE, HIT, RELEASE, REVIVE, "
             "FREE.")] = None,
    tier: Annotated[list[str] | None, typer.Option(
        "--tier", metavar="NAME", show_default=False,
        help="Only rows leaving or entering these tiers (repeat, or comma-separated): "
             "HBM, DRAM, CXL, NVME.")] = None,
    step: Annotated[str | None, typer.Option(
        "--step", metavar="A:B", show_default=False,
        help="Only steps A..B, both inclusive; A: or :B leave a side open; a single number "
             "selects one step.")] = None,
    reason: Annotated[str | None, typer.Option(
        "--reason", metavar="TEXT", show_default=False,
        help="Only rows whose reason contains TEXT (case-insensitive).")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", min=0, metavar="N", help="Print at most N rows (0 = all).")] = 50,
    json_: JsonOption = False,
    csv: CsvOption = False,
) -> None:
    """Shell over :func:`kvsim.results.log_query.show` (help text: ``_HELP``)."""
    result = show(DecisionLog(log), request=request,
                  block=parse_block(block) if block is not None else None,
                  actions=[parse_action(a) for a in _split(action)] or None,
                  tiers=[parse_tier(t) for t in _split(tier)] or None,
                  steps=parse_step_range(step) if step is not None else None,
                  reason=reason, limit=limit)
    if not _emit_frame(result, json_, csv):
        out_console.print(_table(result, f"{log}: {len(result):,} rows"
                                 + (f" (limit {limit})" if limit and len(result) == limit else ""),
                                 _SHOW_TABLE))


#: Columns of the `show` table (the rest are in --json / --csv).
_SHOW_TABLE = ["seq", "step", "action", "block", "request_id", "from_tier", "to_tier",
               "cost_us", "decode_critical", "reason"]


def _split(values: list[str] | None) -> list[str]:
    return [p for v in values or [] for p in v.split(",") if p.strip()]


@log_app.command("explain", help=_HELP["explain"])
def explain_command(
    log: LogArg,
    step: Annotated[int, typer.Option(
        "--step", metavar="N", show_default=False,
        help="Engine step of the decision.")],
    block: BlockOption = None,
    json_: JsonOption = False,
) -> None:
    """Shell over :func:`kvsim.results.log_explain.explain` (help text: ``_HELP``)."""
    result = explain(DecisionLog(log), step, parse_block(block) if block is not None else None)
    if json_:
        emit_json(result)
        return
    _render_explain(result)


def _render_explain(e: Explanation) -> None:
    out_console.print(
        f"[bold]step {e.step}[/bold] (seq {e.seq}, t={e.time_us:,.1f} us), policy "
        f"[bold]{e.policy}[/bold]: {e.action} block {e.block} "
        f"{e.from_tier} -> {e.to_tier} on behalf of request {e.request_id}; reason: {e.reason}")
    if e.candidates:
        from kvsim.cli.render import print_view

        print_view(_candidate_table(e))
    n = e.next_need
    if e.action not in ("EVICT", "DEMOTE"):
        pass
    elif n is None:
        out_console.print(f"next: block {e.block} was never needed again in this log.")
    else:
        missed = {True: "; it MISSED the deadline", False: "; within the deadline",
                  None: ""}[n["deadline_missed"]]
        out_console.print(
            f"next: block {e.block} was needed again at step {n['step']} "
            f"({n['steps_later']} steps later) by request {n['request_id']} via {n['action']}, "
            f"costing {n['cost_us']:,.1f} us"
            + (" on a decode-critical step" if n["decode_critical"] else "") + missed + ".")
    if e.other_decisions:
        shown = e.other_decisions[:_OTHERS_SHOWN]
        others = ", ".join(f"{d['action']} {d['block']} (seq {d['seq']})" for d in shown)
        more = len(e.other_decisions) - len(shown)
        out_console.print(f"other decisions at step {e.step}: {others}"
                          + (f", and {more:,} more (--json lists all)" if more else ""))


def _num_text(v, fmt: str = "{:,.4g}") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v)


def _candidate_table(e: Explanation) -> Table:
    """The candidates of an explanation, sized for 120 columns: the score terms share one
    wrapped column (a policy's explain() may return many), times in ms, no sentinels."""
    from rich import box

    table = Table(title=f"candidates (terms: {e.terms_source})", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False,
                  header_style="bold")
    for header, justify in (("#", "right"), ("block", "left"), ("score", "right"),
                            ("terms", "left"), ("last access\nms", "right"),
                            ("deadline\nms", "right"), ("prio", "right"),
                            ("next use\nstep", "right"), ("next use", "left")):
        table.add_column(header, justify=justify, no_wrap=header != "terms",
                         overflow="fold", min_width=12 if header == "terms" else None)
    logged = e.terms_source == "logged score"
    for c in e.candidates:
        terms = "" if logged else " ".join(f"{k}={_num_text(v)}"
                                           for k, v in sorted(c["terms"].items()))
        deadline = c["deadline_us"]
        table.add_row(str(c["rank"]), c["block"],
                      "never" if c["score"] is None and logged else _num_text(c["score"]),
                      terms, _num_text(c["last_access_us"] / 1000, "{:,.3f}"),
                      "-" if deadline is None or deadline < 0 else f"{deadline / 1000:,.3f}",
                      str(c["priority"]), _num_text(c["next_use_step"], "{:,}"),
                      c["next_use_action"] or "never")
    return table


#: Other decisions of the step printed by `explain` (all of them with --json).
_OTHERS_SHOWN = 10


@log_app.command("diff", help=_HELP["diff"])
def diff_command(
    log_a: Annotated[Path, typer.Argument(help="Decision log of policy A.", metavar="A",
                                          show_default=False)],
    log_b: Annotated[Path, typer.Argument(help="Decision log of policy B (same trace).",
                                          metavar="B", show_default=False)],
    top: TopOption = 10,
    json_: JsonOption = False,
) -> None:
    """Shell over :func:`kvsim.results.log_diff.diff` (help text: ``_HELP``)."""
    result = diff(DecisionLog(log_a), DecisionLog(log_b), top=top)
    if json_:
        emit_json(result)
        return
    _render_diff(result)


def _render_diff(d: LogDiff) -> None:
    a, b = d.policy_a or "A", d.policy_b or "B"
    f = d.first_divergence
    if f is None:
        out_console.print(f"{a} and {b}: the logs are identical ({d.rows_a:,} rows).")
    else:
        out_console.print(f"first divergence at step {f['step']} (seq {f['seq']}):")
        for name, side in ((a, f["a"]), (b, f["b"])):
            if side is None:
                out_console.print(f"  {name}: (log ended)")
                continue
            text = (f"  {name}: {side['action']} block {side['block']} {side['from_tier']} -> "
                    f"{side['to_tier']} ({side['reason'] or 'no reason'})")
            need = side["next_need"]
            if side["action"] in ("EVICT", "DEMOTE"):
                text += (" -> never needed again" if need is None else
                         f" -> needed at step {need['step']} by request {need['request_id']} "
                         f"via {need['action']}: {need['cost_us']:,.1f} us stall"
                         + (" (decode-critical)" if need["decode_critical"] else ""))
            out_console.print(text)
    table = Table(title="evictions and what they cost afterwards")
    for col in ("", a, b):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("rows", f"{d.rows_a:,}", f"{d.rows_b:,}")
    table.add_row("blocks evicted only here", f"{d.evicted_only_a:,}", f"{d.evicted_only_b:,}")
    table.add_row("  their regret cost (us)", f"{d.cost_only_a_us:,.1f}",
                  f"{d.cost_only_b_us:,.1f}")
    table.add_row("regret cost, all evictions (us)", f"{d.regret_cost_a_us:,.1f}",
                  f"{d.regret_cost_b_us:,.1f}")
    out_console.print(table)
    out_console.print(_records(d.top_only_a, f"blocks {a} evicted and {b} kept"))
    out_console.print(_records(d.top_only_b, f"blocks {b} evicted and {a} kept"))
    out_console.print(_records(d.differing_blocks, "blocks whose evictions or cost differ "
                               "(_a = " + a + ", _b = " + b + ")"))


@log_app.command("timeline", help=_HELP["timeline"])
def timeline_command(
    log: LogArg,
    block: BlockOption = None,
    request: Annotated[int | None, typer.Option(
        "--request", metavar="R", min=0, show_default=False,
        help="Instead of a block: every row on behalf of request R.")] = None,
    json_: JsonOption = False,
    csv: CsvOption = False,
) -> None:
    """Shell over :func:`kvsim.results.log_query.timeline` (help text: ``_HELP``)."""
    key = parse_block(block) if block is not None else None
    result = timeline(DecisionLog(log), block=key, request=request)
    if _emit_frame(result, json_, csv):
        return
    cols = ["seq", "step", "action"] + (["request_id"] if key is not None else ["block"]) \
        + ["cost_us", "decode_critical", "what"] + (["resident"] if key is not None else [])
    title = f"block {block}" if key is not None else f"request {request}"
    out_console.print(_table(result, f"{log}: {title}: {len(result):,} rows", cols))
    if key is not None and len(result):
        out_console.print("tiers visited: " + " -> ".join(tiers_visited(result)))
