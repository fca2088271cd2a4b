#!/bin/bash
# The real-GPU checks in one run (bench/gpu/README.md), for a machine lent for a few minutes:
# the CUDA backend's tests, the quick DRAM-link calibration, and the step-time witness.
# Usage: bash bench/gpu/device_checks.sh OUTDIR [default|long|none]   (the step-time shapes)
# Needs torch, numba, numba-cuda and kvsim's other dependencies already installed (kvsim itself
# is installed here without its dependencies, so nothing is fetched).
set -u
out=${1:?usage: device_checks.sh OUTDIR [default|long]}
shapes=${2:-long}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 KVSIM_CACHE_DIR=/tmp/kvsim-cache
{
  date -u +%FT%TZ; cat /proc/loadavg; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, numba, numpy, numba_cuda; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'numba', numba.__version__, 'numba-cuda', \
numba_cuda.__version__, 'numpy', numpy.__version__)"
  git rev-parse HEAD 2>/dev/null || true
} > "$out/env.txt" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1 \
  || { cat "$out/install.txt"; exit 1; }
python3 -m pytest -q -p no:cacheprovider tests/backends/ > "$out/backends.txt" 2>&1
echo "backends rc=$?" | tee -a "$out/env.txt"
tail -3 "$out/backends.txt"
kvsim calibrate --backend cuda --base h200 --out "$out/h200-calibrated-cuda.toml" \
  > "$out/calibrate.txt" 2>&1
echo "calibrate rc=$?" | tee -a "$out/env.txt"
[ "$shapes" = none ] && exit 0
python3 bench/gpu/torch_step_time.py --shapes "$shapes" --out "$out/step_times_$shapes.json" \
  > /dev/null 2> "$out/step_times_$shapes.log"
echo "step times rc=$?" | tee -a "$out/env.txt"
python3 bench/gpu/compare_step_time.py "$out/step_times_$shapes.json" 2>&1 | tee "$out/compare.txt"
