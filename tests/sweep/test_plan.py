"""kvsim plan: a hand-computed cheapest configuration, Pareto front properties, the curve's
pruning threshold, resumability, the price table and the CLI's errors.

Every replay uses the interpreted engine (no compile) and the roofline step time on
hand-built Request tables (llama-3-8b on h100-sxm, 16-token blocks)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.analysis.plan import (
    PlanSpec,
    pareto_front,
    parse_slo,
    run_plan,
    saturation_blocks,
)
from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.engine.engine_model import build_cost_model
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.spec.prices import list_prices, load_prices, parse_prices
from kvsim.spec.sim_config import SimConfig

B = 16
P = 4096
BASE = SimConfig(engine="interpreted", model="llama-3-8b")
ENGINE = EngineOptions(timing="roofline", model="llama-3-8b")
COST = build_cost_model("llama-3-8b", "h100-sxm", block_size_tokens=B, timing="roofline")
PRICES = load_prices("cloud-list-2024")
H100 = 4.916  # profiles/prices/cloud-list-2024.toml [gpu.h100-sxm]
DRAM = 0.004237  # [tiers.dram]
#: two requests of P tokens (no content ids: nothing is ever shared) arriving together
#: with one output token each: one replica prefills both in one step of 2P tokens (the
#: token budget is 8192 = 2P), two replicas (round robin) one each, alone.
STEP_TWO = COST.step_us(2 * P, 2 * P * (P + 1) / 2.0, 2 * P)
STEP_ONE = COST.step_us(P, P * (P + 1) / 2.0, P)


def two_requests():
    return build_request_table({"arrival_us": [0, 0], "prompt_tokens": [P, P],
                                "output_tokens": [1, 1], "block_ids": [[], []]},
                               block_size_tokens=B)


def spec(replicas=(1, 2), dram=(0.0, 64.0), prune=True, slo=None):
    slo = slo or parse_slo(f"ttft_p99={(STEP_ONE + STEP_TWO) / 2:.3f}us")
    return PlanSpec(slo, PRICES, replicas=tuple(replicas), dram_gb=tuple(dram), base=BASE,
                    engine=ENGINE, prune=prune)


def test_cheapest_configuration_by_hand(tmp_path):
    assert STEP_ONE < STEP_TWO
    res = run_plan(two_requests(), spec(prune=False), tmp_path / "p")
    t = res.table
    assert list(zip(t["replicas"], t["dram_gb"])) == [(1, 0.0), (1, 64.0), (2, 0.0), (2, 64.0)]
    np.testing.assert_allclose(t["usd_per_hour"], [H100, H100 + 64 * DRAM, 2 * H100,
                                                   2 * (H100 + 64 * DRAM)], rtol=0, atol=1e-12)
    # TTFT p99: both requests in one 2P step on one replica, alone on two (DRAM unused)
    np.testing.assert_allclose(t["ttft_p99_us"], [STEP_TWO, STEP_TWO, STEP_ONE, STEP_ONE],
                               rtol=0, atol=1e-6)
    assert t["meets_slo"].tolist() == [False, False, True, True]
    b = res.best
    assert (b["replicas"], b["dram_gb"], b["hardware"]) == (2, 0.0, "h100-sxm")
    assert b["usd_per_hour"] == pytest.approx(2 * H100, abs=1e-12)
    # $ per million tokens: the cluster's price for the run's makespan over its tokens
    assert b["makespan_us"] == pytest.approx(STEP_ONE, abs=1e-6)
    assert b["tokens"] == 2 * (P + 1)
    want = 2 * H100 * STEP_ONE / 3.6e9 / (2 * (P + 1)) * 1e6
    assert b["usd_per_m_tokens"] == pytest.approx(want, rel=1e-12)
    # the front: the cheap slow cell and the dear fast one; DRAM cells are dominated
    f = res.front
    assert list(zip(f["replicas"], f["dram_gb"])) == [(1, 0.0), (2, 0.0)]
    data = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert data["best"]["replicas"] == 2 and len(data["front"]) == 2
    assert data["prices"]["gpu"]["h100-sxm"]["usd"] == H100
    assert "list prices" in data["prices"]["note"]


def test_no_cell_meets_the_slo(tmp_path):
    res = run_plan(two_requests(), spec(replicas=(1,), dram=(0.0,),
                                        slo=parse_slo("ttft_p99=1us")), tmp_path / "p")
    assert res.best is None and not res.table["meets_slo"].any()
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["best"] is None


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("lower", [True, False])
def test_pareto_front_properties(seed, lower):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    df = pd.DataFrame({"cost": rng.integers(0, 8, n).astype(float),
                       "m": rng.integers(0, 8, n).astype(float)})
    df.loc[rng.random(n) < 0.1, "m"] = np.nan  # failed cells are never on the front
    front = pareto_front(df, "cost", "m", lower)
    s = 1.0 if lower else -1.0
    pts = df.dropna()
    cost, m = front["cost"].to_numpy(), s * front["m"].to_numpy()
    # sorted by cost, each point strictly better in the metric than the one before
    assert (np.diff(cost) > 0).all() and (np.diff(m) < 0).all()
    for c, v in zip(cost, m):  # nothing dominates a front point
        dom = (pts["cost"] <= c) & (s * pts["m"] <= v) & ((pts["cost"] < c) | (s * pts["m"] < v))
        assert not dom.any()
    for c, v in zip(pts["cost"], s * pts["m"]):  # every point is matched or beaten
        assert ((cost <= c) & (m <= v)).any()
    assert len(front) == 0 or front.index[0] in pts.index


def test_saturation_blocks_exact():
    # 32-token prompts, 16-token blocks: a = [1, 2], b = a again, c = [3, 4]: the stream
    # of chain hashes h1 h12 h1 h12 h3 h34 has LRU distances 0 0 2 2 0 0; 4 distinct blocks
    t = build_request_table({"arrival_us": [0, 1, 2], "prompt_tokens": [32, 32, 32],
                             "output_tokens": [1, 1, 1],
                             "block_ids": [[1, 2], [1, 2], [3, 4]],
                             "hashed_tokens": [32, 32, 32]}, block_size_tokens=B)
    assert saturation_blocks(t, B) == {"lru": 2, "any": 4}


def test_pruned_cells_are_listed_not_replayed(tmp_path):
    # no content ids: the curve's saturation is 0 blocks, so every DRAM size is at least
    # it and only the cheapest (DRAM 0) of each replica count is replayed
    res = run_plan(two_requests(), spec(), tmp_path / "p")
    t = res.table
    assert t["status"].tolist() == ["replayed", "pruned", "replayed", "pruned"]
    assert res.pruned == 2 and res.computed == 2
    assert t.loc[t["status"] == "pruned", "ttft_p99_us"].isna().all()
    assert t["pruned_by"].iloc[1].startswith("curve: ")
    assert (res.best["replicas"], res.best["dram_gb"]) == (2, 0.0)


def test_resumable_and_byte_identical(tmp_path):
    out = tmp_path / "p"
    first = run_plan(two_requests(), spec(prune=False), out)
    assert (first.computed, first.cached) == (4, 0)
    files = {n: (out / n).read_bytes() for n in ("plan.parquet", "plan.json")}
    again = run_plan(two_requests(), spec(prune=False), out)
    assert (again.computed, again.cached) == (0, 4)
    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 4
    cells[0].unlink()  # a plan killed before that cell finished
    resumed = run_plan(two_requests(), spec(prune=False), out)
    assert (resumed.computed, resumed.cached) == (1, 3)
    for n, data in files.items():
        assert (out / n).read_bytes() == data
    grown = run_plan(two_requests(), spec(replicas=(1, 2, 3), prune=False), out)
    assert (grown.computed, grown.cached) == (2, 4)  # only the new replica count


def test_slo_parsing_and_errors():
    assert parse_slo("ttft_p99=2s").target == 2e6
    assert parse_slo("tpot_p99=50ms").target == 5e4
    s = parse_slo("goodput=0.95")
    assert s.met(0.95) and not s.met(0.9) and not s.lower_is_better
    for bad in ("ttft_p99=2", "p50=1s", "goodput=1.5", "goodput=0.9s", "ttft_p99", "x"):
        with pytest.raises(KvsimInputError):
            parse_slo(bad)


def test_goodput_needs_deadlines(tmp_path):
    with pytest.raises(KvsimInputError, match="deadlines"):
        run_plan(two_requests(), spec(slo=parse_slo("goodput=0.9")), tmp_path / "p")
    res = run_plan(two_requests(), spec(dram=(0.0,), slo=parse_slo(
        "goodput=0.9", ttft_us=int((STEP_ONE + STEP_TWO) / 2))), tmp_path / "q")
    assert res.table["slo_value"].tolist() == [0.0, 1.0]  # both late on one replica
    assert res.best["replicas"] == 2


def test_bundled_prices_are_sourced_and_dated():
    assert "cloud-list-2024" in list_prices()
    for name in list_prices():
        p = load_prices(name)
        for price in list(p.gpu.values()) + list(p.tiers.values()):
            assert price.source and price.date and price.usd >= 0
    with pytest.raises(KvsimInputError, match="b200"):
        PRICES.gpu_usd_per_hour("b200")
    with pytest.raises(KvsimInputError, match="source"):
        parse_prices('name = "x"\n[gpu.h100-sxm]\nusd_per_gpu_hour = 1.0\ndate = "2024"\n')
    with pytest.raises(KvsimInputError, match="usd_per_gpu_hour"):
        parse_prices('name = "x"\n[gpu.h100-sxm]\nusd_per_gpu_hour = -1\nsource = "s"\n'
                      'date = "d"\n')


def test_cli_errors_are_one_line_exit_2(tmp_path):
    runner = CliRunner()
    prof = ["--profile", "balanced", "--requests", "4", "--engine", "interpreted"]
    cases = [["plan", *prof, "--slo", "ttft_p99=2", "--out", str(tmp_path / "a")],
             ["plan", *prof, "--slo", "ttft_p99=2s", "--hardware", "b200",
              "--out", str(tmp_path / "b")],
             ["plan", *prof, "--slo", "ttft_p99=2s", "--replicas", "1,x",
              "--out", str(tmp_path / "c")],
             ["plan", "--slo", "ttft_p99=2s", "--out", str(tmp_path / "d")]]
    for args in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        err = res.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), (args, res.stderr)
        assert not (tmp_path / args[-1]).exists() or not any((tmp_path / args[-1]).iterdir())


def test_process_pool_gives_identical_outputs(tmp_path):
    one = run_plan(two_requests(), spec(prune=False), tmp_path / "a", jobs=1)
    two = run_plan(two_requests(), spec(prune=False), tmp_path / "b", jobs=2)
    assert (one.computed, two.computed) == (4, 4)
    for n in ("plan.parquet", "plan.json"):
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()


def test_executor_ray_without_ray_is_one_line(tmp_path, monkeypatch):
    """Whether or not ray is installed here: with ``import ray`` failing, ``--executor ray``
    is one line naming the option (exit 2) and nothing is written."""
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    out = tmp_path / "r"
    with pytest.raises(KvsimInputError, match="--executor ray needs the optional extra"):
        run_plan(two_requests(), spec(prune=False), out, executor="ray")
    assert not out.exists()
    res = CliRunner().invoke(app, ["plan", "--profile", "balanced", "--requests", "4",
                                   "--engine", "interpreted", "--slo", "ttft_p99=2s",
                                   "--executor", "ray", "--out", str(out)])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "--executor" in err[0], err
    assert not out.exists()
    with pytest.raises(KvsimInputError, match="--executor"):
        run_plan(two_requests(), spec(prune=False), out, executor="dask")


def test_ray_executor_gives_identical_outputs_and_resumes(tmp_path):
    ray = pytest.importorskip("ray", reason="--executor ray needs the optional extra "
                              "(pip install 'kvsim[ray]')")
    one = run_plan(two_requests(), spec(prune=False), tmp_path / "a")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # one instance for
    try:  # both plans (run_plan leaves an instance it did not start running)
        ray_ = run_plan(two_requests(), spec(prune=False), tmp_path / "b", jobs=2,
                        executor="ray")
        assert (one.computed, ray_.computed) == (4, 4)
        for n in ("plan.parquet", "plan.json"):
            assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()
        sorted((tmp_path / "b" / "cells").glob("*.json"))[0].unlink()  # killed mid-plan
        again = run_plan(two_requests(), spec(prune=False), tmp_path / "b", jobs=2,
                         executor="ray")
        assert (again.computed, again.cached) == (1, 3)
        for n in ("plan.parquet", "plan.json"):
            assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()
        assert ray.is_initialized()
    finally:
        ray.shutdown()


def test_a_plan_that_fails_before_any_cell_leaves_no_folder(tmp_path, monkeypatch) -> None:
    """As a sweep (issue 38): a plan stopped before any cell finished (an error, Ctrl-C,
    SIGTERM) removes the --out folder it created (main: left holding its .kvsim-plan
    marker)."""
    from pathlib import Path

    import kvsim.analysis.plan as plan_mod

    def boom(*args, **kwargs):
        raise KvsimInputError("a cell failed", None, None, "--replicas")

    monkeypatch.setattr(plan_mod, "run_cell", boom)
    trace = Path(__file__).resolve().parents[2] / "traces" / "sample_mooncake.jsonl"
    out = tmp_path / "pl"
    result = CliRunner().invoke(app, ["plan", "--slo", "ttft_p99=2s", "--request-trace",
                                      str(trace), "--replicas", "1", "--jobs", "1",
                                      "--out", str(out)])
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert "a cell failed" in result.stderr
    assert not out.exists(), sorted(p.name for p in out.iterdir())
