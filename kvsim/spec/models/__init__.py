"""Model catalog (data in ``catalog.toml``) and Hugging Face ``config.json`` parsing.

See :mod:`kvsim.spec.models.catalog` for :class:`ModelSpec` and its invariants, and
``docs/estimate-kv.md`` for how the KV footprint follows from it (:mod:`kvsim.spec.kvsize`).
"""

from kvsim.spec.models.catalog import (
    DEFAULT_MODEL,
    WEIGHT_DTYPE_BYTES,
    ModelSpec,
    estimate_num_params,
    list_models,
    load_config,
    load_model,
    spec_from_config,
)

__all__ = ["DEFAULT_MODEL", "WEIGHT_DTYPE_BYTES", "ModelSpec", "estimate_num_params", "load_config",
           "load_model", "list_models", "spec_from_config"]
