"""The model catalog: :class:`ModelSpec`, read from Hugging Face ``config.json`` fields.

Every model kvsim knows is DATA in ``catalog.toml`` beside this module: the fields of its
published ``config.json`` (same keys, same values) plus kvsim's own keys (source, parameter
counts, serving dtype).  A user's own ``config.json`` (``--config FILE``) goes through the
very same parser, :func:`spec_from_config`, so a catalog entry and the config it was copied
from always give the same :class:`ModelSpec`.

Invariants of a :class:`ModelSpec`:

- ``len(layer_types) == num_layers``; each entry is ``"full"``, ``"sliding"``,
  ``"linear"`` (a linear-attention / Mamba layer: a fixed state per request, no KV) or
  ``"mlp"`` (an MLP / MoE-only layer of a Nemotron-H pattern: neither KV nor state); a
  ``"sliding"`` layer exists only when ``sliding_window`` is a positive int, a ``"linear"``
  layer only when ``linear_state_bytes > 0``.
- ``attention`` is ``"mla"`` iff ``kv_lora_rank > 0`` (then ``qk_rope_head_dim > 0``);
  otherwise ``"mqa"`` iff ``num_kv_heads == 1``, ``"mha"`` iff ``num_kv_heads ==
  num_attention_heads``, else ``"gqa"``.  ``kv_lora_rank`` and ``qk_rope_head_dim`` are 0
  for non-MLA models.
- ``num_params == 0`` means "unknown" (a config kvsim cannot count); ``num_active_params
  <= num_params``.
"""

from __future__ import annotations

import difflib
import functools
import json
import pickle
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value

#: The model a run uses when none is named (``--model``).  Llama-3.1-8B: the KV geometry of
#: Llama-3-8B (32 layers, 8 KV heads of 128 dims, 128 KiB per token in bf16), the same
#: weights' shapes (so the same measured step-time profile, h100-sxm__llama-3.1-8b__tp1),
#: and a 131,072-token context (its config.json: max_position_embeddings), so real
#: traces (the Mooncake conversation trace's prompts reach 126,527 tokens) are served
#: rather than refused against Llama-3-8B's 8,192 (docs/estimate-kv.md, "Model catalog").
DEFAULT_MODEL = "llama-3.1-8b"

#: dtype names kvsim accepts for weights, and their bytes per parameter.
WEIGHT_DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
    # OCP Microscaling MXFP4 (OCP MX spec v1.0): blocks of 32 fp4 (e2m1) values share one
    # 8-bit (e8m0) scale = (32 x 4 + 8) / 32 = 4.25 bits per parameter.
    "mxfp4": 4.25 / 8,
}

#: Fields a published config.json may leave out because transformers fills them from its
#: config class's defaults (the Gemma-3 configs are sparse: google/gemma-3-27b-it's
#: text_config has no vocab_size, sliding_window_pattern, ...).  Source: transformers
#: ``Gemma3TextConfig.__init__`` defaults (v4.50+): vocab_size 262208,
#: max_position_embeddings 131072, sliding_window 4096, sliding_window_pattern 6 (every 6th
#: layer global), tie_word_embeddings True, head_dim 256.
_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072,
                    "sliding_window": 4096, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True, "head_dim": 256},
}


def _text_config(cfg: dict) -> dict:
    """The decoder's fields: a multimodal config's ``text_config`` (Gemma-3) flattened, plus
    the defaults of :data:`_CONFIG_DEFAULTS` for fields the config leaves out."""
    if cfg.get("num_hidden_layers") is None and isinstance(cfg.get("text_config"), dict):
        top = {k: cfg[k] for k in ("torch_dtype", "dtype", "quantization_config") if k in cfg}
        cfg = {**top, **cfg["text_config"], "model_type": cfg["text_config"].get(
            "model_type", cfg.get("model_type"))}
    defaults = _CONFIG_DEFAULTS.get(str(cfg.get("model_type")), {})
    return {**defaults, **cfg} if defaults else cfg

