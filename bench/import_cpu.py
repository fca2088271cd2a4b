"""Whole-process CPU (user + sys, ``getrusage(RUSAGE_CHILDREN)``) of kvsim commands that do
no work, min of ``--repeat`` fresh processes (docs/benchmarks.md, "Import"):

    python bench/import_cpu.py --repeat 3 [--pythonpath CHECKOUT]

``--pythonpath``: run another checkout's kvsim (e.g. a clone of main) with this interpreter.
The numba cache is the environment's (``KVSIM_CACHE_DIR`` / ``NUMBA_CACHE_DIR``): kvsim's
import checks every file of it (kvsim/jit/cache_guard.py), so its size shows here.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

CASES = {"import kvsim.cli": ["-c", "import kvsim.cli"],
         "kvsim --version": ["-m", "kvsim", "--version"],
         "kvsim --help": ["-m", "kvsim", "--help"],
         "kvsim simulate --help": ["-m", "kvsim", "simulate", "--help"]}


def _cpu(argv: list[str], env: dict) -> float:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, capture_output=True, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pythonpath", default=None)
    a = ap.parse_args()
    env = dict(os.environ, COLUMNS="120")
    if a.pythonpath:
        env["PYTHONPATH"] = a.pythonpath
    out = {}
    for name, args in CASES.items():
        runs = [_cpu([sys.executable, *args], env) for _ in range(a.repeat)]
        out[name] = {"min_cpu_s": round(min(runs), 3), "runs": [round(x, 3) for x in runs]}
    out["load"] = open("/proc/loadavg").read().strip()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
