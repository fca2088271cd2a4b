"""Why measured.py has the form it has: simpler forms fitted to the same AIConfigurator
data, and their errors, beside the tables'.

For each config: (1) decode attention of B sequences at context c, fitted as
a + b*B + k*(B*c); (2) prefill attention of b prompts of s tokens with p cached, fitted as
a + t*T + w*W (T = new tokens, W = sum chunk*(context + chunk/2), the issue's attention
work) and a + n*chunks + t*T + w*W; (3) whole steps over bench/timing/cells.py's grid
fitted with the issue's four features, linear: a + t*T + w*W + b*B + k*K (K = decode
context sum).  Each fit is least squares on relative error.  Beside each, the error of
measured.py's tables on the same points.  Runs in the AIConfigurator venv:

    /work/venvs/aic/bin/python bench/timing/compare_forms.py
    /work/venvs/aic/bin/python bench/timing/compare_forms.py --only b200__qwen3-30b-a3b__tp2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aic_query as aq  # noqa: E402
import bench_step_time as bst  # noqa: E402
import cells as cl  # noqa: E402

DEFAULT = ("h100-sxm__llama-3.1-8b__tp1", "h100-sxm__llama-3.1-70b__tp4", "h200__qwen3-30b-a3b__tp1")


def fit(X, y):
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    e = np.abs(X @ coef / y - 1)
    return e.mean(), e.max()


def stat(pred, y):
    e = np.abs(np.asarray(pred) / np.asarray(y) - 1)
    return e.mean(), e.max()


def row(name, fitted):
    return f"  {name:58s} mean {fitted[0]:6.1%}  worst {fitted[1]:6.1%}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=list(DEFAULT))
    args = ap.parse_args(argv)
    mm = bst.load_measured()
    for key in args.only:
        cfg = aq.config(key)
        m = mm.MeasuredStepTime.bundled(cfg.gpu, cfg.model, cfg.tp)
        print(f"## {key}")
        # (1) decode attention
        pts = [(b, c) for b in (1, 2, 3, 4, 8, 12, 16, 32, 48, 64, 100, 128, 200, 256, 512, 1024)
               for c in (128, 512, 1000, 2048, 3000, 6000, 8192, 12000, 20000, 32768, 65536, 131072)]
        y = np.array([aq.decode_parts(cfg, b, c)[1] for b, c in pts])
        B = np.array([b for b, _ in pts], float)
        K = np.array([b * c for b, c in pts], float)
        print(f" decode attention, {len(pts)} points (batch 1-1024, context 128-128k)")
        print(row("linear a + b*B + k*K", fit(np.c_[np.ones_like(B), B, K], y)))
        print(row("measured.py table (B x context, log-bilinear)",
                  stat([m.decode_attn_ms(b, c) for b, c in pts], y)))
        # (2) prefill attention
        pts = [(b, s, p) for b in (1, 2, 3, 4, 8, 16, 32, 64) for s in (128, 256, 512, 1000, 2048, 3000,
               4096, 6000, 8192, 12000, 16384, 32768) for p in (0, s // 2, (s * 15) // 16) if b * s <= 65536]
        y = np.array([aq.prefill_parts(cfg, b, s, p)[1] for b, s, p in pts])
        n = np.array([b for b, _, _ in pts], float)
        T = np.array([b * (s - p) for b, s, p in pts], float)
        W = np.array([b * (s - p) * (p + (s - p) / 2) for b, s, p in pts], float)
        one = np.ones_like(T)
        print(f" prefill attention, {len(pts)} points (b prompts 128-32k, p cached in {{0, s/2, 15s/16}})")
        print(row("linear a + t*T + w*W", fit(np.c_[one, T, W], y)))
        print(row("linear a + n*chunks + t*T + w*W", fit(np.c_[one, n, T, W], y)))
        mp = [m.prefill_attn_ms([(s - p, p)] * b) for b, s, p in pts]
        print(row("measured.py (chunk x context tables: alone, marginal)", stat(mp, y)))
        # (3) whole steps with the four features
        X, y, mine = [], [], []
        for c in cl.grid():
            if c.kind not in cl.STEP_KINDS:
                continue
            if c.kind == "prefill":
                n, p = c.chunk_tokens, c.context_tokens
                t, w, b, k = c.batch * n, c.batch * n * (p + n / 2), 0, 0
            elif c.kind == "decode":
                t, w, b, k = 0, 0, c.batch, c.batch * c.context_tokens
            else:  # the mean step of a chunked prefill: chunk C at mean context (S - C) / 2
                ch = c.chunk_tokens
                t, w = ch, ch * ((c.prompt_tokens - ch) / 2 + ch / 2)
                b, k = c.batch, c.batch * c.context_tokens
            X.append((1.0, t, w, b, k))
            y.append(bst.aic_ms(cfg, c))
            mine.append(cl.model_ms(m, c))
        X, y = np.array(X), np.array(y)
        print(f" whole steps, {len(y)} prefill/decode/mixed cells of bench_step_time.py's grid")
        print(row("linear a + t*T + w*W + b*B + k*K (the issue's features)", fit(X, y)))
        print(row("measured.py", stat(mine, y)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
