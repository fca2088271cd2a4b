#!/usr/bin/env bash
# P/D disaggregation on the Mooncake conversation trace: 8 aggregated replicas against
# --pd splits (docs/benchmarks.md, "Prefill/decode disaggregation").  Usage:
#   bench/bench_pd.sh OUT_DIR [TRACE]      (one JSON and one time -v log per configuration)
set -euo pipefail
OUT=${1:?usage: bench/bench_pd.sh OUT_DIR [TRACE]}
T=${2:-../shared/traces/mooncake/conversation_trace.jsonl}
mkdir -p "$OUT"
C=(--request-trace "$T" --model llama-3.1-8b --block-size 512 --router prefix
   --link-model queue --dram-gb 0 --cxl-gb 0 --nvme-gb 0 --json)
run() {
  local name=$1; shift
  date; cat /proc/loadavg
  /usr/bin/time -v kvsim simulate "${C[@]}" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
}
run agg8 --replicas 8
run pd35 --pd 3:5
run pd44 --pd 4:4
run pd44_25g --pd 4:4 --pd-link-gbps 25
run pd53 --pd 5:3
run pd44_if1 --pd 4:4 --pd-max-inflight 1
date; cat /proc/loadavg
