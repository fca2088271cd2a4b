"""Tiered replay throughput and `kvsim compare` wall time, measured in one run.

For each policy: the first replay (numba compile of the specialised core if it is not in
the on-disk cache, plus the replay) and a second replay in the same process (replay only)
are timed; events/s = event rows / second-replay seconds.  Then `kvsim.api.compare` of all
the policies is timed end to end (pre-pass, every replay, belady) as `kvsim compare` runs
it, with ``--jobs`` worker processes.  Results go to stdout and, with ``--out``, to JSON.

    python bench/bench_compare.py --trace /tmp/mooncake.parquet --hardware h100-sxm --jobs 2
    python bench/bench_compare.py --profile deadline_pressure --requests 1024

Machine facts (CPU model, cores) are printed with the results; compile time depends on the
on-disk caches (``~/.cache/kvsim``, numba's ``__pycache__``): run twice to see both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="event file (e.g. the imported Mooncake trace)")
    ap.add_argument("--profile", help="generate this workload profile instead of --trace")
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--policies", help="comma-separated (default: every registered one)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--skip-per-policy", action="store_true",
                    help="only time compare (not each policy twice)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    from kvsim.api import simulate
    from kvsim.modes.comparison import compare, default_policies
    from kvsim.replay.driver import scan_trace
    from kvsim.spec.sim_config import SimConfig

    tmp = tempfile.TemporaryDirectory(prefix="kvsim-bench-")
    trace = args.trace
    if trace is None:
        if not args.profile:
            ap.error("give --trace or --profile")
        from kvsim.workload import generate

        trace = Path(tmp.name) / "workload.parquet"
        generate(args.profile, args.requests, args.seed, trace)
    names = args.policies.split(",") if args.policies else default_policies()
    config = SimConfig(hardware=args.hardware)
    from kvsim.events import open_events

    with open_events(trace) as reader:
        bs = reader.header.block_size_tokens
    t = time.perf_counter()
    facts = scan_trace(trace, bs)
    scan_s = time.perf_counter() - t
    print(f"machine: {_cpu()}, {os.cpu_count()} cores; python {platform.python_version()}")
    print(f"trace: {trace} ({facts.num_rows:,} events, {facts.max_request_id + 1:,} requests)"
          f"; pre-pass {scan_s:.2f} s")
    results = {"machine": _cpu(), "cores": os.cpu_count(), "trace": str(trace),
               "events": facts.num_rows, "prepass_s": scan_s, "per_policy": {}}
    if not args.skip_per_policy:
        print(f"{'policy':>10} {'first s':>9} {'replay s':>9} {'events/s':>12}  hbm hit  p99 us")
        for name in names:
            t = time.perf_counter()
            simulate(trace, name, config, facts=facts)
            first = time.perf_counter() - t
            t = time.perf_counter()
            res = simulate(trace, name, config, facts=facts)
            run = time.perf_counter() - t
            eps = facts.num_rows / run
            s = res.summary
            print(f"{name:>10} {first:9.2f} {run:9.2f} {eps:12,.0f}  {s['hbm_hit_rate']:.4f}"
                  f"  {s['p99_step_us']:,.0f}", flush=True)
            results["per_policy"][name] = {"first_s": first, "replay_s": run,
                                           "events_per_s": eps}
    t = time.perf_counter()
    df = compare(trace, names, config, jobs=args.jobs)
    wall = time.perf_counter() - t
    print(f"compare of {len(names)} policies (+ belady bound) with --jobs {args.jobs}: "
          f"{wall:.1f} s")
    cols = ["policy", "p50_step_us", "p99_step_us", "ttft_p99_us", "hbm_hit_rate",
            "prefix_hit_rate", "deadline_misses", "decode_critical_misses",
            "recompute_tokens", "gap_hbm_hit_rate_to_belady"]
    print(df[cols].to_string(index=False))
    results["compare_s"] = wall
    results["compare_jobs"] = args.jobs
    results["table"] = df[cols].to_dict(orient="records")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=float))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
