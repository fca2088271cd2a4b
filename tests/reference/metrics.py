"""The summary of a reference run: docs/simulate.md ("Reading `compare`'s table",
"Measurement windows", "Metrics: hit rates"), from the reference's counters, requests and
step latencies."""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def summary(ref) -> dict:
    """Every summary key but policy, offline, mode and warmup_requests."""
    c, bs, tg = defaultdict(float, ref.rec.c), ref.bs, ref.tg
    reqs = [q for q in ref.reqs.values() if q.state != "unseen" and q.rid in ref.measured]
    lat = ref.steps
    if ref.snapshot is not None:  # counters and steps from the window's first step
        for k, v in ref.snapshot.items():
            c[k] -= v
        lat = lat[ref.first_measured_step:]

    def pct(xs, p):
        xs = [x for x in xs if x == x]
        return float(np.percentile(np.array(xs, float), p)) if xs else float("nan")

    def rate(a, b):
        return float(a / b) if b > 0 else float("nan")

    ttft = [q.first_us - q.arrive_us for q in reqs if q.first_us >= 0]
    tpot = [(q.last_us - q.first_us) / (q.nout - 1) for q in reqs
            if q.first_us >= 0 and q.nout > 1]
    e2e = [q.last_us - q.arrive_us for q in reqs if q.first_us >= 0]
    lookup = sum(q.lookup_tok for q in reqs)
    hit = [sum(q.hit_tok[t] for q in reqs) for t in range(4)]
    prompt_blk = sum(-(-q.prompt // bs) for q in reqs if q.lookup_tok > 0)
    link = [c[f"bytes_up_{t}"] + c[f"bytes_down_{t}"] for t in range(4)]
    swap = c["swap_out_bytes"] + c["swap_in_bytes"]
    out = {
        "events": len(ref.rows), "steps": len(lat), "requests": len(reqs),
        "p50_step_us": pct(lat, 50), "p95_step_us": pct(lat, 95),
        "p99_step_us": pct(lat, 99), "p999_step_us": pct(lat, 99.9),
        "mean_step_us": float(np.mean(lat)) if lat else float("nan"),
        "ttft_p50_us": pct(ttft, 50), "ttft_p99_us": pct(ttft, 99),
        "tpot_p50_us": pct(tpot, 50), "tpot_p99_us": pct(tpot, 99),
        "e2e_p50_us": pct(e2e, 50), "e2e_p99_us": pct(e2e, 99),
        "deadline_misses": sum(1 for q in reqs if q.ttft_miss or q.tpot_missed),
        "ttft_deadline_misses": sum(1 for q in reqs if q.ttft_miss),
        "tpot_deadline_misses": sum(q.tpot_missed for q in reqs),
        "decode_critical_misses": int(c["decode_critical_misses"]),
        "prefix_hit_rate": rate(sum(hit), lookup),
        "block_hit_rate": rate(sum(hit) // bs, prompt_blk),
        "hbm_block_hit_rate": rate(hit[0] // bs, prompt_blk),
        "lookup_tokens": lookup, "hit_tokens": sum(hit), "prompt_blocks": prompt_blk,
        "hit_blocks": sum(hit) // bs,
        "bytes_moved": int(sum(link) + swap), "bytes_dram_link": int(link[1] + swap),
        "bytes_cxl_link": int(link[2]), "bytes_nvme_link": int(link[3]),
        "recompute_tokens": int(c["recompute_tokens"] + c["preempt_recompute_tokens"]),
        "evictions": int(sum(c[f"evictions_{t}"] for t in range(4))),
        "spills": int(sum(c[f"spills_{t}"] for t in range(3))),
        "prefetches_wasted": 0,
        "stall_us": float(c["stall_us"]), "saved_us": float(c["saved_us"]),
        "makespan_us": float(ref.clock_us),
    }
    for t, name in enumerate(("hbm", "dram", "cxl", "nvme")):
        out[f"{name}_hit_rate"] = rate(hit[t], lookup)
        out[f"evictions_{name}"] = int(c[f"evictions_{t}"])
        out[f"peak_{name}_blocks"] = int(ref.rec.peaks[t])
        out[f"{name}_capacity_blocks"] = int(([tg.hbm_blocks] + tg.caps)[t])
        if t < 3:
            out[f"spills_{name}"] = int(c[f"spills_{t}"])
    for k in ("first_compute_tokens", "preempt_recompute_tokens", "promotions",
              "prefetches", "prefetches_useful", "write_throughs", "preemptions",
              "swap_out_bytes", "swap_in_bytes", "cow_copies", "overflow_blocks"):
        out[k] = int(c[k])
    return out
