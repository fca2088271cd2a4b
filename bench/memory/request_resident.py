"""Resident bytes of the closed loop's arrays after its run, by holder (issue 38, "Memory"):
runs ``kvsim simulate --request-trace T --json [options]`` in this process and, when the
engines have finished (before the summary), counts each numpy array's pages that are
resident (``/proc/self/pagemap``: an array allocated zeroed costs only the pages touched),
by where it is held: the Request table, the router's prompt hashes (``pb``), and every
replica's engine (``E.<attribute path>``, summed over the replicas; a buffer counted once,
at its first holder).  Also the resident set before the run, after it and after the
summary, with the peak (``VmHWM``, reset at the run's and the summary's start).

    python bench/memory/request_resident.py /tmp/x1.jsonl --replicas 8 --router prefix \\
        > /tmp/r1.json

Linux only.  Diff two sizes' outputs per holder to see what grows with the trace.
"""

import collections
import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np


def status():
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 2**20
    return out

PM = None
def resident(addr, n):
    global PM
    if n <= 0:
        return 0
    if PM is None:
        PM = open("/proc/self/pagemap", "rb", buffering=0)
    p0, p1 = addr // 4096, (addr + n - 1) // 4096
    PM.seek(p0 * 8)
    data = PM.read((p1 - p0 + 1) * 8)
    a = np.frombuffer(data, dtype=np.uint64)
    return int(np.count_nonzero(a & np.uint64(1 << 63))) * 4096

def arr_res(x, seen):
    base = x
    while isinstance(base, np.ndarray) and isinstance(base.base, np.ndarray):
        base = base.base
    key = base.__array_interface__["data"][0]
    if key in seen:
        return 0, 0
    seen.add(key)
    return resident(key, base.nbytes), base.nbytes

def walk(v, name, seen, out, depth=0, vis=None):
    if vis is None:
        vis = set()
    if depth > 5 or id(v) in vis:
        return
    vis.add(id(v))
    if isinstance(v, np.ndarray):
        if v.dtype != object:
            r, n = arr_res(v, seen)
            out[name][0] += r
            out[name][1] += n
        return
    if isinstance(v, (tuple, list)):
        fields = getattr(v, "_fields", None)
        for i, y in enumerate(v):
            walk(y, f"{name}.{fields[i] if fields else i}" if depth < 4 else name, seen, out, depth + 1, vis)
        return
    if isinstance(v, dict):
        for k, y in v.items():
            walk(y, f"{name}.{k}", seen, out, depth + 1, vis)
        return
    d = getattr(v, "__dict__", None)
    if d is not None and "kvsim" in type(v).__module__:
        for k, y in d.items():
            walk(y, f"{name}.{k}", seen, out, depth + 1, vis)

OUT = {}
def main():
    trace = sys.argv[1]
    import kvsim.modes.closed.cluster as cl
    import kvsim.modes.closed.routing as ro
    import kvsim.modes.closed.serving_metrics as sm
    from kvsim.cli import app

    orig_sum, orig_run = sm.cluster_summary, ro._run_cluster
    state = {}
    def run_w(table, engines, router, B, pb, *a, **k):
        state.update(pb=pb, table=table, before=status())
        Path("/proc/self/clear_refs").write_text("5")
        return orig_run(table, engines, router, B, pb, *a, **k)
    cl._run_cluster = run_w
    # one replica: no router; the table from the set-up, "before" at the first step
    orig_rows, orig_adv = cl._serve_rows, cl.Engine.advance

    def rows_w(store, table, *a, **k):
        state.setdefault("table", table)
        state.setdefault("pb", None)
        return orig_rows(store, table, *a, **k)

    def adv_w(self, *a, **k):
        if "before" not in state:
            state["before"] = status()
            Path("/proc/self/clear_refs").write_text("5")
        return orig_adv(self, *a, **k)
    cl._serve_rows, cl.Engine.advance = rows_w, adv_w
    def sum_w(pol, engines, *a, **k):
        OUT["before_run"] = state["before"]
        OUT["after_run"] = status()
        seen = set()
        out = collections.defaultdict(lambda: [0, 0])
        walk(state["table"], "table", seen, out)
        if state["pb"] is not None:
            walk(state["pb"], "pb", seen, out)
        for e in engines:
            walk(e, "E", seen, out)
        tot = sum(v[0] for v in out.values())
        OUT["resident_arrays_mib"] = tot / 2**20
        OUT["held"] = {k: [round(v[0] / 2**20, 2), round(v[1] / 2**20, 1)] for k, v in sorted(out.items(), key=lambda x: -x[1][0]) if v[0] > 2**19}
        Path("/proc/self/clear_refs").write_text("5")
        r = orig_sum(pol, engines, *a, **k)
        OUT["after_summary"] = status()
        return r
    sm.cluster_summary = sum_w
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            app(["simulate", "--request-trace", trace, "--json", *sys.argv[2:]], standalone_mode=False)
        except SystemExit:
            pass
    OUT["end"] = status()
    s = json.loads(buf.getvalue())["policies"][0]
    OUT["res"] = {k: s[k] for k in ("requests", "steps", "ttft_p99_us", "hbm_hit_rate")}
    print(json.dumps(OUT, indent=1))


if __name__ == "__main__":
    main()
