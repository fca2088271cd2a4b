"""Whole-process CPU of a warm ``kvsim simulate --request-trace`` run whose engine steps are
negligible (the first ``--requests`` requests of the Mooncake trace): kvsim's per-process
fixed costs, for one or more checkouts alternated (docs/benchmarks.md, "Per-process
fixed costs"):

    python bench/aisimulate/fixed_cpu.py --checkout before=DIR1:CACHE1 after=DIR2:CACHE2 \
        --requests 100 --repeat 5

Each run is a fresh ``python -m kvsim`` child started in DIR (so DIR's ``kvsim`` is imported even
beside an editable install of another checkout) with ``PYTHONPATH=DIR`` and its own warm cache
(``NUMBA_CACHE_DIR`` / ``KVSIM_CACHE_DIR`` under CACHE, as bench_vs_aisimulate.py's
``--cache``); its CPU is user + sys of the child (``getrusage``).  Prints the minimum per
checkout, every run and /proc/loadavg as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_vs_aisimulate import MOONCAKE, kvsim_cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", nargs="+", required=True, metavar="NAME=DIR:CACHE")
    ap.add_argument("--requests", type=int, default=100, help="0: the whole trace")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--trace", default=str(MOONCAKE))
    a = ap.parse_args()
    trees = dict(c.split("=", 1) for c in a.checkout)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "head.jsonl"
        with open(a.trace) as src:
            trace.write_text("".join(line for _, line in zip(range(a.requests), src))
                             if a.requests else src.read())
        cmd = kvsim_cmd(str(trace), 512, 900, 0, a.replicas, "llama-3.1-8b", "write_back")
        runs: dict[str, list[float]] = {name: [] for name in trees}
        loads = []
        for _ in range(a.repeat):
            for name, spec in trees.items():
                tree, cache = spec.rsplit(":", 1)
                env = dict(os.environ, PYTHONPATH=tree, COLUMNS="120",
                           NUMBA_CACHE_DIR=str(Path(cache) / "numba"),
                           KVSIM_CACHE_DIR=str(Path(cache) / "kvsim"))
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                p = subprocess.run([sys.executable, "-m", "kvsim", *cmd], env=env, cwd=tree,
                                   capture_output=True, text=True)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                if p.returncode != 0:
                    raise SystemExit(f"{name} failed ({p.returncode}):\n{p.stderr[-2000:]}")
                runs[name].append(round(r1.ru_utime + r1.ru_stime - r0.ru_utime
                                        - r0.ru_stime, 3))
                loads.append(Path("/proc/loadavg").read_text().split()[0])
    print(json.dumps({"min_cpu_s": {k: min(v) for k, v in runs.items()}, "runs": runs,
                      "load": loads, "command": cmd}, indent=1))


if __name__ == "__main__":
    main()
