#!/usr/bin/env bash
# Cold and warm timings of the README main job and of the Mooncake 512 compare
# (docs/benchmarks.md, "Cold compile").  Usage:
#   bench/cold_compile.sh OUTDIR [MOONCAKE_512_PARQUET]
# Each "cold" row starts from empty numba and kvsim caches under OUTDIR (its own folder),
# its "warm" row reuses them.  Every row appends one JSON line to OUTDIR/timings.jsonl
# (bench/bench_cold_compile.py: wall, this process's CPU, its workers' CPU, loadavg) and
# writes the command's --json output to OUTDIR/<row>.json.  PY=python by default (set
# PY=/path/to/other/venv/bin/python to time another checkout installed there).
set -u
out=${1:?usage: bench/cold_compile.sh OUTDIR [MOONCAKE_512_PARQUET]}
mc=${2:-}
PY=${PY:-python}
B="$(cd "$(dirname "$0")" && pwd)/bench_cold_compile.py"
mkdir -p "$out"
README="compare --profile deadline_pressure --requests 256 --seed 0 --hbm-gb 8"
row() {  # row NAME CACHE FRESH(--fresh or "") ARGS...
  local name=$1 cache=$2 fresh=$3
  shift 3
  COLUMNS=120 $PY "$B" "$out/$cache" $fresh -- "$@" > "$out/$name.json" 2> "$out/$name.err"
  tail -n 1 "$out/$name.err" | sed "s/^{/{\"row\": \"$name\", /" >> "$out/timings.jsonl"
  tail -n 1 "$out/timings.jsonl"
}
row readme_compiled_cold readme_compiled --fresh $README --engine compiled --json
row readme_compiled_warm readme_compiled "" $README --engine compiled --json
row readme_auto_cold readme_auto --fresh $README --json
row readme_auto_warm readme_auto "" $README --json
if [ -n "$mc" ]; then
  row mooncake_jobs2_cold mooncake --fresh compare --trace "$mc" --jobs 2 --json
  row mooncake_jobs2_warm mooncake "" compare --trace "$mc" --jobs 2 --json
fi
