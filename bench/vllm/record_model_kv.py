#!/usr/bin/env python3
"""vLLM 0.33's own KV sizing for three catalog models: the witness for kvsim's per-token KV
bytes, per-request state bytes and KV-cache block counts (tests/test_model_kv_vllm.py).

For ``nemotron-h-8b`` (Mamba2 + attention + MLP), ``qwen3-next-80b-a3b`` (Gated DeltaNet +
attention) and ``deepseek-v3`` (MLA), with the config fields of kvsim's catalog
(kvsim/spec/models/catalog.toml, read here with tomllib), it records what vLLM computes:

* ``attn_page_1_token``: one attention layer's bytes for one token -- vLLM's
  ``FullAttentionSpec`` / ``MLAAttentionSpec(block_size=1, ...).page_size_bytes``, with the
  heads and head size vLLM's ``ModelConfig`` gives at tensor parallel 1 (MLA: one KV head
  of ``kv_lora_rank + qk_rope_head_dim``: ``ModelConfig.get_num_kv_heads`` returns 1 and
  ``get_head_size`` the latent width when ``use_mla``);
* ``state``: one Mamba2 / Gated DeltaNet layer's state per request: the model class's own
  ``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config`` (which call
  ``MambaStateShapeCalculator.mamba2_state_shape`` / ``gated_delta_net_state_shape``) on a
  config holding the catalog's fields, ``MambaSpec(...).page_size_bytes``, for 0..3
  speculative tokens (the conv state grows by one row per draft);
* ``blocks``: ``num_blocks`` from vLLM's ``get_global_kv_cache_groups`` +
  ``get_kv_cache_configs`` for ``AVAILABLE_BYTES`` of KV memory, on the layer specs vLLM's
  model runner would report -- the target's layers, plus, for MTP, the drafter's
  ``num_nextn_predict_layers`` attention layers (``model.layers.<num_hidden_layers>``) --
  with the hybrid block size vLLM's ``Platform._align_hybrid_block_size`` picks (its
  formula, restated in ``_aligned_block_size``) and the layer-outer ``LBNHC`` layout
  (FlashAttention states no layout preference; ``NHD`` is the legacy default).

Imports only vLLM (and torch / transformers, which it ships with) and the standard library::

    HF_HUB_OFFLINE=1 /work/venvs/vllm033/bin/python bench/vllm/record_model_kv.py \\
        > tests/fixtures/vllm_model_kv.json

Never a CI dependency: tests/test_model_kv_vllm.py reads the committed JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from types import SimpleNamespace as NS

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOG = os.path.join(HERE, "..", "..", "kvsim", "spec", "models", "catalog.toml")
MODELS = ("nemotron-h-8b", "qwen3-next-80b-a3b", "deepseek-v3")
AVAILABLE_BYTES = 40_000_000_000  # KV memory handed to get_kv_cache_configs
BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
KERNEL_ALIGNMENT = 16  # FlashAttentionBackend.get_supported_kernel_block_sizes: MultipleOf(16)
SPEC_TOKENS = (0, 1, 2, 3)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _hf_config(cfg: dict):
    """The catalog's config fields as attributes (what vLLM reads off ``hf_config``), with
    transformers' NemotronH default ``mamba_ssm_cache_dtype`` (float32) when absent."""
    ns = NS(**cfg)
    if cfg.get("model_type") == "nemotron_h":
        from transformers import NemotronHConfig

        ns.mamba_ssm_cache_dtype = NemotronHConfig().mamba_ssm_cache_dtype
    return ns


def _vllm_ns(cfg: dict, num_spec: int):
    """The few VllmConfig members the models' state classmethods read."""
    import torch
    from vllm.config import CacheConfig

    hf = _hf_config(cfg)
    cache = CacheConfig()
    if cfg.get("model_type") == "nemotron_h":
        from vllm.model_executor.models.config import NemotronHForCausalLMConfig

        NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype(cache_config=cache,
                                                                hf_config=hf)
    return NS(parallel_config=NS(tensor_parallel_size=1), cache_config=cache,
              model_config=NS(hf_config=hf, hf_text_config=hf, dtype=torch.bfloat16),
              num_speculative_tokens=num_spec, mamba_config=NS(backend=None),
              speculative_config=NS(num_speculative_tokens=num_spec) if num_spec else None)


def _model_cls(cfg: dict):
    if cfg["model_type"] == "nemotron_h":
        from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM

        return NemotronHForCausalLM
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

    return Qwen3NextForCausalLM


def _state(cfg: dict, num_spec: int) -> dict:
    from vllm.v1.kv_cache_interface import MambaSpec

    cls = _model_cls(cfg)
    ns = _vllm_ns(cfg, num_spec)
    shapes = cls.get_mamba_state_shape_from_config(ns)
    dtypes = cls.get_mamba_state_dtype_from_config(ns)
    page = MambaSpec(shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=-1).page_size_bytes
    return {"num_spec": num_spec, "shapes": [list(s) for s in shapes],
            "dtypes": [str(d).replace("torch.", "") for d in dtypes],
            "page_size_bytes": int(page)}


