"""An independent reference of the tiered replay (``kvsim.api.simulate``), a test witness.

Written from the documentation (docs/simulate.md, docs/memory-model.md, docs/cost-model.md,
docs/trace-format.md, docs/decision-log.md, DESIGN.md §3) in plain Python: lists, dicts and
dataclasses, one event row at a time, no numba, nothing imported from ``kvsim.replay`` or
``kvsim.memory`` but the documented reason sentences.  It shares with the replay only what
is not under test here: the event reader, the hardware-profile parser and the policies
(called through kvsim.policy.api's hook contract).

``reference_replay(trace, policy, config)`` returns the summary (the keys of
``SimResult.summary``) and the decision-log rows (dicts with the columns of
docs/decision-log.md); tests/sim/test_reference_diff.py checks the replay against it.

Modules: :mod:`.pool` (HBM, vLLM v1 prefix caching), :mod:`.tiers` (DRAM/CXL/NVMe and the
spill cascade), :mod:`.replay` (events, placement, costs, preemption, steps, metrics).
"""

from __future__ import annotations

from kvsim.events import read_events
from kvsim.policy.registry import get_policy
from kvsim.spec.hardware import load_hardware

from .replay import Reference, Tiering

GB = 1_000_000_000  # docs/cost-model.md: --hbm-gb and tier capacities are in 1e9 bytes


def tiering(config, block_bytes: int) -> Tiering:
    """Capacities in whole blocks and transfer costs, as docs/cost-model.md states them:
    slowest hop bounds a transfer, one latency (medium + link) per batch, bandwidths in
    bytes per microsecond."""
    hw = load_hardware(config.hardware)
    if config.hbm_blocks is not None:
        hbm = int(config.hbm_blocks)
    else:
        hbm = int(config.hbm_gb * GB) // block_bytes
    caps, up_lat, up_bw, down_lat, down_bw = [], [0.0], [1.0], [0.0], [1.0]
    for name in ("dram", "cxl", "nvme"):
        t = hw.tiers[name]
        gb = getattr(config, f"{name}_gb")
        cap_bytes = t.capacity_bytes if gb is None else int(gb * GB)
        caps.append(int(cap_bytes) // block_bytes)
        lat = float(t.latency_us + t.link_latency_us)
        up_lat.append(lat)
        down_lat.append(lat)
        up_bw.append(min(t.read_bandwidth_bytes_per_s, t.link_bandwidth_bytes_per_s) / 1e6)
        down_bw.append(min(t.write_bandwidth_bytes_per_s, t.link_bandwidth_bytes_per_s) / 1e6)
    return Tiering(hbm, caps, up_lat, up_bw, down_lat, down_bw)


def reference_replay(trace_path, policy: str, config, log: bool = True):
    """(summary dict, decision-log rows) of replaying ``trace_path`` under ``policy``."""
    header, df = read_events(trace_path)
    rows = df.to_dict("records")
    for row in rows:  # plain Python ints and floats
        for k, v in row.items():
            row[k] = v.item() if hasattr(v, "item") else v
    bs = int(header.block_size_tokens)
    block_bytes = int(header.kv_bytes_per_token) * bs
    pol = get_policy(policy)
    lower = [get_policy(config.tier_policy(t)) for t in ("dram", "cxl", "nvme")]
    ref = Reference(rows, bs, pol, lower, tiering(config, block_bytes), config, log).run()
    summary = {"policy": pol.name, "offline": bool(pol.offline), "mode": "engine",
               "warmup_requests": ref.warmup, **ref.summary()}
    return summary, ref.rec.rows
