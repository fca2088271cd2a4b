"""Write kvsim's measured step-time profiles (profiles/timing/<gpu>__<model>__tp<N>.toml)
from AIConfigurator's measured kernel database.

Needs ``pip install aiconfigurator==0.12.0`` (no GPU: the database ships in the wheel);
kvsim reads the files it writes with no AIConfigurator installed
(kvsim/engine/timing/measured.py).  Each profile holds four compact tables sampled from
AIConfigurator's compiled engine (bench/timing/aic_query.py says which call gives which):

  prefill_nonattn  ms of every context-phase op but attention, for N scheduled tokens
  decode_nonattn   ms of every generation-phase op but attention, for a decode batch B
  prefill_attn     ms of one prefill chunk's attention by (chunk tokens, context before)
                   and its marginal cost in a batch of chunks (slope over batch 1-16)
  decode_attn      ms of a decode batch's attention by (batch, context tokens)

then checks the tables, as measured.py interpolates them, against AIConfigurator at random
points off the grid and writes that error into the file too.

    /work/venvs/aic/bin/python bench/timing/extract_aic.py              # every config
    /work/venvs/aic/bin/python bench/timing/extract_aic.py --only h100-sxm__llama-3.1-8b__tp1
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import aic_query as aq  # noqa: E402

# ---- the grids (powers of two and their 1.5x; AIConfigurator's own gemm table is
# measured at m = 1..17, multiples of 16 to 256, of 256 to 4352, then 8192/16384/32768,
# its attention tables at powers of two; see the profile header) -------------------------
BASE_TOKENS = {n for k in range(18) for n in (2**k, 3 * 2**k // 2) if 1 <= n <= 131072}
MAX_TOKENS = 131072  # prefill_nonattn's last point (past it: the last segment extended)
MAX_DECODE_BATCH = 2048  # AIConfigurator's generation-attention table is measured to batch 2048


def token_grid(cfg, top: int) -> list[int]:
    """BASE_TOKENS plus every token count AIConfigurator's gemm/moe tables were measured at
    (a jump between two measured points, e.g. 256 -> 257, then stays a jump), up to ``top``."""
    pts = set(BASE_TOKENS) | set(aq.measured_token_points(cfg))
    return sorted(n for n in pts if 1 <= n <= top)


ATTN_BATCH = [2**k for k in range(12)]  # 1 .. 2048
ATTN_CONTEXT = [2**k for k in range(4, 18)]  # 16 .. 131072
CHUNK = [2**k for k in range(0, 17)]  # 1 .. 65536
CONTEXT_BEFORE = [0] + [2**k for k in range(8, 18)]  # 0, 256 .. 131072
CONTEXT_OFFSET = 256  # prefill_attn's context axis is log2(context_before + 256): 0 -> 8
MARGINAL_BATCH = (1, 2, 4, 8, 16)  # prefill_attn's marginal_ms: slope over these batch sizes
CHECK_POINTS = 200  # random off-grid points per table for the [check] section


def load_measured():
    path = ROOT / "kvsim" / "engine" / "timing" / "measured.py"
    spec = importlib.util.spec_from_file_location("kvsim_timing_measured", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def g(x: float) -> str:
    """A float as TOML with 5 significant digits."""
    s = f"{x:.5g}"
    return s if any(ch in s for ch in ".en") else s + ".0"


def arr(xs) -> str:
    return "[" + ", ".join(str(x) if isinstance(x, int) else g(x) for x in xs) + "]"


def strs(xs) -> str:
    return "[" + ", ".join(f'"{x}"' for x in xs) + "]"


def arr2(rows, indent="  ") -> str:
    return "[\n" + "".join(f"{indent}{arr(r)},\n" for r in rows) + "]"


def sample(cfg: aq.Config) -> dict:
    t = {}
    t["tokens"] = tokens = token_grid(cfg, MAX_TOKENS)
    t["batch"] = batches = token_grid(cfg, MAX_DECODE_BATCH)
    pn, psil = [], 0.0
    for n in tokens:
        na, _at, sil, _src = aq.prefill_parts(cfg, 1, n)
        pn.append(na)
        psil += sil
    t["prefill_nonattn"] = (pn, psil / sum(pn))
    dn, dsil = [], 0.0
    for b in batches:
        na, _at, sil, _src = aq.decode_parts(cfg, b, 1024)
        dn.append(na)
        dsil += sil
    t["decode_nonattn"] = (dn, dsil / sum(dn))
    pa = [[aq.prefill_parts(cfg, 1, c + p, p) for p in CONTEXT_BEFORE] for c in CHUNK]
    da = [[aq.decode_parts(cfg, b, c) for c in ATTN_CONTEXT] for b in ATTN_BATCH]
    t["prefill_attn"] = [[x[1] for x in r] for r in pa]
    t["decode_attn"] = [[x[1] for x in r] for r in da]
    t["prefill_attn_sources"] = sorted({x[3] for r in pa for x in r})
    t["decode_attn_sources"] = sorted({x[3] for r in da for x in r})
    t["prefill_attn_marginal"] = [[marginal_ms(cfg, c, p) for p in CONTEXT_BEFORE] for c in CHUNK]
    return t


def marginal_ms(cfg: aq.Config, chunk: int, before: int) -> float:
    """Least-squares slope of AIConfigurator's attention of b equal chunks over b in
    MARGINAL_BATCH: what one more such chunk adds to a step's prefill attention."""
    xs = MARGINAL_BATCH
    ys = [aq.prefill_parts(cfg, b, chunk + before, before)[1] for b in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        raise ValueError(f"{cfg.key}: attention of {chunk}-token chunks after {before} does not grow "
                         f"with batch ({ys}); the table needs positive values")
    return slope


def render(cfg: aq.Config, t: dict, check: dict | None, today: str) -> str:
    v = aq.backend_version(cfg)
    q = aq.quant_modes(cfg)
    dbs = aq.database_dirs(cfg)
    lines = [
        f"# Measured step times of {cfg.model} at TP {cfg.tp} on {cfg.gpu} under vLLM {v},",
        "# derived from AIConfigurator's database of kernel timings measured on real GPUs.",
        "# Written by bench/timing/extract_aic.py; read by kvsim/engine/timing/measured.py",
        "# (docs/timing-measured.md).  Do not edit by hand: re-run the generator.",
        'schema = "kvsim.timing.measured/1"',
        f'gpu = "{cfg.gpu}"  # kvsim hardware profile (profiles/hardware/{cfg.gpu}.toml)',
        f'model = "{cfg.model}"  # kvsim catalog name (kvsim/models/catalog.toml)',
        f"tp = {cfg.tp}",
        f'dtype = "{q["gemm"]}"  # weights and activations; kv cache {q["kv_cache"]}, attention {q["attention"]}'
        + (f', experts {q["moe"]}' if cfg.moe else ""),
        "",
        "[source]",
        'tool = "aiconfigurator-core"  # the estimator core of AIConfigurator (PyPI aiconfigurator), Apache-2.0',
        f'version = "{aq.aic_version()}"  # released 2026-09 (PyPI)',
        f'system = "{cfg.system}"  # AIConfigurator system',
        f'backend = "{aq.BACKEND}"',
        f'backend_version = "{v}"  # the database version AIConfigurator serves as current for this system',
        f'model_path = "{cfg.model_path}"',
        f'parallel = "tp{cfg.tp}' + (f' moe_tp{cfg.tp} moe_ep1"' if cfg.moe else '"'),
        f'extracted = "{today}"',
        'generator = "bench/timing/extract_aic.py"',
        'api = "aiconfigurator_core.sdk.engine.EngineHandle.compile(model_path, system, \'vllm\', tp_size=..)'
        '.run_static_per_op(mode=\'static_ctx\') / .decode_step_per_op"',
        "# sha256 over the files of each perf-table directory used (aiconfigurator_core/systems/data/<system>/...)",
        "[source.database_sha256]",
    ]
    for k, h in dbs.items():
        lines.append(f'"{k}" = "{h}"')
    pn, psil = t["prefill_nonattn"]
    dn, dsil = t["decode_nonattn"]
    lines += [
        "",
        "[prefill_nonattn]",
        "# every context-phase op but attention (embedding, norms, QKV/O/FFN or MoE GEMMs, activation,",
        "# all-reduce, logits) for N scheduled tokens: run_static_per_op(batch_size=1, isl=N, osl=2,",
        "# mode='static_ctx') minus context_attention.  Linear in N between points.",
        f"measured_share = {psil:.3f}  # share of these ms from ops AIConfigurator tags 'silicon' (its measured tables); the rest 'empirical' (its formulas)",
        f"tokens = {arr(t['tokens'])}",
        f"ms = {arr(pn)}",
        "",
        "[decode_nonattn]",
        "# every generation-phase op but attention for a decode batch B: decode_step_per_op(B, isl, osl=2)",
        "# minus generation_attention (independent of context).  Linear in B between points.",
        f"measured_share = {dsil:.3f}",
        f"batch = {arr(t['batch'])}",
        f"ms = {arr(dn)}",
        "",
        "[prefill_attn]",
        "# attention of ONE prefill chunk of c new tokens after p cached ones: context_attention of",
        "# run_static_per_op(batch_size=1, isl=c+p, prefix=p, mode='static_ctx').  ms[i][j] is chunk_tokens[i]",
        "# at context_before_tokens[j]; bilinear in (log2 c, log2(p + context_offset_tokens)) on log(ms).",
        "# AIConfigurator's context-attention table is measured up to isl 16384; longer is its extrapolation.",
        f"sources = {strs(t['prefill_attn_sources'])}  # AIConfigurator's tags on these values ('silicon': its measured table; 'mixed': a sum of measured and modelled parts)",
        f"chunk_tokens = {arr(CHUNK)}",
        f"context_before_tokens = {arr(CONTEXT_BEFORE)}",
        f"context_offset_tokens = {CONTEXT_OFFSET}",
        f"ms = {arr2(t['prefill_attn'])}",
        "# several chunks in one step share the kernel's fixed cost: each adds its marginal_ms (same axes):",
        "# the least-squares slope over b = 1, 2, 4, 8, 16 of context_attention of run_static_per_op(batch_size=b,",
        "# isl=c+p, prefix=p); a step costs sum(marginal) + max(ms - marginal) over its chunks (one chunk: ms).",
        f"marginal_ms = {arr2(t['prefill_attn_marginal'])}",
        "",
        "[decode_attn]",
        "# attention of a decode batch of B sequences at context c: generation_attention of",
        "# decode_step_per_op(B, isl=c-2, osl=2).  ms[i][j] is batch[i] at context_tokens[j]; bilinear in",
        "# (log2 B, log2 c) on log(ms).  A mixed batch is looked up at its mean context.",
        f"sources = {strs(t['decode_attn_sources'])}",
        f"batch = {arr(ATTN_BATCH)}",
        f"context_tokens = {arr(ATTN_CONTEXT)}",
        f"ms = {arr2(t['decode_attn'])}",
    ]
    if check:
        lines += [
            "",
            "[check]",
            f"# measured.py on these tables vs AIConfigurator at {CHECK_POINTS} random off-grid points each",
            "# (relative error |model / aic - 1| of the component; see bench/timing/bench_step_time.py for whole steps)",
        ]
        for k, (mean, worst) in check.items():
            lines.append(f"{k} = {{ mean = {mean:.4f}, worst = {worst:.4f} }}")
    return "\n".join(lines) + "\n"


def check_tables(cfg: aq.Config, path: Path) -> dict:
    mm = load_measured()
    m = mm.MeasuredStepTime.from_file(path)
    rnd = random.Random(20260928)
    out = {}

    def stat(errs):
        errs = [abs(e) for e in errs]
        return (sum(errs) / len(errs), max(errs))

    e = []
    for _ in range(CHECK_POINTS):
        n = rnd.randint(1, 131072)
        e.append(m._prefill_nonattn_ms(n) / aq.prefill_parts(cfg, 1, n)[0] - 1)
    out["prefill_nonattn"] = stat(e)
    e = []
    for _ in range(CHECK_POINTS):
        b = rnd.randint(1, 2048)
        e.append(m._decode_nonattn_ms(b) / aq.decode_parts(cfg, b, 1024)[0] - 1)
    out["decode_nonattn"] = stat(e)
    e = []
    for _ in range(CHECK_POINTS):
        c = rnd.randint(16, 65536)
        p = 0 if rnd.random() < 0.3 else rnd.randint(1, 131072 - c)
        e.append(m.chunk_attn_ms(c, p) / aq.prefill_parts(cfg, 1, c + p, p)[1] - 1)
    out["prefill_attn"] = stat(e)
    e = []
    for _ in range(CHECK_POINTS):
        b = rnd.randint(2, 64)
        c = rnd.randint(16, max(16, 65536 // b))
        p = 0 if rnd.random() < 0.3 else rnd.randint(1, 32768)
        e.append(m.prefill_attn_ms([(c, p)] * b) / aq.prefill_parts(cfg, b, c + p, p)[1] - 1)
    out["prefill_attn_batched"] = stat(e)
    e = []
    for _ in range(CHECK_POINTS):
        b = rnd.randint(1, 2048)
        c = rnd.randint(16, 131072)
        e.append(m.decode_attn_ms(b, c) / aq.decode_parts(cfg, b, c)[1] - 1)
    out["decode_attn"] = stat(e)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "profiles" / "timing")
    ap.add_argument("--only", nargs="*", help="config keys, e.g. h100-sxm__llama-3.1-8b__tp1")
    ap.add_argument("--date", default=dt.date.today().isoformat(), help="extraction date written")
    args = ap.parse_args(argv)
    cfgs = [aq.config(k) for k in args.only] if args.only else list(aq.CONFIGS)
    args.out.mkdir(parents=True, exist_ok=True)
    for cfg in cfgs:
        t = sample(cfg)
        path = args.out / f"{cfg.key}.toml"
        path.write_text(render(cfg, t, None, args.date))
        chk = check_tables(cfg, path)
        path.write_text(render(cfg, t, chk, args.date))
        worst = max(w for _m, w in chk.values())
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
              f"{path.stat().st_size} B, off-grid worst component error {worst:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
