"""Fill numba's disk cache once before the test workers start (tests/conftest.py,
``pytest_configure`` of the pytest-xdist controller, with ``KVSIM_TEST_WARM=1``).

From an empty cache (a fresh clone in CI) each worker otherwise compiles the same replay
core, closed-loop step drivers and policy hooks on its own (docs/benchmarks.md, "The
default test step": the same code compiled in both workers).  Here it is compiled once, split over the
cores by kvsim's own cold-compile split (kvsim.replay.precompile), and every worker loads
it.  What it runs is a closed-loop ``compare`` of a few requests of the README's workload
profile under every built-in policy, for each scheduler, as a user's first run does; the
tests' results do not depend on it (a cold cache compiles on first use).  Run in its own
process (``python tests/warm_cache.py``) so that the compiler's memory is freed before the
tests start; a no-op when the cache is warm.
"""

from __future__ import annotations

import sys
import time

#: The README's workload profile and a few of its requests under 1 GB of HBM: admissions,
#: decode steps, evictions and preemptions, every path that compiles.
PROFILE = "deadline_pressure"
REQUESTS = 24
HBM_GB = 1.0
SCHEDULERS = ("vllm", "kvsim")


def main() -> int:
    from kvsim.replay.variants import core_is_cold

    cold = [s for s in SCHEDULERS if core_is_cold(s)]
    if not cold:
        return 0
    t0 = time.perf_counter()
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import compare_requests
    from kvsim.spec.sim_config import SimConfig
    from kvsim.spec.workload_profile import load_profile
    from kvsim.workload.generator import build_workload

    table = build_workload(load_profile(PROFILE), REQUESTS, 0)
    config = SimConfig(hbm_gb=HBM_GB, engine="compiled")
    for sched in cold:
        compare_requests(table, None, config, engine=EngineOptions(scheduler=sched), jobs=2)
    sys.stderr.write(f"tests/warm_cache.py: compiled the replay core and every policy's hooks "
                     f"({', '.join(cold)} scheduler) in {time.perf_counter() - t0:.0f} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
