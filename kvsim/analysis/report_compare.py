"""Pictures of a comparison (``kvsim compare --html``, ``kvsim report`` on a compare's
``--parquet``): one self-contained HTML page, the sweep report's machinery
(:mod:`kvsim.analysis.report`: matplotlib to inline SVG, deterministic, no network, no JavaScript).

Figures, each ``fig_<name>(table) -> matplotlib Figure`` (``table``: compare's rows):

- ``policy_bars``: one bar per policy (identical policies share a bar, as in the terminal
  table) for HBM hit rate, decode-critical misses, TTFT p99 and deadline misses; the
  offline bound (the row with ``offline`` true) drawn as a dashed line, never as a bar;
- ``latency_cdf``: step-latency and TTFT CDFs, one line per policy group (from the rows'
  ``step_latency_q_us`` / ``ttft_q_us`` quantiles, :data:`kvsim.analysis.sweep.LATENCY_QUANTILES`);
- ``tier_traffic``: GB moved over each lower-tier link per policy (stacked), and blocks
  evicted and spilled per tier.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.analysis.report import _CSS, _LINKS, Report, _plt, _q_grid, _style, _svg
from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import atomic_output
from kvsim.results.compare_view import bound_row, group_identical, verdict

FIGURES = ("policy_bars", "latency_cdf", "tier_traffic")
_TITLES = {"policy_bars": "Policies side by side (dashed: the offline bound)",
           "latency_cdf": "Step latency and TTFT CDFs",
           "tier_traffic": "Per-tier traffic"}
#: (column, axis label, scale) of the bar panels.
_BARS = (("hbm_hit_rate", "HBM hit rate (prefix tokens, %)", 100.0),
         ("decode_critical_misses", "decode-critical misses", 1.0),
         ("ttft_p99_us", "TTFT p99 (ms)", 1e-3),
         ("deadline_misses", "deadline misses", 1.0))
#: Columns a compare results table must have (``kvsim compare --parquet``).
REQUIRED = ("policy", "offline", "hbm_hit_rate", "decode_critical_misses", "ttft_p99_us")


def load_compare(path: str | Path) -> pd.DataFrame:
    """Read a compare's ``--parquet`` rows; KvsimInputError naming the file otherwise."""
    p = Path(path)
    if not p.is_file():
        raise KvsimInputError("no such file; expected a compare results table "
                              "(kvsim compare --parquet FILE)", p, None, None)
    try:
        df = pd.read_parquet(p)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise KvsimInputError(f"expected a Parquet results table, could not read it "
                              f"({type(exc).__name__})", p, None, None) from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise KvsimInputError("expected a kvsim compare results table (missing columns "
                              f"{', '.join(missing)})", p, None, missing[0])
    return df


def is_compare_table(path: str | Path) -> bool:
    """True when ``path`` is a Parquet file holding compare rows (no ``hbm_gb`` sweep
    coordinate): ``kvsim report`` then draws the compare report."""
    p = Path(path)
    if not p.is_file() or p.suffix != ".parquet":
        return False
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(p).names)
    except Exception:  # noqa: BLE001 - unreadable: let the sweep loader report it
        return False
    return "offline" in names and "hbm_gb" not in names


def _groups(table: pd.DataFrame) -> tuple[list[tuple[str, dict]], dict | None]:
    """(label, row) per online group, and the bound row."""
    online = [(", ".join(n), r) for n, r in group_identical(table) if not r.get("offline")]
    return online, bound_row(table)


def _has_data(vals) -> bool:
    v = np.asarray(vals, dtype=np.float64)
    return bool(np.isfinite(v).any() and np.nanmax(np.abs(v)) > 0)


def _bar_panels(table: pd.DataFrame) -> list[tuple[str, str, float]]:
    """The bar panels with data: a column that is zero or missing for every policy (no
    decode-critical misses, no deadlines) draws no panel."""
    online, bound = _groups(table)
    out = []
    for col, title, scale in _BARS:
        vals = [r.get(col, np.nan) for _, r in online]
        if bound is not None:
            vals.append(bound.get(col, np.nan))
        if _has_data([np.nan if v is None else v for v in vals]):
            out.append((col, title, scale))
    return out


