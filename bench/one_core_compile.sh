#!/bin/bash
# Cold and warm compile cost of the one replay core (issue 17; docs/benchmarks.md, "One
# core").  Each step runs in a fresh process; "cold" steps start from EMPTY numba and kvsim
# caches (folders under $OUT), so the first one compiles the core.  Prints wall and CPU
# seconds (/usr/bin/time) and /proc/loadavg before and after each step.
#
#   bench/one_core_compile.sh OUT_DIR MC512B_PARQUET
#
# MC512B_PARQUET: the Mooncake conversation trace imported at 512-token blocks:
#   kvsim import-request-trace --requests ../shared/traces/mooncake/conversation_trace.jsonl \
#         --block-size 512 --out mc512b.parquet
set -u
OUT=${1:?output folder}; MC=${2:?mc512b.parquet}
mkdir -p "$OUT"
t() {
  local tag=$1; shift
  echo "== $tag  loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f "$tag: wall %e s, user %U s, sys %S s, max RSS %M KB" "$@" \
      > "$OUT/$tag.out" 2> "$OUT/$tag.err"
  tail -1 "$OUT/$tag.err"
  echo "   loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
}
rm -rf "$OUT/numba_a" "$OUT/kvsim_a" "$OUT/numba_b" "$OUT/kvsim_b"
# 1. the README main job on the compiled engine: 13 policies + belady, closed loop
export NUMBA_CACHE_DIR="$OUT/numba_a" KVSIM_CACHE_DIR="$OUT/kvsim_a"
for pol in lru fifo s3fifo; do  # one core compile, then hooks only
  t "simulate_${pol}_after_previous" kvsim simulate --profile deadline_pressure --requests 256 \
      --seed 0 --hbm-gb 8 --policy $pol --engine compiled --json
done
t readme_compare_warm kvsim compare --profile deadline_pressure --requests 256 --seed 0 \
    --hbm-gb 8 --engine compiled --jobs 2 --json
# 2. kvsim compare of every built-in on the 512-token Mooncake import, --jobs 2
export NUMBA_CACHE_DIR="$OUT/numba_b" KVSIM_CACHE_DIR="$OUT/kvsim_b"
t mooncake_compare_cold kvsim compare --trace "$MC" --jobs 2 --json
t mooncake_compare_warm kvsim compare --trace "$MC" --jobs 2 --json
t mooncake_lru_warm kvsim simulate --trace "$MC" --policy lru --engine compiled --json