#: Hugging Face ``torch_dtype`` -> the dtype vLLM serves it in with ``--dtype auto``.
#: fp32 checkpoints are served in fp16 (vLLM ``ModelConfig`` dtype resolution), except
#: model types that do not support fp16 (vLLM ``_FLOAT16_NOT_SUPPORTED_MODELS``: gemma2,
#: gemma3), which are served in bf16.
_TORCH_DTYPE_SERVED = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp16"}
_FP16_UNSUPPORTED = frozenset({"gemma2", "gemma3", "gemma3_text"})

#: ``layer_types`` values of transformers configs -> kvsim's two kinds.
_LAYER_TYPE_NAMES = {
    "full_attention": "full", "full": "full", "global": "full", "global_attention": "full",
    "sliding_attention": "sliding", "sliding": "sliding", "local": "sliding",
    "local_sliding": "sliding", "sliding_window": "sliding",
    # recurrent state instead of KV (vLLM MambaSpec): Gated DeltaNet (Qwen3-Next), Mamba
    "linear_attention": "linear", "mamba": "linear", "linear": "linear",
}

#: ``hybrid_override_pattern`` characters (Nemotron-H; vLLM 0.33 ``nemotron_h.py``
#: ``ALL_DECODER_LAYER_TYPES``) -> kvsim's layer kinds
_PATTERN_KINDS = {"M": "linear", "*": "full", "-": "mlp", "E": "mlp"}

#: Bytes of a served dtype (vLLM's Mamba / Gated DeltaNet state follows the model dtype:
#: ``MambaStateDtypeCalculator._mamba_state_dtype`` with ``mamba_cache_dtype="auto"``).
_STATE_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "fp16": 2, "bfloat16": 2,
                      "float16": 2}


