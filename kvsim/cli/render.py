"""Rendering of result tables for a terminal (no computation of results here).

The functions that compute results (:func:`kvsim.api.compare`, :func:`kvsim.api.simulate`)
return DataFrames whose columns are the stable ``--json`` keys; this module only turns such
a frame into something a person reads at the terminal's width (120 columns by default):

- :func:`metric_view` picks and formats the columns (``--columns``, ``--wide``, ``--sort``)
  and groups policies whose results are identical into one row;
- :func:`verdict` is the one line under the table: the best online policy, its margins over
  lru and its distance to the offline bound (whichever offline row the results contain,
  found by its ``offline`` flag, never by name);
- :func:`print_view` prints at the terminal width (``$COLUMNS``, else 120 when stdout is not
  a terminal) or, with ``--wide``, at the table's natural width.

docs/simulate.md ("Reading the table") documents the columns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvsim.core.errors import KvsimInputError
from kvsim.results.compare_view import (  # noqa: F401 - bound_row, verdict re-exported
    _num,
    bound_name,
    bound_row,
    group_identical,
    offline_label,
    verdict,
    with_derived,
)

if TYPE_CHECKING:  # annotations only: pandas is imported by whoever builds a table, rich
    import pandas as pd  # by whoever prints one
    from rich.table import Table


def _pct(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{100 * f:.2f}%"


def _ms(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{f / 1000:,.2f}"


def _int(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{int(f):,}"


def _us(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{f:,.0f}"


def _gb(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{f / 1e9:,.2f}"


def _pp(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{100 * f:+.2f} pp"


@dataclass(frozen=True)
class Column:
    """One displayable column: ``key`` is what ``--columns``/``--sort`` name (a ``--json``
    key, or a derived key computed from them below)."""

    key: str
    header: str
    fmt: Callable[[object], str]
    better: str | None = None  # "min" | "max" | None: which value is highlighted as best
    default: bool = False
    help: str = field(default="", compare=False)


def _prefetch_text(row: dict) -> str:
    n = _num(row.get("prefetches"))
    if n is None:
        return "-"
    useful = int(_num(row.get("prefetches_useful")) or 0)
    wasted = int(_num(row.get("prefetches_wasted")) or 0)
    partial = int(n) - useful - wasted  # hidden only in part: the step still stalled
    return f"{int(n):,} ({useful:,}/{partial:,}/{wasted:,})"


def _peak_text(row: dict) -> str:
    vals = [_num(row.get(f"peak_{t}_blocks")) for t in ("hbm", "dram", "cxl", "nvme")]
    return "-" if vals[0] is None else "/".join(f"{int(v or 0):,}" for v in vals)


def _vs_lru_text(row: dict) -> str:
    v = _num(row.get("decode_critical_misses_vs_lru"))
    if v is None:
        return "-"
    base = (_num(row.get("decode_critical_misses")) or 0) - v
    pct = f" ({100 * v / base:+.0f}%)" if base else ""
    return f"{int(v):+,}{pct}"


def _p99_vs_lru_text(row: dict) -> str:
    v = _num(row.get("p99_step_us_vs_lru"))
    if v is None:
        return "-"
    pct = _num(row.get("p99_step_pct_vs_lru"))
    return f"{v:+,.1f} us" + (f" ({pct:+.3f}%)" if pct is not None else "")


# Derived keys: computed from the row (and the offline bound row) at render time.
DERIVED = ("lower_tier_hit_rate", "gap_to_bound", "prefetch_detail", "peak_blocks",
           "decode_critical_vs_lru", "p99_vs_lru")

COLUMNS: tuple[Column, ...] = (
    Column("hbm_hit_rate", "HBM hit\n(tokens)", _pct, "max", True),
    Column("block_hit_rate", "block\nhit", _pct, "max", True),
    Column("lower_tier_hit_rate", "lower-tier\nhit", _pct, None, True),
    Column("ttft_p50_us", "TTFT p50\nms", _ms, "min", True),
    Column("ttft_p99_us", "TTFT p99\nms", _ms, "min", True),
    Column("tpot_p99_us", "TPOT p99\nms", _ms, "min", True),
    Column("decode_critical_misses", "decode-crit\nmisses", _int, "min", True),
    Column("deadline_misses", "deadline\nmisses", _int, "min", True),
    Column("gap_to_bound", "gap to\nbound", _pp, "min", True),
    Column("p50_step_us", "step p50\nus", _us, "min"),
    Column("p95_step_us", "step p95\nus", _us, "min"),
    Column("p99_step_us", "step p99\nus", _us, "min"),
    Column("p999_step_us", "step p99.9\nus", _us, "min"),
    Column("tpot_p50_us", "TPOT p50\nms", _ms, "min"),
    Column("e2e_p99_us", "e2e p99\nms", _ms, "min"),
    Column("dram_hit_rate", "DRAM\nhit", _pct, "max"),
    Column("cxl_hit_rate", "CXL\nhit", _pct, "max"),
    Column("nvme_hit_rate", "NVMe\nhit", _pct, "max"),
    Column("prefix_hit_rate", "prefix\nhit", _pct, "max"),
    Column("bytes_dram_link", "DRAM link\nGB", _gb, "min"),
    Column("bytes_cxl_link", "CXL link\nGB", _gb, "min"),
    Column("bytes_nvme_link", "NVMe link\nGB", _gb, "min"),
    Column("recompute_tokens", "recompute\ntokens", _int, "min"),
    Column("evictions", "evictions", _int),
    Column("spills", "spills", _int),
    Column("preemptions", "preempt-\nions", _int, "min"),
    Column("prefetch_detail", "prefetch (full/\npartial/wasted)", lambda v: v),
    Column("peak_blocks", "peak HBM/DRAM/\nCXL/NVMe blocks", lambda v: v),
    Column("p99_vs_lru", "step p99\nvs lru", lambda v: v),
    Column("decode_critical_vs_lru", "decode-crit\nvs lru", lambda v: v),
    # --live-offload (kvsim.modes.live.live_metrics.LIVE_KEYS)
    Column("decode_stalls", "decode\nstalls", _int, "min"),
    Column("decode_critical_stalls", "decode-crit\nstalls", _int, "min"),
    Column("stall_us", "stall\nms", _ms, "min"),
    Column("live_spills", "live\nspills", _int, "min"),
    Column("blocks_fetched", "fetched\n(demand)", _int, "min"),
    Column("prefetches", "prefetch\nissued", _int),
    Column("prefetches_useful", "prefetch\nuseful", _int, "max"),
    Column("prefetches_wasted", "prefetch\nwasted", _int, "min"),
)
#: Default table of a ``--live-offload`` result (its rows carry ``live_offload``).
LIVE_DEFAULT_COLUMNS = ("decode_stalls", "decode_critical_stalls", "stall_us", "tpot_p99_us",
                        "deadline_misses", "live_spills", "blocks_fetched", "prefetches",
                        "prefetches_useful", "prefetches_wasted", "bytes_dram_link")
#: Columns of ``--link-model queue`` and ``--shared-tier-gb`` runs (docs/cost-model.md, "Links
#: as queues"; docs/simulate.md): by name with ``--columns`` only (``--wide`` shows
#: ``COLUMNS``, whose keys every run has).
CLUSTER_MEMORY_COLUMNS: tuple[Column, ...] = (
    Column("shared_tier_hit_rate", "shared\ntier hit", _pct, "max"),
    Column("network_bytes", "network\nGB", _gb, "min"),
    Column("link_queue_p50_us", "link queue\np50 ms", _ms, "min"),
    Column("link_queue_p99_us", "link queue\np99 ms", _ms, "min"),
)
_BY_KEY: dict[str, Column] = {c.key: c for c in COLUMNS + CLUSTER_MEMORY_COLUMNS}
DEFAULT_COLUMNS = tuple(c.key for c in COLUMNS if c.default)


def _resolve(names: list[str], what: str) -> list[Column]:
    cols = []
    for n in names:
        if n not in _BY_KEY:
            raise KvsimInputError(
                f"unknown column '{n}'; expected one of {', '.join(_BY_KEY)}",
                None, None, what)
        cols.append(_BY_KEY[n])
    return cols


def parse_columns(spec: str | None, wide: bool) -> list[Column]:
    """``--columns a,b,...`` (``+a,+b`` adds to the default set), or every column with
    ``--wide``, or the default set."""
    if wide:
        return list(COLUMNS)
    if not spec:
        return [_BY_KEY[k] for k in DEFAULT_COLUMNS]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names and names[0].startswith("+"):
        extra = _resolve([n.lstrip("+") for n in names], "--columns")
        return [_BY_KEY[k] for k in DEFAULT_COLUMNS if _BY_KEY[k] not in extra] + extra
    return _resolve(names, "--columns")


def _cell(col: Column, row: dict) -> str:
    if col.key == "prefetch_detail":
        return _prefetch_text(row)
    if col.key == "peak_blocks":
        return _peak_text(row)
    if col.key == "decode_critical_vs_lru":
        return _vs_lru_text(row)
    if col.key == "p99_vs_lru":
        return _p99_vs_lru_text(row)
    return col.fmt(row.get(col.key))


def metric_table(df: pd.DataFrame, title: str | None, columns: list[Column],
                 sort: str | None = None, group: bool = True) -> Table:
    """Policies (or groups of identical policies) as rows, ``columns`` as columns; the best
    online value of each comparable column in bold green; offline rows labelled as bounds,
    listed last and never counted as winners."""
    frame = with_derived(df)
    if sort:
        desc = sort.startswith("-")
        key = sort.lstrip("-+")
        if key not in frame.columns and key != "policy":
            _resolve([key], "--sort")
            raise KvsimInputError(f"column '{key}' is not in these results", None, None,
                                  "--sort")
        col = _BY_KEY.get(key)
        asc = not desc if col is None or col.better != "max" else desc
        frame = frame.sort_values(key, ascending=asc, kind="stable", na_position="last")
    groups = group_identical(frame) if group else [([str(r["policy"])], r) for r in
                                                    frame.to_dict(orient="records")]
    groups = ([g for g in groups if not g[1].get("offline")]
              + [g for g in groups if g[1].get("offline")])
    best = {}
    online = [g[1] for g in groups if not g[1].get("offline")]
    for c in columns:
        if c.better is None:
            continue
        vals = [v for r in online if (v := _num(r.get(c.key))) is not None]
        if len(vals) >= 2 and min(vals) != max(vals):
            best[c.key] = min(vals) if c.better == "min" else max(vals)
    bound = bound_name(df)
    from rich import box
    from rich.table import Table

    table = Table(title=title, header_style="bold", title_justify="left",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
    longest = max((len(n) for names, _ in groups for n in names), default=6)
    table.add_column("policy", overflow="fold", min_width=max(longest + 1, 6),
                     max_width=None if len(columns) > 12 else max(34, longest + 1))
    for c in columns:
        header = c.header
        if c.key == "gap_to_bound" and bound is not None:
            header = f"gap to\n{bound}"
        table.add_column(header, justify="right", no_wrap=True)
    for names, r in groups:
        label = ", ".join(names) + offline_label(r)
        cells = [label]
        for c in columns:
            text = _cell(c, r)
            if c.key in best and not r.get("offline") and _num(r.get(c.key)) == best[c.key]:
                text = f"[bold green]{text}[/]"
            cells.append(text)
        table.add_row(*cells)
    return table


def console_width(wide: bool) -> int:
    """The width to render at: natural width with ``--wide``; else the terminal's, or
    ``$COLUMNS``, or 120 when stdout is not a terminal."""
    if wide:
        return 1000
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return 120


def print_view(*renderables, wide: bool = False) -> None:
    """Print ``renderables`` on stdout at :func:`console_width` (trailing blanks cut)."""
    import io

    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    tty = sys.stdout.isatty()
    width = console_width(wide)
    natural = max((Console(width=1000).measure(r).minimum for r in renderables
                   if isinstance(r, Table)), default=0)
    if natural > width:  # never squeeze a number to "…": print it whole, say why on stderr
        sys.stderr.write(f"note: this table is {natural} columns wide (terminal: {width}); "
                         "choose fewer --columns, or page it with `less -S`\n")
        width = natural
    Console(file=buf, width=width, force_terminal=tty, highlight=False,
            color_system="auto" if tty else None).print(*renderables, sep="\n")
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))


def live_verdict(df: pd.DataFrame) -> str:
    """``--live-offload``: the online policy with the fewest decode-critical stalls (then
    stall time), against lru and the offline bound (optimal)."""
    on = df[~df["offline"].astype(bool)]
    if on.empty:
        return ""
    best = on.sort_values(["decode_critical_stalls", "stall_us", "policy"]).iloc[0]
    text = (f"best online: {best['policy']}: decode-crit stalls "
            f"{int(best['decode_critical_stalls']):,}, stall {best['stall_us'] / 1e3:,.2f} ms, "
            f"TPOT p99 {best['tpot_p99_us'] / 1e3:,.3f} ms")
    lru = df[df["policy"] == "lru"]
    if len(lru):
        row = lru.iloc[0]
        text += (f" (lru {int(row['decode_critical_stalls']):,}, "
                 f"{row['stall_us'] / 1e3:,.2f} ms, {row['tpot_p99_us'] / 1e3:,.3f} ms)")
    return text


def print_replicas(rows: list[dict]) -> None:
    """One row per replica, the columns a reader compares (every key of
    kvsim.modes.closed.serving_metrics.REPLICA_KEYS is in --json), fitted to the terminal."""
    from rich import box
    from rich.table import Table

    def ms(v):
        return "-" if v != v else f"{v / 1e3:,.1f}"

    def pct(v):
        return "-" if v != v else f"{100 * v:.2f}%"

    cols = (("pool", "pool", str), ("replica", "replica", str),
            ("requests", "requests", "{:,}".format),
            ("ttft_p50_us", "TTFT p50\nms", ms), ("ttft_p99_us", "TTFT p99\nms", ms),
            ("tpot_p99_us", "TPOT p99\nms", ms), ("hbm_hit_rate", "HBM hit", pct),
            ("prefix_hit_rate", "prefix\nhit", pct),
            ("prefill_tokens_saved", "prefill tok\nsaved", "{:,}".format),
            ("preemptions", "preempt", "{:,}".format),
            ("evictions_hbm", "HBM\nevictions", "{:,}".format))
    cols = [c for c in cols if c[0] in rows[0]]
    table = Table(title="replicas", title_justify="left", box=box.SIMPLE_HEAD,
                  header_style="bold")
    for _, header, _ in cols:
        table.add_column(header, justify="right")
    for r in rows:
        table.add_row(*[fmt(r[key]) for key, _, fmt in cols])
    print_view(table)


def print_pd(summary: dict) -> None:
    """``--pd``: the two pools side by side and the link (docs/disaggregation.md)."""
    from rich import box
    from rich.table import Table

    def ms(v):
        return "-" if v != v else f"{v / 1e3:,.1f}"

    pools = Table(title=f"P/D {summary['pd']}: pools", title_justify="left",
                  box=box.SIMPLE_HEAD, header_style="bold")
    for h in ("pool", "HBM hit", "prefix hit", "busy", "queue p50 ms", "queue p99 ms",
              "steps"):
        pools.add_column(h, justify="right")
    for p in ("prefill", "decode"):
        g = lambda k, p=p: summary[f"pd_{p}_{k}"]  # noqa: E731
        pools.add_row(p, f"{100 * g('hbm_hit_rate'):.2f}%",
                      f"{100 * g('prefix_hit_rate'):.2f}%",
                      f"{100 * g('utilisation'):.1f}%", ms(g("queue_p50_us")),
                      ms(g("queue_p99_us")), f"{g('steps'):,}")
    print_view(pools)
    link = Table(title="P->D KV transfers", title_justify="left", box=box.SIMPLE_HEAD,
                 header_style="bold")
    rows = (("client TTFT p50 / p99 ms", "ttft_p50_us", "ttft_p99_us"),
            ("prefill's token p50 / p99 ms", "pd_prefill_ttft_p50_us", "pd_prefill_ttft_p99_us"),
            ("TPOT p50 / p99 ms (decode pool)", "tpot_p50_us", "tpot_p99_us"),
            ("transfer p50 / p99 ms", "pd_transfer_p50_us", "pd_transfer_p99_us"),
            ("link queueing p50 / p99 ms", "pd_link_queue_p50_us", "pd_link_queue_p99_us"),
            ("staging wait p50 / p99 ms", "pd_staging_blocked_p50_us",
             "pd_staging_blocked_p99_us"))
    link.add_column("")
    link.add_column("value", justify="right")
    for name, a, b in rows:
        link.add_row(name, f"{ms(summary[a])} / {ms(summary[b])}")
    link.add_row("bytes sent", f"{summary['pd_link_bytes']:,}")
    link.add_row("staged requests that waited", f"{summary['pd_staging_blocked_requests']:,}")
    print_view(link)


def print_groups(summary: dict) -> None:
    """The hybrid pool's layer groups (``group_rows``, docs/memory-model.md "Hybrid models
    in the closed loop"): blocks held (peak, mean), hit blocks, blocks freed by windows."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"layer groups ({summary['hbm_pool_blocks']:,} block ids of "
                  f"{summary['hybrid_block_bytes']:,} B, one pool)", title_justify="left",
                  box=box.SIMPLE_HEAD, header_style="bold")
    for h in ("group", "held peak", "held mean", "hit blocks", "freed (window / state)"):
        table.add_column(h, justify="right")
    for r in summary["group_rows"]:
        table.add_row(r["label"], f"{r['held_blocks_peak']:,}", f"{r['held_blocks_mean']:,.0f}",
                      f"{r['hit_blocks']:,}", f"{r['freed_blocks']:,}")
    print_view(table)


