"""Pictures of a sweep: one self-contained HTML file (inline SVG) and optional PNGs.

Input: a sweep directory (``kvsim sweep --out DIR``: results.parquet, and curves.parquet
when the sweep ran with ``--curves``) or a results.parquet path.  Figures, each a function
``fig_<name>(table, ...) -> matplotlib Figure``:

- ``hit_rate``: HBM hit rate vs HBM capacity, one line per policy (belady dashed black),
  one panel per DRAM size; the one-pass lru/belady curves (:mod:`kvsim.cachesim.curves`) as thin lines
  when present;
- ``latency_cdf``: step-latency CDFs (from the per-cell quantiles), one panel per HBM size;
- ``p99``: p99 step latency by policy at each HBM size, belady's value drawn as the bound;
- ``link_bytes``: bytes moved over each lower-tier link vs HBM capacity;
- ``occupancy``: peak occupancy of each tier (blocks / capacity) vs HBM capacity;
- ``occupancy_time``: tier occupancy over time for one capacity cell (default: the smallest
  HBM size at the first DRAM size, the cell under most pressure), one panel per tier (HBM
  held by running requests, HBM cached, then each enabled lower tier), one line per policy,
  the tier's capacity dashed.  From the sweep's ``occupancy.parquet`` (each cell's
  per-step occupancy, max over windows of consecutive steps, docs/sweep.md).

Why matplotlib (docs/sweep.md): one wheel with no system libraries, renders both SVG (text
we inline, so the HTML needs no network and no JavaScript) and PNG, and its Agg/SVG
backends are deterministic once the SVG hash salt and the file dates are fixed -- same
results give byte-identical files.  Interactive libraries (plotly, bokeh) need a JavaScript
bundle of several MB inlined, or a CDN, which breaks the no-network rule.
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import atomic_output

#: Figure names, in page order.
FIGURES = ("hit_rate", "latency_cdf", "p99", "link_bytes", "occupancy", "occupancy_time")
_TITLES = {
    "hit_rate": "HBM hit rate vs HBM capacity",
    "latency_cdf": "Step latency CDF by policy",
    "p99": "p99 step latency by policy (belady = offline bound)",
    "link_bytes": "Bytes moved per link",
    "occupancy": "Peak tier occupancy",
    "occupancy_time": "Tier occupancy over time",
}
_LINKS = (("bytes_dram_link", "HBM<->DRAM link"), ("bytes_cxl_link", "HBM<->CXL link"),
          ("bytes_nvme_link", "HBM<->NVMe link"))
_TIERS = (("hbm", "HBM"), ("dram", "DRAM"), ("cxl", "CXL"), ("nvme", "NVMe"))
_BOUND = "belady"


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "kvsim", "font.size": 10, "axes.grid": True,
                         "grid.alpha": 0.3, "figure.dpi": 100})
    return plt


@dataclass
class Report:
    """What :func:`build_report` wrote."""

    html_path: Path
    png_paths: list[Path] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    cells: int = 0
    policies: list[str] = field(default_factory=list)


def _policies(table: pd.DataFrame) -> list[str]:
    """Online policies first (table order), the bound last."""
    names = list(dict.fromkeys(table["policy"].tolist()))
    return [p for p in names if p != _BOUND] + ([_BOUND] if _BOUND in names else [])


def _style(policies: list[str]) -> dict[str, dict]:
    cmap = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf"]
    out, k = {}, 0
    for p in policies:
        if p == _BOUND:
            out[p] = {"color": "black", "linestyle": "--", "marker": "x"}
        else:
            out[p] = {"color": cmap[k % len(cmap)], "linestyle": "-", "marker": "o"}
            k += 1
    return out


def _dram_groups(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    out = []
    for dram, g in table.groupby(table["dram_gb"].fillna(-1.0), sort=True):
        label = "DRAM: profile default" if dram < 0 else f"DRAM {dram:g} GB"
        out.append((label, g))
    return out


def fig_hit_rate(table: pd.DataFrame, curves: pd.DataFrame | None = None):
    plt = _plt()
    groups = _dram_groups(table)
    pols = _policies(table)
    sty = _style(pols)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.5), squeeze=False)
    for ax, (label, g) in zip(axes[0], groups):
        for p in pols:
            s = g[g["policy"] == p].sort_values("hbm_gb")
            ax.plot(s["hbm_gb"], 100 * s["hbm_hit_rate"], label=p, **sty[p])
        if curves is not None and len(curves):
            bb = float(table["block_bytes"].iloc[0]) if "block_bytes" in table else 0.0
            for p in ("lru", _BOUND):
                c = curves[curves["policy"] == p].sort_values("capacity_blocks")
                if len(c) and bb > 0:
                    ax.plot(c["capacity_blocks"] * bb / 1e9, 100 * c["hit_rate"], linewidth=1,
                            alpha=0.6, color=sty.get(p, {"color": "grey"})["color"],
                            linestyle=":", label=f"{p} one-pass curve (block stream)")
        _gb_axis(ax, g["hbm_gb"])
        ax.set_xlabel("HBM capacity for KV (GB)")
        ax.set_ylabel("HBM hit rate (prefix tokens, %)")
        ax.set_title(label)
        # zoomed to the swept values (58 % and 60 % told apart), not from 0
        lo, hi = _zoom(100 * g["hbm_hit_rate"].astype(np.float64))
        ax.set_ylim(lo, hi)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _zoom(values, pad: float = 0.15) -> tuple[float, float]:
    """Limits zoomed onto ``values`` (percentages): their range widened by ``pad`` of it
    on each side (at least 0.5 points), within [0, 100]."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        return 0.0, 100.0
    lo, hi = float(v.min()), float(v.max())
    margin = max((hi - lo) * pad, 0.5)
    return max(lo - margin, 0.0), min(hi + margin, 100.0)


