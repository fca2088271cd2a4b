"""``measured``: engine step times from AIConfigurator's measured kernel database.

A step (one forward pass of one engine, all its TP ranks together) is split the way
AIConfigurator (aiconfigurator-core 0.12.0, Apache-2.0) composes it from kernels measured
on real GPUs under vLLM:

    step_ms = nonattn_ms(tokens)                      GEMMs, norms, activations, MoE,
                                                      all-reduce, logits
            + prefill_attn_ms(chunks)                 flash attention of the prefill chunks
            + decode_attn_ms(batch, mean context)     paged attention of the decode batch

* ``nonattn_ms`` is a 1-D table over scheduled tokens, interpolated linearly (GEMM time
  is flat while weight-bound and linear once compute-bound; the table holds the knee).
  A step with any prefill uses the prefill table at prefill tokens + decode batch (as
  AIConfigurator's mixed step does); a decode-only step uses the decode table at its batch.
* ``prefill_attn_ms``: one chunk alone costs ``h(chunk_tokens, context_before)``, a 2-D
  table bilinear in (log2 chunk, log2(context_before + offset)) on log(ms).  Chunks batched
  into one step share the kernel's fixed cost: each costs its marginal ``g(chunk, context)``
  (a second table: the slope of AIConfigurator's attention of b such chunks over b = 1..16),
  plus the largest ``h - g`` among them once, so a lone chunk costs exactly ``h`` and b
  equal chunks ``h + (b - 1) g``.
* ``decode_attn_ms`` is a 2-D table over (batch, mean context tokens), bilinear in
  (log2 batch, log2 context) on log(ms).  Attention over a batch reads every sequence's
  KV, so batch and total context (batch x mean) are what sets its time.

Every number comes from a profile file (``profiles/timing/<gpu>__<model>__tp<N>.toml``)
written by ``bench/timing/extract_aic.py`` with its source, AIConfigurator version,
database version and date beside the tables.  Pure stdlib: no kvsim import, no numpy
needed; a step costs a few microseconds (bench/timing/bench_step_time.py times it).
"""

from __future__ import annotations

import math
import os
import pickle
import tomllib
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from pathlib import Path

SCHEMA = "kvsim.timing.measured/1"  # the profile format this module reads
PROFILE_SUFFIX = ".toml"


def _profile_name(gpu: str, model: str, tp: int) -> str:
    return f"{gpu}__{model}__tp{int(tp)}{PROFILE_SUFFIX}"


def bundled_dir() -> Path:
    """Where the bundled profiles live: ``kvsim.profiles``'s ``timing/`` (package data),
    else ``profiles/timing`` of a source checkout next to this file."""
    try:
        from importlib import resources

        d = resources.files("kvsim.profiles").joinpath("timing")
        if d.is_dir():
            return Path(str(d))
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    here = Path(__file__).resolve()
    # installed: kvsim/profiles/timing; source checkout: <repo>/profiles/timing
    for d in (here.parents[2] / "profiles" / "timing", here.parents[3] / "profiles" / "timing"):
        if d.is_dir():
            return d
    return here.parents[3] / "profiles" / "timing"


def available(directory: str | Path | None = None) -> list[tuple[str, str, int]]:
    """(gpu, model, tp) of every profile in ``directory`` (default: the bundled ones)."""
    d = Path(directory) if directory is not None else bundled_dir()
    out = []
    if d.is_dir():
        for p in sorted(d.glob(f"*{PROFILE_SUFFIX}")):
            parts = p.name[: -len(PROFILE_SUFFIX)].split("__")
            if len(parts) == 3 and parts[2].startswith("tp") and parts[2][2:].isdigit():
                out.append((parts[0], parts[1], int(parts[2][2:])))
    return out


class _Linear1D:
    """Piecewise-linear y(x); below the first point the first value, past the last point
    the last segment extended."""

    __slots__ = ("xs", "ys", "n")

    def __init__(self, xs: Sequence[float], ys: Sequence[float]):
        self.xs = [float(x) for x in xs]
        self.ys = [float(y) for y in ys]
        self.n = len(self.xs)

    def __call__(self, x: float) -> float:
        xs = self.xs
        if x <= xs[0]:
            return self.ys[0]
        i = bisect_right(xs, x) - 1
        if i >= self.n - 1:
            i = self.n - 2
        x0 = xs[i]
        f = (x - x0) / (xs[i + 1] - x0)
        y0 = self.ys[i]
        return y0 + f * (self.ys[i + 1] - y0)


