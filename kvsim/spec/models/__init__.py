"""Model catalog (data in ``catalog.toml``) and Hugging Face ``config.json`` parsing.

See :mod:`kvsim.spec.models.catalog` for :class:`ModelSpec` and its invariants, and
``docs/estimate-kv.md`` for how the KV footprint follows from it (:mod:`kvsim.spec.kvsize`).
"""

from kvsim.spec.models.catalog import (
    DEFAULT_MODEL,
    WEIGHT_DTYPE_BYTES,
    ModelSpec,
    estimate_num_params,
    linear_state_bytes,
    list_models,
    load_config,
    load_model,
    spec_from_config,
)
from kvsim.spec.models.speculative import SPEC_METHODS, mtp_layers, with_speculative

__all__ = ["DEFAULT_MODEL", "SPEC_METHODS", "WEIGHT_DTYPE_BYTES", "ModelSpec",
           "estimate_num_params", "linear_state_bytes", "load_config", "load_model",
           "list_models", "mtp_layers", "spec_from_config", "with_speculative"]
