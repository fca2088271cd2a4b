"""The compare/simulate table (kvsim.cli.render): fits 120 columns, groups identical
policies, names the best online policy and its margins, keeps every metric in the files."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app, render
from kvsim.core.errors import KvsimInputError
from tests.sim.test_cli import _trace

runner = CliRunner()


def _row(policy, hbm, dc, offline=False, **kw):
    row = {"policy": policy, "offline": offline, "hbm_hit_rate": hbm, "block_hit_rate": 0.5,
           "dram_hit_rate": 0.1, "cxl_hit_rate": 0.02, "nvme_hit_rate": 0.0,
           "ttft_p50_us": 1500.0, "ttft_p99_us": 25000.0, "tpot_p99_us": 7430.0,
           "decode_critical_misses": dc, "deadline_misses": 3, "prefetches": 652,
           "prefetches_useful": 627, "prefetches_wasted": 0}
    row.update(kw)
    return row


def _frame():
    return pd.DataFrame([
        _row("arc", 0.40, 100), _row("deadline", 0.50, 40), _row("fifo", 0.40, 100),
        _row("intent", 0.50, 40), _row("lru", 0.45, 80), _row("belady", 0.52, 30, True)])


def _text(df, **kw):
    cols = render.parse_columns(kw.pop("columns", None), kw.pop("wide", False))
    table = render.metric_table(df, "t", cols, **kw)
    from rich.console import Console

    c = Console(width=120, record=True, file=open("/dev/null", "w"))
    c.print(table)
    return c.export_text()


def test_identical_policies_are_one_row_and_bound_last():
    groups = render.group_identical(_frame())
    assert [g[0] for g in groups] == [["arc", "fifo"], ["deadline", "intent"], ["lru"],
                                      ["belady"]]
    text = _text(_frame())
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines[-1].split()[:2] == ["belady", "(bound)"]
    assert "arc, fifo" in text and "deadline, intent" in text
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 120


def test_verdict_names_best_online_with_margins_over_lru_and_to_bound():
    assert render.verdict(_frame()) == (
        "best online: deadline (= intent): HBM hit 50.00% (+5.00 pp vs lru, -2.00 pp vs "
        "belady (bound)), decode-crit misses 40 (lru 80, -50%)")
    one = pd.DataFrame([_row("lru", 0.4, 1), _row("fifo", 0.4, 1)])
    assert render.verdict(one) == "all 2 online policies give identical results: HBM hit " \
        "40.00%"


def test_gap_column_follows_the_offline_flag_not_the_name():
    df = _frame()
    df.loc[df.policy == "belady", "policy"] = "optimal"
    derived = render.with_derived(df).set_index("policy")["gap_to_bound"]
    assert derived["lru"] == pytest.approx(0.07) and derived["optimal"] == 0.0
    assert "gap to" in _text(df) and "optimal" in _text(df)
    # two bounds: the tighter one (higher HBM hit) is the reference
    df2 = pd.concat([df, pd.DataFrame([_row("belady", 0.51, 35, True)])])
    assert render.bound_row(df2)["policy"] == "optimal"


def test_prefetch_counts_add_up():
    text = _text(_frame(), columns="prefetch_detail")
    assert "652 (627/25/0)" in text  # full / partial / wasted: 627 + 25 + 0 = 652


def test_sort_columns_and_errors():
    text = _text(_frame(), columns="decode_critical_misses", sort="decode_critical_misses")
    order = [ln.split()[0].rstrip(",") for ln in text.splitlines()
             if ln.strip() and ln.split()[0].rstrip(",") in ("arc", "deadline", "lru")]
    assert order == ["deadline", "lru", "arc"]
    with pytest.raises(KvsimInputError, match="unknown column 'nope'"):
        render.parse_columns("hbm_hit_rate,nope", False)
    assert [c.key for c in render.parse_columns("+evictions", False)][-1] == "evictions"
    assert len(render.parse_columns(None, True)) == len(render.COLUMNS)


def test_compare_cli_fits_120_columns_and_files_keep_every_metric(builder, tiny_hw,
                                                                   tmp_path, monkeypatch):
    trace = _trace(builder, tmp_path / "t.parquet")
    monkeypatch.setenv("COLUMNS", "120")
    pq = tmp_path / "rows.parquet"
    args = ["compare", "--trace", str(trace), "--hardware", tiny_hw, "--hbm-blocks", "4",
            "--engine", "interpreted"]
    res = runner.invoke(app, args + ["--parquet", str(pq)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 120, "\n".join(lines)
    assert any(ln.startswith("best online:") or ln.startswith("all ") for ln in lines)
    assert "(bound)" in res.stdout
    df = pd.read_parquet(pq)
    assert {"p999_step_us", "bytes_nvme_link", "peak_cxl_blocks", "prefetches_wasted",
            "gap_hbm_hit_rate_to_belady"} <= set(df.columns)
    doc = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert set(doc["policies"][0]) == set(df.columns)
    wide = runner.invoke(app, args + ["--wide"])
    assert wide.exit_code == 0 and "peak HBM/DRAM/" in wide.stdout
    bad = runner.invoke(app, args + ["--sort", "nope"])
    assert bad.exit_code == 2 and "--sort" in bad.stderr


def test_progress_has_a_real_total_and_is_silent_under_json_to_a_pipe(monkeypatch):
    from kvsim.cli import common
    from kvsim.cli.simulate_opts import policies_to_run as _policies_to_run
    from kvsim.modes.comparison import default_policies
    from kvsim.spec.sim_config import SimConfig

    engine, cache = SimConfig(), SimConfig(mode="cache")
    # compare adds the offline references it measures gaps to: optimal always, belady in
    # engine mode (kvsim.modes.comparison)
    assert _policies_to_run(["lru", "deadline"], engine) == ["lru", "deadline", "optimal",
                                                             "belady"]
    assert _policies_to_run(["belady", "lru"], engine) == ["belady", "lru", "optimal"]
    assert _policies_to_run(["lru"], cache) == ["lru", "optimal"]
    assert len(_policies_to_run(None, engine)) == len(default_policies()) + 1 + (
        "belady" not in default_policies())
    monkeypatch.setattr(common.sys.stdout, "isatty", lambda: False, raising=False)
    assert common.quiet_progress(True) and not common.quiet_progress(False)
    assert common.progress(quiet=True).disable
