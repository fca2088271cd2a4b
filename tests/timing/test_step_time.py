"""The compiled step duration (kvsim/engine/timing/step_time.py) the scheduler calls:
``measured`` equals MeasuredStepTime.step_ms on random steps, ``roofline`` equals the
StepCostModel formula, and ``--timing`` resolves as documented."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.engine.engine_model import build_cost_model
from kvsim.engine.timing import step_time as T
from kvsim.engine.timing.measured import MeasuredStepTime, available
from kvsim.engine.timing.select import SAME_ARCHITECTURE, resolve_timing

REL = 1e-9


def _fp(gpu="h100-sxm", model="llama-3.1-8b", timing="measured"):
    return build_cost_model(model, gpu, timing=timing).as_array()


def _steps(rng, n):
    """Random steps: 0-6 prefill chunks (1-40k tokens after 0-130k cached, some below the
    tables' first point), 0-300 decodes at 1-140k context, every kind (prefill-only,
    decode-only, mixed, a lone chunk)."""
    for _ in range(n):
        nch = int(rng.choice([0, 0, 1, 1, 2, 3, 6]))
        chunks = [(int(rng.choice([1, 7, 16, 100, 513, 2048, 8192, 40000])
                       * rng.uniform(0.5, 1.5)) + 1,
                   int(rng.choice([0, 0, 100, 3000, 30000, 130000]) * rng.uniform(0.5, 1.5)))
                  for _ in range(nch)]
        nd = int(rng.choice([0, 1, 3, 16, 64, 300])) if nch else int(rng.choice([1, 5, 64, 300]))
        ctx = rng.integers(1, int(rng.choice([20, 2000, 140000])), size=nd)
        yield chunks, ctx


@pytest.mark.parametrize("gpu,model,tp", [k for k in available() if k[2] == 1])
def test_compiled_measured_equals_step_ms(gpu, model, tp):
    m = MeasuredStepTime.bundled(gpu, model, tp)
    fp = _fp(gpu, model)
    rng = np.random.default_rng(hash((gpu, model)) % 2**32)
    worst = 0.0
    for chunks, ctx in _steps(rng, 300):
        want = 1000.0 * m.step_ms(chunks, [int(x) for x in ctx])
        c = np.array([x for x, _ in chunks], dtype=np.int64)
        p = np.array([y for _, y in chunks], dtype=np.int64)
        got = T.one_step_us(fp, c, p, np.ones(len(ctx), dtype=np.int64), ctx.astype(np.int64))
        assert want > 0
        worst = max(worst, abs(got / want - 1.0))
    assert worst <= REL


def test_compiled_roofline_equals_the_formula():
    cost = build_cost_model("llama-3-8b", "h100-sxm", timing="roofline")
    fp = cost.as_array()
    assert fp[T.Q_KIND] == T.KIND_ROOFLINE and len(fp) == T.T0
    rng = np.random.default_rng(1)
    for chunks, ctx in _steps(rng, 100):
        t = np.ones(len(ctx), dtype=np.int64)
        c = np.array([x for x, _ in chunks], dtype=np.int64)
        p = np.array([y for _, y in chunks], dtype=np.int64)
        tokens = float(c.sum() + t.sum())
        attended = float(sum(x * y + x * (x + 1) / 2 for x, y in chunks)
                         + sum(2 * L / 2 for L in ctx))
        kv = float(p.sum() + c.sum() + ctx.sum())
        want = cost.step_us(tokens, attended, kv)
        got = T.one_step_us(fp, c, p, t, ctx.astype(np.int64))
        assert math.isclose(got, want, rel_tol=1e-12)


def test_prefill_cost_roofline_unchanged_and_measured_marginal():
    """A block's recompute cost: the roofline's prefill compute (StepCostModel.prefill_us)
    or, measured, the non-attention table's compute-bound slope per token plus the chunk's
    marginal attention g."""
    roof = build_cost_model("llama-3-8b", "h100-sxm", timing="roofline")
    meas = build_cost_model("llama-3-8b", "h100-sxm", timing="measured")
    m = MeasuredStepTime.bundled("h100-sxm", "llama-3.1-8b", 1)
    xs, ys = m._prefill_nonattn_ms.xs, m._prefill_nonattn_ms.ys
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    assert 0.019 < slope < 0.022  # ms per token: ~20 us, compute-bound GEMMs of 8B on H100
    fr, fm = roof.as_array(), meas.as_array()
    for start, n in ((0, 16), (4096, 16), (0, 1), (100_000, 512), (7, 3)):
        assert T.prefill_cost_us(fr, start, n) == roof.prefill_us(start, n)
        want = 1000 * (slope * n + m._prefill_attn_marginal_ms(max(n, 1), start))
        assert math.isclose(T.prefill_cost_us(fm, start, n), want, rel_tol=1e-12)
    assert T.prefill_cost_us(fm, 0, 0) == 0.0


@pytest.mark.parametrize("model", ["llama-3-8b", "llama-3.1-8b"])
def test_reference_points_on_the_default_timing(model):
    """Issue #39's points (AIConfigurator 0.12.0, h100-sxm, Llama-3.1-8B TP 1) on kvsim's
    default path (--timing auto): llama-3.1-8b, and the catalog's default model llama-3-8b
    (same architecture, same profile)."""
    cost = build_cost_model(model, "h100-sxm")
    assert cost.timing_model == "measured:aiconfigurator-0.12.0/vllm-0.24.0"
    assert cost.timing.profile == "h100-sxm__llama-3.1-8b__tp1"
    fp = cost.as_array()
    one = np.ones(1, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)

    def prefill_ms(n):
        return T.one_step_us(fp, n * one, 0 * one, none, none) / 1000

    def decode_ms(b, ctx):  # one decode step of b sequences at ctx
        return T.one_step_us(fp, none, none, np.ones(b, np.int64),
                             np.full(b, ctx, np.int64)) / 1000

    def tpot_ms(b, isl, osl=1000):  # AIConfigurator's TPOT: mean step over the decode
        return sum(decode_ms(b, isl + k) for k in range(1, osl)) / (osl - 1)

    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "timing" / "cells.py"
    spec = importlib.util.spec_from_file_location("kvsim_bench_timing_cells_st", path)
    cells = importlib.util.module_from_spec(spec)
    import sys
    sys.modules[spec.name] = cells  # dataclasses look their module up by name
    spec.loader.exec_module(cells)
    for kind, b, s, ref in cells.REFERENCE:  # the points: TTFT and TPOT, ms
        got = prefill_ms(s) if kind == "ttft" else tpot_ms(b, s, cells.TPOT_OSL)
        assert abs(got / ref - 1) <= 0.10, (kind, b, s, got, ref)


def test_timing_selection():
    assert resolve_timing("roofline", "llama-3-8b", "h100-sxm").name == "roofline"
    assert resolve_timing("auto", "gpt2", "h100-sxm").name == "roofline"  # no data: roofline
    assert resolve_timing("auto", "llama-3.1-8b", "l40s").name == "roofline"
    assert resolve_timing(None, "qwen3-30b-a3b", "b200").profile == "b200__qwen3-30b-a3b__tp1"
    with pytest.raises(KvsimInputError, match="no measured step-time data for model 'gpt2'"):
        resolve_timing("measured", "gpt2", "h100-sxm")
    with pytest.raises(KvsimInputError, match="expected auto | roofline"):
        resolve_timing("fast", "gpt2", "h100-sxm")
    p = "profiles/timing/h200__llama-3.1-70b__tp4.toml"
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    t = resolve_timing(str(root / p), "gpt2", "h100-sxm")
    assert t.profile == "h200__llama-3.1-70b__tp4" and t.kind == "measured"


def test_bad_timing_profile_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema = 'nope'\n")
    with pytest.raises(KvsimInputError, match="not a timing profile"):
        resolve_timing(str(bad), "gpt2", "h100-sxm")


def test_same_architecture_aliases_have_the_same_shapes():
    from kvsim.spec.kvsize import load_model

    keys = ("num_layers", "hidden_size", "num_params", "num_active_params")
    for a, b in SAME_ARCHITECTURE.items():
        ma, mb = load_model(a), load_model(b)
        assert [getattr(ma, k) for k in keys] == [getattr(mb, k) for k in keys], (a, b)
        ca = tomllib_config(a)
        cb = tomllib_config(b)
        for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "hidden_size", "intermediate_size", "vocab_size", "model_type"):
            assert ca[k] == cb[k], (a, b, k)


def tomllib_config(name):
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cat = tomllib.loads((root / "kvsim" / "spec" / "models" / "catalog.toml").read_text())
    return cat[name]["config"]


def test_cli_generate_names_the_timing_model_and_refuses_bad_ones(tmp_path):
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.events import read_events

    runner = CliRunner()
    base = ["generate", "--profile", "deadline_pressure", "--requests", "4", "--json"]
    r = runner.invoke(app, base + ["--out", str(tmp_path / "a.parquet")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["timing_model"] == "measured:aiconfigurator-0.12.0/vllm-0.24.0"
    assert doc["timing_profile"] == "h100-sxm__llama-3.1-8b__tp1"
    header, _ = read_events(tmp_path / "a.parquet")
    assert header.source["engine"]["timing_model"] == doc["timing_model"]
    r = runner.invoke(app, base + ["--out", str(tmp_path / "b.parquet"), "--timing", "roofline"])
    assert r.exit_code == 0 and json.loads(r.stdout)["timing_model"] == "roofline"
    assert json.loads(r.stdout)["makespan_us"] != doc["makespan_us"]
    r = runner.invoke(app, base + ["--out", str(tmp_path / "c.parquet"), "--model", "gpt2",
                                   "--timing", "measured"])
    assert r.exit_code == 2 and not (tmp_path / "c.parquet").exists()
    err = r.stderr if r.stderr_bytes is not None else r.output
    assert len(err.strip().splitlines()) == 1 and "no measured step-time data" in err
    r = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "a.parquet"), "--timing",
                            "roofline"])
    assert r.exit_code == 2 and "expected no --timing with --trace" in (r.stderr or r.output)


def test_recorded_replay_names_the_lowering_timing(tmp_path):
    from kvsim.api import simulate
    from kvsim.spec.sim_config import SimConfig
    from kvsim.workload import generate

    for timing in ("roofline", "auto"):
        trace = tmp_path / f"{timing}.parquet"
        s = generate("deadline_pressure", 4, 0, trace, timing=timing)
        res = simulate(trace, "lru", SimConfig(engine="interpreted"))
        assert res.summary["timing_model"] == s.timing_model
        assert res.config["timing_model"] == s.timing_model
