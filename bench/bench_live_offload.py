"""Live KV offload (``--live-offload``): every policy on the same oversubscribed traces,
measured in one run (docs/benchmarks.md, "Live offload").

Workloads:

* ``kvmi:<profile>``: kv_deadline_scheduler's own generator
  (``generate_synthetic_kv_workload(256, 16, 16384, 2048, profile=...)``, its README's
  shape) written as kvmi JSONL and imported with ``--format kvmi``.  The peer is not a
  dependency and none of its code or traces is in this repository: point ``--peer`` at a
  directory holding its ``kv_memory_intent`` package (``src/`` of a checkout); without
  it these workloads are skipped with a message.
* ``profile:<name>``: kvsim's own profile, generated for ``--requests`` requests (seed 0)
  and lowered for the whole GPU (the recorded schedule the live mode replays).
* ``trace:<path>``: an event file already written (e.g. by ``kvsim generate``), so a
  large trace is lowered once for several runs of this script.

For each workload it first prints the trace's block needs (:func:`step_needs`: the peak
of live blocks and the largest single step's need, between which an HBM size
oversubscribes without making one step's batch alone exceed HBM); then for each HBM size
(``=HBM,HBM`` list per workload) it runs :func:`kvsim.api.simulate` with
``SimConfig(live_offload=True)`` for each policy and prints decode stalls,
decode-critical stalls, stall time, TPOT p99, deadline misses, spills, blocks fetched,
prefetches (issued / useful / wasted) and the run's CPU seconds; ``--out`` appends the
rows as JSON lines.

    python bench/bench_live_offload.py --peer /path/to/kv_deadline_scheduler/src \\
        --workload kvmi:deadline_pressure=2000,3000,4000 --workload profile:deadline_pressure=6000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

COLUMNS = ("decode_stalls", "decode_critical_stalls", "stall_us", "tpot_p99_us",
           "deadline_misses", "live_spills", "pinned_spills", "blocks_fetched", "prefetches",
           "prefetches_useful", "prefetches_wasted", "peak_live_blocks", "cpu_s")


def step_needs(trace: Path) -> dict:
    """``peak_live_blocks``: most blocks held by running requests at once (distinct
    blocks, shared ones once, as the live replay counts them); ``max_step_need_blocks``:
    the most blocks one step's ``ACCESS`` rows read (each request's table, a block shared
    by two requests of the step counted twice: an upper bound on the step's distinct
    need).  Below the step need one batch alone exceeds HBM and every policy streams it."""
    from kvsim.core.schema import EventKind
    from kvsim.events import read_events

    _, df = read_events(trace)
    kind, rid, idx, step = (df[c].to_numpy() for c in ("kind", "request_id",
                                                       "block_index", "step"))
    tables: dict[int, set] = {}
    live = peak = need = best = 0
    cur = None
    A, F, X = int(EventKind.ALLOCATE), int(EventKind.FREE), int(EventKind.ACCESS)
    for k, r, i, s in zip(kind.tolist(), rid.tolist(), idx.tolist(), step.tolist()):
        if s != cur:
            best, need, cur = max(best, need), 0, s
        if k == A:
            t = tables.setdefault(r, set())
            if i not in t:
                t.add(i)
                live += 1
                peak = max(peak, live)
        elif k == F:
            t = tables.get(r, set())
            if i < 0:
                live -= len(t)
                tables[r] = set()
            elif i in t:
                t.discard(i)
                live -= 1
        elif k == X:
            need += len(tables.get(r, ()))
    return {"peak_table_blocks": peak, "max_step_need_blocks": max(best, need)}


def _kvmi_trace(peer: str, profile: str, n: int, work: Path) -> Path:
    sys.path.insert(0, peer)
    from kv_memory_intent.simulator import generate_synthetic_kv_workload

    from kvsim.engine.lowering import import_request_trace

    events = generate_synthetic_kv_workload(n, 16, 16384, n * 8, profile=profile)
    src = work / f"kvmi_{profile}_{n}.jsonl"
    with open(src, "w") as f:
        for e in events:
            f.write(e.to_json() + "\n")
    out = work / f"kvmi_{profile}_{n}.parquet"
    import_request_trace(src, out, format="kvmi")
    return out


def _profile_trace(name: str, n: int, work: Path) -> Path:
    from kvsim.workload import generate

    out = work / f"{name}_{n}.parquet"
    generate(name, n, 0, out)  # lowered for the whole GPU (h100-sxm, llama-3-8b)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=os.environ.get("KVDS_PATH"))
    ap.add_argument("--workload", action="append", required=True,
                    help="kvmi:<profile>=HBM,HBM or profile:<name>=HBM,HBM (blocks)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--policies", default=None, help="comma list (default: every one)")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    ap.add_argument("--no-optimal", action="store_true",
                    help="leave out the bound (re-measuring changed online policies only)")
    args = ap.parse_args()
    from kvsim.api import simulate
    from kvsim.modes.comparison import default_policies
    from kvsim.spec.sim_config import SimConfig

    names = args.policies.split(",") if args.policies else \
        [p for p in default_policies() if p != "belady"]  # belady = optimal in this mode
    if "optimal" not in names and not args.no_optimal:
        names.append("optimal")
    with tempfile.TemporaryDirectory(prefix="kvsim-live-bench-") as tmp:
        work = Path(tmp)
        for spec in args.workload:
            kind_name, _, sizes = spec.partition("=")
            kind, _, name = kind_name.partition(":")
            if kind == "kvmi":
                if not args.peer:
                    print(f"{spec}: skipped (no --peer / KVDS_PATH)", file=sys.stderr)
                    continue
                trace = _kvmi_trace(args.peer, name, args.requests, work)
            elif kind == "trace":
                trace = Path(name)
            else:
                trace = _profile_trace(name, args.requests, work)
            needs = step_needs(trace)
            print(f"\n{kind_name}: {needs}  (/proc/loadavg {_loadavg()})")
            for hbm in (int(x) for x in sizes.split(",")):
                cfg = SimConfig(hbm_blocks=hbm, live_offload=True)
                print(f"\n{kind_name}, {args.requests} requests, HBM {hbm:,} blocks "
                      f"(/proc/loadavg {_loadavg()})")
                print("policy".ljust(11) + "".join(c[:13].rjust(14) for c in COLUMNS))
                for pol in names:  # each row as soon as it is measured
                    t0 = time.process_time()
                    s = simulate(trace, pol, cfg).summary
                    row = {**s, "cpu_s": time.process_time() - t0}
                    print(row["policy"].ljust(11) + "".join(
                        f"{row[c]:14,.1f}" if isinstance(row[c], float) else f"{row[c]:14,}"
                        for c in COLUMNS), flush=True)
                    if args.out is not None:
                        with open(args.out, "a") as f:
                            f.write(json.dumps({"workload": kind_name, "requests":
                                                args.requests, "hbm_blocks": hbm,
                                                **{k: row[k] for k in ("policy", *COLUMNS)},
                                                }) + "\n")
    return 0


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
