"""kvsim.analysis.sweep: grid, cache/resume, executors give identical results, results table."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kvsim.analysis.sweep import (
    LATENCY_QUANTILES,
    SweepSpec,
    cell_key,
    code_fingerprint,
    load_occupancy,
    occupancy_series,
    results_columns,
    run_sweep,
)
from kvsim.api import simulate
from kvsim.cachesim.curves import block_stream, hit_curve
from kvsim.core.errors import KvsimInputError
from kvsim.spec.sim_config import SimConfig

from .conftest import BASE, HBM_GB, SAMPLE, small_spec


def test_grid_rows_match_direct_simulate(small_sweep):
    t = small_sweep.table
    assert list(t.columns) == results_columns()
    # DRAM outer, HBM, then policy; belady added as the bound
    assert list(zip(t["hbm_gb"], t["policy"])) == [
        (h, p) for h in HBM_GB for p in ("lru", "belady")]
    assert small_sweep.computed == 4 and small_sweep.cached == 0
    assert t["hbm_capacity_blocks"].tolist() == [28, 28, 95, 95]
    # a cell is exactly one simulate() call with the capacity replaced
    ref = simulate(SAMPLE, "lru", replace(BASE, hbm_gb=0.06)).summary
    row = t[(t.policy == "lru") & (t.hbm_gb == 0.06)].iloc[0]
    for k in ("hbm_hit_rate", "p99_step_us", "bytes_moved", "evictions", "makespan_us"):
        assert row[k] == ref[k], k
    q = np.asarray(row["step_latency_q_us"])
    assert len(q) == len(LATENCY_QUANTILES) and np.all(np.diff(q) >= 0)
    assert q[LATENCY_QUANTILES.index(0.99)] == pytest.approx(ref["p99_step_us"])
    # gap to belady within each capacity group
    g = t[t.hbm_gb == 0.2]
    bel = float(g[g.policy == "belady"]["hbm_hit_rate"].iloc[0])
    assert np.allclose(g["gap_hbm_hit_rate_to_belady"], bel - g["hbm_hit_rate"])
    assert (g[g.policy == "belady"]["gap_hbm_hit_rate_to_belady"] == 0).all()


def test_outputs_written_and_summary(small_sweep):
    out = small_sweep.out_dir
    back = pd.read_parquet(out / "results.parquet")
    lists = ["step_latency_q_us", "ttft_q_us"]
    assert back.drop(columns=lists).equals(small_sweep.table.drop(columns=lists))
    for col in lists:
        for a, b in zip(back[col], small_sweep.table[col]):
            assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    s = json.loads((out / "summary.json").read_text())
    assert s["cells"] == 4 and s["policies"] == ["lru", "belady"]
    assert [g["hbm_capacity_blocks"] for g in s["by_capacity"]] == [28, 95]
    for g in s["by_capacity"]:
        assert g["best_hit_rate_policy"] == "lru"  # the bound is not a candidate
    assert len(list((out / "cells").glob("*.json"))) == 4
    # curves: the one-pass lru curve at the sweep's capacities equals simulate_cache
    curves = pd.read_parquet(out / "curves.parquet")
    keys = block_stream(SAMPLE)
    ref = hit_curve(keys, [28, 95])
    for pol in ("lru", "belady"):
        c = curves[(curves.policy == pol) & curves.capacity_blocks.isin([28, 95])]
        assert c["hits"].tolist() == ref[ref.policy == pol]["hits"].tolist()


def test_resume_recomputes_only_missing_cells_and_pool_is_identical(tmp_path, small_sweep):
    # a subset first (as after a kill), then the full grid on a 2-process pool: only the
    # missing cells are computed, and the bytes equal the fresh single-process run
    part = run_sweep(small_spec(hbm=(0.06,)), tmp_path, jobs=1)
    assert (part.computed, part.cached) == (2, 0)  # lru + belady at 0.06 GB
    full = run_sweep(small_spec(), tmp_path, jobs=2)
    assert (full.computed, full.cached) == (2, 2)
    again = run_sweep(small_spec(), tmp_path, jobs=2)
    assert (again.computed, again.cached) == (0, 4)
    for name in ("results.parquet", "summary.json", "occupancy.parquet"):
        assert (tmp_path / name).read_bytes() == (small_sweep.out_dir / name).read_bytes()


def test_ray_executor_gives_identical_results(tmp_path, small_sweep):
    pytest.importorskip("ray", reason="the ray executor needs the optional extra "
                        "(pip install 'kvsim[ray]')")
    res = run_sweep(small_spec(), tmp_path, jobs=2, executor="ray")
    assert res.computed == 4
    for name in ("results.parquet", "occupancy.parquet"):
        assert (tmp_path / name).read_bytes() == (small_sweep.out_dir / name).read_bytes()


def test_occupancy_series_is_max_over_windows():
    steps = pd.DataFrame({"step": np.arange(10, 15), "start_us": [0.0, 10, 20, 30, 40],
                          "latency_us": [5.0, 5, 5, 5, 7],
                          "hbm_used_blocks": [1, 4, 2, 0, 3],
                          "dram_used_blocks": [0, 0, 9, 9, 8]})
    # 5 steps in at most 2 points: windows of ceil(5 / 2) = 3 steps -> [10..12], [13..14]
    occ = occupancy_series(steps, max_points=2)
    assert occ["step_first"].tolist() == [10, 13] and occ["step_last"].tolist() == [12, 14]
    assert occ["start_us"].tolist() == [0.0, 30.0] and occ["end_us"].tolist() == [25.0, 47.0]
    assert occ["hbm_used_blocks"].tolist() == [4, 3]
    assert occ["dram_used_blocks"].tolist() == [9, 9]
    assert "hbm_cached_blocks" not in occ  # not in the steps table: not invented
    # few steps: one row per step, values unchanged
    one = occupancy_series(steps)
    assert one["hbm_used_blocks"].tolist() == [1, 4, 2, 0, 3]
    assert one["step_first"].tolist() == one["step_last"].tolist() == list(range(10, 15))
    assert len(occupancy_series(steps.iloc[:0])) == 0
    # at most max_points rows for any length
    big = pd.DataFrame({"step": np.arange(4001), "start_us": np.arange(4001.0),
                        "latency_us": np.ones(4001), "hbm_used_blocks": np.arange(4001)})
    occ = occupancy_series(big)
    assert len(occ) == 1334  # windows of ceil(4001 / 2000) = 3 steps
    assert occ["hbm_used_blocks"].iloc[-1] == 4000 and occ["hbm_used_blocks"].iloc[0] == 2


def test_occupancy_table_matches_each_cell_replay(small_sweep):
    occ = load_occupancy(small_sweep.out_dir)
    assert small_sweep.occupancy_path == small_sweep.out_dir / "occupancy.parquet"
    t = small_sweep.table
    assert occ["cell"].unique().tolist() == t["cell"].tolist()  # grid order
    res = simulate(SAMPLE, "lru", replace(BASE, hbm_gb=0.06))
    key = t[(t.policy == "lru") & (t.hbm_gb == 0.06)]["cell"].iloc[0]
    mine = occ[occ["cell"] == key].drop(columns=["cell", "policy", "hbm_gb", "dram_gb",
                                                  "point"]).reset_index(drop=True)
    assert mine.equals(occupancy_series(res.steps))
    assert len(mine) == min(len(res.steps), 2000)
    for tier in ("hbm", "dram", "cxl", "nvme"):
        g = occ.merge(t[["cell", f"{tier}_capacity_blocks", f"peak_{tier}_blocks"]], on="cell")
        assert (g[f"{tier}_used_blocks"] <= g[f"{tier}_capacity_blocks"]).all()
        assert (g[f"{tier}_used_blocks"] <= g[f"peak_{tier}_blocks"]).all()
    assert occ["dram_used_blocks"].max() > 0  # the small HBM spilled to DRAM
    # each cell's cache holds its series beside its JSON
    assert len(list((small_sweep.out_dir / "cells").glob("*.occupancy.parquet"))) == 4


def test_cell_without_occupancy_file_is_recomputed(tmp_path):
    first = run_sweep(small_spec(policies=("lru",), hbm=(0.06,)), tmp_path, jobs=1)
    assert first.computed == 2
    victim = next((tmp_path / "cells").glob("*.occupancy.parquet"))
    victim.unlink()  # as if killed between the two files of a cell
    again = run_sweep(small_spec(policies=("lru",), hbm=(0.06,)), tmp_path, jobs=1)
    assert (again.computed, again.cached) == (1, 1)
    assert victim.is_file()


def test_cell_key_depends_on_trace_policy_config_code():
    fp = code_fingerprint()
    assert fp == code_fingerprint()
    base = cell_key("t", "lru", SimConfig(hbm_gb=1.0), fp)
    assert base == cell_key("t", "lru", SimConfig(hbm_gb=1.0, batch_rows=7), fp)
    others = {cell_key("u", "lru", SimConfig(hbm_gb=1.0), fp),
              cell_key("t", "fifo", SimConfig(hbm_gb=1.0), fp),
              cell_key("t", "lru", SimConfig(hbm_gb=2.0), fp),
              cell_key("t", "lru", SimConfig(hbm_gb=1.0, dram_gb=0.0), fp),
              cell_key("t", "lru", SimConfig(hbm_gb=1.0), "other-code")}
    assert base not in others and len(others) == 5


def test_bad_input(tmp_path):
    with pytest.raises(KvsimInputError, match="nosuchpolicy"):
        run_sweep(small_spec(policies=("nosuchpolicy",)), tmp_path)
    with pytest.raises(KvsimInputError, match="hbm_gb"):
        SweepSpec(str(SAMPLE), ("lru",), (0.0,))
    with pytest.raises(KvsimInputError, match="executor"):
        run_sweep(small_spec(), tmp_path, executor="slurm")
    with pytest.raises(KvsimInputError, match="trace"):
        run_sweep(SweepSpec(str(tmp_path / "missing.parquet"), ("lru",), (1.0,)), tmp_path)
    assert not (tmp_path / "results.parquet").exists()
