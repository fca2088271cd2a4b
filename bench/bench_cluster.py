"""Closed-loop cluster table: replicas x routers x policies on a request trace.

    python bench/bench_cluster.py --request-trace ../shared/traces/mooncake/conversation_trace.jsonl \
        --block-size 512 --replicas 1 2 4 8 16 --routers round_robin least_loaded session prefix \
        --policies lru fifo belady --out bench/results/cluster_mooncake.json

One row per (replicas, router, policy): TTFT p50/p99, cluster HBM hit rate, prefix hit rate,
throughput, preemptions, plus the run's CPU seconds and wall seconds (compile excluded: the
first run of each policy is repeated when ``--warm`` is given).  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

KEYS = ("ttft_p50_us", "ttft_p99_us", "tpot_p50_us", "queue_p99_us", "hbm_hit_rate",
        "prefix_hit_rate", "prefill_tokens_saved", "throughput_tokens_per_s", "preemptions",
        "slo_attainment", "steps")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--request-trace", required=True)
    ap.add_argument("--format", default=None)
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--routers", nargs="+", default=["round_robin", "least_loaded",
                                                     "session", "prefix"])
    ap.add_argument("--policies", nargs="+", default=["lru", "fifo", "belady"])
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--engine", default="compiled")
    ap.add_argument("--warm", action="store_true", help="run each policy once first")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from kvsim.ingest import read_requests
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    table = read_requests(a.request_trace, a.format)
    opts = EngineOptions(block_size_tokens=a.block_size)
    config = SimConfig(hardware=a.hardware, engine=a.engine)
    rows = []
    for pol in a.policies:
        if a.warm:
            serve(table.__class__(df=table.df.head(64).copy(), block_size_tokens=table.block_size_tokens,
                                  source=table.source), pol, config, replicas=2, engine=opts)
        for n in a.replicas:
            for router in (a.routers if n > 1 else ["round_robin"]):
                t0, c0 = time.time(), time.process_time()
                s = serve(table, pol, config, replicas=n, router=router, engine=opts).summary
                row = {"policy": pol, "replicas": n, "router": router,
                       **{k: s[k] for k in KEYS},
                       "cpu_s": round(time.process_time() - c0, 1),
                       "wall_s": round(time.time() - t0, 1),
                       "loadavg": os.getloadavg()[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| replicas | router | policy | TTFT p50 s | TTFT p99 s | HBM hit | prefix hit | "
          "out tok/s | preemptions | CPU s |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['replicas']} | {r['router']} | {r['policy']} | {r['ttft_p50_us']/1e6:.2f} | "
              f"{r['ttft_p99_us']/1e6:.2f} | {100*r['hbm_hit_rate']:.1f}% | "
              f"{100*r['prefix_hit_rate']:.1f}% | {r['throughput_tokens_per_s']:,.0f} | "
              f"{r['preemptions']:,} | {r['cpu_s']} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "argv": os.sys.argv}, indent=1))


if __name__ == "__main__":
    main()
