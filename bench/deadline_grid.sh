#!/usr/bin/env bash
# deadline vs lru on the deadline_pressure profile: 3 lower-tier set-ups x HBM 4/8/16 GB x
# seeds 0-2, 256 requests, each workload lowered for the HBM it is replayed into
# (`compare --profile`).  One line per (set-up, GB, seed, policy):
#   setup GB seed policy p99_step_us p999_step_us ttft_p99_ms tpot_p99_ms
#   decode_critical_misses hbm_hit_rate recompute_tokens stall_us deadline_misses
# Results and reading: docs/benchmarks.md ("deadline vs lru on deadline_pressure").
set -euo pipefail
for extra in "" "--no-prefetch" "--dram-gb 0 --cxl-gb 0 --nvme-gb 0"; do
  for h in 4 8 16; do
    for s in 0 1 2; do
      kvsim compare --profile deadline_pressure --requests 256 --seed "$s" --hbm-gb "$h" \
        $extra --policies lru,deadline --json 2>/dev/null |
      SETUP="${extra// /_}" H="$h" S="$s" python -c '
import json, os, sys
d = json.load(sys.stdin)
for p in d["policies"]:
    print(os.environ["SETUP"] or "tiers", os.environ["H"], os.environ["S"], p["policy"],
          round(p["p99_step_us"], 1), round(p["p999_step_us"], 1),
          round(p["ttft_p99_us"] / 1e3, 1), round(p["tpot_p99_us"] / 1e3, 2),
          p["decode_critical_misses"], round(p["hbm_hit_rate"], 4), p["recompute_tokens"],
          round(p["stall_us"]), p["deadline_misses"])'
    done
  done
done
