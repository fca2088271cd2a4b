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

import aic_query as aq  # noqa: E402
import cells as cl  # noqa: E402


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", nargs="*", default=["h100-sxm", "h200"], help="kvsim GPU names, or 'all'")
    ap.add_argument("--profiles", type=Path, default=ROOT / "profiles" / "timing")
    ap.add_argument("--summary", action="store_true", help="per-config summary only, no per-cell rows")
    ap.add_argument("--write-fixture", type=Path, help="also write AIConfigurator's values as CSV")
    args = ap.parse_args(argv)

    mm = load_measured()
    have = set(mm.available(args.profiles))
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
    for cfg in cfgs:
        m = mm.MeasuredStepTime.bundled(cfg.gpu, cfg.model, cfg.tp, directory=args.profiles)
        errs = defaultdict(list)
        if not args.summary:
            print(f"\n## {cfg.key}  (AIConfigurator {aq.aic_version()}, {cfg.system} vllm "
                  f"{aq.backend_version(cfg)}, {cfg.model_path})")
            print(f"{'cell':58s} {'aic_ms':>10s} {'kvsim_ms':>10s} {'error':>8s}")
        for c in grid:
            a = aic_ms(cfg, c)
            t0 = time.perf_counter()
            k = cl.model_ms(m, c)
            eval_s += time.perf_counter() - t0
            n_eval += 1
            e = k / a - 1
            errs[c.kind].append(e)
            if c.kind in cl.STEP_KINDS:
                step_err.append(e)
                worst_cells.append((abs(e), e, cfg.key, c.label(), a, k, c))
                by_kind[c.kind].append(e)
            rows.append((c.kind, cfg.gpu, cfg.model, cfg.tp, c.batch, c.prompt_tokens, c.chunk_tokens,
                         c.context_tokens, c.osl, f"{a:.6g}"))
            if not args.summary:
                print(f"{c.label():58s} {a:10.3f} {k:10.3f} {e:+8.1%}")
        by_cfg[cfg.key] = errs

    print(f"\n## MAPE of kvsim measured vs AIConfigurator {aq.aic_version()} (|kvsim/aic - 1|)")
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
