"""The cost model: what a transfer, a spill and a step cost, from a hardware profile.

Formulas (docs/cost-model.md gives each with its source):

* promote a block of ``b`` bytes from lower tier ``t`` into HBM:
  ``latency_t + link_latency_t + b / min(read_bandwidth_t, link_bandwidth_t)``; the
  latency is paid once per request admission per tier (one batched DMA), the bandwidth
  term per block.  (kvsim.spec.hardware.TierSpec.transfer_us is the same formula for one
  transfer.)
* demote (spill) or write-through into tier ``t``: ``b / min(write_bandwidth_t,
  link_bandwidth_t)`` of link time; asynchronous (copy engines overlap with compute), so it
  adds no stall, only bytes on the link.
* swap-out / swap-in of a preempted request: the DRAM path, synchronous: charged to the
  step.
* a block resident nowhere: its ``recompute_cost_us`` (from the lowering's prefill model)
  is already inside ``STEP.duration_us`` at admission; after a recompute preemption it is
  added to the step that resumes the request.
* step latency = ``max(0, duration_us - saved recompute) + stalls + swap/recompute extra``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.core.errors import KvsimInputError
from kvsim.core.layout import (
    NX,
    TIER_NAMES,
    X_DOWN_BYTES_PER_US,
    X_DOWN_LAT_US,
    X_UP_BYTES_PER_US,
    X_UP_LAT_US,
)
from kvsim.core.units import GB  # noqa: E402,F401  (re-exported: callers import it from here)


@dataclass(frozen=True)
class TierCosts:
    """One tier as the replay sees it (capacity in blocks; bandwidths of the slowest hop)."""

    name: str
    capacity_bytes: int
    capacity_blocks: int
    up_latency_us: float  # medium + link latency of a read into HBM
    up_bytes_per_s: float  # min(medium read, link) bandwidth
    down_latency_us: float
    down_bytes_per_s: float  # min(medium write, link) bandwidth
    link: str

    def promote_us(self, nbytes: int, with_latency: bool = True) -> float:
        """Time to bring ``nbytes`` up into HBM (the formula the compiled core uses)."""
        lat = self.up_latency_us if with_latency else 0.0
        return lat + nbytes / self.up_bytes_per_s * 1e6


def hbm_kv_capacity_bytes(gpu_memory_bytes: int, weights_bytes: int,
                          gpu_memory_utilization: float) -> int:
    """vLLM-style KV budget: ``gpu_memory * utilization - weights`` (never negative)."""
    return max(0, int(gpu_memory_bytes * gpu_memory_utilization) - int(weights_bytes))


def tier_costs(hardware, block_bytes: int, hbm_blocks: int) -> list[TierCosts]:
    """Per-tier costs (HBM first) for blocks of ``block_bytes``.  ``hardware`` is a
    :class:`kvsim.spec.hardware.HardwareProfile` whose capacities are already final."""
    if block_bytes <= 0:
        raise KvsimInputError("expected a positive block size in bytes (header "
                              "kv_bytes_per_token x block_size_tokens, or size_bytes rows)",
                              None, None, "size_bytes")
    out = []
    for name in TIER_NAMES:
        spec = hardware.tiers[name]
        if name == "hbm":
            bw = float(spec.read_bandwidth_bytes_per_s) or hardware.hbm_bandwidth_bytes_per_s
            out.append(TierCosts("hbm", hbm_blocks * block_bytes, hbm_blocks, 0.0, bw, 0.0,
                                 bw, "local"))
            continue
        up = min(spec.read_bandwidth_bytes_per_s, spec.link_bandwidth_bytes_per_s)
        down = min(spec.write_bandwidth_bytes_per_s, spec.link_bandwidth_bytes_per_s)
        cap_blocks = int(spec.capacity_bytes // block_bytes) if spec.capacity_bytes > 0 else 0
        if cap_blocks > 0 and (up <= 0 or down <= 0):
            raise KvsimInputError(f"tier {name} has capacity but no bandwidth in profile "
                                  f"{hardware.name!r}", None, None, f"tiers.{name}")
        lat = float(spec.latency_us + spec.link_latency_us)
        out.append(TierCosts(name, int(spec.capacity_bytes), cap_blocks, lat, float(up), lat,
                             float(down), spec.link))
    return out


def cost_array(costs: list[TierCosts]) -> np.ndarray:
    """``X[tier, X_*]`` for the compiled core (bandwidths in bytes per microsecond)."""
    X = np.zeros((4, NX), dtype=np.float64)
    for t, c in enumerate(costs):
        X[t, X_UP_LAT_US] = c.up_latency_us
        X[t, X_UP_BYTES_PER_US] = max(c.up_bytes_per_s, 1.0) / 1e6
        X[t, X_DOWN_LAT_US] = c.down_latency_us
        X[t, X_DOWN_BYTES_PER_US] = max(c.down_bytes_per_s, 1.0) / 1e6
    return X
