"""The step duration of the compiled scheduler: one function, two timing models.

:func:`step_duration_us` is what :func:`kvsim.engine.scheduler.run_steps` calls once per
engine step.  The scheduler feeds it per-step aggregates as it builds the batch
(:func:`acc_chunk` for every prefill chunk, :func:`acc_decode` for every decoding
sequence, on a small array ``acc`` reset by :func:`acc_reset` at the start of a step) plus
the roofline's own sums (scheduled tokens, attended positions, KV tokens read).  Which
model prices the step is in the packed parameters ``fp``
(:meth:`kvsim.engine.engine_model.StepCostModel.as_array`):

* ``fp[Q_KIND] == 0``: ``roofline`` (kvsim.engine.engine_model's docstring):
  ``max(memory_us, compute_us) + step_overhead_us``, unchanged;
* ``fp[Q_KIND] == 2``: ``fitted`` (:mod:`kvsim.engine.timing.fitted`):
  ``a + b * prefill_tokens + c * decode_batch + d * decode_context_sum`` ms;
* ``fp[Q_KIND] == 1``: ``measured``: the tables of one
  :class:`kvsim.engine.timing.measured.MeasuredStepTime` profile, flattened by
  :func:`pack_measured` after the roofline constants, evaluated exactly as
  ``MeasuredStepTime.step_ms_sums`` does (same tables, same interpolation, same order of
  operations; ``tests/timing/test_step_time.py`` checks equality to 1e-9 on random
  steps), times 1,000.  AIConfigurator's step is the whole forward pass; the roofline's
  assumed ``step_overhead_us`` is not added to it.

Speculative decoding (a sequence verifying ``1 + k`` tokens): the non-attention tables are
read at the step's scheduled tokens (``k`` extra per such sequence), attention at the
number of decoding sequences and their KV lengths.  Without drafts this is exactly
``MeasuredStepTime.step_ms``.
"""

from __future__ import annotations

import math

import numpy as np

from kvsim.jit.decorators import njit

# the roofline constants occupy fp[0:7] (kvsim.engine.scheduler.Q_*); then the model kind
Q_KIND = 7
KIND_ROOFLINE, KIND_MEASURED, KIND_FITTED = 0.0, 1.0, 2.0
#: fitted (kvsim.engine.timing.fitted): fp[T0:T0+4] = a, b, c, d (ms)
F_A, F_B, F_C, F_D = range(4)
#: first index of the measured model's header in fp
T0 = 8
# header fields (relative to T0): point counts and absolute offsets into fp
(H_PN_N, H_PN_X, H_PN_Y, H_DN_N, H_DN_X, H_DN_Y,
 H_PA_NU, H_PA_NV, H_PA_U, H_PA_V, H_PA_H, H_PA_G, H_PA_YO,
 H_DA_NU, H_DA_NV, H_DA_U, H_DA_V, H_DA_Z, H_MIN_CHUNK, H_MIN_CTX, H_PN_SLOPE) = range(21)
NUM_HEADER = 21

# per-step aggregates (acc): prefill tokens, prefill chunks, sum of the chunks' marginal
# attention g, the largest h - g, the lone chunk's h, decoding sequences, decode tokens
# (sequences + draft tokens), sum of their KV lengths
(A_PTOK, A_NCH, A_SUMG, A_MAXX, A_H1, A_DSEQ, A_DTOK, A_DCTX) = range(8)
NUM_ACC = 8


def pack_measured(m) -> np.ndarray:
    """The header and tables of ``m`` (a ``MeasuredStepTime``) as one float64 array, to be
    appended at ``fp[T0:]`` (offsets in the header are absolute indices into ``fp``).
    The log-space axes and values are taken from ``m``'s own interpolators, so the compiled
    evaluation reads bit-identical numbers."""
    pn, dn = m._prefill_nonattn_ms, m._decode_nonattn_ms
    ph, pg, da = m._prefill_attn_ms, m._prefill_attn_marginal_ms, m._decode_attn_ms
    if ph.us != pg.us or ph.vs != pg.vs or ph.yo != pg.yo or ph.xo != 0.0 or da.xo != 0.0 \
            or da.yo != 0.0:
        raise ValueError(f"{m.path}: prefill attention tables on different axes")
    parts: list[list[float]] = []
    header = [0.0] * NUM_HEADER
    pos = T0 + NUM_HEADER

    def put(values) -> float:
        nonlocal pos
        start = pos
        vals = [float(v) for v in values]
        parts.append(vals)
        pos += len(vals)
        return float(start)

    header[H_PN_N] = float(pn.n)
    header[H_PN_X] = put(pn.xs)
    header[H_PN_Y] = put(pn.ys)
    header[H_DN_N] = float(dn.n)
    header[H_DN_X] = put(dn.xs)
    header[H_DN_Y] = put(dn.ys)
    header[H_PA_NU], header[H_PA_NV] = float(ph.nu), float(ph.nv)
    header[H_PA_U] = put(ph.us)
    header[H_PA_V] = put(ph.vs)
    header[H_PA_H] = put(z for row in ph.lz for z in row)
    header[H_PA_G] = put(z for row in pg.lz for z in row)
    header[H_PA_YO] = ph.yo
    header[H_DA_NU], header[H_DA_NV] = float(da.nu), float(da.nv)
    header[H_DA_U] = put(da.us)
    header[H_DA_V] = put(da.vs)
    header[H_DA_Z] = put(z for row in da.lz for z in row)
    header[H_MIN_CHUNK] = m._min_chunk
    header[H_MIN_CTX] = m._min_ctx
    header[H_PN_SLOPE] = (pn.ys[-1] - pn.ys[-2]) / (pn.xs[-1] - pn.xs[-2])
    return np.array(header + [v for p in parts for v in p], dtype=np.float64)