class _LogBilinear:
    """z(x, y) from a grid, bilinear on log(z) in the coordinates u = log2(x + x_offset),
    v = log2(y + y_offset); clamped below the first grid point, extended past the last."""

    __slots__ = ("us", "vs", "lz", "xo", "yo", "nu", "nv")

    def __init__(self, xs, ys, zs, x_offset: float = 0.0, y_offset: float = 0.0):
        self.xo = float(x_offset)
        self.yo = float(y_offset)
        self.us = [math.log2(float(x) + self.xo) for x in xs]
        self.vs = [math.log2(float(y) + self.yo) for y in ys]
        self.nu, self.nv = len(self.us), len(self.vs)
        if len(zs) != self.nu or any(len(r) != self.nv for r in zs):
            raise ValueError(f"table is {len(zs)} x ? but its axes are {self.nu} x {self.nv}")
        self.lz = [[math.log(float(z)) for z in row] for row in zs]

    @staticmethod
    def _seg(axis, n, a):
        if a <= axis[0]:
            return 0, 0.0
        i = bisect_right(axis, a) - 1
        if i >= n - 1:
            i = n - 2
        return i, (a - axis[i]) / (axis[i + 1] - axis[i])

    def __call__(self, x: float, y: float) -> float:
        i, f = self._seg(self.us, self.nu, math.log2(x + self.xo))
        j, g = self._seg(self.vs, self.nv, math.log2(y + self.yo))
        r0, r1 = self.lz[i], self.lz[i + 1]
        a = r0[j] + g * (r0[j + 1] - r0[j])
        b = r1[j] + g * (r1[j + 1] - r1[j])
        return math.exp(a + f * (b - a))


def _need(d: dict, key: str, where: str):
    if key not in d:
        raise ValueError(f"{where}: missing {key!r}")
    return d[key]


