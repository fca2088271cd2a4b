"""``compare``: the same trace replayed under many policies, one row per policy (the
Python API under ``kvsim compare``), with each policy's gap to the offline references
(belady, optimal) and, in engine mode, its difference from lru.  Split from
:mod:`kvsim.replay.driver` (one module per responsibility, each under ~600 lines)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.core.errors import KvsimInputError
from kvsim.modes.dispatch import simulate
from kvsim.policy.registry import resolve_policy
from kvsim.replay.driver import _open, scan_trace
from kvsim.spec.sim_config import SimConfig

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas as pd

_SHARED: dict = {}


def _one(name: str, on_events: Callable[[int, int], None] | None = None) -> dict:
    trace, config, facts = _SHARED["args"]
    log_dir = _SHARED.get("log_dir")
    log = None if log_dir is None or name == "optimal" else Path(log_dir) / f"{name}.parquet"
    res = simulate(trace, name, config, decision_log=log, facts=facts,
                   lowering=_SHARED.get("lowering"), on_progress=on_events)
    from kvsim.analysis.sweep_cell import latency_quantiles

    return {**res.summary, **latency_quantiles(res)}  # the quantiles: compare's HTML CDFs


class _LogsOfThisRun:
    """The decision logs a compare writes (``DIR/<policy>.parquet``), so that a compare
    that fails (a policy's error, a killed worker, Ctrl-C, SIGTERM) leaves none of them
    behind: the logs it wrote and the folders it created are removed, a file it did not
    write (another run's log) is kept."""

    def __init__(self, log_dir: str | Path | None, names: Sequence[str]) -> None:
        self.paths = [] if log_dir is None else [Path(log_dir) / f"{n}.parquet" for n in names]
        self.before = {p: self._stamp(p) for p in self.paths}
        folder = None if log_dir is None else Path(os.path.abspath(log_dir))
        self.created = []  # the folders missing now, deepest first
        while folder is not None and not folder.exists() and folder != folder.parent:
            self.created.append(folder)
            folder = folder.parent

    @staticmethod
    def _stamp(path: Path) -> tuple | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def remove(self) -> None:
        for p in self.paths:
            if self._stamp(p) not in (None, self.before[p]):
                with contextlib.suppress(OSError):
                    p.unlink()
        for folder in self.created:
            with contextlib.suppress(OSError):  # only when empty
                folder.rmdir()


def default_policies() -> list[str]:
    """Every installed policy (built-ins and entry points), sorted by name, except those
    whose module sets ``IN_DEFAULT_LIST = False`` (quota_lru: lru unless quotas are given;
    name it in ``--policies``)."""
    from kvsim.policy.registry import list_policies

    return [p.name for p in list_policies() if p.in_default_list]


#: The policy the ``*_vs_lru`` columns of :func:`compare` are measured against.
BASELINE = "lru"


class WorkMeter:
    """A compare's progress in units of work (events, or requests in the closed loop):
    ``runs`` replays of ``per_run`` units each.  :meth:`partial` reports the replay running
    in this process, :meth:`finish` a finished one (in any process); ``on_work(done,
    total)`` receives the sum."""

    def __init__(self, per_run: int, runs: int,
                 on_work: Callable[[int, int], None] | None):
        self.per_run = max(int(per_run), 1)
        self.total = self.per_run * runs
        self.finished = 0
        self.on_work = on_work
        self._shown = 0  # never backwards (a replay after a cold compile starts at 0)

    def partial(self, done: int, _total: int | None = None) -> None:
        if self.on_work is not None:
            self._shown = max(self._shown, min(self.finished * self.per_run
                                               + min(int(done), self.per_run), self.total))
            self.on_work(self._shown, self.total)

    def finish(self) -> None:
        self.finished += 1
        self.partial(0)


def compare(trace_path: str | Path, policies: Sequence[str] | None = None,
            config: SimConfig | None = None, decision_log_dir: str | Path | None = None,
            jobs: int = 1, on_progress: Callable[[str], None] | None = None,
            on_work: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Replay the same trace under each policy; one row per policy (columns = the stable
    ``--json`` keys), in the order given, then the offline references compare adds (their
    rows are always in the result; ``bound_claim`` says which is a proven bound,
    :func:`kvsim.results.compare_view.label_bounds`), plus each policy's gap to the offline
    reference: in engine mode belady (``gap_*_to_belady``), in cache mode
    ``optimal``, the exact optimum (``gap_{hbm,prefix,block}_hit_rate_to_optimal``,
    :mod:`kvsim.bounds.optimal`); and, in engine mode, when lru is among the
    policies, its difference from lru (``p99_step_us_vs_lru``, ``p99_step_pct_vs_lru``,
    ``decode_critical_misses_vs_lru``: this policy's minus lru's; negative = better).
    ``on_progress(policy)`` after each policy; ``on_work(events_done, events_total)`` as
    the replays advance (:class:`WorkMeter`)."""
    import tempfile

    config = config or SimConfig()
    cache = config.mode == "cache"
    live = config.live_offload  # bound: optimal = Belady over live units (live_optimum)
    names = list(policies) if policies else default_policies()
    for n in names:
        if n != "optimal":
            resolve_policy(n)  # fail fast on unknown names
    run_names = list(names)
    if not cache and "optimal" not in run_names:
        run_names.append("optimal")  # the prefix-cache bound on this schedule
    # the offline reference: cache mode's exact optimum, else belady (forced-admission MIN)
    bound = "optimal" if (cache or live) else "belady"
    if bound not in run_names:
        try:
            if not cache:
                resolve_policy(bound)
            run_names.append(bound)
        except KvsimInputError:
            bound = None
    tmpdir = tempfile.TemporaryDirectory(prefix="kvsim-compare-")
    facts = None
    if cache:
        from kvsim.modes.cache import lower_for_cache

        _SHARED["lowering"] = lower_for_cache(trace_path, config.cache_variant, tmpdir.name)
    else:
        with _open(trace_path) as reader:
            bs = int(reader.header.block_size_tokens)
        facts = scan_trace(trace_path, bs, config.batch_rows)
    split, first, cold = False, None, []
    if not cache and not live and facts is not None:
        from kvsim.replay.precompile import compare_engine, needs_split, replay_jobs

        runs = sum(1 for n in run_names if n != "optimal")
        chosen = compare_engine(config.engine, facts.num_rows, runs)
        jobs = replay_jobs(config.engine, chosen, jobs)  # a cold small run: every core
        config = dataclasses.replace(config, engine=chosen)
        split, first, cold = needs_split(config.engine, False, run_names)
    _SHARED["args"] = (str(trace_path), config, facts)
    _SHARED["log_dir"] = decision_log_dir
    results: dict[str, dict] = {}
    meter = WorkMeter(facts.num_rows if facts is not None else 1, len(run_names), on_work)
    logs = _LogsOfThisRun(decision_log_dir, run_names)
    try:
        todo = list(run_names)
        if split:
            # a cold compile: the core compiles here (first policy) while forked workers
            # compile the other policies' hooks (kvsim.replay.precompile); workers forked
            # below inherit the core and load the hooks from numba's disk cache
            from kvsim.replay.precompile import compile_workers, first_then_hooks

            results[first] = first_then_hooks(_one, (first, meter.partial if facts is not None
                                                      else None), cold,
                                              compile_workers(jobs), done=results)
            for n in [first, *(n for n in todo if n in results and n != first)]:
                if on_progress:
                    on_progress(n)
                meter.finish()
                todo.remove(n)
            # the replays after a cold compile use its processes (compile_workers)
            jobs = compile_workers(jobs)
        if jobs > 1 and len(todo) > 1:
            from kvsim.core.workers import process_pool

            # no more workers than policies (--jobs 100000 forked 100,000 processes)
            with process_pool(min(jobs, len(todo))) as ex:  # die with this process
                futures = {n: ex.submit(_one, n) for n in todo}
                for n in todo:
                    results[n] = futures[n].result()
                    if on_progress:
                        on_progress(n)
                    meter.finish()
        else:
            for n in todo:
                results[n] = _one(n, meter.partial if facts is not None else None)
                if on_progress:
                    on_progress(n)
                meter.finish()
    except BaseException:  # a policy's error, a killed worker, Ctrl-C: no partial output
        logs.remove()
        raise
    finally:
        _SHARED.clear()
        tmpdir.cleanup()
    rows = []
    ref = results.get(bound) if bound else None
    opt = results.get("optimal")
    base = results.get(BASELINE)
    nan = float("nan")
    # the references compare added are rows too: a bound the gaps are measured to is
    # shown, never silently dropped because --policies did not list it
    for n in names + [n for n in run_names if n not in names]:
        row = dict(results[n])
        if live:
            row["gap_blocks_fetched_to_optimal"] = row["blocks_fetched"] + row[
                "prefetches"] - ref["blocks_fetched"] - ref["prefetches"]
            row["decode_critical_stalls_vs_lru"] = (
                row["decode_critical_stalls"] - base["decode_critical_stalls"]) \
                if base is not None else nan
            row["tpot_p99_us_vs_lru"] = (row["tpot_p99_us"] - base["tpot_p99_us"]) \
                if base is not None else nan
        if cache:
            for key in ("hbm_hit_rate", "prefix_hit_rate", "block_hit_rate"):
                row[f"gap_{key}_to_optimal"] = (ref[key] - row[key]) if ref is not None \
                    else nan
            rows.append(row)
            continue
        if base is not None:  # the baseline every serving engine starts from
            d = row["p99_step_us"] - base["p99_step_us"]
            row["p99_step_us_vs_lru"] = d
            row["p99_step_pct_vs_lru"] = 100.0 * d / base["p99_step_us"] \
                if base["p99_step_us"] > 0 else nan
            row["decode_critical_misses_vs_lru"] = (row["decode_critical_misses"]
                                                   - base["decode_critical_misses"])
        else:
            row["p99_step_us_vs_lru"] = nan
            row["p99_step_pct_vs_lru"] = nan
            row["decode_critical_misses_vs_lru"] = nan
        for key in ("hbm_hit_rate", "prefix_hit_rate"):
            row[f"gap_{key}_to_optimal"] = (opt[key] - row[key]) if opt is not None else nan
        if ref is not None:
            row["gap_hbm_hit_rate_to_belady"] = ref["hbm_hit_rate"] - row["hbm_hit_rate"]
            row["gap_prefix_hit_rate_to_belady"] = ref["prefix_hit_rate"] - row["prefix_hit_rate"]
            row["gap_p99_step_us_to_belady"] = row["p99_step_us"] - ref["p99_step_us"]
        else:
            row["gap_hbm_hit_rate_to_belady"] = float("nan")
            row["gap_prefix_hit_rate_to_belady"] = float("nan")
            row["gap_p99_step_us_to_belady"] = float("nan")
        rows.append(row)
    import pandas as pd

    from kvsim.results.compare_view import label_bounds

    return label_bounds(pd.DataFrame(rows), "cache" if cache else "live" if live
                        else "engine")


def cpu_count() -> int:
    return os.cpu_count() or 1


__all__ = ["BASELINE", "compare", "cpu_count", "default_policies"]