@njit(cache=True, _nrt=False)
def _seg(fp, start, n, a):
    """(i, f) of ``a`` on the axis ``fp[start:start+n]``: the segment whose left point is
    the last one <= a (``bisect_right - 1``), clamped to [0, n-2]; f = 0 below the axis."""
    if a <= fp[start]:
        return 0, 0.0
    lo = 0
    hi = n  # first index with axis > a, as bisect_right
    while lo < hi:
        mid = (lo + hi) // 2
        if a < fp[start + mid]:
            hi = mid
        else:
            lo = mid + 1
    i = lo - 1
    if i >= n - 1:
        i = n - 2
    x0 = fp[start + i]
    return i, (a - x0) / (fp[start + i + 1] - x0)


@njit(cache=True, _nrt=False)
def _linear(fp, hn, hx, hy, x):
    """``measured._Linear1D``: piecewise-linear, first value below, last segment beyond."""
    n = np.int64(fp[T0 + hn])
    xs = np.int64(fp[T0 + hx])
    ys = np.int64(fp[T0 + hy])
    if x <= fp[xs]:
        return fp[ys]
    i, f = _seg(fp, xs, n, x)
    y0 = fp[ys + i]
    return y0 + f * (fp[ys + i + 1] - y0)


@njit(cache=True, _nrt=False)
def _log_bilinear(fp, nu, nv, us, vs, zs, x, y, yo):
    """``measured._LogBilinear`` (x offset 0): bilinear on log(z) in (log2 x, log2(y + yo))."""
    i, f = _seg(fp, us, nu, math.log2(x))
    j, g = _seg(fp, vs, nv, math.log2(y + yo))
    r0 = zs + i * nv
    r1 = r0 + nv
    a = fp[r0 + j] + g * (fp[r0 + j + 1] - fp[r0 + j])
    b = fp[r1 + j] + g * (fp[r1 + j + 1] - fp[r1 + j])
    return math.exp(a + f * (b - a))


@njit(cache=True, _nrt=False)
def _prefill_attn(fp, zs_field, c, p):
    """h (``zs_field == H_PA_H``) or g (``H_PA_G``) of a chunk of c tokens after p."""
    return _log_bilinear(fp, np.int64(fp[T0 + H_PA_NU]), np.int64(fp[T0 + H_PA_NV]),
                         np.int64(fp[T0 + H_PA_U]), np.int64(fp[T0 + H_PA_V]),
                         np.int64(fp[T0 + zs_field]), c, p, fp[T0 + H_PA_YO])


@njit(cache=True, _nrt=False)
def acc_reset(acc):
    for k in range(NUM_ACC):
        acc[k] = 0.0
    acc[A_MAXX] = -np.inf


@njit(cache=True, _nrt=False)
def acc_chunk(fp, acc, chunk_tokens, context_before_tokens):
    """A prefill chunk of ``chunk_tokens`` computed this step after
    ``context_before_tokens`` of its sequence already in the KV cache."""
    if chunk_tokens <= 0:
        return
    acc[A_PTOK] += chunk_tokens
    acc[A_NCH] += 1.0
    if fp[Q_KIND] != KIND_MEASURED:
        return
    lo = fp[T0 + H_MIN_CHUNK]
    c = float(chunk_tokens)
    c = c if c > lo else lo
    p = float(context_before_tokens)
    p = p if p > 0 else 0.0
    h = _prefill_attn(fp, np.int64(H_PA_H), c, p)  # typed, not literals: one compile
    g = _prefill_attn(fp, np.int64(H_PA_G), c, p)
    if acc[A_NCH] == 1.0:
        acc[A_H1] = h
    acc[A_SUMG] += g
    if h - g > acc[A_MAXX]:
        acc[A_MAXX] = h - g


@njit(cache=True, _nrt=False)
def acc_decode(acc, tokens, context_tokens):
    """A decoding sequence computing ``tokens`` tokens (1, or 1 + draft tokens) with
    ``context_tokens`` in its KV cache (this step's tokens included)."""
    acc[A_DSEQ] += 1.0
    acc[A_DTOK] += tokens
    acc[A_DCTX] += context_tokens


