"""CPU of one Python snippet in two source trees, runs alternated at the same load.

    python bench/alternate_cpu.py --before /path/main_tree --after /path/branch_tree \
        --reps 5 --env KVSIM_CACHE_DIR=/some/cache 'import kvsim'

Each run is ``python -c CODE`` with ``PYTHONPATH`` = the tree and cwd ``/tmp`` (so the
current checkout is not imported instead); CPU-s = the child's user + system time
(``RUSAGE_CHILDREN``).  Prints ``/proc/loadavg``, then min / median / every run per tree, and
what each run printed (its first three).  Used for docs/benchmarks.md "Compile-cache guard:
records at write, stamps at import".
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("code")
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE, repeatable")
    args = ap.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    trees = {"before": args.before, "after": args.after}
    cpu: dict[str, list[float]] = {k: [] for k in trees}
    out: dict[str, list[str]] = {k: [] for k in trees}
    for _ in range(args.reps):
        for name, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=tree, **extra)
            env.pop("NUMBA_CACHE_DIR", None)
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            run = subprocess.run([sys.executable, "-c", args.code], env=env, cwd="/tmp",
                                 capture_output=True, text=True, check=False)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if run.returncode:
                sys.exit(f"{name}: exit {run.returncode}\n{run.stderr[-2000:]}")
            cpu[name].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            out[name].append(run.stdout.strip()[:200])
    with open("/proc/loadavg") as fh:
        print("loadavg", fh.read().strip())
    for name, values in cpu.items():
        print(f"{name}: min {min(values):.3f} median {statistics.median(values):.3f} CPU-s; "
              f"runs {[round(v, 3) for v in values]}; printed {out[name][:3]}")


if __name__ == "__main__":
    main()
