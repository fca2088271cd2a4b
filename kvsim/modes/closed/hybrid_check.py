"""Whether a closed-loop run goes through the hybrid pool, and what that pool refuses
(:mod:`kvsim.modes.closed.hybrid_serve` serves it).  Apart from that module so that the
decision imports nothing of it: every closed-loop run asks, and only a hybrid model's run
needs vLLM's Python scheduler and the hybrid pool (~8 ms of imports a run spared,
issue 34)."""

from __future__ import annotations

from kvsim.core.errors import KvsimInputError

HYBRID_POOL = ("auto", "on", "off")
_SKIP = "hybrid pool (--hybrid-pool on/auto on a hybrid model) does not model"


def is_hybrid(model: str) -> bool:
    """Whether ``model``'s layers are not all full attention (several KV-cache groups)."""
    from kvsim.spec.kvsize import load_model

    spec = load_model(model)
    return bool(spec.num_sliding_layers or spec.num_linear_layers)


def wanted(config, opts) -> bool:
    """Whether the closed loop serves through the hybrid pool: ``opts.hybrid_pool``
    ``on``, or ``auto`` on a hybrid model."""
    mode = opts.hybrid_pool
    if mode not in HYBRID_POOL:
        raise KvsimInputError(f"--hybrid-pool: expected one of {' | '.join(HYBRID_POOL)}, "
                              f"got {mode!r}", None, None, "--hybrid-pool")
    if mode == "off":
        return False
    hybrid = is_hybrid(config.model or opts.model)
    if mode == "on" and not hybrid:
        raise KvsimInputError(f"expected a hybrid model with --hybrid-pool on; "
                              f"{config.model or opts.model} has only full-attention layers",
                              None, None, "--hybrid-pool")
    return hybrid


def check_supported(table, policy, config, opts, replicas: int, pd_options,
                    decision_log) -> None:
    """One line (exit 2) naming the first option the hybrid closed loop does not model."""
    def no(option: str, what: str) -> None:
        raise KvsimInputError(f"the {_SKIP} {what} (use --hybrid-pool off, every layer "
                              "alike)", None, None, option)

    name = policy if isinstance(policy, str) else getattr(policy, "name", str(policy))
    if name != "lru":
        no("--policy", f"HBM policy {name!r}: its pool frees in vLLM's order (lru)")
    if replicas != 1:
        no("--replicas", "several replicas")
    if pd_options is not None:
        no("--pd", "prefill/decode pools")
    if decision_log is not None:
        no("--decision-log", "a decision log")
    if opts.scheduler == "kvsim":
        no("--scheduler", "kvsim's scheduler (it runs vLLM's)")
    for t in ("dram", "cxl", "nvme"):
        if (getattr(config, f"{t}_gb") or 0) > 0:
            no(f"--{t}-gb", "lower tiers (HBM only; the profile's are off)")
    if config.shared_tier_gb is not None:
        no("--shared-tier-gb", "a shared tier")
    if config.write_policy == "vllm_offload":
        no("--write-policy", "vLLM's CPU offloading")
    if config.link_model != "none":
        no("--link-model", "links")
    if config.warmup_count(len(table)) > 0:
        no("--warmup", "a warm-up")
    if config.tenant_quotas or config.tenant_metrics:
        no("--tenant-quota", "tenants")
    if table.source.get("salt_by_tenant"):
        no("--salt-by-tenant", "salted hashes")
    df = table.df
    if getattr(opts, "spec_method", "none") == "mtp":
        no("--spec-method", "an MTP drafter's layers")
    if opts.spec_lookahead or ("spec_draft_tokens" in df and len(df)
                               and int(df["spec_draft_tokens"].max()) > 0):
        no("--spec-lookahead", "speculative drafts (the trace's spec_draft_tokens)")


__all__ = ["HYBRID_POOL", "check_supported", "is_hybrid", "wanted"]