class MeasuredStepTime:
    """Step times of one (GPU, model, TP) from a measured profile.

    >>> m = MeasuredStepTime.bundled("h100-sxm", "llama-3.1-8b", 1)   # doctest: +SKIP
    >>> m.prefill_ms(1000)                  # a lone 1,000-token prompt       # doctest: +SKIP
    >>> m.decode_ms(16, 8192)               # 16 sequences at 8k context      # doctest: +SKIP
    >>> m.step_ms([(2048, 4096)], [3000] * 64)   # a chunk + 64 decodes       # doctest: +SKIP
    """

    def __init__(self, profile: dict, source: str = "<dict>"):
        where = str(source)
        schema = profile.get("schema")
        if schema != SCHEMA:
            raise ValueError(f"{where}: schema is {schema!r}, this module reads {SCHEMA!r}")
        self.gpu: str = _need(profile, "gpu", where)
        self.model: str = _need(profile, "model", where)
        self.tp: int = int(_need(profile, "tp", where))
        self.source: dict = dict(profile.get("source", {}))
        self.path = source
        pn = _need(profile, "prefill_nonattn", where)
        dn = _need(profile, "decode_nonattn", where)
        pa = _need(profile, "prefill_attn", where)
        da = _need(profile, "decode_attn", where)
        self._prefill_nonattn_ms = _Linear1D(_need(pn, "tokens", where), _need(pn, "ms", where))
        self._decode_nonattn_ms = _Linear1D(_need(dn, "batch", where), _need(dn, "ms", where))
        self._prefill_attn_ms = _LogBilinear(
            _need(pa, "chunk_tokens", where),
            _need(pa, "context_before_tokens", where),
            _need(pa, "ms", where),
            0.0,
            float(_need(pa, "context_offset_tokens", where)),
        )
        self._prefill_attn_marginal_ms = _LogBilinear(
            pa["chunk_tokens"],
            pa["context_before_tokens"],
            _need(pa, "marginal_ms", where),
            0.0,
            float(pa["context_offset_tokens"]),
        )
        self._decode_attn_ms = _LogBilinear(
            _need(da, "batch", where), _need(da, "context_tokens", where), _need(da, "ms", where)
        )
        self._min_chunk = float(pa["chunk_tokens"][0])
        self._min_ctx = float(da["context_tokens"][0])

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> MeasuredStepTime:
        p = Path(path)
        return cls(_parsed(p), str(p))

    @classmethod
    def bundled(
        cls, gpu: str, model: str, tp: int = 1, directory: str | Path | None = None
    ) -> MeasuredStepTime:
        """The profile for (gpu, model, tp); ValueError naming what is missing if none."""
        d = Path(directory) if directory is not None else bundled_dir()
        p = d / _profile_name(gpu, model, tp)
        if not p.is_file():
            have = available(d)
            same = sorted(t for g, m, t in have if g == gpu and m == model)
            hint = (
                f"TP {', '.join(map(str, same))} only"
                if same
                else "bundled: " + (", ".join(f"{g}/{m}/tp{t}" for g, m, t in have) or "none")
            )
            raise ValueError(
                f"no measured step-time data for model {model!r} on GPU {gpu!r} at TP {int(tp)} "
                f"in {d} ({hint})"
            )
        return cls.from_file(p)

    # ---- components ---------------------------------------------------------------
    def chunk_attn_ms(self, chunk_tokens: float, context_before_tokens: float = 0.0) -> float:
        """Prefill attention of one chunk alone in a step."""
        c = chunk_tokens if chunk_tokens > self._min_chunk else self._min_chunk
        return self._prefill_attn_ms(c, context_before_tokens if context_before_tokens > 0 else 0.0)

    def prefill_attn_ms(self, prefill_chunks: Iterable[tuple[float, float]]) -> float:
        """Prefill attention of the chunks of one step (chunk_tokens, context_before_tokens)."""
        return self._prefill(prefill_chunks)[1]

    def _prefill(self, prefill_chunks):
        """(prefill tokens, attention ms) of a step's chunks: a lone chunk costs h; several
        cost the sum of their marginals g plus the largest h - g among them once."""
        lo = self._min_chunk
        chunks = [(c, p) for c, p in prefill_chunks if c > 0]
        if not chunks:
            return 0.0, 0.0
        tokens = float(sum(c for c, _ in chunks))
        if len(chunks) == 1:
            c, p = chunks[0]
            return tokens, self._prefill_attn_ms(c if c > lo else lo, p if p > 0 else 0.0)
        marginal = 0.0
        best = -math.inf
        for c, p in chunks:
            c = c if c > lo else lo
            p = p if p > 0 else 0.0
            g = self._prefill_attn_marginal_ms(c, p)
            marginal += g
            extra = self._prefill_attn_ms(c, p) - g
            if extra > best:
                best = extra
        return tokens, marginal + best

    def decode_attn_ms(self, batch: int, mean_context_tokens: float) -> float:
        """Decode attention of ``batch`` sequences whose contexts average ``mean_context_tokens``."""
        if batch <= 0:
            return 0.0
        c = mean_context_tokens if mean_context_tokens > self._min_ctx else self._min_ctx
        return self._decode_attn_ms(batch, c)

    # ---- steps ----------------------------------------------------------------------
    def step_ms_sums(
        self,
        prefill_chunks: Iterable[tuple[float, float]],
        decode_batch: int,
        decode_context_tokens_sum: float,
    ) -> float:
        """``step_ms`` for a caller that keeps the decode batch's size and context sum."""
        tokens, attn = self._prefill(prefill_chunks)
        if tokens > 0:
            ms = self._prefill_nonattn_ms(tokens + decode_batch) + attn
        elif decode_batch > 0:
            ms = self._decode_nonattn_ms(decode_batch)
        else:
            return 0.0
        if decode_batch > 0:
            ms += self.decode_attn_ms(decode_batch, decode_context_tokens_sum / decode_batch)
        return ms

    def step_ms(
        self,
        prefill_chunks: Iterable[tuple[float, float]] = (),
        decode_contexts: Sequence[float] = (),
    ) -> float:
        """One engine step: ``prefill_chunks`` as (chunk_tokens, context_before_tokens) pairs
        (tokens computed this step, tokens of that sequence already in the KV cache), and
        the context length (tokens in the KV cache) of each decoding sequence."""
        b = len(decode_contexts)
        total = decode_contexts.sum() if hasattr(decode_contexts, "sum") else sum(decode_contexts)
        return self.step_ms_sums(prefill_chunks, b, float(total))

    def prefill_ms(self, prompt_tokens: int, batch: int = 1, context_before_tokens: int = 0) -> float:
        """A prefill-only step of ``batch`` prompts of ``prompt_tokens`` new tokens each."""
        b = int(batch)
        if b <= 0 or prompt_tokens <= 0:
            return 0.0
        c = prompt_tokens if prompt_tokens > self._min_chunk else self._min_chunk
        p = context_before_tokens if context_before_tokens > 0 else 0.0
        attn = self._prefill_attn_ms(c, p)
        if b > 1:
            attn += (b - 1) * self._prefill_attn_marginal_ms(c, p)
        return self._prefill_nonattn_ms(float(prompt_tokens) * b) + attn

    def decode_ms(self, batch: int, context_tokens: float) -> float:
        """A decode-only step of ``batch`` sequences of ``context_tokens`` each."""
        return self.step_ms_sums((), int(batch), float(context_tokens) * int(batch))

    def __repr__(self) -> str:
        s = self.source
        return (
            f"MeasuredStepTime({self.gpu}/{self.model}/tp{self.tp}: {s.get('tool', '?')} "
            f"{s.get('version', '?')}, {s.get('backend', '?')} {s.get('backend_version', '?')})"
        )


#: (path, size, modification time) -> the file's TOML, pickled: a closed-loop run reads its
#: step-time profile 4 times (timing name, cost model, scheduler, sizing), ~10 ms a parse.
_PARSED: dict[tuple[str, int, int], bytes] = {}


def _parsed(path: Path) -> dict:
    """``path``'s TOML, parsed once per process while the file is unchanged (a fresh dict
    each call, as a parse gives)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
        if key not in _PARSED:
            _PARSED[key] = pickle.dumps(tomllib.load(f), protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.loads(_PARSED[key])
