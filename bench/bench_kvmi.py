"""kvsim vs kv_deadline_scheduler on the same kvmi workloads, measured in one run.

kv_deadline_scheduler (github.com/manishklach/kv_deadline_scheduler, MIT) is the Python
predecessor kvsim replaces.  Its simulator keeps blocks in dicts of dataclasses, rescans
every live block on each eviction and decays every block's recency on each event, so it
grows quadratically.  This benchmark:

1. generates its ``deadline_pressure`` workload with *its own* generator for N requests,
   writes it as kvmi JSONL (its MemoryIntentEvent format),
2. times its ``KVMemorySimulator`` with its deadline-aware policy on those events,
3. imports the same JSONL with ``kvsim import-request-trace --format kvmi`` and times
   ``kvsim simulate`` with kvsim's deadline policy on it (compile time excluded: a warm-up
   run on the smallest workload comes first, and is reported separately),
4. prints events/s of both and the ratio.

The peer is not a dependency and none of its code is in this repository.  Point
``--peer`` (or ``KVDS_PATH``) at a directory holding its ``kv_memory_intent`` package
(``src/`` of a checkout); without it the benchmark says so and exits 0.

    python bench/bench_kvmi.py --peer /path/to/kv_deadline_scheduler/src --requests 25,50
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

BLOCKS_PER_REQUEST = 16  # the peer's README example
BLOCK_BYTES = 16_384  # the peer's default block size
PROFILE = "deadline_pressure"


def _peer_events(n: int):
    from kv_memory_intent.simulator import generate_synthetic_kv_workload

    return generate_synthetic_kv_workload(n, BLOCKS_PER_REQUEST, BLOCK_BYTES, n * 8,
                                          profile=PROFILE)


def _peer_run(events, n: int) -> tuple[float, dict]:
    from kv_memory_intent.simulator import KVMemorySimulator, policy_from_name

    sim = KVMemorySimulator(policy_from_name("deadline"),
                            hbm_capacity_bytes=BLOCK_BYTES * n * 4,
                            dram_capacity_bytes=BLOCK_BYTES * n * 40)
    t0 = time.perf_counter()
    result = sim.run(events)
    return time.perf_counter() - t0, result if isinstance(result, dict) else result.to_dict()


def _kvsim_run(jsonl: Path, work: Path, n: int) -> tuple[float, float, dict]:
    from kvsim.api import simulate
    from kvsim.engine.lowering import import_request_trace
    from kvsim.spec.sim_config import SimConfig

    events = work / f"kvmi_{n}.parquet"
    t0 = time.perf_counter()
    import_request_trace(jsonl, events, format="kvmi")
    t_import = time.perf_counter() - t0
    config = SimConfig(hbm_blocks=n * 4, dram_gb=BLOCK_BYTES * n * 40 / 1e9, cxl_gb=0, nvme_gb=0,
                       engine="compiled")
    t0 = time.perf_counter()
    result = simulate(events, "deadline", config)
    return t_import, time.perf_counter() - t0, result.summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=os.environ.get("KVDS_PATH"),
                    help="directory containing the kv_memory_intent package")
    ap.add_argument("--requests", default="25,50", help="comma-separated request counts")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if not args.peer or not (Path(args.peer) / "kv_memory_intent").is_dir():
        print("kv_deadline_scheduler not found: pass --peer DIR (its src/ folder) or set "
              "KVDS_PATH; nothing measured", file=sys.stderr)
        return 0
    sys.path.insert(0, str(Path(args.peer).resolve()))
    sizes = [int(x) for x in args.requests.split(",")]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # warm-up: compile kvsim's replay for the deadline policy on the smallest workload
        warm_n = min(sizes)
        warm_jsonl = work / "warm.jsonl"
        warm_jsonl.write_text("".join(e.to_json() + "\n" for e in _peer_events(warm_n)))
        t0 = time.perf_counter()
        _kvsim_run(warm_jsonl, work, warm_n)
        compile_s = time.perf_counter() - t0
        print(f"kvsim warm-up (numba compile + first run): {compile_s:.1f} s, excluded below")
        print(f"{'requests':>8} {'events':>8} {'peer s':>9} {'peer ev/s':>10} "
              f"{'kvsim s':>8} {'kvsim ev/s':>11} {'speed-up':>9}")
        for n in sizes:
            events = _peer_events(n)
            jsonl = work / f"peer_{n}.jsonl"
            jsonl.write_text("".join(e.to_json() + "\n" for e in events))
            peer_s, peer_res = _peer_run(events, n)
            imp_s, sim_s, summary = _kvsim_run(jsonl, work, n)
            row = {"requests": n, "events": len(events), "peer_s": peer_s,
                   "peer_events_per_s": len(events) / peer_s, "kvsim_import_s": imp_s,
                   "kvsim_simulate_s": sim_s, "kvsim_events_per_s": len(events) / sim_s,
                   "speedup": peer_s / sim_s, "speedup_incl_import": peer_s / (sim_s + imp_s),
                   "peer_result": peer_res,
                   "kvsim_result": {k: summary.get(k) for k in
                                    ("p99_step_us", "decode_critical_misses", "evictions")}}
            rows.append(row)
            print(f"{n:>8} {len(events):>8} {peer_s:>9.2f} {row['peer_events_per_s']:>10.0f} "
                  f"{sim_s:>8.3f} {row['kvsim_events_per_s']:>11.0f} {row['speedup']:>8.0f}x")
    if args.json:
        args.json.write_text(json.dumps({"compile_s": compile_s, "rows": rows}, indent=2,
                                        default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