@njit(cache=True, _nrt=False)
def measured_step_ms(fp, acc):
    """``MeasuredStepTime.step_ms_sums`` of the aggregates in ``acc``."""
    ptok = acc[A_PTOK]
    nseq = acc[A_DSEQ]
    if ptok > 0:
        attn = acc[A_H1] if acc[A_NCH] == 1.0 else acc[A_SUMG] + acc[A_MAXX]
        ms = _linear(fp, H_PN_N, H_PN_X, H_PN_Y, ptok + acc[A_DTOK]) + attn
    elif nseq > 0:
        ms = _linear(fp, H_DN_N, H_DN_X, H_DN_Y, acc[A_DTOK])
    else:
        return 0.0
    if nseq > 0:
        ctx = acc[A_DCTX] / nseq
        lo = fp[T0 + H_MIN_CTX]
        ctx = ctx if ctx > lo else lo
        ms += _log_bilinear(fp, np.int64(fp[T0 + H_DA_NU]), np.int64(fp[T0 + H_DA_NV]),
                            np.int64(fp[T0 + H_DA_U]), np.int64(fp[T0 + H_DA_V]),
                            np.int64(fp[T0 + H_DA_Z]), nseq, ctx, 0.0)
    return ms


@njit(cache=True, _nrt=False)
def prefill_cost_us(fp, start, m):
    """Compute time of ``m`` prefill tokens at positions [start, start + m): a block's
    ``recompute_cost_us``, a lost hit's recompute in the closed loop, the slack estimates.
    A marginal cost (what these tokens add to a step), not a step:

    * roofline: ``(2 P m + 4 L d (m start + m (m + 1) / 2)) / FLOP/s`` (engine_model);
    * measured: ``m`` x the per-token slope of the non-attention table's last segment (its
      compute-bound regime, 20.3 us a token for Llama-3.1-8B on H100) plus the chunk's
      marginal attention ``g(m, start)`` (the prefill-attention cost it adds to a batch).
    """
    mf = float(m)
    if fp[Q_KIND] == KIND_FITTED:
        return 1000.0 * fp[T0 + F_B] * mf
    if fp[Q_KIND] == KIND_MEASURED:
        if mf <= 0:
            return 0.0
        lo = fp[T0 + H_MIN_CHUNK]
        c = mf if mf > lo else lo
        p = float(start)
        p = p if p > 0 else 0.0
        return 1000.0 * (fp[T0 + H_PN_SLOPE] * mf + _prefill_attn(fp, np.int64(H_PA_G), c, p))
    att = mf * start + mf * (mf + 1.0) / 2.0
    return (2.0 * fp[5] * mf + 4.0 * fp[6] * att) / fp[4]


@njit(cache=True, _nrt=False)
def step_duration_us(fp, acc, tokens, attended, kv_read):
    """The step's duration in microseconds: the roofline of (scheduled tokens, attended
    positions, KV tokens read), or the measured model of ``acc`` (module docstring)."""
    if fp[Q_KIND] == KIND_MEASURED:
        return 1000.0 * measured_step_ms(fp, acc)
    if fp[Q_KIND] == KIND_FITTED:
        return 1000.0 * (fp[T0 + F_A] + fp[T0 + F_B] * acc[A_PTOK] + fp[T0 + F_C] * acc[A_DSEQ]
                         + fp[T0 + F_D] * acc[A_DCTX])
    # roofline (fp[0:7]: kvsim.engine.scheduler.Q_OVER, Q_WBYTES, Q_KVBPT, Q_BW, Q_FLOPS,
    # Q_ACTIVE, Q_LH)
    mem = (fp[1] + fp[2] * kv_read) / fp[3]
    comp = (2.0 * fp[5] * tokens + 4.0 * fp[6] * attended) / fp[4]
    return max(mem, comp) + fp[0]


@njit(cache=True)
def one_step_us(fp, chunk_tokens, chunk_before, decode_tokens, decode_context):
    """One step's duration from its chunks and decodes, through the scheduler's own
    functions (tests, bench/timing/bench_step_time.py).  Roofline sums as the scheduler
    forms them (chunk: positions [before, before + c); decode of t tokens at KV length L:
    attended t (2L - t + 1) / 2, reads L)."""
    acc = np.empty(NUM_ACC, dtype=np.float64)
    acc_reset(acc)
    tokens = 0.0
    attended = 0.0
    kv_read = 0.0
    for r in range(len(decode_tokens)):
        t = float(decode_tokens[r])
        ctx = float(decode_context[r])
        acc_decode(acc, t, ctx)
        tokens += t
        attended += t * (2.0 * ctx - t + 1.0) / 2.0
        kv_read += ctx
    for r in range(len(chunk_tokens)):
        c = float(chunk_tokens[r])
        p = float(chunk_before[r])
        acc_chunk(fp, acc, c, p)
        tokens += c
        attended += c * p + c * (c + 1.0) / 2.0
        kv_read += p + c
    return step_duration_us(fp, acc, tokens, attended, kv_read)