def _gb_axis(ax, sizes) -> None:
    """Log x axis ticked at exactly the sweep's HBM sizes, plain numbers."""
    sizes = sorted(float(v) for v in set(sizes))
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(sizes, [f"{v:g}" for v in sizes])


def _q_grid(n: int) -> np.ndarray:
    from kvsim.analysis.sweep import LATENCY_QUANTILES

    if n == len(LATENCY_QUANTILES):
        return np.asarray(LATENCY_QUANTILES)
    return np.linspace(0.0, 1.0, n)


def fig_latency_cdf(table: pd.DataFrame):
    plt = _plt()
    pols = _policies(table)
    sty = _style(pols)
    sizes = sorted(table["hbm_gb"].unique())
    base = table[table["dram_gb"].fillna(-1.0) == table["dram_gb"].fillna(-1.0).min()]
    ncol = min(3, len(sizes))
    nrow = math.ceil(len(sizes) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.8 * nrow), squeeze=False)
    for k, hbm in enumerate(sizes):
        ax = axes[k // ncol][k % ncol]
        g = base[base["hbm_gb"] == hbm]
        for p in pols:
            s = g[g["policy"] == p]
            if not len(s):
                continue
            qv = np.asarray(s["step_latency_q_us"].iloc[0], dtype=np.float64)
            if not np.isfinite(qv).any():
                continue
            ax.plot(qv / 1e3, 100 * _q_grid(len(qv)), label=p, color=sty[p]["color"],
                    linestyle=sty[p]["linestyle"], linewidth=1.4)
        ax.set_xscale("log")
        ax.set_title(f"HBM {hbm:g} GB")
        ax.set_xlabel("step latency (ms)")
        ax.set_ylabel("% of steps <= x")
        ax.set_ylim(0, 101)
        if k == 0 and ax.get_legend_handles_labels()[0]:  # cache mode has no step latencies
            ax.legend(fontsize=8)
    for k in range(len(sizes), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fig.tight_layout()
    return fig


def fig_p99(table: pd.DataFrame):
    plt = _plt()
    pols = _policies(table)
    online = [p for p in pols if p != _BOUND]
    sty = _style(pols)
    base = table[table["dram_gb"].fillna(-1.0) == table["dram_gb"].fillna(-1.0).min()]
    sizes = sorted(base["hbm_gb"].unique())
    fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(sizes) * max(len(online), 1) / 3), 4.5))
    width = 0.8 / max(len(online), 1)
    x = np.arange(len(sizes))
    for j, p in enumerate(online):
        vals = [float(base[(base["hbm_gb"] == h) & (base["policy"] == p)]["p99_step_us"]
                      .iloc[0]) / 1e3 if len(base[(base["hbm_gb"] == h) &
                                                   (base["policy"] == p)]) else np.nan
                for h in sizes]
        ax.bar(x - 0.4 + width * (j + 0.5), vals, width, label=p, color=sty[p]["color"])
    if _BOUND in pols:
        for k, h in enumerate(sizes):
            s = base[(base["hbm_gb"] == h) & (base["policy"] == _BOUND)]
            if len(s):
                v = float(s["p99_step_us"].iloc[0]) / 1e3
                ax.hlines(v, k - 0.45, k + 0.45, colors="black", linestyles="--",
                          label="belady (offline bound)" if k == 0 else None)
    ax.set_xticks(x, [f"{h:g} GB" for h in sizes])
    ax.set_xlabel("HBM capacity for KV")
    ax.set_ylabel("p99 step latency (ms)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def fig_link_bytes(table: pd.DataFrame):
    plt = _plt()
    pols = _policies(table)
    sty = _style(pols)
    base = table[table["dram_gb"].fillna(-1.0) == table["dram_gb"].fillna(-1.0).min()]
    fig, axes = plt.subplots(1, len(_LINKS), figsize=(5.2 * len(_LINKS), 4.0), squeeze=False)
    for ax, (col, label) in zip(axes[0], _LINKS):
        for p in pols:
            s = base[base["policy"] == p].sort_values("hbm_gb")
            ax.plot(s["hbm_gb"], s[col] / 1e9, label=p, **sty[p])
        _gb_axis(ax, base["hbm_gb"])
        ax.set_title(label)
        ax.set_xlabel("HBM capacity for KV (GB)")
        ax.set_ylabel("GB moved (both directions)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def fig_occupancy(table: pd.DataFrame):
    plt = _plt()
    pols = _policies(table)
    sty = _style(pols)
    base = table[table["dram_gb"].fillna(-1.0) == table["dram_gb"].fillna(-1.0).min()]
    fig, axes = plt.subplots(1, len(_TIERS), figsize=(4.4 * len(_TIERS), 3.8), squeeze=False)
    for ax, (tier, label) in zip(axes[0], _TIERS):
        for p in pols:
            s = base[base["policy"] == p].sort_values("hbm_gb")
            cap = s[f"{tier}_capacity_blocks"].astype(np.float64).replace(0, np.nan)
            ax.plot(s["hbm_gb"], 100 * s[f"peak_{tier}_blocks"] / cap, label=p, **sty[p])
        _gb_axis(ax, base["hbm_gb"])
        ax.set_ylim(0, 105)
        ax.set_title(f"{label}: peak blocks / capacity (%)")
        ax.set_xlabel("HBM capacity for KV (GB)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


#: Panels of ``occupancy_time``: (column of occupancy.parquet, tier of its capacity,
#: title).  A lower tier's panel is drawn only when the cell gives it capacity.
_OCC_PANELS = (("hbm_used_blocks", "hbm", "HBM: held by running requests"),
               ("hbm_cached_blocks", "hbm", "HBM: cached (evictable)"),
               ("dram_used_blocks", "dram", "DRAM: resident"),
               ("cxl_used_blocks", "cxl", "CXL: resident"),
               ("nvme_used_blocks", "nvme", "NVMe: resident"))


#: In ``occupancy_time``, a panel's y axis runs to the tier's capacity only when the
#: series reaches at least this fraction of it; below, the capacity line would squash the
#: series into the bottom pixels, so the axis follows the data (a readability choice).
OCC_CAPACITY_SHOWN = 0.25


def occupancy_cell(table: pd.DataFrame, hbm_gb: float | None = None,
                   dram_gb: float | None = None, path=None) -> tuple[float, float]:
    """The capacity cell ``occupancy_time`` draws: ``(hbm_gb, dram_gb)`` with ``dram_gb``
    NaN for the profile's DRAM.  Defaults: the smallest HBM size at the first DRAM size
    of the table's DRAM groups (the profile's DRAM if present, else the smallest), as the
    other figures; ``dram_gb=-1`` asks for the profile's DRAM.  Raises KvsimInputError
    (naming ``path``, the results) when the asked cell is not in the sweep."""
    dram_key = table["dram_gb"].fillna(-1.0)
    want_dram = float(dram_key.min()) if dram_gb is None else float(dram_gb)
    sub = table[dram_key == want_dram]
    if not len(sub):
        raise KvsimInputError(f"expected a DRAM size of the sweep "
                              f"({', '.join(f'{v:g}' for v in sorted(set(dram_key)))} GB; "
                              f"-1 = the profile's), got {want_dram:g}", path, None,
                              "occupancy_dram_gb")
    sizes = sorted(float(v) for v in sub["hbm_gb"].unique())
    want_hbm = sizes[0] if hbm_gb is None else float(hbm_gb)
    if want_hbm not in sizes:
        raise KvsimInputError(f"expected an HBM size of the sweep "
                              f"({', '.join(f'{v:g}' for v in sizes)} GB), got "
                              f"{want_hbm:g}", path, None, "occupancy_hbm_gb")
    return want_hbm, (float("nan") if want_dram < 0 else want_dram)


def fig_occupancy_time(table: pd.DataFrame, occupancy: pd.DataFrame | None,
                       hbm_gb: float | None = None, dram_gb: float | None = None):
    """Occupancy over engine time of the cell :func:`occupancy_cell` picks: one panel per
    tier, one line per policy (blocks; the tier's capacity dashed grey)."""
    plt = _plt()
    hbm, dram = occupancy_cell(table, hbm_gb, dram_gb)
    same_dram = (lambda d: d.isna()) if math.isnan(dram) else (lambda d: d == dram)
    cells = table[(table["hbm_gb"] == hbm) & same_dram(table["dram_gb"])]
    where = f"HBM {hbm:g} GB, " + ("DRAM: profile default" if math.isnan(dram)
                                   else f"DRAM {dram:g} GB")
    if occupancy is None or not len(occupancy):
        fig, ax = plt.subplots(figsize=(8.0, 3.0))
        ax.axis("off")
        ax.text(0.5, 0.5, "No occupancy series in this sweep (made by a kvsim without "
                "them):\nrerun kvsim sweep with the same --out to add them.",
                ha="center", va="center", fontsize=11)
        return fig
    pols = _policies(cells)
    sty = _style(_policies(table))
    first = cells.iloc[0]
    panels = [(col, tier, title) for col, tier, title in _OCC_PANELS
              if col in occupancy
              and (tier == "hbm" or int(first[f"{tier}_capacity_blocks"]) > 0)]
    ncol = min(3, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.4 * ncol, 3.6 * nrow), squeeze=False)
    for k, (col, tier, title) in enumerate(panels):
        ax = axes[k // ncol][k % ncol]
        for p in pols:
            key = cells[cells["policy"] == p]["cell"]
            s = occupancy[occupancy["cell"].isin(key)].sort_values("point")
            if not len(s):
                continue
            ax.plot(s["end_us"] / 1e6, s[col], label=p, color=sty[p]["color"],
                    linestyle=sty[p]["linestyle"], linewidth=1.2, drawstyle="steps-post")
        cap = int(first[f"{tier}_capacity_blocks"])
        top = float(occupancy[occupancy["cell"].isin(cells["cell"])][col].max())
        if top >= OCC_CAPACITY_SHOWN * cap:  # the capacity line fits without squashing
            ax.axhline(cap, color="grey", linestyle="--", linewidth=1, label="capacity")
            ax.set_ylim(0, cap * 1.08)
        else:  # far below capacity: scale to the data, say the capacity in the title
            ax.set_ylim(0, max(top, 1.0) * 1.15)
        ax.set_title(f"{title}\n(capacity {cap:,} blocks)", fontsize=10)
        ax.set_xlabel("engine time (s)")
        ax.set_ylabel("blocks")
        if k == 0:
            ax.legend(fontsize=8)
    for k in range(len(panels), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fig.suptitle(where, fontsize=11)
    fig.tight_layout()
    return fig


def render_figures(table: pd.DataFrame, curves: pd.DataFrame | None = None,
                   occupancy: pd.DataFrame | None = None,
                   occupancy_hbm_gb: float | None = None,
                   occupancy_dram_gb: float | None = None) -> dict:
    """Name -> matplotlib Figure for every figure of :data:`FIGURES`."""
    return {"hit_rate": fig_hit_rate(table, curves), "latency_cdf": fig_latency_cdf(table),
            "p99": fig_p99(table), "link_bytes": fig_link_bytes(table),
            "occupancy": fig_occupancy(table),
            "occupancy_time": fig_occupancy_time(table, occupancy, occupancy_hbm_gb,
                                                 occupancy_dram_gb)}


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE for inlining


def _summary_table(table: pd.DataFrame) -> str:
    cols = [("policy", "policy"), ("hbm_gb", "HBM GB"), ("dram_gb", "DRAM GB"),
            ("hbm_hit_rate", "HBM hit rate"), ("prefix_hit_rate", "prefix hit rate"),
            ("p99_step_us", "p99 step (ms)"), ("gap_hbm_hit_rate_to_belady",
                                               "hit-rate gap to belady"),
            ("gap_hbm_hit_rate_to_optimal", "hit-rate gap to optimal"),
            ("bytes_moved", "GB moved")]
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in cols)
    body = []
    for _, r in table.iterrows():
        cells = []
        for c, _t in cols:
            v = r.get(c)
            if c not in r or (isinstance(v, float) and math.isnan(v) and c != "dram_gb"):
                s = ""
            elif c == "p99_step_us":
                s = f"{v / 1e3:.3f}"
            elif c == "bytes_moved":
                s = f"{v / 1e9:.3f}"
            elif c == "dram_gb" and pd.isna(v):
                s = "profile"
            elif isinstance(v, float):
                s = "" if math.isnan(v) else f"{v:.4g}"
            else:
                s = str(v)
            cells.append(f"<td>{html.escape(s)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_CSS = """body{font-family:sans-serif;margin:24px;max-width:1500px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}figure{margin:0}
figure svg{max-width:100%;height:auto}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}p.note{color:#555}"""


def build_report(results: str | Path, out_html: str | Path,
                 png_dir: str | Path | None = None, *, occupancy_hbm_gb: float | None = None,
                 occupancy_dram_gb: float | None = None) -> Report:
    """Write the HTML report of a sweep (and the same figures as PNG into ``png_dir``).

    ``occupancy_hbm_gb`` / ``occupancy_dram_gb``: the capacity cell of the occupancy-over-
    time figure (:func:`occupancy_cell`; default the smallest HBM size at the first DRAM
    size; ``occupancy_dram_gb=-1`` = the profile's DRAM).
    Deterministic: the same results give byte-identical HTML and PNG files.  Raises
    KvsimInputError when ``results`` is not a sweep directory or results table, or the
    asked occupancy cell is not in it.
    """
    from kvsim.analysis.sweep import load_curves, load_occupancy, load_results

    table = load_results(results)
    if not len(table):
        raise KvsimInputError("expected at least one cell in the results table", results,
                              None, None)
    rp = Path(results)
    curves = load_curves(rp)  # a corrupt or incomplete file: one line
    occupancy = load_occupancy(rp)
    hbm, dram = occupancy_cell(table, occupancy_hbm_gb, occupancy_dram_gb, results)
    plt = _plt()
    figs = render_figures(table, curves, occupancy, hbm, -1.0 if math.isnan(dram) else dram)
    trace = html.escape(str(table["trace"].iloc[0])) if "trace" in table else ""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvsim sweep report"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>kvsim sweep report: {trace}</h1>",
             f"<p>{len(table)} cells"
             + (f" ({html.escape(str(table['mode'].iloc[0]))} mode)" if "mode" in table
                and len(table) else "") + "; policies: "
             f"{html.escape(', '.join(_policies(table)))}; HBM sizes (GB): "
             f"{html.escape(', '.join(f'{v:g}' for v in sorted(table['hbm_gb'].unique())))}"
             f"</p>"]
    for name in FIGURES:
        parts.append(f"<h2>{html.escape(_TITLES[name])}</h2>")
        if name == "occupancy":
            parts.append("<p class='note'>The peak of each tier over the whole replay "
                         "(within steps too); the next figure shows occupancy over time."
                         "</p>")
        if name == "occupancy_time":
            where = f"HBM {hbm:g} GB, " + ("the profile's DRAM" if math.isnan(dram)
                                           else f"DRAM {dram:g} GB")
            parts.append(f"<p class='note'>Cell: {html.escape(where)} (kvsim.analysis.report."
                         "build_report(occupancy_hbm_gb=..., occupancy_dram_gb=...) picks "
                         "another).  Each point is the maximum over a window of "
                         "consecutive steps of the occupancy as each step ends (at most "
                         "2,000 points per cell, docs/sweep.md); HBM <i>held</i> blocks "
                         "belong to running requests, <i>cached</i> blocks are the "
                         "eviction candidates.</p>")
        if name == "hit_rate" and curves is not None:
            parts.append("<p class='note'>Dotted: one-pass stack-distance curves of the "
                         "trace's full-block stream (single tier, no in-use pinning; "
                         "docs/sweep.md).</p>")
        parts.append(f"<figure id='{name}'>{_svg(figs[name])}</figure>")
    parts.append("<h2>All cells</h2>")
    parts.append(_summary_table(table))
    parts.append("</body></html>\n")
    out_html = Path(out_html)
    with atomic_output(out_html) as tmp:
        tmp.write_text("\n".join(parts), encoding="utf-8")
    pngs: list[Path] = []
    if png_dir is not None:
        d = Path(png_dir)
        for name in FIGURES:
            p = d / f"{name}.png"
            with atomic_output(p) as tmp:
                figs[name].savefig(tmp, format="png", dpi=110,
                                   metadata={"Software": None})
            pngs.append(p)
    for f in figs.values():
        plt.close(f)
    return Report(out_html, pngs, list(FIGURES), int(len(table)), _policies(table))


__all__ = ["FIGURES", "Report", "build_report", "occupancy_cell", "render_figures"]