def _attn_spec(cfg: dict, block_size: int):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    if cfg.get("kv_lora_rank"):
        return MLAAttentionSpec(block_size=block_size, num_kv_heads=1,
                                head_size=cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"],
                                dtype=torch.bfloat16, cache_dtype_str="auto")
    head = cfg.get("head_dim") or cfg.get("attention_head_dim") \
        or cfg["hidden_size"] // cfg["num_attention_heads"]
    return FullAttentionSpec(block_size=block_size, num_kv_heads=cfg["num_key_value_heads"],
                             head_size=head, dtype=torch.bfloat16)


def _layers(cfg: dict) -> tuple[int, int]:
    """(attention layers, Mamba / linear layers) of the target model."""
    n = cfg["num_hidden_layers"]
    if "hybrid_override_pattern" in cfg:
        p = cfg["hybrid_override_pattern"]
        return p.count("*"), p.count("M")
    if "full_attention_interval" in cfg:
        full = sum(1 for i in range(n) if (i + 1) % cfg["full_attention_interval"] == 0)
        return full, n - full
    return n, 0


def _aligned_block_size(attn_1: int, state_page: int) -> int:
    """``Platform._align_hybrid_block_size`` with FlashAttention (kernel blocks MultipleOf
    16) and no prefill-checkpoint alignment (MambaMixer2 and GDN without FlashInfer
    export none)."""
    align = max(KERNEL_ALIGNMENT, BLOCK_SIZE)
    bs = align * _cdiv(state_page, align * attn_1)
    return max(BLOCK_SIZE, KERNEL_ALIGNMENT * _cdiv(bs, KERNEL_ALIGNMENT))


def _blocks(vllm_config, cfg: dict, method: str, num_spec: int) -> dict:
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.kv_cache_interface import MambaSpec

    attn, linear = _layers(cfg)
    draft = (cfg.get("num_nextn_predict_layers") or 1) if method == "mtp" else 0
    attn_1 = _attn_spec(cfg, 1).page_size_bytes
    bs = BLOCK_SIZE
    specs = {}
    if linear:
        st = _state(cfg, num_spec)
        bs = _aligned_block_size(attn_1, st["page_size_bytes"])
        cls = _model_cls(cfg)
        ns = _vllm_ns(cfg, num_spec)
        padded = bs * attn_1 if bs * attn_1 != st["page_size_bytes"] else None
        mspec = MambaSpec(shapes=tuple(cls.get_mamba_state_shape_from_config(ns)),
                          dtypes=tuple(cls.get_mamba_state_dtype_from_config(ns)),
                          block_size=bs, page_size_padded=padded, mamba_cache_mode="align",
                          num_speculative_blocks=num_spec)
        for i in range(linear):
            specs[f"model.layers.{i}.mixer"] = mspec
    aspec = _attn_spec(cfg, bs)
    for i in range(attn):
        specs[f"model.layers.{linear + i}.attn"] = aspec
    for j in range(draft):
        specs[f"model.layers.{cfg['num_hidden_layers'] + j}.attn"] = aspec
    groups = get_global_kv_cache_groups(vllm_config, [specs])
    kv = get_kv_cache_configs(vllm_config, [specs], [AVAILABLE_BYTES], groups)[0]
    return {"method": method, "num_spec": num_spec, "draft_layers": draft,
            "block_size": bs, "num_groups": len(kv.kv_cache_groups),
            "layers_per_group": max(len(g.layer_names) for g in kv.kv_cache_groups),
            "num_blocks": int(kv.num_blocks)}


def _vllm_config():
    import shutil

    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    sys.path.insert(0, HERE)
    from record_scheduler import _tiny_model_dir

    d = _tiny_model_dir()
    try:
        mc = ModelConfig(model=d, skip_tokenizer_init=True, dtype="bfloat16",
                         max_model_len=4096, seed=0)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    sc = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    cache = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    cache.kv_cache_layout = "LBNHC"
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cache,
                    device_config=DeviceConfig(device="cpu"))
    # the hybrid manager is on for hybrid models (the tiny stand-in model is not one)
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    return vc


def main() -> None:
    import vllm

    with open(CATALOG, "rb") as fh:
        catalog = tomllib.load(fh)
    vc = _vllm_config()
    out = {"vllm": vllm.__version__, "available_bytes": AVAILABLE_BYTES, "models": {}}
    for name in MODELS:
        cfg = catalog[name]["config"]
        attn, linear = _layers(cfg)
        rec = {"attn_layers": attn, "linear_layers": linear,
               "attn_page_1_token": int(_attn_spec(cfg, 1).page_size_bytes),
               "spec_class": type(_attn_spec(cfg, 1)).__name__}
        if linear:
            rec["state"] = [_state(cfg, k) for k in SPEC_TOKENS]
        runs = [_blocks(vc, cfg, "none", 0)]
        if linear:
            runs.append(_blocks(vc, cfg, "ngram", 2))
        if cfg.get("model_type") != "nemotron_h":
            runs += [_blocks(vc, cfg, "mtp", k) for k in (1, 2, 3)]
        rec["blocks"] = runs
        out["models"][name] = rec
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
