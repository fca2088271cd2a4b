"""kvsim.sweep: grid, cache/resume, executors give identical results, results table."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from kvsim.errors import KvsimInputError
from kvsim.mrc import block_stream, hit_curve
from kvsim.sim.config import SimConfig
from kvsim.sim.replay import simulate
from kvsim.sweep import (LATENCY_QUANTILES, SweepSpec, cell_key, code_fingerprint,
                         results_columns, run_sweep)

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
    for name in ("results.parquet", "summary.json"):
        assert (tmp_path / name).read_bytes() == (small_sweep.out_dir / name).read_bytes()


def test_ray_executor_gives_identical_results(tmp_path, small_sweep):
    pytest.importorskip("ray", reason="the ray executor needs the optional extra "
                        "(pip install 'kvsim[ray]')")
    res = run_sweep(small_spec(), tmp_path, jobs=2, executor="ray")
    assert res.computed == 4
    assert (tmp_path / "results.parquet").read_bytes() == \
        (small_sweep.out_dir / "results.parquet").read_bytes()


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
