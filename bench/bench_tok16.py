"""Tiered replay speed at 16-token blocks (issue 17): events per second (wall) and per
CPU-second, and peak RSS, of ``simulate`` on event traces, and where the time goes.

    python bench/bench_tok16.py --trace mc512.parquet --trace mc16.parquet [--out J]

For each ``--trace`` (made with ``kvsim import-request-trace --requests
../shared/traces/mooncake/conversation_trace.jsonl [--block-size 512] --out T``):

* **end to end** (a fresh child process, like ``kvsim simulate --engine compiled``): wall
  and CPU seconds of ``simulate(trace, policy, SimConfig(engine="compiled"))`` (CPU = user
  + sys of the child, ``RUSAGE_CHILDREN``; imports and start-up included), and the
  child's peak resident set (``ru_maxrss``).  The compiled core is loaded from numba's
  disk cache: a warm-up child runs first and its figures are reported apart (a cold
  compile is not a replay cost).
* **in process, replay only** (the figure of ``bench/replay_cpu_rate.py``): one
  ``simulate`` call timed (wall, and ``time.process_time``: every thread) after a warm-up
  call in the same process (imports and loading the core excluded), best CPU of
  ``--repeat``.
* **by depth of the hierarchy** (``--hierarchies``): the in-process figure again with the
  lower tiers switched off one by one (``dram_gb`` / ``cxl_gb`` / ``nvme_gb`` = 0), and
  the spills into each tier: at 16-token blocks nearly every HBM eviction cascades through
  every lower tier, so the replay's cost grows with the number of tiers.
* **where the CPU goes** (the timed call, each phase timed with ``time.thread_time`` in
  the thread that runs it): the Parquet reads (reading, Arrow -> numpy and validation) of
  the pre-pass and of the replay (a second pass over the file), both in the reader thread
  (kvsim.events.read_ahead), beside the main thread's pre-pass work, the compiled core
  (``core.run`` calls), and the driver's per-batch work and the output tables (the rest
  of the main thread).  On two cores the reads overlap the main thread's work, so the
  wall is below the CPU total.

``/proc/loadavg`` is recorded at the start and the end: the machine is shared, so CPU
seconds are the comparable figures.  Results go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, sys, time, resource
t0, c0 = time.perf_counter(), time.process_time()
from kvsim.api import SimConfig, simulate
r = simulate(sys.argv[1], sys.argv[2], SimConfig(engine="compiled"))
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s_self": time.process_time() - c0,
                  "events": r.summary["events"], "hbm_hit_rate": r.summary["hbm_hit_rate"]}))
"""


def _load() -> list[str]:
    return open("/proc/loadavg").read().split()[:3]


