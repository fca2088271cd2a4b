"""Speculative decoding as vLLM 0.33 sizes the KV cache: the MTP drafter's layers and the
draft tokens' Mamba / linear state (docs/estimate-kv.md, "Speculative decoding")."""

from __future__ import annotations

from dataclasses import replace

from kvsim.core.errors import bad_value
from kvsim.spec.models.catalog import ModelSpec, linear_state_bytes

#: Speculative-decoding methods kvsim sizes (``--spec-method``): ``ngram`` (no drafter
#: layers) and ``mtp`` (the model's own multi-token-prediction layers, vLLM
#: ``SpeculativeConfig`` method ``mtp``)
SPEC_METHODS = ("none", "ngram", "mtp")
#: model types whose vLLM MTP drafter exists when the config does not say
#: num_nextn_predict_layers (vLLM SpeculativeConfig: deepseek_mtp, qwen3_next_mtp)
_MTP_MODEL_TYPES = frozenset({"deepseek_v3", "qwen3_next"})


def mtp_layers(model: ModelSpec) -> int:
    """Attention layers vLLM's MTP drafter adds: the config's
    ``num_nextn_predict_layers`` (vLLM ``DeepSeekMultiTokenPredictor`` /
    ``Qwen3NextMultiTokenPredictor``: ``getattr(config, "num_nextn_predict_layers", 1)``);
    the drafter reuses them for every draft step (``spec_step_idx % num_mtp_layers``)."""
    return int(model.config.get("num_nextn_predict_layers") or 1)


def with_speculative(model: ModelSpec, method: str = "none",
                     num_speculative_tokens: int = 0) -> ModelSpec:
    """The model as vLLM 0.33 sizes its KV cache under speculative decoding.

    ``mtp``: the drafter's :func:`mtp_layers` full-attention layers (MLA for DeepSeek)
    join the target's layers in the KV cache -- vLLM builds them as ordinary attention
    layers ``model.layers.<num_hidden_layers + i>``, so ``get_kv_cache_spec`` finds them
    and every block holds their pages too (same block table; a Qwen3-Next MTP layer is
    ``layer_type="full_attention"``).  Any method with ``k`` drafts also grows each
    Mamba / Gated DeltaNet conv state by ``k`` rows (``num_spec``).  ``none`` (or k = 0
    with ``ngram``) returns ``model``."""
    if method not in SPEC_METHODS:
        raise bad_value(None, None, "spec_method", f"one of {', '.join(SPEC_METHODS)}",
                        method)
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
            or num_speculative_tokens < 0:
        raise bad_value(None, None, "num_speculative_tokens", "an integer >= 0",
                        num_speculative_tokens)
    if method == "none" or num_speculative_tokens == 0:
        if method == "mtp":
            raise bad_value(None, None, "num_speculative_tokens",
                            "at least 1 with spec_method mtp", num_speculative_tokens)
        return model
    if method == "mtp" and not (model.config.get("num_nextn_predict_layers")
                                or model.config.get("model_type") in _MTP_MODEL_TYPES):
        raise bad_value(model.source, None, "spec_method", "a model with MTP layers "
                        "(num_nextn_predict_layers), or --spec-method ngram / none", method)
    extra = mtp_layers(model) if method == "mtp" else 0
    return replace(model, num_layers=model.num_layers + extra,
                   layer_types=model.layer_types + ("full",) * extra,
                   linear_state_bytes=linear_state_bytes(model, num_speculative_tokens))
