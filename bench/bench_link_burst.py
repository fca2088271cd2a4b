"""A burst of returning conversations: where link queueing, not link speed, decides whether
a shared tier helps TTFT (docs/benchmarks.md, "Cluster memory: a shared tier and links as
queues").

    python bench/bench_link_burst.py

``--requests`` conversations of ``--prompt-blocks`` 512-token blocks arrive one a second on 2
replicas (round robin) with a small HBM (``--hbm-gb``), so all but the last few are evicted
to the tier below; then all of them come back at once with a new partial block (a burst:
they wait in the replicas' queues).  Measured: the burst's requests (the first pass is the
warm-up).  Configurations: no lower tier; a shared tier at ``--gbps`` with each
transfer timed alone (``--link-model none``: every waiting request's prefetch gets the
whole link) and queued (``--link-model queue``: they share it, first in first out).
"""

from __future__ import annotations

import argparse
import json
import time

B = 512


def table(n: int, blocks: int):
    from kvsim.ingest.requests import build_request_table

    ids, arrival = [], []
    for j in range(n):  # first pass: one a second
        ids.append([1000 * j + k for k in range(1, blocks + 1)])
        arrival.append(j * 1_000_000)
    t_burst = (n + 10) * 1_000_000
    for j in range(n):  # the burst: the same prompts, a new partial block
        ids.append([1000 * j + k for k in range(1, blocks + 1)] + [1000 * j + 999])
        arrival.append(t_burst + j)  # 1 us apart: arrival order = j
    prompt = [blocks * B + 100] * n + [blocks * B + 200] * n
    return build_request_table({"arrival_us": arrival, "prompt_tokens": prompt,
                                "output_tokens": [16] * (2 * n), "block_ids": ids,
                                "hashed_tokens": [min(len(x) * B, p) for x, p in
                                                  zip(ids, prompt)]},
                               block_size_tokens=B)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-blocks", type=int, default=15)
    ap.add_argument("--hbm-gb", type=float, default=4.0)
    ap.add_argument("--gbps", type=float, nargs="+", default=[40.0, 100.0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    t = table(a.requests, a.prompt_blocks)
    opts = EngineOptions(block_size_tokens=B, model=a.model)
    base = {"model": a.model, "hbm_gb": a.hbm_gb, "warmup_requests": a.requests,
            "engine": "compiled"}
    runs = [("no lower tier", None, "none", {"dram_gb": 0.0, "cxl_gb": 0.0, "nvme_gb": 0.0})]
    for g in a.gbps:
        for link in ("none", "queue"):
            runs.append((f"shared tier, {g:g} Gbit/s", g, link,
                         {"shared_tier_gb": 256.0, "shared_link_bytes_per_s": g * 1e9 / 8}))
    rows = []
    for label, g, link, kw in runs:
        c0 = time.process_time()
        s = serve(t, "lru", SimConfig(link_model=link, **base, **kw), replicas=2,
                  engine=opts).summary
        rows.append({"config": label, "gbps": g, "link_model": link,
                     **{k: s.get(k) for k in ("prefix_hit_rate", "hbm_hit_rate",
                                              "ttft_p50_us", "ttft_p99_us", "stall_us",
                                              "prefetches", "prefetches_useful",
                                              "promotions", "link_queue_p50_us",
                                              "link_queue_p99_us", "network_bytes_up")},
                     "cpu_s": round(time.process_time() - c0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    print("| configuration | links | prefix hit | TTFT p50 ms | TTFT p99 ms | stall s | "
          "prefetches (useful) | on demand | queue p50 ms | queue p99 ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        q50, q99 = r["link_queue_p50_us"], r["link_queue_p99_us"]
        print(f"| {r['config']} | {r['link_model']} | {r['prefix_hit_rate']:.2%} | "
              f"{r['ttft_p50_us'] / 1e3:.1f} | {r['ttft_p99_us'] / 1e3:.1f} | "
              f"{r['stall_us'] / 1e6:.2f} | {r['prefetches']} ({r['prefetches_useful']}) | "
              f"{r['promotions']} | {'-' if q50 is None else f'{q50 / 1e3:.1f}'} | "
              f"{'-' if q99 is None else f'{q99 / 1e3:.1f}'} |")


if __name__ == "__main__":
    main()