def zoomed_limits(values, pad: float = 0.15) -> tuple[float, float]:
    """x limits that zoom onto ``values`` (finite ones): their range widened by ``pad`` of
    it on each side (at least 0.5 units), clipped to [0, 100] (a percentage), so 58 % and
    60 % are told apart instead of both filling a 0-100 axis."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], np.float64)
    if not v.size:
        return 0.0, 100.0
    lo, hi = float(v.min()), float(v.max())
    margin = max((hi - lo) * pad, 0.5)
    return max(lo - margin, 0.0), min(hi + margin, 100.0)


def fig_policy_bars(table: pd.DataFrame):
    """One panel per metric with data; HBM hit rate as dots on an axis zoomed to the data
    (bars from 0 would hide a 2-point difference), the others as bars from 0."""
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    online, bound = _groups(table)
    labels = [lab for lab, _ in online]
    sty = _style(labels)
    panels = _bar_panels(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels),
                                                      1.4 + 0.42 * max(len(labels), 3)),
                             squeeze=False)
    y = np.arange(len(labels))
    for ax, (col, title, scale) in zip(axes[0], panels):
        vals = [float(r.get(col, np.nan)) * scale for _, r in online]
        colours = [sty[lab]["color"] for lab in labels]
        ref = None
        if bound is not None and col in bound:
            ref = float(bound[col]) * scale
        if col == "hbm_hit_rate":
            ax.scatter(vals, y, color=colours, zorder=3)
            ax.hlines(y, *zoomed_limits(vals + [ref])[:1], vals, color=colours, linewidth=2)
            ax.set_xlim(*zoomed_limits(vals + [ref]))
        else:
            ax.barh(y, vals, color=colours)
            top = max([v for v in vals + [ref] if v is not None and np.isfinite(v)] or [1.0])
            ax.set_xlim(0, top * 1.08)  # room for the longest bar: nothing clipped
        if ref is not None and np.isfinite(ref):
            ax.axvline(ref, color="black", linestyle="--", linewidth=1.2,
                       label=f"{bound['policy']} ({_bound_word(bound)})")
            ax.legend(fontsize=8, loc="lower right")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # tick labels never overlap
        ax.set_yticks(y, labels if ax is axes[0][0] else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def _bound_word(row) -> str:
    """How the reference row is labelled: a proven bound or an offline heuristic
    (``bound_claim``, kvsim.results.compare_view.label_bounds)."""
    return "offline bound" if str(row.get("bound_claim", "bound")) == "bound" \
        else "offline heuristic"


def fig_latency_cdf(table: pd.DataFrame):
    plt = _plt()
    online, bound = _groups(table)
    rows = online + ([(f"{bound['policy']} (bound)", bound)] if bound is not None else [])
    sty = _style([lab for lab, _ in online])
    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.2), squeeze=False)
    for ax, (col, xlabel) in zip(axes[0], (("step_latency_q_us", "step latency (ms)"),
                                            ("ttft_q_us", "TTFT (ms)"))):
        drawn = 0
        for lab, r in rows:
            qv = np.asarray(r.get(col) if r.get(col) is not None else [], dtype=np.float64)
            if not qv.size or not np.isfinite(qv).any():
                continue
            style = sty.get(lab, {"color": "black", "linestyle": "--"})
            ax.plot(qv / 1e3, 100 * _q_grid(len(qv)), label=lab, color=style["color"],
                    linestyle=style["linestyle"], linewidth=1.4)
            drawn += 1
        if drawn:
            ax.set_xscale("log")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, f"no {col} quantiles in these results", ha="center",
                    transform=ax.transAxes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("% <= x")
        ax.set_ylim(0, 101)
    fig.tight_layout()
    return fig


_TIERS = (("hbm", "HBM"), ("dram", "DRAM"), ("cxl", "CXL"))
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c")


def _traffic(table: pd.DataFrame):
    """(rows, links with traffic, tiers with evictions or spills): what the per-tier
    figure draws; a link or tier that is zero for every policy is left out (no CXL legend
    entry when there is no CXL)."""
    online, bound = _groups(table)
    rows = online + ([(f"{bound['policy']} (bound)", bound)] if bound is not None else [])
    links = [(col, name, c) for (col, name), c in zip(_LINKS, _COLOURS)
             if _has_data([float(r.get(col, 0.0) or 0.0) for _, r in rows])]
    tiers = [(t, name, c) for (t, name), c in zip(_TIERS, _COLOURS)
             if _has_data([float(r.get(f"evictions_{t}", 0) or 0) + float(
                 r.get(f"spills_{t}", 0) or 0) for _, r in rows])]
    return rows, links, tiers


def _has_quantiles(table: pd.DataFrame) -> bool:
    for col in ("step_latency_q_us", "ttft_q_us"):
        if col in table.columns:
            for v in table[col]:
                if v is not None and np.isfinite(np.asarray(v, np.float64)).any():
                    return True
    return False


def fig_tier_traffic(table: pd.DataFrame):
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    rows, links, tiers = _traffic(table)
    labels = [lab for lab, _ in rows]
    y = np.arange(len(labels))
    panels = int(bool(links)) + int(bool(tiers))
    fig, axes = plt.subplots(1, max(panels, 1), figsize=(6.5 * max(panels, 1),
                                                         1.4 + 0.42 * max(len(labels), 3)),
                             squeeze=False)
    k = 0
    if links:
        ax = axes[0][k]
        k += 1
        left = np.zeros(len(labels))
        for col, name, colour in links:
            vals = np.array([float(r.get(col, 0.0) or 0.0) / 1e9 for _, r in rows])
            ax.barh(y, vals, left=left, color=colour, label=name)
            left += vals
        ax.set_xlim(0, max(float(left.max()), 1e-9) * 1.08)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("GB moved (both directions)")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.legend(fontsize=8)
    if tiers:
        ax = axes[0][k]
        width = 0.8 / (2 * len(tiers))
        top = 0.0
        for j, (tier, name, colour) in enumerate(tiers):
            ev = [float(r.get(f"evictions_{tier}", 0) or 0) for _, r in rows]
            sp = [float(r.get(f"spills_{tier}", 0) or 0) for _, r in rows]
            top = max(top, *ev, *sp)
            ax.barh(y - 0.4 + width * (2 * j + 0.5), sp, width, label=f"{name} spilled down",
                    color=colour)
            ax.barh(y - 0.4 + width * (2 * j + 1.5), ev, width, label=f"{name} evicted",
                    color=colour, alpha=0.45)
        ax.set_xlim(0, max(top, 1.0) * 1.08)
        ax.set_yticks(y, labels if k == 0 else [""] * len(labels), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("blocks")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def figures_with_data(table: pd.DataFrame) -> list[str]:
    """The figures of :data:`FIGURES` that have something to show for ``table``."""
    _, links, tiers = _traffic(table)
    have = {"policy_bars": bool(_bar_panels(table)), "latency_cdf": _has_quantiles(table),
            "tier_traffic": bool(links or tiers)}
    return [f for f in FIGURES if have[f]]


def _summary_table(table: pd.DataFrame) -> str:
    cols = (("hbm_hit_rate", "HBM hit", "{:.2%}"), ("block_hit_rate", "block hit", "{:.2%}"),
            ("ttft_p50_us", "TTFT p50 ms", "ms"), ("ttft_p99_us", "TTFT p99 ms", "ms"),
            ("tpot_p99_us", "TPOT p99 ms", "ms"),
            ("decode_critical_misses", "decode-crit misses", "{:,.0f}"),
            ("deadline_misses", "deadline misses", "{:,.0f}"),
            ("bytes_moved", "GB moved", "gb"), ("evictions", "evictions", "{:,.0f}"))
    head = "<th>policy</th>" + "".join(f"<th>{html.escape(t)}</th>" for _, t, _ in cols)
    body = []
    groups = group_identical(table)
    for names, r in ([g for g in groups if not g[1].get("offline")]
                     + [g for g in groups if g[1].get("offline")]):
        label = ", ".join(names) + (" (offline bound)" if r.get("offline") else "")
        cells = [f"<td style='text-align:left'>{html.escape(label)}</td>"]
        for c, _, fmt in cols:
            v = r.get(c)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                s = ""
            elif fmt == "ms":
                s = f"{float(v) / 1e3:,.2f}"
            elif fmt == "gb":
                s = f"{float(v) / 1e9:,.3f}"
            else:
                s = fmt.format(float(v))
            cells.append(f"<td>{html.escape(s)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def build_compare_report(table: pd.DataFrame | str | Path, out_html: str | Path,
                         title: str = "") -> Report:
    """Write the HTML report of a comparison (``table``: compare's rows, or the path of its
    ``--parquet``).  Deterministic: the same rows give a byte-identical file."""
    if not isinstance(table, pd.DataFrame):
        table = load_compare(table)
    if not len(table):
        raise KvsimInputError("expected at least one policy row", None, None, None)
    plt = _plt()
    drawers = {"policy_bars": fig_policy_bars, "latency_cdf": fig_latency_cdf,
               "tier_traffic": fig_tier_traffic}
    shown = figures_with_data(table)
    figs = {name: drawers[name](table) for name in shown}
    first = table.iloc[0]
    what = html.escape(title or "comparison")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvsim compare "
             f"report</title><style>{_CSS}</style></head><body>",
             f"<h1>kvsim compare report: {what}</h1>",
             # the answer first: the recommendation (kvsim.results.compare_view.verdict)
             f"<p class='verdict'><b>Recommendation: {html.escape(verdict(table))}</b></p>",
             f"<p>{int(first.get('requests', 0)):,} requests, {int(first.get('steps', 0)):,} "
             f"steps; {len(table)} policies.</p>"]
    left_out = [n for n in FIGURES if n not in shown]
    if left_out:
        parts.append("<p>Not drawn, no data in these results: "
                     + ", ".join(html.escape(_TITLES[n].lower()) for n in left_out) + ".</p>")
    for name in shown:
        parts.append(f"<h2>{html.escape(_TITLES[name])}</h2>")
        parts.append(f"<figure id='{name}'>{_svg(figs[name])}</figure>")
    parts.append("<h2>Policies (identical results share a row)</h2>")
    parts.append(_summary_table(table))
    parts.append("</body></html>\n")
    out_html = Path(out_html)
    with atomic_output(out_html) as tmp:
        tmp.write_text("\n".join(parts), encoding="utf-8")
    for f in figs.values():
        plt.close(f)
    return Report(out_html, [], shown, int(len(table)),
                  [str(p) for p in table["policy"]])


__all__ = ["FIGURES", "build_compare_report", "figures_with_data", "is_compare_table",
           "load_compare", "zoomed_limits"]
