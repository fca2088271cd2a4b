"""kvsim's ``measured`` step times vs AIConfigurator's estimates, cell by cell.

For every bundled profile (profiles/timing/*.toml) or the ones chosen, asks AIConfigurator
(aiconfigurator 0.12.0's compiled engine, bench/timing/aic_query.py) for each cell of the
grid in bench/timing/cells.py (prefill: batch 1-64 x prompts 1k-32k; decode: batch 1-256 x
context 1k-32k; mixed: chunked prefill of 1k-32k prompts in 512-8192-token chunks beside
1-256 decodes; AIConfigurator's TPOT and TTFT), evaluates kvsim/engine/timing/measured.py
on the same cell, and prints both with the error.  MAPE (mean and worst |model/aic - 1|) is
over the prefill (cold and after a prefix-cache hit), decode and mixed step cells; TPOT/TTFT rows are printed apart, with the
issue's reference numbers.  Runs in the AIConfigurator venv:

    /work/venvs/aic/bin/python bench/timing/bench_step_time.py                       # H100 SXM + H200
    /work/venvs/aic/bin/python bench/timing/bench_step_time.py --gpus all --summary  # every profile
    /work/venvs/aic/bin/python bench/timing/bench_step_time.py --gpus all --summary \\
        --write-fixture tests/fixtures/aic/grid.csv                                  # the test fixture

Where kvsim itself imports (its venv: numba), each cell is also answered by kvsim's
compiled step duration (kvsim/engine/timing/step_time.py, the function the scheduler
calls) under ``measured`` and, for TP 1 (kvsim has no tensor-parallel option), under
``roofline`` (the catalog model on the hardware profile of the same name), with MAPE for
both.  ``--aic-from`` reads AIConfigurator's values from the fixture it wrote (the same
numbers, no AIConfigurator needed), so this runs in kvsim's venv:

    python bench/timing/bench_step_time.py --gpus all --summary --aic-from tests/fixtures/aic/grid.csv
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import cells as cl  # noqa: E402

aq = None  # bench/timing/aic_query.py (imports AIConfigurator): unless --aic-from


class _FixtureConfig:
    """A (gpu, model, tp) of the fixture, shaped like aic_query.Config where it is used."""

    def __init__(self, gpu: str, model: str, tp: int):
        self.gpu, self.model, self.tp = gpu, model, tp
        self.key = f"{gpu}__{model}__tp{tp}"


def _cell_key(kind, gpu, model, tp, c: cl.Cell) -> tuple:
    return (kind, gpu, model, int(tp), int(c.batch), int(c.prompt_tokens), int(c.chunk_tokens),
            int(c.context_tokens), int(c.osl))


def load_fixture(path: Path) -> dict:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(ln for ln in f if not ln.startswith("#")))
    return {(r["kind"], r["gpu"], r["model"], int(r["tp"]), int(r["batch"]),
             int(r["prompt_tokens"]), int(r["chunk_tokens"]), int(r["context_tokens"]),
             int(r["osl"])): float(r["aic_ms"]) for r in rows}


def kvsim_models(gpu: str, model: str, tp: int, profile: Path):
    """kvsim's packed step-time parameters (fp) for this config: measured (the profile
    file through --timing's resolution) and roofline (TP 1 only; None otherwise); None
    when kvsim does not import here (the AIConfigurator venv has no numba)."""
    try:
        from kvsim.engine.engine_model import build_cost_model
    except ImportError:
        return None
    meas = build_cost_model(model, gpu, timing=str(profile)).as_array()
    roof = build_cost_model(model, gpu, timing="roofline").as_array() if tp == 1 else None
    return meas, roof


def compiled_ms(fp, c: cl.Cell) -> float:
    """kvsim's compiled step duration (step_time.one_step_us, the scheduler's own
    functions) for one cell, in ms; cells of many steps as cells.model_ms averages them."""
    import numpy as np

    from kvsim.engine.timing.step_time import one_step_us

    def step(chunks, b, ctx):
        ch = np.array([x for x, _ in chunks], dtype=np.int64)
        pb = np.array([y for _, y in chunks], dtype=np.int64)
        return one_step_us(fp, ch, pb, np.ones(b, np.int64), np.full(b, ctx, np.int64)) / 1e3

    k = c.kind
    if k in ("prefill", "ttft"):
        return step([(c.chunk_tokens, c.context_tokens)] * c.batch, 0, 0)
    if k == "decode":
        return step((), c.batch, c.context_tokens)
    if k == "mixed":
        s, ch, b = c.prompt_tokens, c.chunk_tokens, c.batch
        starts = range(0, s, ch)
        return sum(step([(min(ch, s - p), p)], b, c.context_tokens) for p in starts) / len(starts)
    if k == "tpot":
        steps = range(1, c.osl)
        return sum(step((), c.batch, c.prompt_tokens + i) for i in steps) / len(steps)
    raise ValueError(k)


def load_measured():
    path = ROOT / "kvsim" / "engine" / "timing" / "measured.py"
    spec = importlib.util.spec_from_file_location("kvsim_timing_measured", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def aic_ms(cfg: aq.Config, c: cl.Cell) -> float:
    if c.kind in ("prefill", "ttft"):
        return aq.prefill_ms(cfg, c.batch, c.prompt_tokens, c.context_tokens)
    if c.kind == "decode":
        return aq.decode_ms(cfg, c.batch, c.context_tokens)
    if c.kind == "mixed":
        return aq.mixed_ms(cfg, c.chunk_tokens, c.batch, c.prompt_tokens, c.osl)
    if c.kind == "tpot":
        return aq.tpot_ms(cfg, c.batch, c.prompt_tokens, c.osl)
    raise ValueError(c.kind)


def print_compiled(comp_cfg: dict, comp_vs_py: float, version: str) -> None:
    """MAPE of kvsim's compiled step duration under measured and roofline, per config and
    over every step cell."""
    kinds = (*cl.STEP_KINDS, "tpot", "ttft")
    for label, idx in (("measured (kvsim's compiled step_duration_us)", 0),
                       ("roofline (kvsim's compiled step_duration_us; TP 1 only)", 1)):
        print(f"\n## MAPE of {label} vs AIConfigurator {version}")
        print(f"{'config':34s} " + " ".join(f"{k + ' mean/worst':>20s}" for k in kinds)
              + f" {'steps mean/worst':>20s}")
        allk = defaultdict(list)
        for key, pair in comp_cfg.items():
            errs = pair[idx]
            if not errs:
                continue
            cols = []
            for k in kinds:
                mean, worst = cl.summarize(errs[k])
                cols.append(f"{mean:9.1%} /{worst:7.1%}")
                allk[k] += errs[k]
            steps = [e for k in cl.STEP_KINDS for e in errs[k]]
            mean, worst = cl.summarize(steps)
            cols.append(f"{mean:9.1%} /{worst:7.1%}")
            print(f"{key:34s} " + " ".join(f"{c:>20s}" for c in cols))
        steps = [e for k in cl.STEP_KINDS for e in allk[k]]
        cols = [f"{cl.summarize(allk[k])[0]:9.1%} /{cl.summarize(allk[k])[1]:7.1%}" for k in kinds]
        mean, worst = cl.summarize(steps)
        cols.append(f"{mean:9.1%} /{worst:7.1%}")
        print(f"{'ALL (' + str(len(steps)) + ' step cells)':34s} " + " ".join(f"{c:>20s}" for c in cols))
        signed = sum(steps) / len(steps) if steps else 0.0
        print(f"  mean signed error over step cells {signed:+.1%} (kvsim above AIConfigurator when +)")
    print(f"\ncompiled measured vs measured.py, largest |compiled/py - 1| over every cell: {comp_vs_py:.2e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", nargs="*", default=["h100-sxm", "h200"], help="kvsim GPU names, or 'all'")
    ap.add_argument("--profiles", type=Path, default=ROOT / "profiles" / "timing")
    ap.add_argument("--summary", action="store_true", help="per-config summary only, no per-cell rows")
    ap.add_argument("--write-fixture", type=Path, help="also write AIConfigurator's values as CSV")
    ap.add_argument("--aic-from", type=Path, help="AIConfigurator's values from this fixture "
                    "(tests/fixtures/aic/grid.csv) instead of asking AIConfigurator")
    args = ap.parse_args(argv)
    global aq
    fixture = None
    if args.aic_from:
        fixture = load_fixture(args.aic_from)
        if args.write_fixture:
            print("--write-fixture needs AIConfigurator, not --aic-from", file=sys.stderr)
            return 2
    else:
        import aic_query as aq  # noqa: F811

    mm = load_measured()
    have = set(mm.available(args.profiles))
    if fixture is not None:
        known = sorted({(k[1], k[2], k[3]) for k in fixture})
        cfgs = [_FixtureConfig(g, mo, tp) for g, mo, tp in known if (g, mo, tp) in have
                and ("all" in args.gpus or g in args.gpus)]
    else:
        cfgs = [c for c in aq.CONFIGS if (c.gpu, c.model, c.tp) in have
                and ("all" in args.gpus or c.gpu in args.gpus)]
    if not cfgs:
        print(f"no profiles for {args.gpus} in {args.profiles}", file=sys.stderr)
        return 2
    grid = cl.grid()
    rows = []
    step_err = []
    by_kind = defaultdict(list)
    by_cfg = {}
    eval_s = 0.0
    n_eval = 0
    worst_cells = []
    comp_cfg = {}  # key -> {kind: [compiled measured error]}, {kind: [roofline error]}
    comp_vs_py = 0.0  # largest |compiled / measured.py - 1|
    for cfg in cfgs:
        m = mm.MeasuredStepTime.bundled(cfg.gpu, cfg.model, cfg.tp, directory=args.profiles)
        km = kvsim_models(cfg.gpu, cfg.model, cfg.tp, Path(m.path))
        cerr, rerr = defaultdict(list), defaultdict(list)
        if km is not None:
            comp_cfg[cfg.key] = (cerr, rerr)
        errs = defaultdict(list)
        if not args.summary:
            src = ("the fixture " + str(args.aic_from)) if fixture is not None else (
                f"AIConfigurator {aq.aic_version()}, {cfg.system} vllm "
                f"{aq.backend_version(cfg)}, {cfg.model_path}")
            print(f"\n## {cfg.key}  ({src})")
            print(f"{'cell':58s} {'aic_ms':>10s} {'kvsim_ms':>10s} {'error':>8s}"
                  + (f" {'compiled':>10s} {'roofline':>10s} {'error':>8s}" if km else ""))
        for c in grid:
            a = (fixture[_cell_key(c.kind, cfg.gpu, cfg.model, cfg.tp, c)] if fixture is not None
                 else aic_ms(cfg, c))
            t0 = time.perf_counter()
            k = cl.model_ms(m, c)
            eval_s += time.perf_counter() - t0
            n_eval += 1
            e = k / a - 1
            errs[c.kind].append(e)
            extra = ""
            if km is not None:
                kc = compiled_ms(km[0], c)
                comp_vs_py = max(comp_vs_py, abs(kc / k - 1))
                cerr[c.kind].append(kc / a - 1)
                if km[1] is not None:
                    kr = compiled_ms(km[1], c)
                    rerr[c.kind].append(kr / a - 1)
                    extra = f" {kc:10.3f} {kr:10.3f} {kr / a - 1:+8.1%}"
                else:
                    extra = f" {kc:10.3f} {'-':>10s} {'-':>8s}"
            if c.kind in cl.STEP_KINDS:
                step_err.append(e)
                worst_cells.append((abs(e), e, cfg.key, c.label(), a, k, c))
                by_kind[c.kind].append(e)
            rows.append((c.kind, cfg.gpu, cfg.model, cfg.tp, c.batch, c.prompt_tokens, c.chunk_tokens,
                         c.context_tokens, c.osl, f"{a:.6g}"))
            if not args.summary:
                print(f"{c.label():58s} {a:10.3f} {k:10.3f} {e:+8.1%}{extra}")
        by_cfg[cfg.key] = errs

    version = "0.12.0 (fixture)" if fixture is not None else aq.aic_version()
    print(f"\n## MAPE of kvsim measured vs AIConfigurator {version} (|kvsim/aic - 1|)")
    print(f"{'config':34s} " + " ".join(f"{k + ' mean/worst':>20s}" for k in (*cl.STEP_KINDS, "tpot")))
    for key, errs in by_cfg.items():
        cols = []
        for k in (*cl.STEP_KINDS, "tpot"):
            mean, worst = cl.summarize(errs[k])
            cols.append(f"{mean:9.1%} /{worst:7.1%}")
        print(f"{key:34s} " + " ".join(f"{c:>20s}" for c in cols))
    for k in cl.STEP_KINDS:
        mean, worst = cl.summarize(by_kind[k])
        print(f"{'all ' + k:34s} {len(by_kind[k]):5d} cells: mean {mean:.2%}, worst {worst:.2%}")
    mean, worst = cl.summarize(step_err)
    print(f"{'ALL STEP CELLS':34s} {len(step_err):5d} cells: mean {mean:.2%}, worst {worst:.2%} "
          f"(target: mean <= 10 %, worst <= 20 %)")

    if comp_cfg:
        print_compiled(comp_cfg, comp_vs_py, version)
    if fixture is not None:
        return 0
    print("worst step cells (mixed ones also against AIConfigurator's mixed step with its chunk attention\n"
          "taken from its own prefix-cached prefill estimate, aic_mixed_via_prefix_path):")
    for _a, e, key, label, a, k, c in sorted(worst_cells, key=lambda r: r[0], reverse=True)[:6]:
        line = f"  {key:32s} {label:58s} aic {a:9.3f} kvsim {k:9.3f} {e:+7.1%}"
        if c.kind == "mixed":
            v = aq.mixed_via_prefix_path(aq.config(key), c.chunk_tokens, c.batch, c.prompt_tokens, c.osl)
            line += f"   via prefix path {v:9.3f} (kvsim {k / v - 1:+.1%})"
        print(line)

    g, mo, tp = cl.REFERENCE_CONFIG
    if any((c.gpu, c.model, c.tp) == (g, mo, tp) for c in cfgs):
        cfg = next(c for c in cfgs if (c.gpu, c.model, c.tp) == (g, mo, tp))
        m = mm.MeasuredStepTime.bundled(g, mo, tp, directory=args.profiles)
        print(f"\n## the issue's reference points ({g}, {mo}, TP {tp})")
        print(f"{'point':40s} {'issue':>8s} {'aic':>9s} {'kvsim':>9s} {'vs issue':>9s}")
        for kind, b, s, ref in cl.REFERENCE:
            c = cl.reference_cell(kind, b, s)
            a, k = aic_ms(cfg, c), cl.model_ms(m, c)
            print(f"{c.label():40s} {ref:8.1f} {a:9.2f} {k:9.2f} {k / ref - 1:+9.1%}")
        for b, ctx in ((16, 8000), (64, 4000), (128, 2000)):
            print(f"  (one decode step at exactly {ctx} context, b={b}: aic "
                  f"{aq.decode_ms(cfg, b, ctx):.2f} ms, kvsim {m.decode_ms(b, ctx):.2f} ms)")
    print(f"\nmeasured.py: {n_eval} cells answered in {eval_s * 1e3:.0f} ms (a mixed or tpot cell is many steps)")
    m = mm.MeasuredStepTime.bundled(cfgs[0].gpu, cfgs[0].model, cfgs[0].tp, directory=args.profiles)
    dec = [3000 + 7 * i for i in range(64)]
    for what, fn in (
        ("decode_ms(64, 3000)", lambda: m.decode_ms(64, 3000)),
        ("step_ms([(2048, 4096)], 64 contexts)", lambda: m.step_ms([(2048, 4096)], dec)),
        ("step_ms_sums([(2048, 4096)], 64, sum)", lambda: m.step_ms_sums([(2048, 4096)], 64, 200000.0)),
    ):
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        print(f"  {what:40s} {(time.perf_counter() - t0) / n * 1e6:6.2f} us per call")

    if args.write_fixture:
        args.write_fixture.parent.mkdir(parents=True, exist_ok=True)
        with open(args.write_fixture, "w", newline="") as f:
            f.write(f"# AIConfigurator (aiconfigurator-core {aq.aic_version()}, vLLM databases) step-time "
                    "estimates over bench/timing/cells.py's grid; ms per engine step.\n")
            f.write("# Written by: /work/venvs/aic/bin/python bench/timing/bench_step_time.py --gpus all "
                    "--summary --write-fixture tests/fixtures/aic/grid.csv\n")
            w = csv.writer(f, lineterminator="\n")
            w.writerow(cl.COLUMNS)
            w.writerows(rows)
        print(f"wrote {len(rows)} rows to {args.write_fixture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
