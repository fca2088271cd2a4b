"""``kvsim plan``: the cheapest configuration that serves a request trace within an SLO.

A *cell* is one closed-loop run (:func:`kvsim.modes.closed.cluster.serve`) of the Request
table: a GPU kind (hardware profile, one GPU per replica: kvsim's step-time tables are
tensor-parallel 1), a replica count, an HBM policy and the lower tiers' sizes per replica
(DRAM, CXL, NVMe GB).  The grid is every combination (:meth:`PlanSpec.cells`, order: GPU
kind, replicas, DRAM, CXL, NVMe, policy).  Each cell is priced with a
:class:`kvsim.spec.prices.PriceTable`::

    usd_per_hour = replicas x (gpu_usd_per_hour[kind] + sum over tiers of gb x usd_per_gb_hour)

and measured against the SLO (:class:`SLO`: TTFT p99, TPOT p99 or goodput).  The answer is
the cheapest cell meeting the SLO (ties: grid order), the Pareto front of cost against the
SLO metric over every replayed cell (:func:`pareto_front`), and each cell's dollars per
million tokens served (``usd_per_hour`` x the run's makespan / tokens).

Pruning with one-pass curves (:mod:`kvsim.cachesim.curves`).  The prompt-block stream of
the table (every request's engine-block hashes in arrival order) is run once through the
LRU stack-distance pass.  In cache mode a cache of at least ``S`` blocks (``S`` = the
largest finite LRU stack distance, for ``lru``; the number of distinct blocks for any
other policy: such a cache never evicts) already gets every hit the stream allows, and a
replica of any router sees a sub-sequence of the stream, whose distances are no larger.
So among cells that differ only in lower-tier sizes and whose per-replica capacity (HBM +
lower tiers, blocks) is at least ``S``, only the cheapest is replayed; the others are
listed with ``status = "pruned"``.  This is exact for the cache-mode hit rate and an
approximation in the closed loop (running requests' decode blocks also take room there);
``prune=False`` replays every cell.  Latency needs the replay: no curve gives it.

Resumable: each replayed cell is written to ``OUT/cells/<key>.json`` (atomically) where
``key`` is the SHA-256 of the table's content, the cell, the engine options, the router,
the base config, the sweep's code fingerprint (:func:`kvsim.analysis.sweep.code_fingerprint`)
and the source of :func:`run_cell` (what a cell computes);
a rerun reads finished cells and replays the rest.  Executor: the calling process or a
fork-based process pool (``jobs``); Ray is not offered here.  No wall-clock time reaches
any output: fresh and resumed runs write byte-identical ``plan.parquet`` and ``plan.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.analysis.plan_rows import CELL_KEYS, build_rows, summary_dict
from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import atomic_output, claim_output_dir
from kvsim.spec.prices import PriceTable
from kvsim.spec.sim_config import SimConfig

#: SLO metrics: (summary key, lower is better).  ``goodput``: the fraction of requests
#: that meet their own TTFT and TPOT deadlines (the summary's ``slo_attainment``).
SLO_METRICS = {"ttft_p99": ("ttft_p99_us", True), "tpot_p99": ("tpot_p99_us", True),
               "goodput": ("slo_attainment", False)}
PLAN_MARKER = ".kvsim-plan"
#: Bumped when a cell's stored row changes (part of every key).
PLAN_ROW_FORMAT = 1
_UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


@dataclass(frozen=True)
class SLO:
    """``metric`` (a key of :data:`SLO_METRICS`) and its target: microseconds for the
    latencies (met when ``value <= target``), a fraction for goodput (met when ``value >=
    target``).  For goodput, ``ttft_us`` / ``tpot_us`` are the deadlines given to requests
    whose trace carries none (-1 in the Request table)."""

    metric: str
    target: float
    ttft_us: int | None = None
    tpot_us: int | None = None

    def __post_init__(self) -> None:
        if self.metric not in SLO_METRICS:
            raise bad_value(None, None, "--slo", " | ".join(SLO_METRICS), self.metric)
        if not np.isfinite(self.target) or self.target <= 0 or (
                self.metric == "goodput" and self.target > 1):
            raise bad_value(None, None, "--slo", "a target > 0 (goodput: a fraction <= 1)",
                            self.target)

    @property
    def key(self) -> str:
        return SLO_METRICS[self.metric][0]

    @property
    def lower_is_better(self) -> bool:
        return SLO_METRICS[self.metric][1]

    def met(self, value: float) -> bool:
        if not np.isfinite(value):
            return False
        return value <= self.target if self.lower_is_better else value >= self.target

    def describe(self) -> str:
        if self.metric == "goodput":
            return f"goodput >= {self.target:g} of requests within their deadlines"
        return f"{self.metric} <= {self.target / 1e3:g} ms"


def parse_slo(text: str, ttft_us: int | None = None, tpot_us: int | None = None) -> SLO:
    """``ttft_p99=2s``, ``tpot_p99=50ms``, ``ttft_p99=800000us``, ``goodput=0.95``."""
    m = re.fullmatch(r"\s*([a-z0-9_]+)\s*=\s*([0-9.eE+-]+)\s*(us|ms|s)?\s*", str(text))
    if not m:
        raise bad_value(None, None, "--slo", "METRIC=VALUE: ttft_p99=2s, tpot_p99=50ms or "
                        "goodput=0.95", text)
    metric, num, unit = m.group(1), m.group(2), m.group(3)
    if metric not in SLO_METRICS:
        raise bad_value(None, None, "--slo", "a metric among " + ", ".join(SLO_METRICS), metric)
    try:
        value = float(num)
    except ValueError:
        raise bad_value(None, None, "--slo", "a number after '='", text) from None
    if metric == "goodput":
        if unit:
            raise bad_value(None, None, "--slo", "goodput as a fraction (no unit)", text)
        if ttft_us is None and tpot_us is None:
            pass  # the deadlines may come from the trace; run_plan checks
    else:
        if unit is None:
            raise bad_value(None, None, "--slo", f"{metric} with a unit (us, ms, s)", text)
        value *= _UNITS_US[unit]
    return SLO(metric, value, ttft_us, tpot_us)


@dataclass(frozen=True)
class PlanCell:
    """One configuration of the grid (tier sizes per replica, GB)."""

    hardware: str
    replicas: int
    policy: str
    dram_gb: float
    cxl_gb: float
    nvme_gb: float

    def config(self, base: SimConfig) -> SimConfig:
        return dataclasses.replace(base, hardware=self.hardware, hbm_gb=None,
                                   hbm_blocks=None, dram_gb=self.dram_gb,
                                   cxl_gb=self.cxl_gb, nvme_gb=self.nvme_gb)

    def usd_per_hour(self, prices: PriceTable) -> float:
        per = prices.gpu_usd_per_hour(self.hardware)
        for t in ("dram", "cxl", "nvme"):
            gb = getattr(self, f"{t}_gb")
            per += gb * prices.tier_usd_per_gb_hour(t, gb)
        return self.replicas * per


@dataclass(frozen=True)
class PlanSpec:
    """The search: an SLO, a price table and the grid's axes; ``base`` and ``engine`` give
    every other setting (model, block size, scheduler limits, step-time model)."""

    slo: SLO
    prices: PriceTable
    hardware: tuple[str, ...] = ("h100-sxm",)
    replicas: tuple[int, ...] = (1,)
    policies: tuple[str, ...] = ("lru",)
    dram_gb: tuple[float, ...] = (0.0,)
    cxl_gb: tuple[float, ...] = (0.0,)
    nvme_gb: tuple[float, ...] = (0.0,)
    router: str = "round_robin"
    base: SimConfig = field(default_factory=SimConfig)
    engine: object = None  # kvsim.modes.closed.closed_loop.EngineOptions (None: defaults)
    prune: bool = True

    def __post_init__(self) -> None:
        for name in ("hardware", "replicas", "policies", "dram_gb", "cxl_gb", "nvme_gb"):
            values = getattr(self, name)
            if not values:
                raise bad_value(None, None, f"--{name.replace('_', '-')}", "at least one value",
                                "")
            if len(set(values)) != len(values):
                raise bad_value(None, None, f"--{name.replace('_', '-')}", "distinct values",
                                ",".join(str(v) for v in values))
        for r in self.replicas:
            if int(r) != r or r < 1:
                raise bad_value(None, None, "--replicas", "integers >= 1", r)
        for name in ("dram_gb", "cxl_gb", "nvme_gb"):
            for v in getattr(self, name):
                if v is None or not np.isfinite(v) or v < 0:
                    raise bad_value(None, None, f"--{name.replace('_', '-')}",
                                    "sizes >= 0 (GB per replica)", v)

    def cells(self) -> list[PlanCell]:
        return [PlanCell(hw, int(r), pol, float(d), float(c), float(n))
                for hw in self.hardware for r in self.replicas for d in self.dram_gb
                for c in self.cxl_gb for n in self.nvme_gb for pol in self.policies]


# ----------------------------------------------------------------------------------------
# Keys, the table's content, the curve
# ----------------------------------------------------------------------------------------

def table_sha256(table) -> str:
    """SHA-256 of a Request table's content (every column, in order, and its block size)."""
    h = hashlib.sha256(f"block_size {table.block_size_tokens}".encode())
    df = table.df
    for col in df.columns:
        h.update(col.encode() + b"\0")
        s = df[col]
        if col == "block_ids":
            off, ids = table.flat_block_ids()
            h.update(np.ascontiguousarray(off, np.int64).tobytes())
            h.update(np.ascontiguousarray(ids, np.int64).tobytes())
        elif s.dtype == object or str(s.dtype) in ("string", "str"):
            h.update("\x1f".join(str(v) for v in s.tolist()).encode())
        else:
            h.update(np.ascontiguousarray(s.to_numpy()).tobytes())
    return h.hexdigest()