@dataclass(frozen=True)
class ModelSpec:
    """What kvsim needs to know about a model: KV geometry, parameter counts, provenance."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int  # per-head query/key dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    hidden_size: int
    attention: str  # "mha" | "gqa" | "mqa" | "mla"
    sliding_window: int | None  # tokens a "sliding" layer keeps; None = no sliding layer
    layer_types: tuple[str, ...]  # per layer: "full" | "sliding" | "linear" (recurrent state)
    kv_lora_rank: int  # MLA compressed-latent width; 0 = not MLA
    qk_rope_head_dim: int  # MLA decoupled RoPE key width; 0 = not MLA
    num_params: int  # total parameters; 0 = unknown
    num_active_params: int  # parameters touched per token (MoE < total)
    weights_dtype: str  # key of WEIGHT_DTYPE_BYTES: dtype the weights are served in
    source: str  # the config.json this spec was read from (URL or file path)
    v_head_dim: int = 0  # value head dim (MLA); = head_dim otherwise
    intermediate_size: int = 0  # dense MLP width (0 = not given)
    vocab_size: int = 0
    max_position_embeddings: int = 0  # context length of the config (0 = not given)
    num_experts: int = 0  # routed experts per MoE layer (0 = dense)
    num_experts_per_tok: int = 0
    notes: str = ""
    #: bytes of one linear-attention / Mamba layer's state per request (0: none), vLLM's
    #: ``MambaSpec.page_size_bytes`` before padding (:func:`_linear_state_bytes`)
    linear_state_bytes: int = 0
    #: which recurrent state the linear layers keep: ``"gated_delta_net"`` (Qwen3-Next),
    #: ``"mamba2"`` (Nemotron-H), ``""`` (none)
    linear_state_kind: str = ""
    config: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_sliding_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "sliding")

    @property
    def num_linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear")

    @property
    def num_full_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "full")

    @property
    def num_mlp_layers(self) -> int:
        """Layers with neither KV nor state (a Nemotron-H ``-`` / ``E`` layer)."""
        return sum(1 for t in self.layer_types if t == "mlp")

    @property
    def weights_bytes(self) -> int:
        """Bytes of the weights in :attr:`weights_dtype` (quantization scales not counted)."""
        return int(self.num_params * WEIGHT_DTYPE_BYTES[self.weights_dtype])


# --------------------------------------------------------------------------- config parsing

def _first(cfg: dict, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return None


def _positive_int(value: Any, path: str, fieldname: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise bad_value(path, None, fieldname, "a positive integer", value)
    return value


def _required(cfg: dict, keys: tuple[str, ...], path: str) -> int:
    value = _first(cfg, keys)
    if value is None:
        also = f" (or {', '.join(keys[1:])})" if len(keys) > 1 else ""
        raise KvsimInputError(f"missing required field{also}; expected a positive integer",
                              path, None, keys[0])
    return _positive_int(value, path, keys[0])


def _layer_types(cfg: dict, num_layers: int, window: int | None, path: str) -> tuple[str, ...]:
    """Per-layer attention kind, following transformers' semantics for each config style."""
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("hybrid_override_pattern") is not None:
        # Nemotron-H: one character per layer (vLLM NemotronHModel builds layer i from
        # hybrid_override_pattern[i]): M = Mamba2 (state), * = attention (KV), - = MLP,
        # E = MoE (neither)
        pattern = cfg["hybrid_override_pattern"]
        if (not isinstance(pattern, str) or len(pattern) != num_layers
                or set(pattern) - set(_PATTERN_KINDS)):
            raise bad_value(path, None, "hybrid_override_pattern",
                            f"a string of {num_layers} characters from "
                            f"{''.join(_PATTERN_KINDS)}", pattern)
        types = tuple(_PATTERN_KINDS[c] for c in pattern)
    elif cfg.get("layer_types") is not None:
        raw = cfg["layer_types"]
        if not isinstance(raw, list) or len(raw) != num_layers:
            raise bad_value(path, None, "layer_types",
                            f"a list of {num_layers} attention types", raw)
        kinds = []
        for i, name in enumerate(raw):
            if name not in _LAYER_TYPE_NAMES:
                raise KvsimInputError(
                    f"entry {i}: expected one of {sorted(set(_LAYER_TYPE_NAMES))}, got {name!r}",
                    path, None, "layer_types")
            kinds.append(_LAYER_TYPE_NAMES[name])
        types = tuple(kinds)
    elif cfg.get("full_attention_interval") is not None:
        # Qwen3-Next: every interval-th layer is full attention, the others Gated DeltaNet
        # (transformers Qwen3NextConfig.layer_types)
        every = _positive_int(cfg["full_attention_interval"], path, "full_attention_interval")
        types = tuple("full" if (i + 1) % every == 0 else "linear" for i in range(num_layers))
    elif window is None:
        types = ("full",) * num_layers
    elif "use_sliding_window" in cfg:
        # Qwen2 style: a window only if use_sliding_window; then layers >= max_window_layers
        # slide (transformers Qwen2Config.layer_types).
        first = int(cfg.get("max_window_layers") or 0)
        types = tuple("sliding" if cfg["use_sliding_window"] and i >= first else "full"
                      for i in range(num_layers))
    elif cfg.get("sliding_window_pattern") is not None:
        # Gemma-3 style: every pattern-th layer is global (transformers Gemma3TextConfig).
        pattern = _positive_int(cfg["sliding_window_pattern"], path, "sliding_window_pattern")
        types = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))
    elif model_type == "gemma2":
        # Gemma-2: even layers slide, odd layers are global (transformers Gemma2, vLLM).
        types = tuple("sliding" if i % 2 == 0 else "full" for i in range(num_layers))
    else:
        # Mistral style: sliding_window applies to every layer.
        types = ("sliding",) * num_layers
    if "sliding" in types and window is None:
        raise KvsimInputError("layer_types names sliding layers; expected a positive integer "
                              "sliding_window", path, None, "sliding_window")
    return types


def _dtype_bytes(name, default: int) -> int:
    return _STATE_DTYPE_BYTES.get(str(name), default) if name else default


def linear_state_kind(cfg: dict) -> str:
    """``"mamba2"`` for a Nemotron-H config (``mamba_num_heads``), else
    ``"gated_delta_net"`` (Qwen3-Next's ``linear_*`` fields)."""
    return "mamba2" if cfg.get("mamba_num_heads") is not None else "gated_delta_net"