def end_to_end(trace: str, policy: str) -> dict:
    """``simulate`` in a fresh child: CPU (user + sys), wall, peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, trace, policy], capture_output=True,
                         text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res.update(cpu_s=cpu, process_wall_s=wall, events_per_cpu_s=res["events"] / cpu,
               events_per_wall_s=res["events"] / wall, peak_rss_bytes=after.ru_maxrss * 1024)
    return res


#: ``--hierarchies``: the tiers below HBM switched off (capacity 0) in each row, the last
#: row being the default four-tier hierarchy of the other figures.
HIERARCHIES = {
    "hbm": {"dram_gb": 0, "cxl_gb": 0, "nvme_gb": 0},
    "hbm+dram": {"cxl_gb": 0, "nvme_gb": 0},
    "hbm+dram+cxl": {"nvme_gb": 0},
    "hbm+dram+nvme": {"cxl_gb": 0},
    "hbm+dram+cxl+nvme": {},
}


def in_process(trace: str, policy: str, repeat: int, tiers: dict | None = None) -> dict:
    """Replay-only CPU seconds and wall (best CPU of ``repeat``) and the phase split of
    the best run.  The reads run in the reader thread (kvsim.events.read_ahead) beside the
    pre-pass and the core: each phase is timed with ``time.thread_time`` in the thread that
    runs it, the total with ``time.process_time`` (every thread)."""
    from kvsim.api import simulate
    from kvsim.replay import driver as replay
    from kvsim.replay import prepass
    from kvsim.spec.sim_config import SimConfig

    cfg = SimConfig(engine="compiled", **(tiers or {}))
    simulate(trace, policy, cfg)  # warm-up: loads the compiled core
    best = None
    for _ in range(repeat):
        acc = {"prepass_read": 0.0, "replay_read": 0.0, "core": 0.0, "prepass_work": 0.0}
        orig_open, orig_scan, orig_feed = prepass._open, replay.scan_trace, replay._Run.feed
        phase = {"name": "replay_read"}

        def timed(it, name):
            """The reader's batches, the CPU of each read added to ``acc[name]`` (in the
            thread that reads: the reader thread under read-ahead)."""
            while True:
                c = time.thread_time()
                try:
                    cols = next(it)
                except StopIteration:
                    acc[name] += time.thread_time() - c
                    return
                acc[name] += time.thread_time() - c
                yield cols

        class _TimedReader:
            def __init__(self, reader):
                self.reader = reader
                self.ahead = []

            def __enter__(self):
                self.reader.__enter__()
                return self

            def __exit__(self, *exc):
                for a in self.ahead:
                    a.close()
                return self.reader.__exit__(*exc)

            @property
            def header(self):
                return self.reader.header

            def batches(self, n, read_ahead=False, **kw):  # kw: columns, checked
                it = timed(self.reader.batches(n, **kw), phase["name"])
                if read_ahead:
                    from kvsim.events.read_ahead import ReadAhead

                    it = ReadAhead(it)
                    self.ahead.append(it)
                return it

        def timed_open(path):
            return _TimedReader(orig_open(path))

        def timed_scan(*a, **k):
            phase["name"] = "prepass_read"
            c = time.thread_time()
            try:
                return orig_scan(*a, **k)
            finally:
                acc["prepass_work"] = time.thread_time() - c
                phase["name"] = "replay_read"

        def timed_feed(self, cols):
            core = self.core
            if not hasattr(core, "_bench_wrapped"):
                run = core.run

                class _Core:
                    _bench_wrapped = True

                    def __getattr__(self, name):
                        return getattr(core, name)

                    @staticmethod
                    def run(*args):
                        c = time.thread_time()
                        try:
                            return run(*args)
                        finally:
                            acc["core"] += time.thread_time() - c
                self.core = _Core()
            return orig_feed(self, cols)

        prepass._open, replay._open = timed_open, timed_open
        replay.scan_trace, replay._Run.feed = timed_scan, timed_feed
        try:
            c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            r = simulate(trace, policy, cfg)
            total = time.process_time() - c0
            main_thread = time.thread_time() - t0
            wall = time.perf_counter() - w0
        finally:
            prepass._open, replay._open = orig_open, orig_open
            replay.scan_trace, replay._Run.feed = orig_scan, orig_feed
        if best is None or total < best["cpu_s"]:
            n = r.summary["events"]
            best = {"cpu_s": total, "wall_s": wall, "events": n,
                    "events_per_cpu_s": n / total, "events_per_wall_s": n / wall,
                    "hbm_hit_rate": r.summary["hbm_hit_rate"],
                    "spills": {k: int(r.summary[k]) for k in
                               ("spills_hbm", "spills_dram", "spills_cxl", "evictions")},
                    "split_cpu_s": {
                        "prepass_read": acc["prepass_read"],
                        "prepass_work": acc["prepass_work"],
                        "replay_read": acc["replay_read"],
                        "core": acc["core"],
                        "driver_and_outputs": main_thread - acc["prepass_work"]
                        - acc["core"]},
                    "core_ns_per_event": acc["core"] / n * 1e9}
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", required=True, help="event trace (repeat)")
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--repeat", type=int, default=1, help="in-process timed runs (best of)")
    ap.add_argument("--hierarchies", action="store_true",
                    help="also time the in-process replay with fewer lower tiers")
    ap.add_argument("--out", type=Path, default=None, help="JSON results")
    args = ap.parse_args(argv)
    res = {"command": " ".join(["python", "bench/bench_tok16.py"] + (argv or sys.argv[1:])),
           "load_average_at_start": _load(), "cpus": os.cpu_count(), "policy": args.policy,
           "traces": {}}
    for trace in args.trace:
        warm = end_to_end(trace, args.policy)  # loads or compiles the core: not reported
        e2e = end_to_end(trace, args.policy)
        inproc = in_process(trace, args.policy, args.repeat)
        res["traces"][trace] = {"warm_up_child": warm, "end_to_end": e2e,
                                "in_process": inproc}
        s = inproc["split_cpu_s"]
        print(f"{trace} ({args.policy}, {e2e['events']:,} events): end to end "
              f"{e2e['process_wall_s']:.2f} s wall = {e2e['events_per_wall_s'] / 1e6:.3f} M "
              f"events/s, {e2e['cpu_s']:.2f} CPU-s = {e2e['events_per_cpu_s'] / 1e6:.3f} M "
              f"events per CPU-s, peak RSS {e2e['peak_rss_bytes'] / 2**30:.3f} GiB; in "
              f"process {inproc['wall_s']:.2f} s wall = "
              f"{inproc['events_per_wall_s'] / 1e6:.3f} M events/s, "
              f"{inproc['cpu_s']:.2f} CPU-s = {inproc['events_per_cpu_s'] / 1e6:.3f} M events "
              f"per CPU-s (CPU: pre-pass reads {s['prepass_read']:.2f}, pre-pass work "
              f"{s['prepass_work']:.2f}, replay reads {s['replay_read']:.2f}, core "
              f"{s['core']:.2f} = {inproc['core_ns_per_event']:.0f} ns per event, driver "
              f"and outputs {s['driver_and_outputs']:.2f}); hbm_hit_rate "
              f"{e2e['hbm_hit_rate']:.6f}", flush=True)
        if args.hierarchies:
            res["traces"][trace]["by_hierarchy"] = by = {}
            for name, tiers in HIERARCHIES.items():
                by[name] = h = in_process(trace, args.policy, args.repeat, tiers)
                print(f"  {name:18s} in process {h['wall_s']:.2f} s wall = "
                      f"{h['events_per_wall_s'] / 1e6:.3f} M events/s, core "
                      f"{h['split_cpu_s']['core']:.2f} CPU-s, spills from hbm / dram / "
                      f"cxl {h['spills']['spills_hbm']:,} / {h['spills']['spills_dram']:,} "
                      f"/ {h['spills']['spills_cxl']:,}, hbm_hit_rate "
                      f"{h['hbm_hit_rate']:.6f}", flush=True)
    res["load_average_at_end"] = _load()
    print("load average", res["load_average_at_start"], "->", res["load_average_at_end"])
    if args.out is not None:
        from kvsim.core.fsutil import atomic_output

        with atomic_output(args.out) as tmp:
            tmp.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
