"""Replay-only CPU rate of one policy on one event trace: simulate() timed with
time.process_time, best of 3 after a warm-up run in the same process (docs/benchmarks.md,
"One core").  Usage: python bench/replay_cpu_rate.py TRACE.parquet [POLICY]"""
import sys
import time

import kvsim
from kvsim.api import simulate
from kvsim.spec.sim_config import SimConfig

trace = sys.argv[1]
pol = sys.argv[2] if len(sys.argv) > 2 else "lru"
cfg = SimConfig(engine="compiled")
r = simulate(trace, pol, cfg)  # loads (or compiles) the core
best = None
for _ in range(3):
    t = time.process_time()
    r = simulate(trace, pol, cfg)
    dt = time.process_time() - t
    best = dt if best is None else min(best, dt)
n = r.summary["events"]
print(f"{kvsim.__file__} {pol}: {n} events, best of 3 {best:.2f} CPU-s in simulate() = {n / best / 1e6:.3f} M events per CPU-s; hbm_hit_rate {r.summary['hbm_hit_rate']:.6f}")
