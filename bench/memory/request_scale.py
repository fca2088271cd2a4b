"""Peak RSS of the closed loop (``kvsim simulate --request-trace``) on 1x, 10x a Mooncake
request trace: memory should grow with what is resident, not with the trace's length
(issue 38, "Memory").

    python bench/memory/request_scale.py \\
        --trace ../shared/traces/mooncake/conversation_trace.jsonl --copies 1 10 \\
        --dir /tmp/kvsim_rscale --out bench/results/request_scale_memory.json

``--trace`` (Mooncake JSONL) is repeated N times back to back in time (written to
``--dir``, never into the repository): copy k has its timestamps shifted by k x (the
trace's span + 1 ms) and the same ``hash_ids``, so the working set is the same and only the
length grows.  ``--stretch F`` first multiplies every arrival time by F (a lighter load:
the same requests spread out, so a single replica is not overloaded and its queue does not
grow with the copies).  Each size runs ``kvsim simulate --request-trace T --json`` (h100-sxm
defaults, llama-3.1-8b, vLLM's scheduler) in a fresh child and reads its peak resident set
(``ru_maxrss`` of ``RUSAGE_CHILDREN``, each child measured by its own process), CPU
seconds and wall; /proc/loadavg before and after.  The compile is excluded (an untimed 1x
run first).  Extra ``kvsim simulate`` options go after ``--``.

``--phases`` runs each size through ``request_phases.py`` instead (the same command in one
process, its phases wrapped): the resident set before and after each phase and its peak
(read, size, prepare, hashes, engines, block_facts, run, finish, summary), which says
what grows.  ``--max-gib G`` (default 3) refuses a size whose extrapolated peak (the two
smallest sizes' growth per copy, projected) exceeds G: 100x the conversation trace is a
300 MB file and 1.2 M requests, ~89 M engine steps at ``--stretch 10``, and is run only
where it fits (docs/benchmarks.md says where it was not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def repeat_trace(src: Path, copies: int, dst: Path, stretch: float = 1.0) -> None:
    lines = src.read_text().splitlines()
    rows = [json.loads(x) for x in lines if x.strip()]
    if stretch != 1.0:  # arrivals spread out: the same requests, a lighter load
        rows = [{**r, "timestamp": round(r["timestamp"] * stretch)} for r in rows]
    span = max(r["timestamp"] for r in rows) + 1
    tmp = dst.with_suffix(".tmp")
    with tmp.open("w") as f:
        for k in range(copies):
            for r in rows:
                f.write(json.dumps({**r, "timestamp": r["timestamp"] + k * span}) + "\n")
    tmp.replace(dst)


def run(trace: Path, extra: list[str]) -> dict:
    script = Path(sys.executable).with_name("kvsim")
    argv = [str(script), "simulate", "--request-trace", str(trace), "--json", *extra]
    load0 = _load()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(p.stderr[-2000:])
    s = json.loads(p.stdout)["policies"][0]
    return {"requests": s["requests"], "steps": s["steps"], "ttft_p99_us": s["ttft_p99_us"],
            "p99_step_us": s["p99_step_us"], "hbm_hit_rate": s["hbm_hit_rate"],
            "stdout_sha256": hashlib.sha256(p.stdout.encode()).hexdigest(),
            "peak_rss_gib": r1.ru_maxrss / 2**20,
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "wall_s": wall, "load_before": load0, "load_after": _load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--dir", default="/tmp/kvsim_rscale")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-warm", action="store_true", help="skip the untimed first run")
    ap.add_argument("--stretch", type=float, default=1.0,
                    help="multiply the arrival times by this first (a lighter load: one "
                         "replica is overloaded by the Mooncake conversation trace at 1.0)")
    ap.add_argument("--phases", action="store_true",
                    help="per-phase RSS of each size (request_phases.py)")
    ap.add_argument("--max-gib", type=float, default=3.0,
                    help="skip a size whose projected peak RSS exceeds this (GiB)")
    ap.add_argument("extra", nargs="*", help="more kvsim simulate options (after --)")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    here = str(Path(__file__).parent)
    for n in sorted(a.copies):
        plain = n == 1 and a.stretch == 1.0
        tag = "" if a.stretch == 1.0 else f"_s{a.stretch:g}"
        dst = Path(a.trace) if plain else d / f"{Path(a.trace).stem}{tag}_x{n}.jsonl"
        if len(rows) >= 2:  # project: the growth per copy of the two smallest sizes
            (c0, g0), (c1, g1) = [(r["copies"], r["peak_rss_gib"]) for r in rows[:2]]
            need = g1 + (g1 - g0) / (c1 - c0) * (n - c1)
            if need > a.max_gib:
                print(f"{n} copies skipped: projected peak {need:.2f} GiB > --max-gib "
                      f"{a.max_gib:g}", flush=True)
                continue
        if not plain and not dst.exists():
            repeat_trace(Path(a.trace), n, dst, a.stretch)
        if not rows and not a.no_warm:
            run(dst, a.extra)  # untimed: the compile
        if a.phases:
            p = subprocess.run([sys.executable, str(Path(here) / "request_phases.py"),
                                "--trace", str(dst), *(["--", *a.extra] if a.extra else [])],
                               capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(p.stderr[-2000:])
            print(f"## {n} copies\n{p.stdout}", flush=True)
        code = (f"import json,sys; sys.path.insert(0, {here!r}); import request_scale as b;"
                f" print(json.dumps(b.run(__import__('pathlib').Path({str(dst)!r}), "
                f"{a.extra!r})))")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr[-2000:])
        row = {"copies": n, **json.loads(p.stdout)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["peak_rss_gib"]
    print("\n| copies | requests | steps | peak RSS GiB | vs 1x | CPU s | TTFT p99 us |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['copies']} | {r['requests']:,} | {r['steps']:,} | "
              f"{r['peak_rss_gib']:.3f} | {r['peak_rss_gib'] / base - 1:+.1%} | "
              f"{r['cpu_s']:.1f} | {r['ttft_p99_us']:,.0f} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "argv": sys.argv, "started": started,
                                           "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                  time.gmtime())}, indent=1))


if __name__ == "__main__":
    main()