def _linear_state_bytes(cfg: dict, path: str, num_spec: int = 0) -> int:
    """One linear layer's state per request, vLLM 0.33 at tensor parallel 1, with
    ``num_spec`` speculative tokens (the conv state keeps ``conv_kernel - 1 + num_spec``
    rows: ``MambaStateShapeCalculator``'s ``num_spec``):

    * Gated DeltaNet (``gated_delta_net_state_shape``): a conv state of
      ``(2 * key_heads * key_dim + value_heads * value_dim) x (conv_kernel - 1 + num_spec)``
      and a recurrent state of ``value_heads x value_dim x key_dim``, both in the model
      dtype (``mamba_ssm_dtype`` when given);
    * Mamba2 (``mamba2_state_shape``, Nemotron-H): a conv state of ``(mamba_num_heads x
      mamba_head_dim + 2 x n_groups x ssm_state_size) x (conv_kernel - 1 + num_spec)`` in
      the model dtype and an SSM state of ``mamba_num_heads x mamba_head_dim x
      ssm_state_size`` in ``mamba_ssm_cache_dtype``: float32 unless the config says
      otherwise (vLLM ``NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE``)."""
    model_bytes = _dtype_bytes(_first(cfg, ("torch_dtype", "dtype")), 2)
    if linear_state_kind(cfg) == "mamba2":
        heads = _required(cfg, ("mamba_num_heads",), path)
        head_dim = _required(cfg, ("mamba_head_dim",), path)
        groups = _required(cfg, ("n_groups",), path)
        state = _required(cfg, ("ssm_state_size",), path)
        kernel = _required(cfg, ("conv_kernel",), path)
        conv = (heads * head_dim + 2 * groups * state) * (kernel - 1 + num_spec)
        ssm = heads * head_dim * state
        return conv * model_bytes + ssm * _dtype_bytes(cfg.get("mamba_ssm_cache_dtype")
                                                       or "float32", 4)
    kh = _required(cfg, ("linear_num_key_heads",), path)
    vh = _required(cfg, ("linear_num_value_heads",), path)
    kd = _required(cfg, ("linear_key_head_dim",), path)
    vd = _required(cfg, ("linear_value_head_dim",), path)
    kernel = _required(cfg, ("linear_conv_kernel_dim",), path)
    conv = (2 * kh * kd + vh * vd) * (kernel - 1 + num_spec)
    temporal = vh * vd * kd
    return (conv + temporal) * _dtype_bytes(cfg.get("mamba_ssm_dtype")
                                            or _first(cfg, ("torch_dtype", "dtype")), 2)


def linear_state_bytes(model: ModelSpec, num_speculative_tokens: int = 0) -> int:
    """One linear layer's state per request when vLLM runs ``num_speculative_tokens``
    drafts (0: :attr:`ModelSpec.linear_state_bytes`); 0 for models without linear layers."""
    if model.num_linear_layers == 0:
        return 0
    return _linear_state_bytes(model.config, model.source, num_speculative_tokens)


def _weights_dtype(cfg: dict) -> str:
    quant = cfg.get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    bits = quant.get("bits") or quant.get("w_bit")
    if bits in (4, 8):
        return "int4" if bits == 4 else "int8"
    torch_dtype = str(_first(cfg, ("torch_dtype", "dtype")) or "float32")
    served = _TORCH_DTYPE_SERVED.get(torch_dtype, "fp16")
    if torch_dtype == "float32" and cfg.get("model_type") in _FP16_UNSUPPORTED:
        served = "bf16"
    return served


