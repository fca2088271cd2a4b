"""``kvsim sweep`` (API: :func:`kvsim.analysis.sweep.run_sweep`) and ``kvsim report``
(API: :func:`kvsim.analysis.report.build_report`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from kvsim.cli import app
from kvsim.cli.common import (
    JsonOption,
    check_finite,
    check_outputs,
    comma_names,
    emit_json,
    err_console,
    out_console,
    progress,
    quiet_progress,
)
from kvsim.core.errors import KvsimInputError
from kvsim.spec.sim_config import SimConfig, parse_tier_policies


def _floats(text: str, option: str, allow_default: bool = False) -> tuple:
    out = []
    for part in text.split(","):
        part = part.strip()
        if allow_default and part in ("default", "profile"):
            out.append(None)
            continue
        try:
            if not part.isascii():
                raise ValueError
            value = float(part)
        except ValueError:
            raise KvsimInputError(f"expected a comma-separated list of numbers (GB), got "
                                  f"{part!r}", None, None, option) from None
        out.append(check_finite(option, value, 0.0))
    return tuple(out)


@app.command("sweep", short_help="Replay a trace over a grid of policies x HBM (x DRAM) "
             "sizes, in parallel or on Ray; cached and resumable.")
def sweep_command(
    trace: Annotated[Path, typer.Option(
        "--trace", help="Event file to replay (Parquet or JSONL; kvsim "
        "import-request-trace / generate).", show_default=False, metavar="PATH")],
    policies: Annotated[str, typer.Option(
        "--policies", help="Comma-separated HBM policies (names from kvsim compare, or .py "
        "policy files), e.g. lru,s3fifo,deadline.", metavar="LIST")],
    hbm_gb: Annotated[str, typer.Option(
        "--hbm-gb", help="Comma-separated HBM capacities for KV blocks in GB (1e9 bytes), "
        "e.g. 10,20,40,80.", metavar="LIST")],
    out: Annotated[Path, typer.Option(
        "--out", help="Output directory: results.parquet, summary.json, cells/ (the cache: "
        "a rerun computes only missing cells), curves.parquet with --curves.",
        metavar="DIR")] = Path("sweep-out"),
    dram_gb: Annotated[str | None, typer.Option(
        "--dram-gb", help="Comma-separated DRAM tier capacities in GB (0 disables the "
        "tier; 'default' = the hardware profile's).  Default: the profile's only.",
        metavar="LIST", show_default=False)] = None,
    hardware: Annotated[str, typer.Option(
        "--hardware", help="Hardware profile name or .toml path (tier bandwidths, "
        "latencies, default capacities).", metavar="NAME")] = "h100-sxm",
    tier_policy: Annotated[str | None, typer.Option(
        "--tier-policy", help="Lower-tier eviction policies, e.g. dram=lru,cxl=s3fifo "
        "(default lru everywhere).", metavar="TIER=POLICY,...", show_default=False)] = None,
    write_policy: Annotated[str, typer.Option(
        "--write-policy", help="Host-write policy: write_back | write_through | "
        "write_through_selective.", metavar="NAME")] = "write_back",
    warmup_fraction: Annotated[float, typer.Option(
        "--warmup-fraction", min=0.0, max=0.99,
        help="Warm-up: the first floor(F x requests) requests in arrival order are excluded "
        "from the metrics.")] = 0.0,
    warmup_requests: Annotated[int | None, typer.Option(
        "--warmup-requests", min=0, metavar="N",
        help="Warm-up as an absolute count of requests (instead of --warmup-fraction).",
        show_default=False)] = None,
    mode: Annotated[str, typer.Option(
        "--mode", metavar="MODE",
        help="engine (default: the scheduled replay) or cache (requests one at a time, "
        "lookup then insert, no timing; docs/simulate.md).")] = "engine",
    cache_variant: Annotated[str, typer.Option(
        "--cache-variant", metavar="VARIANT",
        help="--mode cache only: prefix, vllm or block lookups.")] = "prefix",
    seed: Annotated[int, typer.Option("--seed", help="Seed passed to randomised "
                                      "policies.")] = 0,
    engine: Annotated[str, typer.Option(
        "--engine", help="Replay engine: auto (compiled when cached on disk for the "
        "policies or for traces of >= 1,000,000 events, else interpreted), compiled "
        "(numba, compiled once per policy and cached on disk) "
        "or interpreted (no compile, ~100x slower per event).",
        metavar="NAME")] = "auto",
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Parallel workers (default: the number of CPUs).",
        show_default=False)] = None,
    executor: Annotated[str, typer.Option(
        "--executor", help="local (process pool) or ray (optional extra: pip install "
        "'kvsim[ray]'; same results).", metavar="NAME")] = "local",
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Ray cluster address (default: start a local Ray instance "
        "with --jobs CPUs).", show_default=False)] = None,
    bound: Annotated[bool, typer.Option(
        "--bound/--no-bound", help="Also run belady (the offline bound) at every capacity "
        "when it is not listed.")] = True,
    optimal: Annotated[bool | None, typer.Option(
        "--optimal/--no-optimal", help="Also run `optimal` (the prefix-cache optimum, "
        "docs/policies.md) at every capacity for the gap-to-optimal columns.  Default: "
        "with --mode cache only.", show_default=False)] = None,
    curves: Annotated[bool, typer.Option(
        "--curves/--no-curves", help="Also write one-pass lru/belady hit-rate-vs-capacity "
        "curves of the trace's block stream (curves.parquet, docs/sweep.md).")] = False,
    curve_sample_rate: Annotated[float, typer.Option(
        "--curve-sample-rate", min=1e-6, max=1.0,
        help="SHARDS sampling rate of the curves (1 = exact).")] = 1.0,
    force: Annotated[bool, typer.Option(
        "--force", help="Write into --out even when it is a non-empty folder that is not a "
        "kvsim sweep folder (its results.parquet / summary.json are replaced).")] = False,
    json_: JsonOption = False,
) -> None:
    """Replay TRACE once per cell of the grid (policy x HBM size x DRAM size) and write one
    Parquet results table (one row per cell: the summary keys of `kvsim compare` plus
    capacities, gaps to belady, step-latency and TTFT quantiles) and summary.json (the best
    policy per capacity).  Finished cells are cached under --out by a content hash of the
    trace bytes, the config, the policy and the code, so an interrupted sweep resumes where
    it stopped.  Progress on stderr; the table (or --json) on stdout."""
    from kvsim.analysis.sweep import SweepSpec, run_sweep

    check_outputs(("--out", out, "dir"))
    base = SimConfig(hardware=hardware, tier_policies=parse_tier_policies(tier_policy),
                     write_policy=write_policy, warmup_fraction=warmup_fraction, seed=seed,
                     engine=engine, warmup_requests=warmup_requests, mode=mode,
                     cache_variant=cache_variant)
    names = tuple(comma_names("--policies", policies))
    spec = SweepSpec(str(trace), names, _floats(hbm_gb, "--hbm-gb"),
                     _floats(dram_gb, "--dram-gb", True) if dram_gb else (None,), base, bound,
                     optimal)
    t0 = time.perf_counter()
    rows = _event_rows(trace)  # progress in events: cells x the trace's events
    with progress(transient=False, quiet=quiet_progress(json_)) as bar:
        task = bar.add_task(f"sweep {trace.name} ({len(spec.cells())} cells)",
                            total=len(spec.cells()) * rows,
                            unit="events" if rows > 1 else "cells")

        def on_cell(done: int, total: int, policy: str, cached: bool) -> None:
            bar.update(task, completed=done * rows, total=total * rows,
                       description=f"sweep {trace.name} ({done}/{total} cells)")

        res = run_sweep(spec, out, jobs=jobs, executor=executor, ray_address=ray_address,
                        curves=curves, curve_sample_rate=curve_sample_rate, on_cell=on_cell,
                        force=force)
    elapsed = time.perf_counter() - t0
    err_console.print(f"{res.cells} cells: {res.computed} computed, {res.cached} from the "
                      f"cache, {elapsed:.1f} s; wrote {res.results_path}", highlight=False)
    # a degenerate cell is warned about as in compare (few measured, preemption storm)
    from kvsim.cli.sizing import print_warnings
    from kvsim.results.warnings import result_warnings

    found = result_warnings(res.table.to_dict(orient="records"))
    print_warnings(found)
    if json_:
        emit_json({"results": str(res.results_path), "summary_path": str(res.summary_path),
                   "curves": None if res.curves_path is None else str(res.curves_path),
                   "cells": res.cells, "computed": res.computed, "cached": res.cached,
                   "summary": res.summary, "warnings": found})
        return
    from kvsim.cli.render import print_view

    print_view(sweep_table(res.table, f"sweep {trace.name}: {res.cells} cells, {mode} mode"))


def _event_rows(trace: Path) -> int:
    """The events in ``trace`` (Parquet's footer); 1 when unknown here (JSONL, or a bad
    file: run_sweep reports it): progress then counts cells."""
    try:
        from kvsim.events import open_events

        with open_events(trace) as reader:
            return max(int(reader.num_rows or 1), 1)
    except Exception:  # noqa: BLE001 - the sweep itself raises the one-line error
        return 1


def sweep_table(table: pd.DataFrame, title: str) -> Table:
    """One row per (HBM, DRAM) cell and distinct result: policies whose cell results are
    identical share a row (as in compare); percentages and the gap to belady in points."""
    from rich import box

    from kvsim.cli.render import group_identical

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0),
              pad_edge=False, header_style="bold")
    has_opt = "gap_hbm_hit_rate_to_optimal" in table.columns
    for col in ("HBM GB", "DRAM GB", "policy", "HBM hit", "gap to\nbelady",
                *(("gap to\noptimal",) if has_opt else ()), "p99 step\nms", "GB moved"):
        t.add_column(col, justify="left" if col == "policy" else "right",
                     overflow="fold", max_width=40 if col == "policy" else None)
    keys = [c for c in ("hbm_gb", "dram_gb") if c in table.columns]
    cells = table.groupby(keys, dropna=False, sort=True) if keys else [((), table)]
    for _, cell in cells:
        result_cols = [c for c in ("policy", "offline", "hbm_hit_rate", "p99_step_us",
                                   "gap_hbm_hit_rate_to_belady",
                                   "gap_hbm_hit_rate_to_optimal", "bytes_moved",
                                   "decode_critical_misses", "ttft_p99_us")
                       if c in cell.columns]
        for names, r in group_identical(cell[result_cols]):
            full = cell[cell["policy"] == names[0]].iloc[0]
            gap = full["gap_hbm_hit_rate_to_belady"]
            gopt = full["gap_hbm_hit_rate_to_optimal"] if has_opt else float("nan")
            p99 = full["p99_step_us"]
            t.add_row(f"{full['hbm_gb']:g}",
                      "profile" if full["dram_gb"] != full["dram_gb"] else f"{full['dram_gb']:g}",
                      ", ".join(names), f"{100 * full['hbm_hit_rate']:.2f}%",
                      "" if gap != gap else f"{100 * gap:+.2f} pp",
                      *(("" if gopt != gopt else f"{100 * gopt:+.2f} pp",) if has_opt else ()),
                      "-" if p99 != p99 else f"{p99 / 1e3:.3f}",
                      f"{full['bytes_moved'] / 1e9:.3f}")
    return t


@app.command("report", short_help="Draw a sweep: one self-contained HTML file (and PNGs): "
             "hit rate vs capacity, latency CDFs, p99, link bytes, occupancy.")
def report_command(
    results: Annotated[Path, typer.Argument(
        help="A sweep directory (kvsim sweep --out DIR) or its results.parquet, or a "
             "compare's rows (kvsim compare --parquet FILE).",
        metavar="RESULTS", show_default=False)],
    out: Annotated[Path, typer.Option(
        "--out", help="HTML file to write (self-contained: inline SVG, no network, no "
        "JavaScript).", metavar="FILE")] = Path("report.html"),
    png: Annotated[Path | None, typer.Option(
        "--png", help="Also write every figure as DIR/<figure>.png.", metavar="DIR",
        show_default=False)] = None,
    occupancy_hbm_gb: Annotated[float | None, typer.Option(
        "--occupancy-hbm-gb", help="HBM size (GB, one of the sweep's) of the cell drawn in "
        "the occupancy-over-time figure [default: the smallest].", metavar="GB",
        show_default=False)] = None,
    occupancy_dram_gb: Annotated[float | None, typer.Option(
        "--occupancy-dram-gb", help="DRAM size (GB, one of the sweep's) of that cell "
        "[default: the first].", metavar="GB", show_default=False)] = None,
    json_: JsonOption = False,
) -> None:
    """Render a sweep's results as one HTML page: HBM hit rate vs HBM capacity per policy
    (with the one-pass lru/belady curves when the sweep ran with --curves), step-latency
    CDFs, p99 step latency by policy with the belady bound, bytes moved per link, peak tier
    occupancy, and tier occupancy over time for one capacity cell (one panel per tier, a
    line per policy); --png writes the same figures as PNG files."""
    from kvsim.analysis.report import build_report
    from kvsim.analysis.report_compare import build_compare_report, is_compare_table

    check_outputs(("--out", out, "html"), ("--png", png, "dir"))
    if is_compare_table(results):  # a compare's --parquet: the compare report
        rep = build_compare_report(results, out, title=results.name)
        if json_:
            emit_json({"html": str(rep.html_path), "png": [], "figures": rep.figures,
                       "cells": rep.cells, "policies": rep.policies})
        else:
            out_console.print(f"wrote {rep.html_path} (compare of {rep.cells} policies, "
                              f"{len(rep.figures)} figures)", highlight=False)
        return
    rep = build_report(results, out, png, occupancy_hbm_gb=occupancy_hbm_gb,
                       occupancy_dram_gb=occupancy_dram_gb)
    if json_:
        emit_json({"html": str(rep.html_path), "png": [str(p) for p in rep.png_paths],
                   "figures": rep.figures, "cells": rep.cells, "policies": rep.policies})
        return
    out_console.print(f"wrote {rep.html_path} ({rep.cells} cells, {len(rep.figures)} "
                      f"figures)" + (f"; PNGs in {png}" if png is not None else ""),
                      highlight=False)
