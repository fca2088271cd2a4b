"""The 16-token replay end to end, a file's first replay against a repeat (issue 34: >= 2 M
events/s; docs/benchmarks.md "16-token replay: the pre-pass kept by content").

    python bench/tok16_facts.py --trace mc16.parquet [--policy lru] [--rounds 3] [--out J]

Each run is ``kvsim simulate --trace T --policy P --json`` in a fresh child (the command as
a user types it; numba's cache already filled: one untimed run first).  Rounds alternate a
*first* replay of the file (its pre-pass facts entry removed before the run: the pass reads
the file, hashes it and stores the facts) and a *repeat* (the entry there: loaded).  Per run:
wall, CPU (user + sys, ``RUSAGE_CHILDREN``), peak RSS, the SHA-256 of the ``--json`` output
(every run must print the same) and ``/proc/loadavg``; then min / median per kind and events/s
at the min wall.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return ""


def _run(cmd: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.decode()[-2000:]}")
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime)
            + (after.ru_stime - before.ru_stime), "peak_rss_gib": after.ru_maxrss / 2**20,
            "out_sha256": hashlib.sha256(p.stdout).hexdigest(), "load": _load()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", required=True)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from kvsim.core.parsed_cache import cache_root, entry_file
    from kvsim.events import open_events

    with open_events(a.trace) as r:
        events = int(r.num_rows)
    root = cache_root()
    if root is None:
        raise SystemExit("the trace cache is off (KVSIM_TRACE_CACHE=0): nothing to compare")
    kvsim = shutil.which("kvsim") or str(Path(sys.executable).with_name("kvsim"))
    cmd = [kvsim, "simulate", "--trace", a.trace, "--policy", a.policy, "--json"]
    _run(cmd)  # untimed: numba's cache filled, the facts stored
    runs = []
    for k in range(a.rounds):
        for kind in ("first", "repeat"):
            if kind == "first":  # this trace's facts entry only
                entry_file(root, Path(a.trace).resolve(), "facts").unlink(missing_ok=True)
            runs.append({"kind": kind, "round": k, **_run(cmd)})
            print(json.dumps(runs[-1]), flush=True)
    if len({r["out_sha256"] for r in runs}) != 1:
        raise SystemExit("the runs printed different results")
    summary = {}
    for kind in ("first", "repeat"):
        w = [r["wall_s"] for r in runs if r["kind"] == kind]
        c = [r["cpu_s"] for r in runs if r["kind"] == kind]
        m = [r["peak_rss_gib"] for r in runs if r["kind"] == kind]
        summary[kind] = {"wall_min_s": min(w), "wall_median_s": statistics.median(w),
                         "cpu_min_s": min(c), "peak_rss_max_gib": max(m),
                         "events_per_s_at_min_wall": events / min(w)}
        print(f"{kind:7s} wall min {min(w):.2f} s median {statistics.median(w):.2f} s, "
              f"CPU min {min(c):.2f} s, peak RSS <= {max(m):.3f} GiB, "
              f"{events / min(w) / 1e6:.2f} M events/s at the min wall")
    if a.out:
        a.out.write_text(json.dumps({"argv": sys.argv, "events": events, "cmd": cmd,
                                     "machine": platform.node(), "cpus": os.cpu_count(),
                                     "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                     "runs": runs, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