def spec_from_config(cfg: dict, *, name: str, source: str, extra: dict | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from ``config.json`` fields (``extra``: catalog keys).

    Raises :class:`KvsimInputError` naming the missing or bad field.
    """
    extra = extra or {}
    path = source
    cfg = _text_config(cfg)
    num_layers = _required(cfg, ("num_hidden_layers", "n_layer", "num_layers"), path)
    heads = _required(cfg, ("num_attention_heads", "n_head"), path)
    hidden = _required(cfg, ("hidden_size", "n_embd", "d_model"), path)
    if cfg.get("multi_query") is True:
        kv_heads = 1
    else:
        kv = _first(cfg, ("num_key_value_heads", "num_kv_heads", "n_head_kv",
                          "multi_query_group_num"))
        kv_heads = heads if kv is None else _positive_int(kv, path, "num_key_value_heads")
    if heads % kv_heads:
        raise bad_value(path, None, "num_key_value_heads",
                        f"a divisor of num_attention_heads ({heads})", kv_heads)

    kv_lora_rank = cfg.get("kv_lora_rank") or 0
    if kv_lora_rank:
        kv_lora_rank = _positive_int(kv_lora_rank, path, "kv_lora_rank")
        rope = _required(cfg, ("qk_rope_head_dim",), path)
        nope = cfg.get("qk_nope_head_dim") or 0
        head_dim = nope + rope if nope else (cfg.get("head_dim") or hidden // heads)
        v_head_dim = int(cfg.get("v_head_dim") or head_dim)
        attention = "mla"
    else:
        rope = 0
        if _first(cfg, ("head_dim", "attention_head_dim")) is not None:  # Nemotron-H:
            head_dim = _positive_int(_first(cfg, ("head_dim", "attention_head_dim")),
                                     path, "head_dim")  # attention_head_dim
        elif hidden % heads == 0:
            head_dim = hidden // heads
        else:
            raise KvsimInputError(f"missing; hidden_size ({hidden}) is not a multiple of "
                                  f"num_attention_heads ({heads}), so head_dim must be given",
                                  path, None, "head_dim")
        v_head_dim = head_dim
        attention = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"

    window = cfg.get("sliding_window")
    if window is not None:
        window = _positive_int(window, path, "sliding_window")
    if cfg.get("use_sliding_window") is False and cfg.get("layer_types") is None:
        window = None  # Qwen2: the field is present but disabled
    types = _layer_types(cfg, num_layers, window, path)
    if "sliding" not in types:
        window = None
    state_bytes = _linear_state_bytes(cfg, path) if "linear" in types else 0
    state_kind = linear_state_kind(cfg) if "linear" in types else ""

    counted = estimate_num_params(cfg)
    num_params = int(extra.get("num_params", cfg.get("num_params", counted[0] if counted else 0)))
    num_active = int(extra.get("num_active_params",
                               cfg.get("num_active_params",
                                       counted[1] if counted else num_params)))
    weights_dtype = str(extra.get("weights_dtype") or _weights_dtype(cfg))
    if weights_dtype not in WEIGHT_DTYPE_BYTES:
        raise bad_value(path, None, "weights_dtype", f"one of {list(WEIGHT_DTYPE_BYTES)}",
                        weights_dtype)
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        hidden_size=hidden,
        attention=attention,
        sliding_window=window,
        layer_types=types,
        kv_lora_rank=int(kv_lora_rank),
        qk_rope_head_dim=int(rope),
        num_params=num_params,
        num_active_params=num_active,
        weights_dtype=weights_dtype,
        source=str(extra.get("source", source)),
        v_head_dim=int(v_head_dim),
        intermediate_size=int(_first(cfg, ("intermediate_size", "ffn_dim", "n_inner")) or 0),
        vocab_size=int(cfg.get("vocab_size") or 0),
        max_position_embeddings=int(_first(cfg, ("max_position_embeddings", "n_positions"))
                                    or 0),
        num_experts=int(_first(cfg, ("num_local_experts", "n_routed_experts", "num_experts"))
                        or 0),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
        notes=str(extra.get("notes", "")),
        linear_state_bytes=int(state_bytes),
        linear_state_kind=state_kind,
        config=dict(cfg),
    )


# --------------------------------------------------------------------------- parameter count

#: Per-layer norm weight vectors of llama-style decoders (Gemma-2 and Gemma-3 add
#: post-attention and pre/post-feed-forward norms: transformers Gemma2DecoderLayer,
#: Gemma3DecoderLayer).
_NORMS_PER_LAYER = {"gemma2": 4, "gemma3_text": 4}
_LLAMA_STYLE = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe",
                          "gemma", "gemma2", "gemma3_text", "gpt_oss"})
#: Models with a per-head RMSNorm on queries and keys (q_norm, k_norm: head_dim weights each;
#: transformers Qwen3Attention, Gemma3Attention).
_QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3_text"})
#: Tied input/output embeddings unless the config says otherwise (transformers defaults).
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3_text"})


def _nemotron_h_params(cfg: dict) -> tuple[int, int] | None:
    """Nemotron-H without MoE layers, layer by layer as vLLM's ``nemotron_h.py`` holds them:
    Mamba2 (``MambaMixer2``: in_proj to ``2 x d_inner + 2 x n_groups x state + heads``,
    conv1d ``conv_dim x kernel`` (+ bias), dt_bias / A / D per head, gated norm ``d_inner``,
    out_proj), attention (q, k, v, o; no bias) or relu2 MLP (up, down; no bias), each with
    its pre-norm; embeddings (+ an untied lm_head) and the final norm."""
    g = cfg.get
    pattern, h = g("hybrid_override_pattern") or "", g("hidden_size")
    if "E" in pattern or not pattern:
        return None  # the MoE variants' layout is not counted
    heads, kv = g("num_attention_heads"), g("num_key_value_heads")
    hd = g("head_dim") or g("attention_head_dim") or h // heads
    nh, d_in = g("mamba_num_heads"), g("mamba_num_heads") * g("mamba_head_dim")
    bc = 2 * g("n_groups") * g("ssm_state_size")
    conv_dim = d_in + bc
    mamba = (h * (2 * d_in + bc + nh) + conv_dim * g("conv_kernel")
             + (conv_dim if g("use_conv_bias", True) else 0) + 3 * nh + d_in + d_in * h)
    per_layer = {"M": mamba, "*": h * heads * hd + 2 * h * kv * hd + heads * hd * h,
                 "-": 2 * h * g("intermediate_size")}
    total = (g("vocab_size") * h * (1 if g("tie_word_embeddings", False) else 2)
             + sum(per_layer[c] + h for c in pattern) + h)
    return total, total


def estimate_num_params(cfg: dict) -> tuple[int, int] | None:
    """(total, active) parameters counted from a config's tensor shapes, or None.

    Exact for the layouts it knows (GPT-2, OPT, and llama-style decoders: llama, mistral,
    mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, gpt_oss; nemotron_h
    without MoE layers); None for any
    other ``model_type`` (DeepSeek's MLA + MoE layout is not counted: the catalog carries
    its published figures).  Gemma-3's config nests the text model in ``text_config``: its
    vision tower is not counted.
    """
    cfg = _text_config(cfg)
    mt = cfg.get("model_type")
    g = cfg.get
    if mt == "nemotron_h":
        return _nemotron_h_params(cfg)
    if mt == "gpt2":
        h, layers, vocab, pos = g("n_embd"), g("n_layer"), g("vocab_size"), g("n_positions")
        inner = g("n_inner") or 4 * h
        per_layer = (2 * h + 3 * h * h + 3 * h + h * h + h + 2 * h
                     + h * inner + inner + inner * h + h)
        total = vocab * h + pos * h + layers * per_layer + 2 * h  # lm_head tied to wte
        return total, total
    if mt == "opt":
        h, layers, ffn = g("hidden_size"), g("num_hidden_layers"), g("ffn_dim")
        if g("word_embed_proj_dim", h) != h:
            return None
        per_layer = 4 * (h * h + h) + h * ffn + ffn + ffn * h + h + 4 * h
        # learned positions have 2 extra rows (OPTLearnedPositionalEmbedding offset)
        total = g("vocab_size") * h + (g("max_position_embeddings") + 2) * h \
            + layers * per_layer + 2 * h
        return total, total
    if mt not in _LLAMA_STYLE:
        return None
    h, layers, heads = g("hidden_size"), g("num_hidden_layers"), g("num_attention_heads")
    kv = g("num_key_value_heads") or heads
    hd = g("head_dim") or h // heads
    inter, vocab = g("intermediate_size"), g("vocab_size")
    if None in (h, layers, heads, inter, vocab):
        return None
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if mt == "qwen2" or g("attention_bias"):
        attn += heads * hd + 2 * kv * hd  # q/k/v biases (Qwen2 always has them)
    if mt == "gpt_oss" and g("attention_bias"):
        attn += h + heads  # o_proj bias; one attention-sink logit per head (GptOssAttention)
    if mt in _QK_NORM:
        attn += 2 * hd
    norms = _NORMS_PER_LAYER.get(mt, 2) * h
    experts = g("num_local_experts") or g("num_experts") or 0
    if mt == "gpt_oss":
        # GptOssExperts: gate_up (h x 2*inter) and down (inter x h) with biases; the router
        # is a Linear with bias (GptOssTopKRouter).
        mlp = h * 2 * inter + 2 * inter + inter * h + h
        router = h * experts + experts
    else:
        mlp = 3 * h * (g("moe_intermediate_size") or inter if experts else inter)
        router = h * experts
    if experts:
        per_token = g("num_experts_per_tok")
        layer_total = attn + norms + experts * mlp + router
        layer_active = attn + norms + per_token * mlp + router
    else:
        layer_total = layer_active = attn + norms + mlp
    tied = g("tie_word_embeddings", mt in _TIED_BY_DEFAULT)
    embed = vocab * h * (1 if tied else 2)
    return embed + layers * layer_total + h, embed + layers * layer_active + h


# --------------------------------------------------------------------------- catalog access

@functools.lru_cache(maxsize=1)
def _catalog_text() -> str:
    return resources.files("kvsim.spec.models").joinpath("catalog.toml").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _catalog_pickle() -> bytes:
    """The catalog parsed once per process (a TOML parse costs ~10 ms; a closed-loop run
    asks for it ~11 times), kept as a pickle."""
    return pickle.dumps(tomllib.loads(_catalog_text()), protocol=pickle.HIGHEST_PROTOCOL)


def _catalog() -> dict[str, dict]:
    """The parsed catalog (a fresh dict each call: callers may not mutate a shared one)."""
    return pickle.loads(_catalog_pickle())


def list_models() -> list[str]:
    """Names of the bundled catalog entries, sorted."""
    return sorted(_catalog())


def load_model(name_or_config_path: str) -> ModelSpec:
    """A catalog entry by name, or a Hugging Face ``config.json`` by path.

    An argument naming an existing file (or ending in ``.json``), or a folder holding a
    ``config.json`` (a downloaded model snapshot), is read as a config;
    anything else is a catalog name.  Unknown names raise :class:`KvsimInputError` listing
    the closest catalog names (difflib).
    """
    arg = str(name_or_config_path)
    path = Path(arg)
    if path.is_dir():  # a downloaded HF snapshot (main: "unknown model" for one without)
        return load_config(path / "config.json")
    if path.is_file() or arg.endswith(".json"):
        return load_config(path)
    catalog = _catalog()
    if arg not in catalog:
        pool = sorted(list(catalog))
        close = [n for n in pool if n.startswith(arg)]  # 'h100' -> 'h100-sxm' first
        close += [n for n in difflib.get_close_matches(arg, pool, n=3, cutoff=0.5)
                  if n not in close]
        close = close[:3]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KvsimInputError(f"unknown model {arg!r}{hint} (known: {', '.join(sorted(catalog))};"
                              " or pass a config.json with --config)", None, None, "model")
    entry = catalog[arg]
    return spec_from_config(entry["config"], name=arg, source=entry["source"], extra=entry)


def load_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face ``config.json``; the spec is named after its folder or file."""
    path = Path(path)
    if not path.is_file():
        raise KvsimInputError("no such file; expected a Hugging Face config.json", path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise KvsimInputError(f"not valid JSON: {exc.msg}", path, f"line {exc.lineno}") from None
    if not isinstance(cfg, dict):
        raise bad_value(path, None, None, "a JSON object", type(cfg).__name__)
    name = cfg.get("_name_or_path") or (path.parent.name if path.name == "config.json"
                                        else path.stem)
    return spec_from_config(cfg, name=str(name), source=str(path))
