"""What a kvsim command compiles on the current numba cache: after ``kvsim warm``, a default
run should compile nothing (docs/benchmarks.md, "Cold compile ahead of the first run").

    python bench/warm_check.py -- simulate --request-trace ... --json

Runs the command in this process (caches from NUMBA_CACHE_DIR / KVSIM_CACHE_DIR as set), then
prints on stderr the CPU seconds of this process and of its children (a forked compile worker),
the wall seconds, and every numba dispatcher of kvsim or its policies that compiled at least one
signature here (numba's per-dispatcher ``stats.cache_misses``) rather than loading it.
"""

from __future__ import annotations

import os
import resource
import sys
import time


def main() -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    from kvsim.cli import app

    sys.argv = ["kvsim", *sys.argv[sys.argv.index("--") + 1:]]
    try:
        app()
    except SystemExit:
        pass
    sys.stdout.flush()
    me, wall = time.process_time() - c0, time.perf_counter() - t0
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    from numba.core.dispatcher import Dispatcher

    compiled, loaded = [], 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name.startswith("kvsim") or name.startswith("policies")):
            continue
        for attr, v in list(vars(mod).items()):
            if isinstance(v, Dispatcher) and v.py_func.__module__ == name:
                st = v.stats
                loaded += sum(st.cache_hits.values())
                if st.cache_misses and sum(st.cache_misses.values()):
                    compiled.append(f"{name}.{attr} ({sum(st.cache_misses.values())})")
    print(f"warm_check: CPU self {me:.2f} s, children {ch.ru_utime + ch.ru_stime:.2f} s, "
          f"wall {wall:.2f} s; signatures loaded from the cache {loaded}; compiled here "
          f"{len(compiled)}: {', '.join(sorted(compiled)) or '-'}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
