"""The request-trace read alone against trace length (issue 38, "Memory"): each trace is
read by ``kvsim.ingest.read_requests`` in a fresh child, which reports the resident set
before and after the read, the read's peak (``VmHWM`` after ``/proc/self/clear_refs`` at
its start, Linux), its CPU seconds (user + sys) and, with ``--tracemalloc``, the peak of
the Python/numpy allocations it traced (a separate child: tracing slows the read).

    python bench/memory/read_scale.py T1 T10 T100 [--repeat 3] [--cache] [--tracemalloc] \\
        [--out bench/results/x.json]

T1/T10/T100: ``request_scale.py``'s ``repeat_trace`` copies of a Mooncake trace.  The
parsed-trace cache is off (``KVSIM_TRACE_CACHE=0``: every read parses the JSONL) unless
``--cache`` (then the first read of each file stores the entry, the later ones load it).
``--repeat R`` reads each file R times, the files alternated (CPU seconds under load: the
median is printed).  ``--src DIR`` puts DIR first on the children's ``sys.path`` (another
checkout's ``kvsim``, e.g. main's, for a before/after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import json, os, sys, time, tracemalloc
from pathlib import Path
def status():
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 2**20  # kB -> GiB
    return out
trace, traced = sys.argv[1], sys.argv[2] == "1"
import numpy, pyarrow  # noqa: F401  (imports first: not the read)
from kvsim.ingest import read_requests
if traced:
    tracemalloc.start(1)
before = status()["VmRSS"]
try:
    Path("/proc/self/clear_refs").write_text("5")
except OSError:
    pass
t0 = os.times()
table = read_requests(trace)
t1 = os.times()
s = status()
row = {"requests": len(table), "rss_before_gib": before, "rss_after_gib": s["VmRSS"],
       "peak_gib": s["VmHWM"], "cpu_s": (t1.user - t0.user) + (t1.system - t0.system)}
off, ids = table.flat_block_ids()
row["block_ids"] = int(ids.size)
if traced:
    row["traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
print(json.dumps(row))
"""


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def read_once(trace: str, traced: bool, cache: bool, src: str | None) -> dict:
    env = dict(os.environ)
    if not cache:
        env["KVSIM_TRACE_CACHE"] = "0"
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    # run in ``src`` (``python -c`` puts its working folder first on sys.path, before
    # PYTHONPATH: run here, a checkout's own kvsim would win)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(Path(trace).resolve()),
                        "1" if traced else "0"], capture_output=True, text=True, env=env,
                       cwd=src or None)
    if p.returncode:
        raise SystemExit(p.stderr[-2000:])
    return json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cache", action="store_true", help="the parsed-trace cache on")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--src", default=None, help="a kvsim checkout first on sys.path")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs: dict[str, list[dict]] = {t: [] for t in a.traces}
    for _ in range(a.repeat):  # alternated: load drifts hit every file alike
        for t in a.traces:
            row = read_once(t, False, a.cache, a.src)
            row["load"] = _load()
            runs[t].append(row)
            print(json.dumps({"trace": t, **row}), flush=True)
    rows = []
    for t in a.traces:
        rs = runs[t]
        row = {"trace": t, "requests": rs[0]["requests"], "block_ids": rs[0]["block_ids"],
               "peak_gib": max(r["peak_gib"] for r in rs),
               "rss_before_gib": rs[0]["rss_before_gib"],
               "rss_after_gib": max(r["rss_after_gib"] for r in rs),
               "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
               "cpu_s": [r["cpu_s"] for r in rs]}
        if a.tracemalloc:
            row["traced_peak_mib"] = read_once(t, True, a.cache, a.src)["traced_peak_mib"]
        rows.append(row)
    print("\n| trace | requests | read peak GiB | peak - before MiB | after - before MiB "
          "| CPU s (median) | traced peak MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {Path(r['trace']).name} | {r['requests']:,} | {r['peak_gib']:.3f} | "
              f"{(r['peak_gib'] - r['rss_before_gib']) * 1024:.0f} | "
              f"{(r['rss_after_gib'] - r['rss_before_gib']) * 1024:.0f} | "
              f"{r['cpu_s_median']:.2f} | {r.get('traced_peak_mib', float('nan')):.1f} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "argv": sys.argv, "started": started,
                                           "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                  time.gmtime()),
                                           "load_end": _load()}, indent=1))


if __name__ == "__main__":
    main()
