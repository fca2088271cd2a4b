"""A cold run (empty numba and kvsim caches, in a temporary folder) of one kvsim command in
this process, then each compiled function this process compiled with numba's compile timers
(``compiler_lock`` wall seconds: the compile including the callees compiled for it), on
stderr (docs/benchmarks.md, "vs NVIDIA AISimulate", cold):

    python bench/aisimulate/cold_timers.py -- simulate --request-trace ... --json
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time


def main() -> None:
    d = tempfile.mkdtemp(prefix="kvsim_cold_")
    os.environ["NUMBA_CACHE_DIR"] = d + "/numba"
    os.environ["KVSIM_CACHE_DIR"] = d + "/kvsim"
    os.environ["KVSIM_COMPILE_LOG"] = "1"
    t0 = time.process_time()
    from kvsim.cli import app

    sys.argv = ["kvsim", *sys.argv[sys.argv.index("--") + 1:]]
    try:
        app()
    except SystemExit:
        pass
    me = time.process_time() - t0
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"CPU self {me:.1f} children {ch.ru_utime + ch.ru_stime:.1f}", file=sys.stderr)
    from numba.core.dispatcher import Dispatcher

    rows = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("kvsim") or mod is None:
            continue
        for attr, v in list(vars(mod).items()):
            if isinstance(v, Dispatcher) and getattr(v.py_func, "__module__", "") == name:
                for cres in v.overloads.values():
                    t = (cres.metadata or {}).get("timers", {})
                    rows.append((t.get("compiler_lock", 0.0), t.get("llvm_lock", 0.0),
                                 f"{name}.{attr}", len(v.overloads)))
    rows.sort(reverse=True)
    print("compiler_lock s, llvm_lock s, overloads, function", file=sys.stderr)
    for c, llvm, n, k in rows[:40]:
        print(f"{c:8.2f} {llvm:8.2f} {k:3d} {n}", file=sys.stderr)
    os._exit(0)


if __name__ == "__main__":
    main()
