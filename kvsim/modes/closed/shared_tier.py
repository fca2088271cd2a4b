"""A shared cluster tier (``--shared-tier-gb``): one KV store every replica reaches over its
own network link (Mooncake Store, LMCache's remote backends, Dynamo KVBM's G4).

How it is built.  Each replica of the closed loop (:mod:`kvsim.modes.closed.cluster`) has its
own HBM pool; with a shared tier its lower hierarchy is the shared one instead of a private
DRAM / CXL / NVMe: the tier in the DRAM slot (tier 1) holds ``shared_tier_gb`` and is **the
same arrays** in every replica's replay (:func:`share`), so a block one replica spills is
found by every other one's admission lookup, and by the router.  The private CXL and NVMe
tiers are off (the three tiers share one hash table, kvsim.replay.kernel.tiers, so a
private tier cannot sit beside a shared one).

Rules, each with its source:

* **capacity and eviction**: ``shared_tier_gb`` x 1e9 bytes in whole blocks, its own
  eviction policy ``shared_tier_policy`` (any registered policy; lru by default: Mooncake
  Store evicts approximately LRU at a high watermark, DESIGN.md s.3);
* **what enters it**: what enters the DRAM slot of a private hierarchy: HBM evictions under
  ``write_back``, first (or second) uses under ``write_through`` (SGLang HiCache's write
  policies, docs/memory-model.md);
* **de-duplication**: always: the store is content-addressed (a block's key is its prefix
  hash), so a content any replica already stored is not stored again (Mooncake Store and
  LMCache key KV chunks by their token-prefix hash);
* **one network link per replica**: a replica's transfers to and from the store use its own
  link (``shared_link_bytes_per_s``, ``shared_link_latency_us``); under ``--link-model
  queue`` that link is a FIFO queue (kvsim.replay.kernel.links), so a replica's promotions
  wait behind its own earlier ones.  The store's own NIC is not a shared bottleneck in
  this model (stated in docs/memory-model.md, "Shared cluster tier");
* **lookup**: the admission lookup continues the HBM chain in the store, as it does in a
  private DRAM tier (vLLM's connector ``get_num_new_matched_tokens`` after the local
  prefix cache).

Metrics: the summary's ``dram_*`` keys are the shared tier's (its hit rate, bytes over the
links, evictions); :func:`shared_keys` adds ``shared_tier_hit_rate``,
``shared_tier_capacity_blocks``, ``shared_tier_peak_blocks`` and ``network_bytes`` (all
replicas' links together, both directions; ``network_bytes_up`` / ``_down`` split it).
"""

from __future__ import annotations

import dataclasses

from kvsim.core import layout as L
from kvsim.core.errors import KvsimInputError


def enabled(config) -> bool:
    return getattr(config, "shared_tier_gb", None) is not None


def config_for(config):
    """The replicas' config with a shared tier: the DRAM slot holds the store (its capacity
    and policy), CXL and NVMe off."""
    if not enabled(config):
        return config
    if (config.dram_gb == config.shared_tier_gb and config.cxl_gb == 0 and config.nvme_gb == 0
            and config.tier_policy("dram") == config.shared_tier_policy):
        return config  # already this function's result (idempotent)
    if config.shared_tier_gb <= 0:
        raise KvsimInputError(f"expected --shared-tier-gb > 0, got {config.shared_tier_gb}",
                              None, None, "--shared-tier-gb")
    for name in ("dram_gb", "cxl_gb", "nvme_gb"):
        if getattr(config, name) not in (None, 0, 0.0):
            raise KvsimInputError(f"expected no --{name.replace('_', '-')} with "
                                  "--shared-tier-gb (the replicas' lower hierarchy is the "
                                  "shared tier)", None, None, f"--{name.replace('_', '-')}")
    pols = dict(config.tier_policies)
    pols["dram"] = config.shared_tier_policy
    return dataclasses.replace(config, dram_gb=config.shared_tier_gb, cxl_gb=0.0, nvme_gb=0.0,
                               tier_policies=tuple(pols.items()))


def network_costs(config, costs: list) -> list:
    """``costs`` (HBM first) with tier 1 moved behind the network link."""
    if not enabled(config):
        return costs
    bw = float(config.shared_link_bytes_per_s)
    lat = float(config.shared_link_latency_us)
    c = costs[1]
    shared = dataclasses.replace(c, up_latency_us=lat, up_bytes_per_s=bw, down_latency_us=lat,
                                 down_bytes_per_s=bw, link="network")
    return [costs[0], shared, *costs[2:]]


def share(engines: list) -> None:
    """Make every replica's lower tiers replica 0's (the same arrays: one store)."""
    first = engines[0].run
    for e in engines[1:]:
        run = e.run
        run.T = first.T
        run.T_core = first.T_core
        run.views = (run.views[0],) + first.views[1:]
        for k in ("L1_rows", "L2_rows", "L3_rows"):
            run.rows[k] = first.rows[k]
        sc = e.sched
        sc.lookup = (*sc.lookup[:2], first.T[0].L_h)
        e._args = None  # the compiled step's arguments are made again with these


def shared_keys(summary: dict, engines: list, warmup: int = 0) -> dict:
    """The shared tier's keys (see the module's docstring); its peak is the store's, not
    the sum over replicas the cluster summary adds up.  ``network_bytes_up`` (store ->
    HBM) and ``network_bytes_down`` (HBM -> store) split ``network_bytes``, measured like
    it (after the warm-up snapshot when ``warmup`` > 0)."""
    peak = max(int(e.run.C[L.C_PEAK + 1]) for e in engines)
    up = down = 0.0
    for e in engines:
        C = e.run.C
        W = e.run.Cw if warmup > 0 and C[L.C_WARM_DONE] != 0 else None
        up += C[L.M_BYTES_UP + 1] - (W[L.M_BYTES_UP + 1] if W is not None else 0.0)
        down += C[L.M_BYTES_DOWN + 1] - (W[L.M_BYTES_DOWN + 1] if W is not None else 0.0)
    return {"shared_tier_hit_rate": summary["dram_hit_rate"],
            "shared_tier_capacity_blocks": summary["dram_capacity_blocks"],
            "shared_tier_peak_blocks": peak,
            "peak_dram_blocks": peak,
            "network_bytes": summary["bytes_dram_link"],
            "network_bytes_up": int(up),
            "network_bytes_down": int(down)}
