#!/usr/bin/env bash
# Cold compile CPU and warm runtime CPU of kvsim under one setting of numba's knobs
# (docs/benchmarks.md, "Cold compile": NUMBA_OPT, NUMBA_LOOP_VECTORIZE, ...).  Usage:
#   bench/compile_knobs.sh OUTDIR MOONCAKE_512_PARQUET [VAR=VALUE ...]
# With empty numba and kvsim caches under OUTDIR and the VAR=VALUE settings in the
# environment of every command:
#   1. cold: bench/prof_compile_phases.py on the closed-loop lru run (compile by phase,
#      LLVM functions machine-compiled), KVSIM_COMPILE_WORKERS=1 (one process);
#   2. the README main job with --engine compiled, twice (the first compiles the other
#      policies' hooks; the second is the warm figure; its --json kept as readme.json);
#   3. kvsim simulate on the Mooncake 512 import, lru, compiled, twice (second = warm;
#      --json kept as mooncake.json).
# Each timed command appends "name user_s sys_s wall_s loadavg_before loadavg_after" to
# OUTDIR/times.txt (/usr/bin/time: CPU of the process and its children).
set -u
out=${1:?usage}; mc=${2:?usage}; shift 2
rm -rf "$out"; mkdir -p "$out"
export NUMBA_CACHE_DIR="$out/numba" KVSIM_CACHE_DIR="$out/kvsim" COLUMNS=120
for kv in "$@"; do export "$kv"; done
echo "settings: $*" > "$out/times.txt"
t() {  # t NAME OUTFILE CMD...
  local name=$1 o=$2; shift 2
  local l0; l0=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -f "%U %S %e" -o "$out/$name.time" "$@" > "$o" 2> "$out/$name.err"
  echo "$name $(cat "$out/$name.time") $l0 $(cut -d' ' -f1 /proc/loadavg)" >> "$out/times.txt"
}
B="$(cd "$(dirname "$0")" && pwd)"
R="--profile deadline_pressure --requests 256 --seed 0 --hbm-gb 8"
KVSIM_COMPILE_WORKERS=1 t cold_prof "$out/prof.txt" python "$B/prof_compile_phases.py" \
  simulate $R --policy lru --engine compiled --json
t readme_first "$out/readme_first.json" kvsim compare $R --engine compiled --json
t readme_warm "$out/readme.json" kvsim compare $R --engine compiled --json
t mc_first "$out/mooncake_first.json" kvsim simulate --trace "$mc" --policy lru --engine compiled --json
t mc_warm "$out/mooncake.json" kvsim simulate --trace "$mc" --policy lru --engine compiled --json
t mc_warm2 "$out/mooncake2.json" kvsim simulate --trace "$mc" --policy lru --engine compiled --json
