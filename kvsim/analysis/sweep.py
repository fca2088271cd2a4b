"""Sweeps: one trace replayed over a grid of (policy x HBM size x DRAM size), with a cache.

A *cell* is one :func:`kvsim.api.simulate` call: the sweep's base :class:`SimConfig` with
``hbm_gb`` / ``dram_gb`` replaced (:func:`dataclasses.replace`) and one HBM policy.  Its
result is one *row*: the replay's summary (the stable keys of docs/simulate.md), the cell's
coordinates, a content key, and the step-latency and TTFT quantiles at
:data:`LATENCY_QUANTILES` (so a report can draw latency CDFs without the per-step tables).

Cache.  A finished cell is written atomically to ``OUT/cells/<key>.json`` where ``key`` is
the SHA-256 of (the trace file's bytes hash, the policy, the config, the kvsim version and
a fingerprint of the sources a result depends on: the replay, its modes and bounds, the
engine, memory, the policy interface, event reading, the specs (hardware, models, config),
the built-in policies and this module).  A rerun -- after a kill, or with a larger grid -- reads cached cells and
computes only the missing ones.  Editing any of those sources invalidates every cell.

Executors.  ``local``: the calling process (``jobs=1``) or a fork-based process pool of
``jobs`` workers; the trace's pre-pass (:func:`kvsim.replay.driver.scan_trace`) runs once in
the parent and is inherited by the workers.  ``ray``: the same cell function as a Ray task
(optional ``ray`` extra), the pre-pass shared through the object store.  Cells are written
by the driver as they finish, and the results table is ordered by the grid, never by
completion, so every executor gives byte-identical outputs.

Outputs (``OUT/``): ``results.parquet`` (one row per cell, :func:`results_columns`),
``summary.json`` (per capacity: the best policy by HBM hit rate and by p99 step latency,
each policy's gap to belady), ``occupancy.parquet`` (each cell's tier occupancy over time,
at most :data:`OCCUPANCY_MAX_POINTS` points per cell, :func:`occupancy_series`),
``cells/`` (the cache: ``<key>.json`` and ``<key>.occupancy.parquet``), and with
``curves=True`` ``curves.parquet`` (one-pass lru/belady hit-rate curves, :mod:`kvsim.cachesim.curves`).
No wall-clock time reaches any file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim import __version__
from kvsim.analysis.sweep_cell import (
    LATENCY_QUANTILES,
    OCCUPANCY_MAX_POINTS,
    _run_cell_full,
    cell_label,
    occupancy_series,
    run_cell,
)
from kvsim.analysis.sweep_keys import (
    ROW_FORMAT,
    SWEEP_MARKER,
    _config_identity,
    cell_key,
    code_fingerprint,
    file_sha256,
    own_trace,
)
from kvsim.core.errors import KvsimInputError, KvsimResourceError, bad_value
from kvsim.core.fsutil import atomic_output, claim_output_dir
from kvsim.spec.sim_config import SimConfig

#: Policy run in every capacity group as the offline bound (when ``bound=True``).
BOUND_POLICY = "belady"
#: The prefix-cache optimum (kvsim.bounds.optimal), also run in every capacity group when
#: ``bound=True``: the gap columns ``gap_*_to_optimal`` are measured against it (in cache
#: mode it is exact, in engine mode a bound on the trace's fixed schedule).
OPTIMAL_POLICY = "optimal"
EXECUTORS = ("local", "ray")




# ----------------------------------------------------------------------------------------
# Grid and keys
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepSpec:
    """The grid: every policy at every (DRAM, HBM) capacity pair.  ``dram_gb`` entries may
    be None (= the hardware profile's DRAM).  ``base`` supplies every other setting."""

    trace: str
    policies: tuple[str, ...]
    hbm_gb: tuple[float, ...]
    dram_gb: tuple[float | None, ...] = (None,)
    base: SimConfig = field(default_factory=SimConfig)
    bound: bool = True  # add BOUND_POLICY to the grid when it is not listed
    #: add OPTIMAL_POLICY to every capacity group (the gap_*_to_optimal columns); None =
    #: in cache mode only (there it is exact and costs well under a second; the engine-mode
    #: bound reads the event file row by row in Python, which is slow on large traces)
    optimal: bool | None = None

    def __post_init__(self) -> None:
        if not self.policies:
            raise bad_value(None, None, "policies", "at least one policy name", "")
        if len(set(self.policies)) != len(self.policies):
            raise bad_value(None, None, "policies", "distinct names", ",".join(self.policies))
        if not self.hbm_gb:
            raise bad_value(None, None, "hbm_gb", "at least one HBM size in GB", "")
        for v in self.hbm_gb:
            if not v > 0:
                raise bad_value(None, None, "hbm_gb", "sizes > 0 (GB)", v)
        for v in self.dram_gb:
            if v is not None and not v >= 0:
                raise bad_value(None, None, "dram_gb", "sizes >= 0 (GB)", v)

    def run_policies(self) -> tuple[str, ...]:
        names = tuple(self.policies)
        if self.bound and BOUND_POLICY not in names:
            names = names + (BOUND_POLICY,)
        want = self.optimal if self.optimal is not None else self.base.mode == "cache"
        if want and OPTIMAL_POLICY not in names:
            names = names + (OPTIMAL_POLICY,)
        return names

    def cells(self) -> list[tuple[str, SimConfig]]:
        """(policy, config) of every cell in grid order: DRAM outer, HBM, then policy."""
        out = []
        for dram in self.dram_gb:
            for hbm in self.hbm_gb:
                cfg = dataclasses.replace(self.base, hbm_gb=float(hbm), hbm_blocks=None,
                                          dram_gb=None if dram is None else float(dram))
                for pol in self.run_policies():
                    out.append((pol, cfg))
        return out


_WORKER: dict = {}


def _pool_cell(index: int) -> tuple[int, dict, pd.DataFrame]:
    trace, cells, facts = _WORKER["args"]
    policy, config = cells[index]
    return (index, *_run_cell_full(trace, policy, config, facts))


def _ray_task():
    import ray

    @ray.remote
    def cell(trace, policy, config, facts, index):
        return (index, *_run_cell_full(trace, policy, config, facts))

    return cell


# ----------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------

@dataclass
class SweepResult:
    """What :func:`run_sweep` did.  ``table`` is the results table (grid order)."""

    table: pd.DataFrame
    summary: dict
    out_dir: Path
    results_path: Path
    summary_path: Path
    curves_path: Path | None
    cells: int
    computed: int
    cached: int
    occupancy_path: Path | None = None


def _cell_path(out_dir: Path, key: str) -> Path:
    return out_dir / "cells" / f"{key}.json"


def _occupancy_path(cell_path: Path) -> Path:
    return cell_path.with_name(cell_path.stem + ".occupancy.parquet")


def _read_cell(path: Path) -> tuple[dict, pd.DataFrame] | None:
    """A cached cell's row and occupancy series; None (recompute) if either is missing or
    unreadable (atomic writes make that rare: a kill between the two files)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        occ = pd.read_parquet(_occupancy_path(path))
    except Exception:  # OSError, ValueError, pyarrow's errors on a damaged file
        return None
    row = data.get("row") if isinstance(data, dict) else None
    return None if row is None else (row, occ)


def _write_cell(path: Path, key: str, row: dict, occ: pd.DataFrame) -> None:
    """The occupancy file first, then the JSON: a JSON file means the cell is complete."""
    with atomic_output(_occupancy_path(path)) as tmp:
        occ.to_parquet(tmp, index=False)
    with atomic_output(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"key": key, "row_format": ROW_FORMAT, "row": row}, fh, sort_keys=True)


def _occupancy_table(cells, keys, series) -> pd.DataFrame:
    """Every cell's occupancy series, grid order, with the cell's key and coordinates."""
    parts = []
    for (policy, cfg), key, occ in zip(cells, keys, series):
        head = pd.DataFrame({
            "cell": [key] * len(occ), "policy": [policy] * len(occ),
            "hbm_gb": np.full(len(occ), float(cfg.hbm_gb)),
            "dram_gb": np.full(len(occ), np.nan if cfg.dram_gb is None
                               else float(cfg.dram_gb)),
            "point": np.arange(len(occ), dtype=np.int64)})
        parts.append(pd.concat([head, occ.reset_index(drop=True)], axis=1))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def results_columns() -> list[str]:
    """Columns of results.parquet, in order."""
    from kvsim.replay.metrics import SUMMARY_KEYS

    return (["cell", "policy", "hbm_gb", "dram_gb", "block_bytes", "trace", "trace_sha256",
             "kvsim_version", "code_fingerprint", "config_json"]
            + [k for k in SUMMARY_KEYS if k != "policy"]
            + ["gap_hbm_hit_rate_to_belady", "gap_p99_step_us_to_belady",
               "gap_hbm_hit_rate_to_optimal", "gap_prefix_hit_rate_to_optimal",
               "step_latency_q_us", "ttft_q_us"])


def _build_table(spec: SweepSpec, cells, keys, rows, trace_sha, fingerprint) -> pd.DataFrame:
    recs = []
    for (policy, cfg), key, row in zip(cells, keys, rows):
        rec = dict(row)
        rec.update({"cell": key, "policy": policy, "hbm_gb": float(cfg.hbm_gb),
                    "dram_gb": float("nan") if cfg.dram_gb is None else float(cfg.dram_gb),
                    "trace": Path(spec.trace).name, "trace_sha256": trace_sha,
                    "kvsim_version": __version__, "code_fingerprint": fingerprint,
                    "config_json": json.dumps(_config_identity(cfg), sort_keys=True,
                                              default=str)})
        recs.append(rec)
    # cache mode has no latency keys: those columns are NaN
    df = pd.DataFrame(recs).reindex(columns=list(dict.fromkeys(
        [c for c in results_columns() if not c.startswith("gap_")]
        + [c for c in pd.DataFrame(recs).columns if c not in results_columns()])))
    # gap to the bound within each capacity group
    df["gap_hbm_hit_rate_to_belady"] = np.nan
    df["gap_p99_step_us_to_belady"] = np.nan
    for _, idx in df.groupby(["hbm_gb", "dram_gb"], dropna=False, sort=False).groups.items():
        g = df.loc[idx]
        ref = g[g["policy"] == BOUND_POLICY]
        if len(ref):
            df.loc[idx, "gap_hbm_hit_rate_to_belady"] = (float(ref["hbm_hit_rate"].iloc[0])
                                                         - g["hbm_hit_rate"])
            df.loc[idx, "gap_p99_step_us_to_belady"] = (g["p99_step_us"]
                                                        - float(ref["p99_step_us"].iloc[0]))
        opt = g[g["policy"] == OPTIMAL_POLICY]
        for key in ("hbm_hit_rate", "prefix_hit_rate"):
            df.loc[idx, f"gap_{key}_to_optimal"] = (float(opt[key].iloc[0]) - g[key]) \
                if len(opt) else np.nan
    # cache mode has no latency keys: those columns stay NaN
    return df.reindex(columns=results_columns())


def _summarize(spec: SweepSpec, table: pd.DataFrame, trace_sha: str) -> dict:
    groups = []
    online = table[table["offline"] == False]  # noqa: E712
    for (hbm, dram), g in table.groupby(["hbm_gb", "dram_gb"], dropna=False, sort=False):
        on = online[(online["hbm_gb"] == hbm) & ((online["dram_gb"] == dram) |
                                                  (online["dram_gb"].isna() & pd.isna(dram)))]
        entry = {"hbm_gb": float(hbm), "dram_gb": None if pd.isna(dram) else float(dram),
                 "hbm_capacity_blocks": int(g["hbm_capacity_blocks"].iloc[0])}
        if len(on):
            best_hit = on.sort_values(["hbm_hit_rate", "policy"], ascending=[False, True],
                                      kind="stable").iloc[0]
            best_p99 = on.sort_values(["p99_step_us", "policy"], kind="stable").iloc[0]
            entry["best_hit_rate_policy"] = str(best_hit["policy"])
            entry["best_hit_rate"] = float(best_hit["hbm_hit_rate"])
            entry["best_p99_policy"] = str(best_p99["policy"])
            entry["best_p99_step_us"] = float(best_p99["p99_step_us"])
        entry["policies"] = {str(r["policy"]): {
            "hbm_hit_rate": float(r["hbm_hit_rate"]), "p99_step_us": float(r["p99_step_us"]),
            "gap_hbm_hit_rate_to_belady": float(r["gap_hbm_hit_rate_to_belady"]),
            "gap_p99_step_us_to_belady": float(r["gap_p99_step_us_to_belady"]),
            "gap_hbm_hit_rate_to_optimal": float(r["gap_hbm_hit_rate_to_optimal"])}
            for _, r in g.iterrows()}
        groups.append(entry)
    return {"trace": Path(spec.trace).name, "trace_sha256": trace_sha,
            "kvsim_version": __version__, "mode": spec.base.mode,
            "policies": list(spec.run_policies()),
            "hbm_gb": [float(v) for v in spec.hbm_gb],
            "dram_gb": [None if v is None else float(v) for v in spec.dram_gb],
            "cells": int(len(table)), "by_capacity": groups}


def _json_safe(obj):
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


def _capacity_blocks(trace: str, hbm_gb: Sequence[float]) -> list[int]:
    from kvsim.engine.cost_model import GB
    from kvsim.events import open_events

    with open_events(trace) as reader:
        h = reader.header
    block_bytes = int(h.kv_bytes_per_token) * int(h.block_size_tokens)
    if block_bytes <= 0:
        raise KvsimInputError("expected kv_bytes_per_token in the trace header to size the "
                              "curve's capacities", trace, None, "kv_bytes_per_token")
    return [max(int(g * GB) // block_bytes, 1) for g in hbm_gb]


def curve_capacities(hbm_blocks: Sequence[int], points: int = 48) -> list[int]:
    """The sweep's HBM sizes in blocks plus ``points`` log-spaced sizes from 1/64 of the
    smallest to 4x the largest (sorted, distinct)."""
    lo = max(min(hbm_blocks) // 64, 1)
    hi = max(max(hbm_blocks) * 4, lo + 1)
    grid = np.unique(np.round(np.geomspace(lo, hi, points)).astype(np.int64))
    return sorted(set(int(v) for v in grid) | set(int(v) for v in hbm_blocks))


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, jobs: int | None = None,
              executor: str = "local", ray_address: str | None = None,
              curves: bool = False, curve_sample_rate: float = 1.0,
              on_cell: Callable[[int, int, str, bool], None] | None = None,
              force: bool = False) -> SweepResult:
    """Run every cell of ``spec`` not already cached in ``out_dir``; write the results.

    ``jobs``: parallel workers (default: the number of CPUs).  ``executor``: ``local`` or
    ``ray`` (``ray_address`` None starts a local Ray instance with ``jobs`` CPUs).
    ``on_cell(done, total, policy, cached)`` is called once per cell as it completes.
    Same inputs => byte-identical results.parquet, summary.json and curves.parquet.
    ``out_dir`` must be empty, new, or a kvsim sweep folder (it holds
    :data:`SWEEP_MARKER`, or a ``cells/`` cache from before the marker); ``force`` writes
    into any folder.
    """
    if executor not in EXECUTORS:
        raise bad_value(None, None, "executor", " | ".join(EXECUTORS), executor)
    jobs = int(jobs) if jobs else (os.cpu_count() or 1)
    if jobs < 1:
        raise bad_value(None, None, "jobs", "an integer >= 1", jobs)
    from kvsim.policy.registry import resolve_policy

    trace = str(spec.trace)
    if not Path(trace).is_file():
        raise KvsimInputError("expected an event file (kvsim import-request-trace / generate)",
                              trace, None, "trace")
    for name in spec.run_policies():
        if name != OPTIMAL_POLICY:  # optimal is the solver, not a registered policy
            resolve_policy(name)  # unknown names fail before any work
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    claim_output_dir(out_dir, SWEEP_MARKER, "kvsim sweep folder", force, legacy="cells")
    try:
        return _sweep_into(spec, trace, out_dir, force, jobs, executor, ray_address, curves,
                           curve_sample_rate, on_cell)
    except BaseException:  # a bad trace, a policy's error, Ctrl-C before any cell
        if created:
            _remove_if_no_cell(out_dir)
        raise


def _remove_if_no_cell(out_dir: Path, marker: str = SWEEP_MARKER) -> None:
    """Remove a sweep (or plan: its ``marker``) folder this run created when no cell
    finished in it (it holds only its marker and an empty cells/): a failed sweep leaves
    no partial output; one with finished cells keeps them (the next run resumes)."""
    import shutil

    cells = out_dir / "cells"
    with contextlib.suppress(OSError):
        if set(os.listdir(out_dir)) <= {marker, "cells"} and not (
                cells.is_dir() and os.listdir(cells)):
            shutil.rmtree(out_dir)


def _sweep_into(spec: SweepSpec, trace: str, out_dir: Path, force: bool, jobs: int,
                executor: str, ray_address: str | None, curves: bool,
                curve_sample_rate: float, on_cell) -> SweepResult:
    """:func:`run_sweep` after its checks, in the folder it claimed."""
    trace_sha = file_sha256(trace)
    own_trace(out_dir, trace, trace_sha, force)
    fingerprint = code_fingerprint()
    cells = spec.cells()
    keys = [cell_key(trace_sha, p, c, fingerprint) for p, c in cells]
    cached = [_read_cell(_cell_path(out_dir, k)) for k in keys]
    rows: list[dict | None] = [None if c is None else c[0] for c in cached]
    series: list[pd.DataFrame | None] = [None if c is None else c[1] for c in cached]
    del cached
    todo = [i for i, r in enumerate(rows) if r is None]
    total = len(cells)
    done = 0
    for i, r in enumerate(rows):
        if r is not None:
            done += 1
            if on_cell:
                on_cell(done, total, cells[i][0], True)

    def finished(i: int, row: dict, occ: pd.DataFrame) -> None:
        nonlocal done
        _write_cell(_cell_path(out_dir, keys[i]), keys[i], row, occ)
        rows[i] = row
        series[i] = occ
        done += 1
        if on_cell:
            on_cell(done, total, cells[i][0], False)

    if todo:
        from kvsim.events import open_events
        from kvsim.replay.driver import scan_trace

        with open_events(trace) as reader:
            bs = int(reader.header.block_size_tokens)
        facts = scan_trace(trace, bs, spec.base.batch_rows)
        if executor == "ray":
            _run_ray(trace, cells, todo, facts, jobs, ray_address, finished)
        elif jobs == 1 or len(todo) == 1:
            for i in todo:
                finished(i, *_run_cell_full(trace, cells[i][0], cells[i][1], facts))
        else:
            _run_pool(trace, cells, todo, facts, jobs, finished)
    table = _build_table(spec, cells, keys, rows, trace_sha, fingerprint)
    summary = _json_safe(_summarize(spec, table, trace_sha))
    results_path = out_dir / "results.parquet"
    summary_path = out_dir / "summary.json"
    with atomic_output(results_path) as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_output(summary_path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    occupancy_path = out_dir / "occupancy.parquet"
    with atomic_output(occupancy_path) as tmp:
        _occupancy_table(cells, keys, series).to_parquet(tmp, index=False)
    curves_path = None
    if not curves:  # never leave curves of an earlier run for `report` to draw
        (out_dir / "curves.parquet").unlink(missing_ok=True)
    if curves:
        from kvsim.cachesim.curves import block_stream, hit_curve

        caps = curve_capacities(_capacity_blocks(trace, spec.hbm_gb))
        df = hit_curve(block_stream(trace, spec.base.batch_rows), caps,
                       sample_rate=curve_sample_rate)
        curves_path = out_dir / "curves.parquet"
        with atomic_output(curves_path) as tmp:
            df.to_parquet(tmp, index=False)
    return SweepResult(table, summary, out_dir, results_path, summary_path, curves_path,
                       total, len(todo), total - len(todo), occupancy_path)


def _run_pool(trace, cells, todo, facts, jobs, finished) -> None:
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    from kvsim.core.workers import process_pool

    _WORKER["args"] = (trace, cells, facts)
    try:
        with process_pool(min(jobs, len(todo))) as ex:  # workers die with this process
            futures = {ex.submit(_pool_cell, i): i for i in todo}
            for fut in as_completed(futures):
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    raise KvsimResourceError(
                        f"a sweep worker died (killed: out of memory or a signal) while "
                        f"running cell {cell_label(*cells[futures[fut]])}; the finished "
                        "cells are kept: run the same command again to resume") from None
                finished(*result)
    finally:
        _WORKER.clear()



def require_ray():
    """The ``ray`` module, or the one-line error naming ``--executor`` (the optional extra)."""
    try:
        import ray
    except ImportError:
        raise KvsimInputError("--executor ray needs the optional extra: pip install "
                              "'kvsim[ray]' (ray==2.60.0; ray is not installed)", None, None,
                              "--executor") from None
    return ray


def run_on_ray(submit, jobs: int, address: str | None, finished) -> None:
    """Run ``submit(ray)``'s task references in a Ray session (joined at ``address``, or a
    local one of ``jobs`` CPUs started and shut down here) and pass each task's result to
    ``finished`` as it arrives: sweeps and plans write each cell's file as it lands, so a
    Ray run resumes as a local one does."""
    ray = require_ray()
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        pending = submit(ray)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                finished(*ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def _run_ray(trace, cells, todo, facts, jobs, address, finished) -> None:
    def submit(ray):
        task = _ray_task()
        facts_ref = ray.put(facts)
        return [task.remote(trace, cells[i][0], cells[i][1], facts_ref, i) for i in todo]

    run_on_ray(submit, jobs, address, finished)


def load_results(path: str | Path) -> pd.DataFrame:
    """Read a sweep's results table: ``path`` is results.parquet or the sweep directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.parquet"
    if not p.is_file():
        raise KvsimInputError("expected a sweep directory or its results.parquet "
                              "(kvsim sweep --out DIR)", p, None, None)
    try:
        df = pd.read_parquet(p)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise KvsimInputError(f"expected a Parquet results table, could not read it "
                              f"({type(exc).__name__})", p, None, None) from None
    missing = [c for c in ("policy", "hbm_gb", "hbm_hit_rate", "p99_step_us")
               if c not in df.columns]
    if missing:
        raise KvsimInputError("expected a kvsim sweep results table (missing columns "
                              f"{', '.join(missing)})", p, None, missing[0])
    return df


