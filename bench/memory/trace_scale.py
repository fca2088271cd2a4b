"""Peak RSS of ``kvsim simulate`` on 1x, 10x, 100x an event trace: memory should grow with
what is resident, not with the trace's length (issue 38, "Memory").

    python bench/memory/trace_scale.py --trace /work/cache/mc512.parquet \
        --copies 1 10 100 --dir /tmp/kvsim_scale --out bench/results/trace_scale_memory.json

``--trace`` is repeated N times back to back in time (written to ``--dir``, never into the
repository; kept for ``--reuse``): copy k has its steps, times, request ids and decode
targets shifted past copy k-1's, and the same content hashes, so the working set is the
same and only the length grows.  Each size runs ``kvsim simulate --trace T --policy lru
--engine compiled --json`` (h100-sxm defaults) as a fresh child and reads its peak resident
set (``ru_maxrss`` of ``RUSAGE_CHILDREN``; each child waited for alone), CPU seconds and
wall; /proc/loadavg before and after.  ``--repeat`` rounds (default 3) of every size in
turn: a single run's peak varies by up to ~8 % (how far the read-ahead gets, whether the
64 MiB read-buffer slack of ``kvsim.replay.prepass.BufferRelease`` fills), so the table
shows min / median / max and compares medians.  The compile is excluded (an untimed
smallest-size run first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def repeat_trace(src: str, copies: int, dst: Path) -> None:
    """Write ``copies`` back-to-back copies of the event file ``src`` to ``dst``, streamed
    one row group at a time."""
    f = pq.ParquetFile(src)
    t = f.read(columns=["step", "time_us", "request_id"])
    step_span = pc.max(t["step"]).as_py() + 1
    time_span = pc.max(t["time_us"]).as_py() + 1
    req_span = pc.max(t["request_id"]).as_py() + 1
    del t
    tmp = dst.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, f.schema_arrow) as w:
        for k in range(copies):
            for g in range(f.num_row_groups):
                b = f.read_row_group(g)
                if k:
                    cols = {}
                    for name, span in (("step", step_span), ("time_us", time_span),
                                       ("target_decode_step", step_span),
                                       ("request_id", req_span),
                                       ("parent_request_id", req_span)):
                        c = b[name]
                        cols[name] = pc.if_else(pc.greater_equal(c, 0),
                                                pc.add(c, pa.scalar(k * span, c.type)), c)
                    b = pa.table([cols.get(n, b[n]) for n in b.column_names],
                                 schema=b.schema)
                w.write_table(b)
    tmp.replace(dst)


def run(trace: Path, policy: str) -> dict:
    script = Path(sys.executable).with_name("kvsim")
    argv = [str(script), "simulate", "--trace", str(trace), "--policy", policy,
            "--engine", "compiled", "--json"]
    load0 = _load()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(p.stderr[-2000:])
    s = json.loads(p.stdout)["policies"][0]
    return {"events": s["events"], "requests": s["requests"], "steps": s["steps"],
            "p99_step_us": s["p99_step_us"], "mean_step_us": s["mean_step_us"],
            "ttft_p99_us": s["ttft_p99_us"], "hbm_hit_rate": s["hbm_hit_rate"],
            "stdout_sha256": hashlib.sha256(p.stdout.encode()).hexdigest(),
            "peak_rss_gib": r1.ru_maxrss / 2**20,  # KiB; max over children so far
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "wall_s": wall, "load_before": load0, "load_after": _load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--dir", default="/tmp/kvsim_scale")
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--reuse", action="store_true", help="keep and reuse written traces")
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each size (in rounds; the table shows min / median / max)")
    ap.add_argument("--build-only", action="store_true",
                    help="write the repeated traces under --dir and stop")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    traces = {}
    for n in sorted(a.copies):
        dst = d / f"{Path(a.trace).stem}_x{n}.parquet"
        if n == 1:
            dst = Path(a.trace)
        elif not (a.reuse and dst.exists()):
            repeat_trace(a.trace, n, dst)
        traces[n] = dst
    if a.build_only:
        return
    run(traces[min(traces)], a.policy)  # untimed: the compile (kept in the disk cache)
    rows = []
    here = str(Path(__file__).parent)
    # rounds of every size in turn: a drift of the machine's load reaches all sizes alike
    for k in range(a.repeat):
        for n, dst in traces.items():
            # ru_maxrss of RUSAGE_CHILDREN is the max over every child waited for: run
            # each size in its own measuring process so that a bigger earlier child does
            # not mask
            code = (f"import json,sys; sys.path.insert(0, {here!r}); import "
                    "trace_scale as b; print(json.dumps(b.run("
                    f"__import__('pathlib').Path({str(dst)!r}), {a.policy!r})))")
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(p.stderr[-2000:])
            row = {"copies": n, "round": k, **json.loads(p.stdout)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    by = {n: [r for r in rows if r["copies"] == n] for n in traces}
    for n, rs in by.items():
        if len({r["stdout_sha256"] for r in rs}) != 1:
            raise SystemExit(f"{n}x: the runs' stdout differ (the replay must be deterministic)")
    peaks = {n: sorted(r["peak_rss_gib"] for r in rs) for n, rs in by.items()}
    med = {n: statistics.median(v) for n, v in peaks.items()}
    base = med[min(traces)]
    print(f"\n{a.repeat} runs of each size; peak RSS GiB min / median / max; the ratio of "
          "medians to the smallest size's")
    print("\n| copies | events | requests | steps | peak RSS GiB (min / median / max) | "
          "median vs 1x | CPU s (median) | p99 step us |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, rs in by.items():
        r, v = rs[0], peaks[n]
        cpu = statistics.median(x["cpu_s"] for x in rs)
        print(f"| {n} | {r['events']:,} | {r['requests']:,} | {r['steps']:,} | "
              f"{v[0]:.3f} / {med[n]:.3f} / {v[-1]:.3f} | {med[n] / base - 1:+.1%} | "
              f"{cpu:.1f} | {r['p99_step_us']:,.1f} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "argv": sys.argv, "started": started,
                                           "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                  time.gmtime())}, indent=1))


if __name__ == "__main__":
    main()
