"""``kvsim calibrate`` and ``kvsim replay``: measure transfer costs on this machine
(API: :mod:`kvsim.analysis.calibrate`) and replay a decision log's data movements on a real pool
(API: :mod:`kvsim.analysis.placement_replay`).  Docs: docs/calibration.md."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvsim.backends.base import CALIBRATION_LAYOUT, DTYPE_BYTES, BlockLayout
from kvsim.cli import app
from kvsim.cli.common import (
    JsonOption,
    check_outputs,
    emit_json,
    out_console,
    progress,
    quiet_progress,
)
from kvsim.core.errors import KvsimInputError

_BACKEND_HELP = ("cpu: numpy pool in RAM, numba copies, file I/O (host memcpy stands in for "
                 "the DRAM link; PCIe is not measured).  cuda: numba-cuda kernels on a real "
                 "GPU, mapped pinned host tier, CUDA events (the CUDA simulator is refused).")
_TIMER_HELP = ("cpu backend only: clock of memory copies.  thread = CPU time of the copying "
               "thread (the copy's cost on a core of its own, immune to preemption by other "
               "processes); wall = wall clock.  Disk I/O is always wall clock.")
_DISK_HELP = ("Directory for the disk tier's scratch file (removed afterwards) "
              "(default: the system temp dir).  Put it on the device you want measured.")


def _check_backend(name: str) -> str:
    if name not in ("cpu", "cuda"):
        raise KvsimInputError(f"expected cpu or cuda, got {name!r}", field="--backend")
    return name


@app.command("calibrate")
def calibrate_command(
    out: Annotated[Path, typer.Option("--out", help="Where to write the calibrated hardware "
                                      "profile (TOML; use it with --hardware).",
                                      show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help=_BACKEND_HELP)] = "cpu",
    base: Annotated[str, typer.Option("--base", help="Hardware profile (name or .toml) "
                                      "whose dram/nvme numbers the measurements replace; "
                                      "everything else is kept.")] = "h100-sxm",
    name: Annotated[str | None, typer.Option(
        "--name", help="Name of the written profile (default: <base>-calibrated-<backend>).",
        show_default=False)] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Sizes 64 KiB..1 MiB, 3 repeats, 1 "
                                        "warm-up: a few seconds (smoke tests).")] = False,
    repeats: Annotated[int | None, typer.Option(
        "--repeats", min=1, help="Timed batches per size; the median is kept (default: 9, "
        "3 with --quick).", show_default=False)] = None,
    warmup: Annotated[int | None, typer.Option(
        "--warmup", min=0, help="Untimed batches per size before timing (default: 2, 1 "
        "with --quick).", show_default=False)] = None,
    min_kib: Annotated[int, typer.Option("--min-kib", min=1, help="Smallest transfer, KiB "
                                         "(sizes double up to --max-mib).")] = 64,
    max_mib: Annotated[float | None, typer.Option(
        "--max-mib", min=0.0, help="Largest transfer, MiB (default: 64, 1 with --quick).",
        show_default=False)] = None,
    layers: Annotated[int, typer.Option("--layers", min=1, help="Layers of the pool's block "
                                        "layout.")] = CALIBRATION_LAYOUT.num_layers,
    block_tokens: Annotated[int, typer.Option("--block-tokens", min=1, help="Tokens per "
                                              "block.")] = CALIBRATION_LAYOUT.block_tokens,
    kv_heads: Annotated[int, typer.Option("--kv-heads", min=1, help="KV heads per layer.")]
    = CALIBRATION_LAYOUT.num_kv_heads,
    head_dim: Annotated[int, typer.Option("--head-dim", min=1, help="Head dimension.")]
    = CALIBRATION_LAYOUT.head_dim,
    dtype: Annotated[str, typer.Option("--dtype", help="KV element type: " +
                                       ", ".join(DTYPE_BYTES) + " (sets the element width).")]
    = CALIBRATION_LAYOUT.dtype,
    disk_dir: Annotated[Path | None, typer.Option("--disk-dir", help=_DISK_HELP,
                                                     show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the block-id choice and the "
                                      "buffers' fill pattern.")] = 0,
    cpu_timer: Annotated[str, typer.Option("--cpu-timer", help=_TIMER_HELP)] = "thread",
    samples: Annotated[bool, typer.Option("--samples", help="Also print the median time of "
                                          "every (operation, size) and its fit residual.")]
    = False,
    from_vllm_bench: Annotated[Path | None, typer.Option(
        "--from-vllm-bench", metavar="RESULT.json",
        help="Fit engine step times instead: read a `vllm bench serve --save-result "
        "--save-detailed` result (per-request input/output lengths, TTFT, ITL, start "
        "times), fit step_ms = a + b x prefill tokens + c x decode batch + d x decode "
        "context, print the fit's MAPE per metric and write a timing profile to --out "
        "(use it with --timing FILE).  docs/cost-model.md, \"Step time\".",
        show_default=False)] = None,
    as_json: JsonOption = False,
) -> None:
    """Time gather, scatter, spill, promote, disk write and disk read on a real KV pool for
    transfers of 64 KiB..64 MiB, fit latency + bytes/bandwidth to each, and write a hardware
    profile whose dram and nvme tiers carry the measured numbers (with provenance).  Use
    it with [bold]kvsim simulate/compare --hardware FILE[/bold].  With --from-vllm-bench:
    fit engine step times to a vLLM benchmark result instead (a timing profile for
    [bold]--timing FILE[/bold])."""
    from kvsim.analysis.calibrate import MIB, CalibrationSettings, calibrate, write_calibration

    check_outputs(("--out", out, "toml"))
    if from_vllm_bench is not None:
        _calibrate_timing(from_vllm_bench, out, as_json)
        return
    _check_disk_dir(disk_dir)
    layout = BlockLayout(layers, block_tokens, kv_heads, head_dim, dtype)
    overrides: dict = {"backend": _check_backend(backend), "layout": layout, "base": base,
                       "name": name or "", "seed": seed, "min_bytes": min_kib * 1024,
                       "disk_dir": str(disk_dir) if disk_dir else None,
                       "cpu_timer": cpu_timer}
    if repeats is not None:
        overrides["repeats"] = repeats
    if warmup is not None:
        overrides["warmup"] = warmup
    if max_mib is not None:
        overrides["max_bytes"] = int(max_mib * MIB)
    settings = (CalibrationSettings.quick(**overrides) if quick
                else CalibrationSettings(**overrides))
    with progress(quiet=quiet_progress(as_json)) as bar:
        task = bar.add_task(f"calibrate {backend}", total=None)
        result = calibrate(settings, on_progress=lambda d, t: bar.update(task, completed=d,
                                                                           total=t))
    write_calibration(result, out)
    if as_json:
        emit_json({
            "profile_path": str(out), "profile_name": result.profile.name,
            "provenance": result.profile.provenance, "layout": layout.to_dict(),
            "operations": [{
                "operation": o.operation, "stands_for": o.stands_for,
                "latency_us": o.fit.latency_us if o.fit else None,
                "bandwidth_bytes_per_s": o.fit.bandwidth_bytes_per_s if o.fit else None,
                "r_squared": o.fit.r_squared if o.fit else None,
                "max_abs_relative_residual": o.fit.max_abs_relative_residual if o.fit
                else None,
                "latency_clamped": o.fit.latency_clamped if o.fit else None,
                "fit_error": o.fit_error or None,
                "samples": [{"bytes": s, "median_us": m, "min_us": lo, "max_us": hi,
                             "residual_us": o.fit.residuals_us[i] if o.fit else None}
                            for i, (s, m, lo, hi) in enumerate(zip(o.sizes_bytes, o.median_us,
                                                                   o.min_us, o.max_us))],
            } for o in result.operations],
        })
        return
    info = result.device
    out_console.print(f"[bold]calibrate[/bold] backend={info.backend}  device={info.device}  "
                      f"disk_io={info.disk_io}  timer={info.timer}")
    out_console.print(f"layout: {layout.describe()}; {settings.repeats} repeats after "
                      f"{settings.warmup} warm-up per size; date {result.date}")
    table = Table(show_header=True, header_style="bold")
    for col, justify in (("operation", "left"), ("sets profile", "left"),
                         ("latency us", "right"), ("GB/s", "right"), ("R^2", "right"),
                         ("max |resid|", "right"), ("sizes", "right")):
        table.add_column(col, justify=justify, overflow="fold",
                         min_width=10 if col == "operation" else None)
    for o in result.operations:
        if o.fit is None:
            table.add_row(o.operation, o.stands_for or "-", "fit failed", "-", "-", "-",
                          str(len(o.sizes_bytes)))
            continue
        table.add_row(o.operation, o.stands_for or "-",
                      f"{o.fit.latency_us:,.1f}" + (" (clamped)" if o.fit.latency_clamped
                                                     else ""),
                      f"{o.fit.bandwidth_bytes_per_s / 1e9:,.3f}", f"{o.fit.r_squared:.4f}",
                      f"{100 * o.fit.max_abs_relative_residual:.1f}%",
                      str(len(o.sizes_bytes)))
    out_console.print(table)
    if samples:
        frame = result.samples_frame()
        st = Table(show_header=True, header_style="bold")
        for col in ("operation", "bytes", "median us", "min us", "max us", "fitted us",
                    "residual us"):
            st.add_column(col, justify="left" if col == "operation" else "right",
                          overflow="fold")
        for r in frame.itertuples(index=False):
            st.add_row(r.operation, f"{r.bytes:,}", f"{r.median_us:,.1f}", f"{r.min_us:,.1f}",
                       f"{r.max_us:,.1f}", f"{r.fitted_us:,.1f}", f"{r.residual_us:,.1f}")
        out_console.print(st)
    for o in result.operations:
        if o.fit is None:
            out_console.print(f"[yellow]note:[/yellow] {o.operation}: {o.fit_error}; the "
                              "profile keeps the base numbers it would have set (try larger "
                              "sizes: --max-mib)")
    out_console.print(f"wrote {out} (profile {result.profile.name!r}; measured: "
                      f"{result.profile.provenance['measured']})")


@app.command("replay")
def replay_command(
    decision_log: Annotated[Path, typer.Option(
        "--decision-log", help="Decision log (Parquet) written by kvsim simulate "
        "--decision-log.", show_default=False)],
    backend: Annotated[str, typer.Option("--backend", help=_BACKEND_HELP)] = "cpu",
    block_bytes: Annotated[int | None, typer.Option(
        "--block-bytes", min=2, help="Bytes per KV block (default: the log's first data "
        "movement's bytes).", show_default=False)] = None,
    layers: Annotated[int, typer.Option("--layers", min=1, help="Layers the block is split "
                                        "into in the real pool (one chunk per layer and K/V; "
                                        "shapes the copy, not the bytes).")] = 32,
    pool_mib: Annotated[float, typer.Option(
        "--pool-mib", min=0.0, help="Size of each real tier (device pool, host tier, disk "
        "file), MiB; blocks recycle slots round-robin beyond it.")] = 256.0,
    max_rows: Annotated[int | None, typer.Option(
        "--max-rows", min=1, help="Replay at most this many data-movement rows.",
        show_default=False)] = None,
    disk_dir: Annotated[Path | None, typer.Option("--disk-dir", help=_DISK_HELP,
                                                     show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the pool's fill pattern.")] = 0,
    cpu_timer: Annotated[str, typer.Option("--cpu-timer", help=_TIMER_HELP)] = "thread",
    as_json: JsonOption = False,
) -> None:
    """Replay the spills (DEMOTE, WRITE_THROUGH) and fetches (PROMOTE, PREFETCH) of a
    decision log on a real KV pool, batch by batch, and compare the measured time with the
    simulator's cost_us per action type and tier path: the cost model's error on this
    machine.  relative_error = (predicted - measured) / measured."""
    from kvsim.analysis.placement_replay import MIB, ReplaySettings, replay_decision_log

    _check_disk_dir(disk_dir)
    settings = ReplaySettings(backend=_check_backend(backend), block_bytes=block_bytes,
                              num_layers=layers, pool_bytes=max(1, int(pool_mib * MIB)),
                              max_rows=max_rows, disk_dir=str(disk_dir) if disk_dir else None,
                              seed=seed, cpu_timer=cpu_timer)
    with progress(quiet=quiet_progress(as_json)) as bar:
        task = bar.add_task("replay", total=None)
        result = replay_decision_log(decision_log, settings,
                                     on_progress=lambda d, t: bar.update(task, completed=d,
                                                                         total=t))
    frame = result.to_frame()
    info = result.device
    if as_json:
        emit_json({
            "log": result.log_path, "policy": result.policy, "backend": info.backend,
            "device": info.device, "driver": info.driver, "timer": info.timer,
            "disk_io": info.disk_io, "layout": result.layout.to_dict(),
            "pool_blocks": result.pool_blocks, "rows_scanned": result.rows_scanned,
            "rows_replayed": result.rows_replayed, "truncated": result.truncated,
            "skipped": result.skipped, "actions": frame.to_dict(orient="records"),
        })
        return
    out_console.print(f"[bold]replay[/bold] {result.log_path} (policy {result.policy or '?'}) "
                      f"on {info.backend}: {info.device}; disk_io={info.disk_io}")
    out_console.print(f"layout: {result.layout.describe()}; {result.pool_blocks} blocks per "
                      f"tier; {result.rows_replayed} of {result.rows_scanned} movement rows "
                      "replayed" + (" (stopped at --max-rows)" if result.truncated else ""))
    table = Table(show_header=True, header_style="bold")
    for col in ("action", "rows", "batches", "pred us", "meas us", "pred/row", "meas/row",
                "error"):
        table.add_column(col, justify="left" if col == "action" else "right",
                         overflow="fold", min_width=18 if col == "action" else None)
    for r in frame.itertuples(index=False):
        err = "-" if r.relative_error != r.relative_error else f"{r.relative_error:+.1%}"
        table.add_row(f"{r.action} {r.path}".strip(), f"{r.rows:,}", f"{r.batches:,}",
                      f"{r.predicted_us:,.1f}", f"{r.measured_us:,.1f}",
                      f"{r.predicted_mean_us:,.2f}", f"{r.measured_mean_us:,.2f}", err)
    out_console.print(table)
    for reason, count in result.skipped.items():
        out_console.print(f"skipped {count:,} rows: {reason}")


def _calibrate_timing(result: Path, out: Path, as_json: bool) -> None:
    """``kvsim calibrate --from-vllm-bench``: fit, print the MAPE per metric, write the
    timing profile (nothing written when the file cannot be fitted: one-line error, exit
    2)."""
    from kvsim.engine.timing.fitted import TERMS, BenchFileError, fit_bench, write_profile

    try:
        fit = fit_bench(result)
    except BenchFileError as e:
        raise KvsimInputError(str(e).split(": ", 1)[-1], result, None,
                              "--from-vllm-bench") from None
    write_profile(fit, out)
    coef = {k: float(v) for k, v in zip(TERMS, fit.coef)}
    mape = {k: {"mean": m, "worst": w, "count": n} for k, (m, w, n) in fit.mape.items()}
    if as_json:
        emit_json({"profile_path": str(out), "timing_model": f"fitted:{out.stem}",
                   "coefficients": coef, "mape": mape, "requests": fit.requests,
                   "skipped_requests": fit.skipped, "steps": int(len(fit.steps.ms)),
                   "source": fit.source})
        return
    out_console.print(f"[bold]calibrate --from-vllm-bench[/bold] {result}: {fit.requests:,} "
                      f"requests ({fit.skipped:,} skipped), {len(fit.steps.ms):,} engine steps "
                      f"rebuilt ({fit.source['reconstruction']})")
    a, b, c, d = coef.values()
    out_console.print(f"step_ms = {a:.6g} + {b:.6g} x prefill_tokens + {c:.6g} x decode_batch "
                      f"+ {d:.6g} x decode_context")
    table = Table(show_header=True, header_style="bold")
    for col in ("metric", "MAPE mean", "worst", "count"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for k, m in mape.items():
        table.add_row(k, f"{m['mean']:.2%}", f"{m['worst']:.2%}", f"{m['count']:,}")
    out_console.print(table)
    out_console.print(f"wrote {out} (use it with --timing {out})")


def _check_disk_dir(disk_dir: Path | None) -> None:
    """``--disk-dir`` names an existing folder (kvsim writes its scratch file there and
    removes it; main created the missing folders and left them behind)."""
    if disk_dir is not None and not Path(disk_dir).is_dir():
        raise KvsimInputError("expected an existing folder for the disk tier's scratch file",
                              disk_dir, None, "--disk-dir")