def _engine_identity(engine) -> dict:
    return engine.identity()


def cell_key(table_sha: str, cell: PlanCell, spec: PlanSpec, engine, fingerprint: str) -> str:
    from kvsim.analysis.sweep import _config_identity

    payload = json.dumps({"table": table_sha, "cell": dataclasses.asdict(cell),
                          "config": _config_identity(cell.config(spec.base)),
                          "engine": _engine_identity(engine), "router": spec.router,
                          "deadlines": [spec.slo.ttft_us, spec.slo.tpot_us],
                          "row": PLAN_ROW_FORMAT, "code": fingerprint},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def saturation_blocks(table, block_size_tokens: int) -> dict[str, int]:
    """``{"lru": S_lru, "any": distinct}``: the largest finite LRU stack distance of the
    table's prompt-block stream (engine blocks of ``block_size_tokens``, identified ones
    only) and its number of distinct blocks (docs/plan.md, "Pruning")."""
    from kvsim.cachesim.curves import lru_stack_distances
    from kvsim.cachesim.simulator import remap_keys
    from kvsim.modes.closed.closed_facts import prompt_block_hashes

    off, ids = table.flat_block_ids()
    _, hashes = prompt_block_hashes(table, off, ids, int(block_size_tokens))
    keys = hashes[hashes != 0]
    if keys.shape[0] == 0:
        return {"lru": 0, "any": 0}
    dense, by_id = remap_keys(keys)
    dist = lru_stack_distances(dense, int(by_id.shape[0]))
    return {"lru": int(dist.max()), "any": int(by_id.shape[0])}


def _prune(cells: list[PlanCell], spec: PlanSpec, sat: dict[str, int],
           capacity: Callable[[PlanCell], int]) -> dict[int, str]:
    """Index -> reason of the cells the curve shows cannot gain hits over a cheaper cell
    of the same (GPU kind, replicas, policy)."""
    out: dict[int, str] = {}
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault((c.hardware, c.replicas, c.policy), []).append(i)
    for (_hw, _r, pol), idx in groups.items():
        s = sat["lru"] if pol == "lru" else sat["any"]
        over = [i for i in idx if capacity(cells[i]) >= s]
        if len(over) < 2:
            continue
        keep = min(over, key=lambda i: (cells[i].usd_per_hour(spec.prices), i))
        k = cells[keep]
        for i in over:
            if i != keep:
                out[i] = (f"curve: {capacity(cells[i]):,} blocks per replica >= {s:,} "
                          f"({'lru stack distance' if pol == 'lru' else 'distinct blocks'}); "
                          f"kept dram {k.dram_gb:g} / cxl {k.cxl_gb:g} / nvme {k.nvme_gb:g} GB")
    return out


# ----------------------------------------------------------------------------------------
# Cells
# ----------------------------------------------------------------------------------------

def _with_deadlines(table, slo: SLO):
    """The table with ``slo``'s deadlines given to requests that carry none."""
    if slo.metric != "goodput" or (slo.ttft_us is None and slo.tpot_us is None):
        return table
    df = table.df.copy()
    for col, v in (("ttft_deadline_us", slo.ttft_us), ("tpot_deadline_us", slo.tpot_us)):
        if v is not None:
            df.loc[df[col] < 0, col] = int(v)
    return dataclasses.replace(table, df=df)


def run_cell(table, cell: PlanCell, base: SimConfig, engine, router: str) -> dict:
    """Serve ``table`` on ``cell``; the cell's measured keys (:data:`CELL_KEYS`) plus
    ``tokens`` (prompt + output tokens of the finished measured requests)."""
    from kvsim.modes.closed.cluster import serve

    res = serve(table, cell.policy, cell.config(base), replicas=cell.replicas, router=router,
                engine=engine)
    s = res.summary
    row = {k: (float(s[k]) if isinstance(s.get(k), (int, float, np.number)) else None)
           for k in CELL_KEYS}
    rq = res.requests
    warm = base.warmup_count(len(table))
    done = rq[rq["e2e_us"].notna() & (rq["request_id"] >= warm)]
    row["tokens"] = float(done["prompt_tokens"].sum() + done["output_tokens"].sum())
    row["output_tokens"] = float(done["output_tokens"].sum())
    row["finished_requests"] = float(len(done))
    return row


_WORKER: dict = {}


def _pool_cell(i: int) -> tuple[int, dict]:
    table, cells, base, engine, router = _WORKER["args"]
    return i, run_cell(table, cells[i], base, engine, router)


EXECUTORS = ("local", "ray")


def _run_ray(table, cells, todo, spec, engine, jobs, address, finished) -> None:
    """Each cell of ``todo`` as a Ray task (the table shared through the object store);
    ``finished`` writes each cell's file here as it arrives, as the local path does."""
    from kvsim.analysis.sweep import run_on_ray

    def submit(ray):
        task = ray.remote(_ray_cell)
        table_ref = ray.put(table)
        return [task.remote(table_ref, cells[i], spec.base, engine, spec.router, i)
                for i in todo]

    run_on_ray(submit, jobs, address, finished)


def _ray_cell(table, cell: PlanCell, base: SimConfig, engine, router: str, i: int
              ) -> tuple[int, dict]:
    return i, run_cell(table, cell, base, engine, router)


def _read(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    row = data.get("row") if isinstance(data, dict) else None
    return row if isinstance(row, dict) else None


def _write(path: Path, key: str, row: dict) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps({"key": key, "row_format": PLAN_ROW_FORMAT, "row": row},
                                  sort_keys=True) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------------------
# The front and the answer
# ----------------------------------------------------------------------------------------

def pareto_front(df: pd.DataFrame, cost: str, metric: str, lower_is_better: bool = True
                 ) -> pd.DataFrame:
    """The rows of ``df`` no other row dominates (cost no higher and metric no worse, one
    of them strictly better), sorted by cost (then metric); rows with a NaN metric are
    left out.  Of rows equal in both, the first (``df``'s order) is kept."""
    d = df[np.isfinite(df[metric].to_numpy(np.float64))]
    sign = 1.0 if lower_is_better else -1.0
    order = sorted(range(len(d)), key=lambda i: (float(d[cost].iat[i]),
                                                 sign * float(d[metric].iat[i]), i))
    keep = []
    best = np.inf
    for i in order:
        m = sign * float(d[metric].iat[i])
        if m < best:
            keep.append(i)
            best = m
    return d.iloc[keep]


@dataclass
class PlanResult:
    """What :func:`run_plan` did.  ``table``: one row per cell, grid order; ``front``: the
    Pareto front; ``best``: the cheapest row meeting the SLO (None: no cell does)."""

    table: pd.DataFrame
    front: pd.DataFrame
    best: dict | None
    summary: dict
    out_dir: Path
    cells: int
    computed: int
    cached: int
    pruned: int


def _json_safe(v):
    if isinstance(v, float) and not np.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return _json_safe(float(v))
    return v


def run_plan(table, spec: PlanSpec, out_dir: str | Path, *, jobs: int = 1,
             force: bool = False, on_cell: Callable[[int, int, PlanCell, bool], None]
             | None = None, executor: str = "local",
             ray_address: str | None = None) -> PlanResult:
    """Search ``spec``'s grid for ``table`` (a :class:`kvsim.ingest.requests.RequestTable`);
    cells cached in ``out_dir/cells``; writes ``plan.parquet`` (every cell) and
    ``plan.json`` (the SLO, the answer, the front, the prices' sources).  ``executor``:
    ``local`` (``jobs`` processes) or ``ray`` (each cell a Ray task; ``ray_address`` None
    starts a local Ray instance with ``jobs`` CPUs): the same cells, written by this
    process as each finishes, so the results and the resumability are the same."""
    from kvsim.analysis.sweep import _remove_if_no_cell, code_fingerprint, require_ray
    from kvsim.modes.closed.closed_loop import EngineOptions, prepare
    from kvsim.modes.closed.cluster import ROUTERS
    from kvsim.policy.registry import resolve_policy

    if spec.router not in ROUTERS:
        raise bad_value(None, None, "--router", " | ".join(ROUTERS), spec.router)
    if jobs < 1:
        raise bad_value(None, None, "--jobs", "an integer >= 1", jobs)
    if executor not in EXECUTORS:
        raise bad_value(None, None, "--executor", " | ".join(EXECUTORS), executor)
    if executor == "ray":
        require_ray()  # before any work: a missing extra is one line, nothing written
    for p in spec.policies:
        resolve_policy(p)
    engine = spec.engine or EngineOptions()
    if engine.hybrid_pool == "auto":  # a plan searches tiers and replicas: every layer alike
        engine = dataclasses.replace(engine, hybrid_pool="off")
    cells = spec.cells()
    for c in cells:  # every price exists before any work
        c.usd_per_hour(spec.prices)
    table = _with_deadlines(table, spec.slo)
    if spec.slo.metric == "goodput":
        df = table.df
        if not ((df["ttft_deadline_us"] >= 0) | (df["tpot_deadline_us"] >= 0)).any():
            raise KvsimInputError("expected request deadlines for a goodput SLO: the trace "
                                  "carries none; give --ttft-deadline / --tpot-deadline",
                                  None, None, "--slo")
    out_dir = Path(out_dir)
    created = not out_dir.exists()
    claim_output_dir(out_dir, PLAN_MARKER, "kvsim plan folder", force, legacy="cells")
    try:
        hbm_blocks = {}
        block_bytes = {}
        for hw in spec.hardware:
            cfg = dataclasses.replace(spec.base, hardware=hw, dram_gb=0.0, cxl_gb=0.0,
                                      nvme_gb=0.0, hbm_gb=None, hbm_blocks=None)
            _cost, hb, _costs, bb, *_ = prepare(table, cfg, engine)
            hbm_blocks[hw], block_bytes[hw] = int(hb), int(bb)
        from kvsim.engine.cost_model import GB

        def capacity(c: PlanCell) -> int:
            bb = block_bytes[c.hardware]
            return hbm_blocks[c.hardware] + sum(int(g * GB) // bb
                                                for g in (c.dram_gb, c.cxl_gb, c.nvme_gb))

        sat = saturation_blocks(table, engine.block_size_tokens)
        pruned = _prune(cells, spec, sat, capacity) if spec.prune else {}
        tsha = table_sha256(table)
        fp = hashlib.sha256((code_fingerprint() + inspect.getsource(run_cell)
                             + repr(CELL_KEYS)).encode()).hexdigest()
        keys = [cell_key(tsha, c, spec, engine, fp) for c in cells]
        paths = [out_dir / "cells" / f"{k}.json" for k in keys]
        rows: list[dict | None] = [None if i in pruned else _read(p) for i, p in enumerate(paths)]
        todo = [i for i, r in enumerate(rows) if r is None and i not in pruned]
        cached = sum(1 for i, r in enumerate(rows) if r is not None)
        done = 0
        for i, r in enumerate(rows):
            if r is not None:
                done += 1
                if on_cell:
                    on_cell(done, len(cells) - len(pruned), cells[i], True)

        def finished(i: int, row: dict) -> None:
            nonlocal done
            _write(paths[i], keys[i], row)
            rows[i] = row
            done += 1
            if on_cell:
                on_cell(done, len(cells) - len(pruned), cells[i], False)

        if executor == "ray" and todo:
            _run_ray(table, cells, todo, spec, engine, jobs, ray_address, finished)
        elif jobs == 1 or len(todo) <= 1:
            for i in todo:
                finished(i, run_cell(table, cells[i], spec.base, engine, spec.router))
        else:
            from concurrent.futures import as_completed

            from kvsim.core.workers import process_pool

            _WORKER["args"] = (table, cells, spec.base, engine, spec.router)
            try:
                with process_pool(min(jobs, len(todo))) as ex:
                    futs = [ex.submit(_pool_cell, i) for i in todo]
                    for f in as_completed(futs):
                        finished(*f.result())
            finally:
                _WORKER.clear()
        df = build_rows(cells, keys, rows, pruned, spec, capacity, hbm_blocks)
        front = pareto_front(df[df["status"] == "replayed"], "usd_per_hour", "slo_value",
                             spec.slo.lower_is_better)
        ok = df[df["meets_slo"]]
        best = None
        if len(ok):
            i = min(range(len(ok)), key=lambda j: (float(ok["usd_per_hour"].iat[j]), j))
            best = _json_safe(ok.iloc[i].to_dict())
        summary = _json_safe(summary_dict(spec, df, front, best, sat, tsha, engine))
        with atomic_output(out_dir / "plan.parquet") as tmp:
            df.to_parquet(tmp, index=False)
        with atomic_output(out_dir / "plan.json") as tmp:
            tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return PlanResult(df, front, best, summary, out_dir, len(cells), len(todo), cached,
                          len(pruned))
    except BaseException:  # a bad cell, Ctrl-C before any cell: no folder left behind
        if created:
            _remove_if_no_cell(out_dir, PLAN_MARKER)
        raise
