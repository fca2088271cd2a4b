"""Shared cluster tier and links as queues on a request trace (docs/benchmarks.md, "Cluster
memory: a shared tier and links as queues").

    python bench/bench_shared_tier.py --request-trace ../shared/traces/mooncake/conversation_trace.jsonl \
        --out bench/results/shared_tier_mooncake.json

Serves the trace closed loop on ``--replicas`` engines behind ``--router`` under each
configuration of CONFIGS (private tiers off, a private DRAM tier, a shared tier at several
network speeds; each with ``--link-model none`` and ``queue``) and prints one Markdown row
per configuration: hit rates, TTFT p50/p99, network bytes, link utilisation and queueing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

#: (label, SimConfig fields): the private hierarchy off unless named
CONFIGS = {
    "hbm-only": {"dram_gb": 0.0},
    "private-dram": {"dram_gb": 32.0},
    "shared-100g": {"shared_tier_gb": 256.0},
    "shared-50g": {"shared_tier_gb": 256.0, "shared_link_bytes_per_s": 50e9 / 8},
    "shared-40g": {"shared_tier_gb": 256.0, "shared_link_bytes_per_s": 40e9 / 8},
    "shared-25g": {"shared_tier_gb": 256.0, "shared_link_bytes_per_s": 25e9 / 8},
    "shared-10g": {"shared_tier_gb": 256.0, "shared_link_bytes_per_s": 10e9 / 8},
}
KEYS = ("hbm_hit_rate", "prefix_hit_rate", "dram_hit_rate", "ttft_p50_us", "ttft_p99_us",
        "stall_us", "bytes_dram_link", "prefetches", "prefetches_useful", "promotions",
        "link_queue_p50_us", "link_queue_p99_us", "link_shared_up_utilisation",
        "link_dram_up_utilisation", "network_bytes_up", "network_bytes_down",
        "link_shared_up_queue_us", "link_shared_up_transfers", "steps")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--request-trace", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--routers", nargs="+", default=["prefix"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS))
    ap.add_argument("--links", nargs="+", default=["none", "queue"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from kvsim.ingest import read_requests
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    table = read_requests(a.request_trace, None)
    opts = EngineOptions(block_size_tokens=a.block_size, model=a.model)
    rows = []
    for label in a.configs:
        for router in a.routers:
            for link in a.links:
                kw = {"cxl_gb": 0.0, "nvme_gb": 0.0, **CONFIGS[label]}
                if "shared_tier_gb" in kw:
                    kw.pop("cxl_gb"), kw.pop("nvme_gb")
                config = SimConfig(model=a.model, engine="compiled", link_model=link, **kw)
                t0, c0 = time.time(), time.process_time()
                s = serve(table, "lru", config, replicas=a.replicas, router=router,
                          engine=opts).summary
                row = {"config": label, "router": router, "link_model": link,
                       **{k: s.get(k) for k in KEYS},
                       "cpu_s": round(time.process_time() - c0, 1),
                       "wall_s": round(time.time() - t0, 1),
                       "load": open("/proc/loadavg").read().split()[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("| config | router | links | HBM hit | prefix hit | tier hit | TTFT p50 ms | "
          "TTFT p99 ms | network GB | link util | queue p50 ms | queue p99 ms |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        util = r["link_shared_up_utilisation"] or r["link_dram_up_utilisation"]
        net = r["bytes_dram_link"] / 1e9 if r["config"].startswith("shared") else 0.0

        def ms(x):
            return "-" if x is None else f"{x / 1e3:.2f}"
        print(f"| {r['config']} | {r['router']} | {r['link_model']} | "
              f"{r['hbm_hit_rate']:.2%} | {r['prefix_hit_rate']:.2%} | "
              f"{r['dram_hit_rate']:.2%} | {ms(r['ttft_p50_us'])} | {ms(r['ttft_p99_us'])} | "
              f"{net:.1f} | {'-' if util is None else f'{util:.1%}'} | "
              f"{ms(r['link_queue_p50_us'])} | {ms(r['link_queue_p99_us'])} |")


if __name__ == "__main__":
    main()
