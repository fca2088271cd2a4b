"""The single-tier loops with and without their prefetch, on key ranges around the rule.

``simulate_cache`` prefetches a key's table entry ``AHEAD`` accesses early only when the
table has at least ``PREFETCH_MIN_SPAN`` entries (kvsim/cachesim/fast_loops.py).  This
script times ``simulate_cache(keys, capacity, policy)`` (end to end, raw keys) with the
prefetch forced off and forced on, interleaved, on Zipf streams over several key ranges
and on the Mooncake block stream (when ../shared/traces has it), and checks that both
give the same misses and evictions.  CPU time of this process (``time.process_time``),
best of ``--repeat``; the JSON records ``/proc/loadavg`` and the commit.

    python bench/bench_prefetch.py --out bench/results/prefetch.json
    python bench/bench_prefetch.py --accesses 1000000 --repeat 1 --out /tmp/p.json   # quick
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cachesim import MOONCAKE, machine, mooncake_stream, zipf_stream  # noqa: E402

from kvsim.cachesim import fast_loops as cachesim_fast  # noqa: E402
from kvsim.cachesim.simulator import simulate_cache  # noqa: E402
from kvsim.core.fsutil import atomic_output  # noqa: E402

POLICIES = ["lru", "fifo", "lfu", "sieve", "s3fifo", "arc", "belady"]


def timed(keys, cap, policy, prefetch: bool):
    """(CPU seconds, result) of one end-to-end call with the prefetch forced on or off."""
    saved = cachesim_fast.PREFETCH_MIN_SPAN
    cachesim_fast.PREFETCH_MIN_SPAN = 0 if prefetch else 1 << 62
    try:
        t0 = time.process_time()
        r = simulate_cache(keys, cap, policy)
        return time.process_time() - t0, r
    finally:
        cachesim_fast.PREFETCH_MIN_SPAN = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=3_000_000, help="Zipf stream length")
    ap.add_argument("--universes", type=int, nargs="+",
                    default=[100_000, 250_000, 500_000, 1_000_000], help="Zipf key ranges")
    ap.add_argument("--caps", type=int, nargs="+", default=[1_000, 100_000],
                    help="cache sizes (objects)")
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per setting (best kept)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/prefetch.json"))
    args = ap.parse_args(argv)

    info = machine()
    info["started_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    streams = {f"zipf1.0-{args.accesses}-over-{u}": zipf_stream(args.accesses, u, 1.0, 42)
               for u in args.universes}
    if MOONCAKE.is_file():
        streams["mooncake-conversation"] = mooncake_stream(MOONCAKE)
    for p in args.policies:  # compile outside the timers
        for on in (False, True):
            timed(np.arange(100, dtype=np.int64) % 7, 3, p, on)

    rows, ok = [], True
    print(f"{'stream':<34}{'span':>10}{'cap':>8} {'policy':<8}{'off CPU-s':>11}"
          f"{'on CPU-s':>10}{'on/off':>8}")
    for sname, keys in streams.items():
        span = int(keys.max() - keys.min()) + 1
        for cap in args.caps:
            for p in args.policies:
                best = {False: float("inf"), True: float("inf")}
                res = {}
                for _ in range(args.repeat):
                    for on in (False, True):
                        dt, res[on] = timed(keys, cap, p, on)
                        best[on] = min(best[on], dt)
                same = (res[False].misses, res[False].evictions) == (res[True].misses,
                                                                     res[True].evictions)
                ok &= same
                rows.append({"stream": sname, "accesses": int(keys.shape[0]), "span": span,
                             "capacity_blocks": cap, "policy": p, "misses": res[True].misses,
                             "identical": same, "cpu_s_no_prefetch": best[False],
                             "cpu_s_prefetch": best[True],
                             "prefetch_by_rule": span >= cachesim_fast.PREFETCH_MIN_SPAN})
                print(f"{sname:<34}{span:>10}{cap:>8} {p:<8}{best[False]:>11.4f}"
                      f"{best[True]:>10.4f}{best[True] / best[False]:>8.2f}", flush=True)
    try:
        info["load_average_at_end"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    info["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    result = {"command": " ".join(["python", "bench/bench_prefetch.py"] +
                                  (argv if argv is not None else sys.argv[1:])),
              "machine": info, "ahead": cachesim_fast.AHEAD,
              "prefetch_min_span": cachesim_fast.PREFETCH_MIN_SPAN,
              "timing": "CPU seconds (process_time), best of --repeat, interleaved; end to "
                        "end simulate_cache on raw keys",
              "rows": rows, "all_identical": bool(ok)}
    with atomic_output(args.out) as tmp_path:
        tmp_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}; identical: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