def load_curves(path: str | Path) -> pd.DataFrame | None:
    """A sweep's one-pass curves (``curves.parquet`` beside ``results.parquet``), or None
    when the sweep has none.  A corrupt or incomplete file is one KvsimInputError."""
    p = Path(path)
    p = (p if p.is_dir() else p.parent) / "curves.parquet"
    if not p.is_file():
        return None
    try:
        df = pd.read_parquet(p)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise KvsimInputError(f"expected a Parquet curves table, could not read it "
                              f"({type(exc).__name__}); rerun the sweep with --curves",
                              p, None, None) from None
    missing = [c for c in ("policy", "capacity_blocks", "hit_rate") if c not in df.columns]
    if missing:
        raise KvsimInputError("expected a kvsim curves table (missing columns "
                              f"{', '.join(missing)}); rerun the sweep with --curves", p,
                              None, missing[0])
    return df


def load_occupancy(path: str | Path) -> pd.DataFrame | None:
    """A sweep's occupancy table (``occupancy.parquet`` beside ``results.parquet``; ``path``
    is either file or the sweep directory), or None when the sweep has none (made by a
    kvsim without occupancy series).  Raises KvsimInputError on an unreadable file."""
    p = Path(path)
    if not p.is_dir():
        p = p.parent
    p = p / "occupancy.parquet"
    if not p.is_file():
        return None
    try:
        return pd.read_parquet(p)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise KvsimInputError(f"expected a Parquet occupancy table, could not read it "
                              f"({type(exc).__name__})", p, None, None) from None


__all__ = ["BOUND_POLICY", "EXECUTORS", "LATENCY_QUANTILES", "OCCUPANCY_MAX_POINTS",
           "SweepResult", "SweepSpec", "cell_key", "code_fingerprint", "curve_capacities",
           "file_sha256", "load_curves", "load_occupancy", "load_results", "occupancy_series",
           "results_columns", "run_cell", "run_sweep"]