# ---- simulate / compare: the title and the table of a run (kvsim.cli.simulate)

def profile_label(profile: str, requests: int, seed: int) -> str:
    """The ``trace`` of the JSON output for a generated workload."""
    return f"profile {profile} ({requests} requests, seed {seed})"


def run_scope(row, config) -> str:
    """Title tail: which mode produced the table, and what it measured."""
    text = f"{int(row['requests']):,} requests"
    warm = row.get("warmup_requests") or 0
    if config.mode == "cache":
        return f"cache mode ({config.cache_variant} lookups, no timing), " + text + \
            (f" after {int(warm):,} warm-up" if warm else "")
    text += f", {int(row['steps']):,} steps"
    if getattr(config, "live_offload", False):
        text += ", live offload"
    return "engine mode, " + text + (f" after {int(warm):,} warm-up" if warm else "")


def run_title(label: str, row: dict | None, config, sched: str) -> str:
    """The table's title: what was replayed, in which mode, on which schedule."""
    if row is None:
        return label
    return f"{label} — {run_scope(row, config)}, {sched} schedule"


def source_label(trace, profile, requests, seed, request_trace) -> str:
    """The ``trace`` of the JSON output: the event file, the profile, or the request trace."""
    from kvsim.core.fsutil import shown_path

    if trace is not None:
        return shown_path(trace)
    if profile is not None:
        return profile_label(profile, requests, seed)
    return shown_path(request_trace)


def render_results(df: pd.DataFrame, title: str, columns: str | None, wide: bool,
                   sort: str | None, with_verdict: bool) -> None:
    """Print a results frame as a table that fits the terminal."""
    live = "live_offload" in df.columns and bool(df["live_offload"].fillna(False).any())
    if live and columns is None and not wide:
        columns = ",".join(LIVE_DEFAULT_COLUMNS)
    cols = parse_columns(columns, wide)
    if columns is None and bound_name(df) is None:  # nothing to measure a gap to
        cols = [c for c in cols if c.key != "gap_to_bound"]
    table = metric_table(df, title, cols, sort=sort)
    items = [table]
    if with_verdict and live:
        items.append(live_verdict(df))
    elif with_verdict:
        items.append(verdict(df))
    print_view(*items, wide=wide)
