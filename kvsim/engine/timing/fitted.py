"""``fitted``: step-time coefficients fitted to a user's own vLLM measurements.

``kvsim calibrate --from-vllm-bench RESULT.json`` reads what ``vllm bench serve
--save-result --save-detailed`` writes (per request: ``input_lens``, ``output_lens``,
``ttfts`` and ``itls`` in seconds, ``start_times``, ``errors``), rebuilds the engine's
steps from the token timestamps, fits

    step_ms = a + b * prefill_tokens + c * decode_batch + d * decode_context_sum

by least squares, and writes a timing profile (``kvsim.timing.fitted/1``) that
``--timing FILE.toml`` reads.

Why this form: it is what such a file can identify.  A request's first token ends the step
that prefilled it (its prompt tokens), every later token ends a step that decoded it (one
sequence, its context); nothing in the file says how a step's attention was split.  Each
term stands for a part of a vLLM step: ``a`` the weights read and the fixed per-step cost
(launches, sampling, scheduling), ``b`` the GEMM work per computed prompt token, ``c`` the
per-sequence work of a decode (its token's GEMM row, sampling, block tables), ``d`` the
decode attention's KV read (``d x`` the batch's total context).  Fitted to
AIConfigurator's measured tables for whole steps, this linear family is within about 6 %
mean, 30 % worst (docs/timing-measured.md, "Why this form"); a fit to one's own server is
its own check (the MAPE printed per metric).

Steps from timestamps: request ``i``'s tokens are emitted at ``start_i + ttft_i`` and then
after each of its ITLs.  A running engine emits one token per running sequence per step,
so the union of the emission times are the step ends: times closer than a quarter of the
median ITL are one step, which ends at their mean (client timestamps jitter).  A step's
prefill tokens are the prompts whose first token ends it; its decode batch the requests
with a later token ending it, each at context ``input_len + j`` for its ``j``-th output
token (KV length including the token computed, as kvsim's scheduler counts it); it starts
at the previous step's end, or when the last of its prefilled requests arrived if the
engine was idle.  Assumes whole prompts prefill in one step (no chunked prefill, prompts
under ``max_num_batched_tokens``), no preemption and no speculative decoding.  Without
``start_times`` (older vLLM) only a serial run (``max_concurrency`` 1) can be rebuilt:
each request alone, its TTFT one prefill step, its ITLs decode steps of one sequence.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SCHEMA = "kvsim.timing.fitted/1"
TERMS = ("a_ms", "b_ms_per_prefill_token", "c_ms_per_decode_seq", "d_ms_per_context_token")
#: fewest reconstructed steps a fit accepts (per coefficient: 4)
MIN_STEPS = 4 * len(TERMS)


class BenchFileError(ValueError):
    """A result file kvsim cannot fit from (one line, names the file)."""


@dataclass
class Steps:
    """Reconstructed engine steps: features (n, 4) = [1, P, B, K] and observed ms, plus
    per-request indices to map steps back to TTFT / ITL."""

    X: np.ndarray
    ms: np.ndarray
    start_ms: np.ndarray
    end_ms: np.ndarray
    # per request: arrival ms, index of its prefill step, indices of its token steps
    arrival_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    first_step: list = field(default_factory=list)
    token_steps: list = field(default_factory=list)


@dataclass
class Fit:
    coef: np.ndarray  # a, b, c, d in ms
    steps: Steps
    mape: dict  # metric -> (mean, worst, count)
    requests: int
    skipped: int
    source: dict


def _bad(path, msg: str) -> BenchFileError:
    return BenchFileError(f"{path}: {msg}")


def load_result(path: str | Path) -> dict:
    """The parsed JSON of a ``vllm bench serve --save-result --save-detailed`` file, with
    its per-request lists checked; :class:`BenchFileError` otherwise."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _bad(p, "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(p, f"not a JSON result file ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise _bad(p, "expected a JSON object (vllm bench serve --save-result)")
    need = ("input_lens", "output_lens", "ttfts", "itls")
    missing = [k for k in need if k not in doc]
    if missing:
        raise _bad(p, f"missing {', '.join(missing)}: expected a result written with "
                      "`vllm bench serve --save-result --save-detailed`")
    n = len(doc["input_lens"]) if isinstance(doc["input_lens"], list) else -1
    for k in (*need, *(("start_times",) if "start_times" in doc else ()),
              *(("errors",) if isinstance(doc.get("errors"), list) else ())):
        if not isinstance(doc[k], list) or len(doc[k]) != n:
            raise _bad(p, f"{k}: expected a list with one entry per request ({n})")
    return doc


def _requests(doc: dict, path) -> tuple[list, int]:
    """(input_len, output_len, start_s or None, ttft_s, [itl_s]) of the successful
    requests, and how many were skipped (an error, no first token)."""
    errs = doc.get("errors") if isinstance(doc.get("errors"), list) else None
    starts = doc.get("start_times")
    out, skipped = [], 0
    for i in range(len(doc["input_lens"])):
        if errs is not None and errs[i]:
            skipped += 1
            continue
        try:
            inp, osl = int(doc["input_lens"][i]), int(doc["output_lens"][i])
            ttft = float(doc["ttfts"][i])
            itl = [float(x) for x in doc["itls"][i]]
            st = None if starts is None else float(starts[i])
        except (TypeError, ValueError):
            raise _bad(path, f"request {i}: expected numbers in input_lens, output_lens, "
                             "ttfts, itls, start_times") from None
        vals = [ttft, *itl, *(() if st is None else (st,))]
        if not all(math.isfinite(v) for v in vals) or inp < 1 or ttft <= 0 \
                or any(x < 0 for x in itl):
            if ttft <= 0 and not itl:
                skipped += 1  # a request that never produced a token
                continue
            raise _bad(path, f"request {i}: expected input_len >= 1, ttft > 0, itls >= 0 "
                             "(finite)")
        out.append((inp, osl, st, ttft, itl))
    return out, skipped


def reconstruct(reqs: list, serial: bool, tol_ms: float | None = None) -> Steps:
    """The engine's steps (module docstring)."""
    if serial:
        # one request at a time: its TTFT is a prefill step of its prompt, each ITL a
        # decode step of one sequence; requests placed back to back
        X, ms, t0s, t1s, arr, first, toks = [], [], [], [], [], [], []
        t = 0.0
        for inp, _osl, _st, ttft, itl in reqs:
            arr.append(t)
            first.append(len(ms))
            steps = [len(ms)]
            X.append((1.0, inp, 0.0, 0.0))
            ms.append(ttft * 1e3)
            t0s.append(t)
            t += ttft * 1e3
            t1s.append(t)
            for j, x in enumerate(itl, start=1):
                X.append((1.0, 0.0, 1.0, float(inp + j)))
                ms.append(x * 1e3)
                t0s.append(t)
                t += x * 1e3
                t1s.append(t)
                steps.append(len(ms) - 1)
            toks.append(steps)
        return Steps(np.array(X, dtype=np.float64).reshape(-1, 4), np.array(ms),
                     np.array(t0s), np.array(t1s), np.array(arr), first, toks)
    # token emission times (ms) of every request
    base = min(st for _i, _o, st, _t, _l in reqs)
    emit = []
    for r, (inp, _osl, st, ttft, itl) in enumerate(reqs):
        t = (st - base + ttft) * 1e3
        emit.append((t, r, 0))
        for j, x in enumerate(itl, start=1):
            t += x * 1e3
            emit.append((t, r, j))
    emit.sort()
    times = np.array([e[0] for e in emit])
    if tol_ms is None:
        itls = np.array([x for r in reqs for x in r[4] if x > 0]) * 1e3
        tol_ms = 0.25 * float(np.median(itls)) if len(itls) else 1e-3
    # emission times closer than tol to the previous one belong to the same step; a step
    # ends at the mean of its emissions (client timestamps jitter around the engine's)
    step_of = np.concatenate([[0], np.cumsum(np.diff(times) > tol_ms)]).astype(np.int64)
    nsteps = int(step_of[-1]) + 1 if len(times) else 0
    ends = np.bincount(step_of, weights=times, minlength=nsteps) / np.bincount(
        step_of, minlength=nsteps)
    P = np.zeros(nsteps)
    B = np.zeros(nsteps)
    K = np.zeros(nsteps)
    latest_arrival = np.full(nsteps, -np.inf)
    first = [0] * len(reqs)
    toks = [[] for _ in reqs]
    arr = np.array([(st - base) * 1e3 for _i, _o, st, _t, _l in reqs])
    for (t, r, j), k in zip(emit, step_of):
        inp = reqs[r][0]
        toks[r].append(int(k))
        if j == 0:
            P[k] += inp
            first[r] = int(k)
            latest_arrival[k] = max(latest_arrival[k], arr[r])
        else:
            B[k] += 1
            K[k] += inp + j
    end = np.array(ends)
    prev = np.concatenate([[-np.inf], end[:-1]])
    start = np.maximum(prev, latest_arrival)
    # every step has a finite start: the first one prefills (the earliest emission is a
    # first token), later ones follow a previous end
    X = np.stack([np.ones(nsteps), P, B, K], axis=1)
    return Steps(X, end - start, start, end, arr, first, toks)


def _lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative error (rows weighted by 1 / y): steps of 5 ms and of
    500 ms count alike, as the MAPE printed does."""
    w = 1.0 / np.maximum(y, 1e-12)
    coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    return coef


def fit_bench(path: str | Path, *, tol_ms: float | None = None) -> Fit:
    """Fit the step-time coefficients to ``path`` (module docstring); BenchFileError with
    one line when the file is malformed or holds too little to fit."""
    p = Path(path)
    doc = load_result(p)
    reqs, skipped = _requests(doc, p)
    if not reqs:
        raise _bad(p, "no successful request to fit")
    has_starts = all(r[2] is not None for r in reqs)
    serial = not has_starts
    if serial and doc.get("max_concurrency") != 1:
        raise _bad(p, "no start_times (vLLM before they were saved): only a serial run "
                      "(--max-concurrency 1) can be rebuilt into steps")
    steps = reconstruct(reqs, serial, tol_ms)
    good = np.isfinite(steps.ms) & (steps.ms > 0)
    X, y = steps.X[good], steps.ms[good]
    if len(y) < MIN_STEPS:
        raise _bad(p, f"too little data: {len(y)} engine steps rebuilt from {len(reqs)} "
                      f"requests, at least {MIN_STEPS} needed")
    if np.linalg.matrix_rank(X / np.maximum(np.abs(X).max(axis=0), 1e-300)) < X.shape[1]:
        raise _bad(p, "too little variety to fit: the steps need both prefill and decode "
                      "steps and decode batches of more than one size and context")
    coef = _lstsq(X, y)
    mape = _mape(steps, coef, reqs, serial)
    src = {"tool": "vllm bench serve", "file": p.name,
           "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
           "model_id": str(doc.get("model_id", "")), "backend": str(doc.get("backend", "")),
           "date": str(doc.get("date", "")), "max_concurrency": doc.get("max_concurrency"),
           "request_rate": doc.get("request_rate"),
           "reconstruction": "serial" if serial else "timeline"}
    return Fit(coef, steps, mape, len(reqs), skipped, src)


def step_ms(coef, X) -> np.ndarray:
    return X @ np.asarray(coef, dtype=np.float64)


def _mape(steps: Steps, coef, reqs, serial) -> dict:
    """Mean and worst |predicted / observed - 1| of step times, TTFT and ITL."""
    pred = step_ms(coef, steps.X)
    out = {}

    def put(name, got, want):
        got, want = np.asarray(got, float), np.asarray(want, float)
        ok = np.isfinite(got) & np.isfinite(want) & (want > 0)
        e = np.abs(got[ok] / want[ok] - 1)
        out[name] = (float(e.mean()) if len(e) else 0.0, float(e.max()) if len(e) else 0.0,
                     int(len(e)))

    put("step", pred, steps.ms)
    ttft_p, ttft_o, itl_p, itl_o = [], [], [], []
    for r, (_inp, _osl, _st, ttft, itl) in enumerate(reqs):
        k = steps.first_step[r]
        wait = 0.0 if serial else steps.start_ms[k] - steps.arrival_ms[r]
        ttft_p.append(wait + pred[k])
        ttft_o.append(ttft * 1e3)
        ks = steps.token_steps[r]
        for j in range(1, len(ks)):
            a, b = ks[j - 1], ks[j]
            if b == a:
                continue  # two tokens in one step (client-side bunching)
            # the steps between two tokens of this request, and any idle gap (none while
            # it runs)
            itl_p.append(float(pred[a + 1:b + 1].sum()))
            itl_o.append(itl[j - 1] * 1e3)
    put("ttft", ttft_p, ttft_o)
    put("itl", itl_p, itl_o)
    return out


def write_profile(fit: Fit, out: str | Path, model: str | None = None,
                  gpu: str | None = None) -> None:
    """The fitted timing profile (TOML) with provenance, written atomically."""
    from kvsim.core.fsutil import atomic_output

    a, b, c, d = (float(x) for x in fit.coef)
    s = fit.source
    lines = [
        "# Step-time coefficients fitted by `kvsim calibrate --from-vllm-bench` to a",
        "# `vllm bench serve --save-result --save-detailed` result",
        "# (kvsim/engine/timing/fitted.py).",
        "# step_ms = a + b * prefill_tokens + c * decode_batch + d * decode_context_sum",
        f'schema = "{SCHEMA}"',
        f'model = "{model or s.get("model_id", "")}"',
        f'gpu = "{gpu or ""}"',
        "",
        "[source]",
        f'tool = "{s["tool"]}"',
        f'file = {json.dumps(s["file"])}',
        f'sha256 = "{s["sha256"]}"',
        f'model_id = {json.dumps(s["model_id"])}',
        f'backend = {json.dumps(s["backend"])}',
        f'bench_date = {json.dumps(s["date"])}',
        f'reconstruction = "{s["reconstruction"]}"',
        f"requests = {fit.requests}",
        f"skipped_requests = {fit.skipped}",
        f"steps = {int(np.isfinite(fit.steps.ms).sum())}",
        f'fitted = "{_dt.date.today().isoformat()}"',
        'generator = "kvsim calibrate --from-vllm-bench"',
        "",
        "[fit]",
        f"a_ms = {a!r}",
        f"b_ms_per_prefill_token = {b!r}",
        f"c_ms_per_decode_seq = {c!r}",
        f"d_ms_per_context_token = {d!r}",
        "",
        "[check]",
        "# |predicted / observed - 1| on the same file: mean, worst, count",
    ]
    for k, (mean, worst, n) in fit.mape.items():
        lines.append(f"{k} = {{ mean = {mean:.6g}, worst = {worst:.6g}, count = {n} }}")
    with atomic_output(Path(out)) as tmp:
        Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_profile(path: str | Path) -> tuple[np.ndarray, dict]:
    """(coefficients a, b, c, d in ms, the whole document) of a fitted profile."""
    import tomllib

    p = Path(path)
    with open(p, "rb") as f:
        doc = tomllib.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{p}: schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    fit = doc.get("fit", {})
    try:
        coef = np.array([float(fit[k]) for k in TERMS])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{p}: [fit] needs {', '.join(TERMS)}") from None
    return coef, doc
