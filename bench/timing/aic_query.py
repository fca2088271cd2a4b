"""AIConfigurator (aiconfigurator-core 0.12.0) step-time queries shared by
bench/timing/extract_aic.py and bench/timing/bench_step_time.py.

Runs only where ``aiconfigurator`` is installed (``pip install aiconfigurator==0.12.0``;
no GPU needed: its estimates come from the kernel-timing database it ships).  kvsim itself
never imports this module.

One forward pass ("step") of vLLM on one engine (TP ranks together), as AIConfigurator's
compiled engine (``aiconfigurator_core.sdk.engine.EngineHandle``) estimates it:

* prefill of ``batch`` prompts of ``isl`` tokens, ``prefix`` of them already cached:
  ``run_static_per_op(batch_size, isl, osl=2, prefix, mode="static_ctx")`` (its sum is
  ``predict_prefill_latency(batch, isl, prefix)``, the TTFT of a lone prompt);
* decode of ``batch`` sequences whose context is ``ctx`` tokens:
  ``decode_step_per_op(batch, isl=ctx - 2, osl=2)`` (the engine evaluates decode at
  ``isl + osl // 2 + 1``, so this is a step at exactly ``ctx``);
* mixed (vLLM chunked prefill, one partial prefill per step): ``mixed_step_breakdown(
  ctx_tokens=C, gen_tokens=b, isl=S, osl)`` = non-attention ops over C + b tokens, plus the
  whole S-token prompt's prefill attention divided by ceil(S / C), plus decode attention of
  b sequences at context S + osl // 2 + 1;
* TPOT as AIConfigurator reports it: ``run_static(batch, isl, osl, mode="static")``'s
  generation time / (osl - 1), i.e. the mean decode step while the context grows from isl
  to isl + osl (stride-32 quadrature).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

logging.disable(logging.WARNING)  # the core logs a line per low-fidelity fallback table it loads

from aiconfigurator_core.sdk.config_builders import build_model_config  # noqa: E402
from aiconfigurator_core.sdk.engine import EngineHandle, _literal_backend_version  # noqa: E402
from aiconfigurator_core.sdk.models import get_model  # noqa: E402

BACKEND = "vllm"


@dataclass(frozen=True)
class Config:
    gpu: str  # kvsim hardware profile name (profiles/hardware/<gpu>.toml)
    system: str  # AIConfigurator system name (aiconfigurator_core/systems/<system>.yaml)
    model: str  # kvsim catalog name (kvsim/models/catalog.toml)
    model_path: str  # the Hugging Face id AIConfigurator knows the model by
    tp: int
    moe: bool = False

    @property
    def key(self) -> str:
        return f"{self.gpu}__{self.model}__tp{self.tp}"


GPUS = (("h100-sxm", "h100_sxm"), ("h200", "h200_sxm"), ("b200", "b200_sxm"), ("a100-80g", "a100_sxm"))
MODELS = (
    ("llama-3.1-8b", "meta-llama/Meta-Llama-3.1-8B", (1, 2), False),
    ("llama-3.1-70b", "meta-llama/Meta-Llama-3.1-70B", (4, 8), False),
    ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", (1, 2), True),
)
CONFIGS = tuple(
    Config(gpu, system, model, path, tp, moe)
    for gpu, system in GPUS
    for model, path, tps, moe in MODELS
    for tp in tps
)


def config(key: str) -> Config:
    for c in CONFIGS:
        if c.key == key:
            return c
    raise KeyError(f"unknown config {key!r}; known: {', '.join(c.key for c in CONFIGS)}")


def aic_version() -> str:
    return metadata.version("aiconfigurator-core")


def backend_version(cfg: Config) -> str:
    """The vLLM database version AIConfigurator resolves as 'current' for this system."""
    return _literal_backend_version(cfg.system, BACKEND, None, None, None)


def _parallel_kwargs(cfg: Config) -> dict:
    # vLLM without --enable-expert-parallel shards every expert across the TP ranks.
    return dict(tp_size=cfg.tp, moe_tp_size=cfg.tp, moe_ep_size=1) if cfg.moe else dict(tp_size=cfg.tp)


@cache
def handle(cfg: Config) -> EngineHandle:
    return EngineHandle.compile(cfg.model_path, cfg.system, BACKEND, **_parallel_kwargs(cfg))


def quant_modes(cfg: Config) -> dict:
    kw = _parallel_kwargs(cfg)
    mc = build_model_config(
        tp_size=cfg.tp, pp_size=1, attention_dp_size=1,
        moe_tp_size=kw.get("moe_tp_size", 1), moe_ep_size=1,
    )
    m = get_model(cfg.model_path, mc, BACKEND)
    c = m.config
    return {
        "gemm": c.gemm_quant_mode.name,
        "kv_cache": c.kvcache_quant_mode.name,
        "attention": c.fmha_quant_mode.name,
        "moe": c.moe_quant_mode.name,
    }


def database_dirs(cfg: Config) -> dict[str, str]:
    """sha256 over the files of each perf-table directory of this system at the vLLM
    version in use (op families gemm, attention, moe, comm), so a profile names the
    exact measured data it was derived from."""
    import aiconfigurator_core

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / cfg.system
    v = backend_version(cfg)
    out = {}
    for fam in ("gemm", "attention", "moe", "comm"):
        d = root / fam / BACKEND / v
        if not d.is_dir():
            continue
        h = hashlib.sha256()
        for f in sorted(d.iterdir()):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        out[f"{fam}/{BACKEND}/{v}"] = h.hexdigest()
    return out


def measured_token_points(cfg: Config) -> list[int]:
    """The token counts at which this system's vLLM gemm table (m) and, for a MoE model,
    moe table (num_tokens) were measured: AIConfigurator interpolates between them, and
    its kernels change tile shape across some (e.g. 256 -> 257), so a profile samples them."""
    import aiconfigurator_core
    import pandas as pd

    root = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / cfg.system
    v = backend_version(cfg)
    pts = set(int(m) for m in pd.read_parquet(root / "gemm" / BACKEND / v / "gemm_perf.parquet", columns=["m"])["m"])
    if cfg.moe:
        for f in sorted((root / "moe" / BACKEND / v).glob("*.parquet")):
            pts |= set(int(n) for n in pd.read_parquet(f, columns=["num_tokens"])["num_tokens"])
    return sorted(pts)


def _split(ops, attn_name):
    """(non-attention ms, attention ms, non-attention ms whose source AIConfigurator tags
    'silicon', i.e. looked up in its measured tables, attention's source tag)."""
    na = at = silicon = 0.0
    attn_source = ""
    for name, ms, _energy, source, *_ in ops:
        if name == attn_name:
            at += ms
            attn_source = source
        else:
            na += ms
            if source == "silicon":
                silicon += ms
    return na, at, silicon, attn_source


def prefill_parts(cfg: Config, batch: int, isl: int, prefix: int = 0):
    ctx_ops, _ = handle(cfg).run_static_per_op(
        batch_size=batch, isl=isl, osl=2, prefix=prefix, mode="static_ctx"
    )
    return _split(ctx_ops, "context_attention")


def decode_parts(cfg: Config, batch: int, ctx: int):
    ops = handle(cfg).decode_step_per_op(batch, ctx - 2, 2)
    return _split(ops, "generation_attention")


def prefill_ms(cfg: Config, batch: int, isl: int, prefix: int = 0) -> float:
    return handle(cfg).predict_prefill_latency(batch, isl, prefix)


def decode_ms(cfg: Config, batch: int, ctx: int) -> float:
    return handle(cfg).decode_step_latency(batch, ctx - 2, 2)


def mixed_ms(cfg: Config, chunk: int, decode_batch: int, prompt: int, osl: int) -> float:
    return handle(cfg).mixed_step_breakdown(chunk, decode_batch, prompt, osl)[0]


def mixed_via_prefix_path(cfg: Config, chunk: int, decode_batch: int, prompt: int, osl: int) -> float:
    """AIConfigurator's mixed step with its context attention replaced by the mean, over the
    chunk positions, of its own estimate of that chunk after its cached prefix
    (run_static_per_op(isl=p+chunk, prefix=p) context_attention): what the step would be
    if its two conventions for a chunk's attention agreed."""
    total, _shared, ctx_attn, _dec = handle(cfg).mixed_step_breakdown(chunk, decode_batch, prompt, osl)
    starts = range(0, prompt, chunk)
    via = sum(prefill_parts(cfg, 1, p + min(chunk, prompt - p), p)[1] for p in starts) / len(starts)
    return total - ctx_attn + via


def mixed_decode_context(prompt: int, osl: int) -> int:
    """Context of the decoding sequences in AIConfigurator's mixed step (isl + osl//2 + 1)."""
    return prompt + osl // 2 + 1


def tpot_ms(cfg: Config, batch: int, isl: int, osl: int) -> float:
    _ctx, gen, _tot = handle(cfg).run_static(batch_size=batch, isl=isl, osl=osl, mode="static")
    return gen / (osl - 1)


def n_chunks(prompt: int, chunk: int) -> int:
    return math.ceil(prompt / chunk)
