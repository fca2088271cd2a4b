"""The rows of ``kvsim plan``'s table (one per cell) and its ``plan.json`` summary
(:mod:`kvsim.analysis.plan` runs the cells; this module only prices and arranges them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Summary keys a cell keeps (besides the cost columns it derives).
CELL_KEYS = ("ttft_p50_us", "ttft_p99_us", "tpot_p50_us", "tpot_p99_us", "e2e_p99_us",
             "slo_attainment", "hbm_hit_rate", "prefix_hit_rate", "throughput_tokens_per_s",
             "makespan_us", "requests", "dropped_requests", "preemptions", "evictions_hbm",
             "hbm_capacity_blocks", "dram_capacity_blocks", "cxl_capacity_blocks",
             "nvme_capacity_blocks")
#: Microseconds per hour.
US_PER_HOUR = 3.6e9
#: GPUs per replica: kvsim's step-time tables and roofline are tensor-parallel 1.
GPUS_PER_REPLICA = 1


def plan_columns() -> list[str]:
    """Columns of ``plan.parquet``, in order."""
    return (["cell", "hardware", "replicas", "policy", "dram_gb", "cxl_gb", "nvme_gb",
             "status", "pruned_by", "gpus", "usd_per_hour", "hbm_blocks_per_replica",
             "kv_blocks_per_replica"] + list(CELL_KEYS)
            + ["tokens", "output_tokens", "finished_requests", "usd_run", "usd_per_m_tokens",
               "usd_per_m_output_tokens", "slo_value", "meets_slo"])


def build_rows(cells, keys, rows, pruned, spec, capacity, hbm_blocks) -> pd.DataFrame:
    """One row per cell in grid order: coordinates, price, measured keys, dollars per
    million tokens (``usd_per_hour`` x makespan / tokens) and the SLO verdict.  Pruned
    cells keep their price and NaN measurements."""
    recs = []
    nan = float("nan")
    for i, (c, key, row) in enumerate(zip(cells, keys, rows)):
        per_hour = c.usd_per_hour(spec.prices)
        rec = {"cell": key, "hardware": c.hardware, "replicas": c.replicas,
               "policy": c.policy, "dram_gb": c.dram_gb, "cxl_gb": c.cxl_gb,
               "nvme_gb": c.nvme_gb, "status": "pruned" if i in pruned else "replayed",
               "pruned_by": pruned.get(i, ""), "gpus": c.replicas * GPUS_PER_REPLICA,
               "usd_per_hour": per_hour, "hbm_blocks_per_replica": hbm_blocks[c.hardware],
               "kv_blocks_per_replica": capacity(c)}
        row = row or {}
        for k in CELL_KEYS + ("tokens", "output_tokens", "finished_requests"):
            v = row.get(k)
            rec[k] = nan if v is None else float(v)
        run = per_hour * rec["makespan_us"] / US_PER_HOUR
        rec["usd_run"] = run
        rec["usd_per_m_tokens"] = run / rec["tokens"] * 1e6 if rec["tokens"] > 0 else nan
        rec["usd_per_m_output_tokens"] = (run / rec["output_tokens"] * 1e6
                                          if rec["output_tokens"] > 0 else nan)
        value = rec.get(spec.slo.key, nan)
        rec["slo_value"] = value
        # a cell that dropped requests (never admissible) serves less than the trace
        served_all = rec["dropped_requests"] == 0 if np.isfinite(rec["dropped_requests"]) \
            else False
        rec["meets_slo"] = bool(rec["status"] == "replayed" and served_all
                                and spec.slo.met(value))
        recs.append(rec)
    df = pd.DataFrame(recs, columns=plan_columns())
    for col in ("replicas", "gpus", "hbm_blocks_per_replica", "kv_blocks_per_replica"):
        df[col] = df[col].astype(np.int64)
    df["meets_slo"] = df["meets_slo"].astype(bool)
    return df


#: Columns of the front shown by the CLI and stored in plan.json.
FRONT_COLUMNS = ("hardware", "replicas", "policy", "dram_gb", "cxl_gb", "nvme_gb",
                 "usd_per_hour", "slo_value", "meets_slo", "usd_per_m_tokens",
                 "ttft_p99_us", "tpot_p99_us", "slo_attainment", "hbm_hit_rate",
                 "prefix_hit_rate")


def summary_dict(spec, df: pd.DataFrame, front: pd.DataFrame, best, sat, table_sha: str,
                 engine) -> dict:
    """``plan.json``: the SLO, the grid, the answer, the front and the prices used (with
    their sources), the curve's saturation sizes, cell counts."""
    import dataclasses

    from kvsim import __version__

    prices = spec.prices
    used_gpu = {hw: dataclasses.asdict(prices.gpu[hw]) for hw in spec.hardware}
    used_tiers = {t: dataclasses.asdict(p) for t, p in prices.tiers.items()
                  if any(v > 0 for v in getattr(spec, f"{t}_gb"))}
    return {
        "kvsim_version": __version__,
        "table_sha256": table_sha,
        "slo": {"metric": spec.slo.metric, "key": spec.slo.key, "target": spec.slo.target,
                "ttft_deadline_us": spec.slo.ttft_us, "tpot_deadline_us": spec.slo.tpot_us,
                "text": spec.slo.describe()},
        "grid": {"hardware": list(spec.hardware), "replicas": list(spec.replicas),
                 "policies": list(spec.policies), "dram_gb": list(spec.dram_gb),
                 "cxl_gb": list(spec.cxl_gb), "nvme_gb": list(spec.nvme_gb),
                 "router": spec.router, "prune": spec.prune,
                 "engine": engine.identity(), "model": spec.base.model},
        "prices": {"name": prices.name, "currency": prices.currency, "gpu": used_gpu,
                   "tiers": used_tiers,
                   "note": "public list prices at the dates given, not quotes"},
        "saturation_blocks": sat,
        "cells": int(len(df)), "replayed": int((df["status"] == "replayed").sum()),
        "pruned": int((df["status"] == "pruned").sum()),
        "meeting_slo": int(df["meets_slo"].sum()),
        "best": None if best is None else {k: best[k] for k in ("cell",) + FRONT_COLUMNS},
        "front": [{k: r[k] for k in FRONT_COLUMNS} for r in front.to_dict("records")],
    }
