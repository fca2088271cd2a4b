"""A warm run of one kvsim command in this process, then where its CPU went outside the
compiled engine's steps, on stderr (docs/benchmarks.md, "Per-process fixed costs"):

    python bench/aisimulate/load_timers.py -- simulate --request-trace ... --json

* the CPU of the import, of the call and of the trace read (``kvsim.ingest.read_requests``);
* each function numba loaded from its disk cache (its dispatcher's ``stats.cache_hits``),
  loaded once more after the run through the same numba cache object (CPU seconds,
  ``time.process_time``), with its cache files' size: the marginal cost of one cached
  function; the run's first load also paid numba's one-time set-up of its target context
  (its lowering registries imported, ``numba.cpython.*``, ``numba.np.*``).

numba's objects are read and called, nothing in numba or kvsim is changed.  Run it with
numba's cache already filled (a run before it).
"""

from __future__ import annotations

import os
import sys
import time

T0 = time.process_time()
from kvsim.cli import app  # noqa: E402

T1 = time.process_time()


def _cache_bytes(qualname: str) -> int:
    """Bytes of the numba cache files (index + data) of ``qualname`` in this cache."""
    root = os.environ.get("NUMBA_CACHE_DIR", "")
    mod, _, fn = qualname.rpartition(".")
    stem = f"{mod.rpartition('.')[2]}.{fn}-"
    total = 0
    for folder, _dirs, names in os.walk(root):
        total += sum(os.path.getsize(os.path.join(folder, n)) for n in names
                     if n.startswith(stem))
    return total


def _loaded() -> list:
    """Every kvsim function numba loaded from its disk cache in this process: (qualified
    name, dispatcher, signatures loaded)."""
    from numba.core.dispatcher import Dispatcher

    rows = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("kvsim") or mod is None:
            continue
        for attr, v in list(vars(mod).items()):
            if isinstance(v, Dispatcher) and getattr(v.py_func, "__module__", "") == name:
                hits = [sig for sig, n in v.stats.cache_hits.items() if n]
                if hits:
                    rows.append((f"{name}.{attr}", v, hits))
    return rows


def main() -> None:
    import kvsim.ingest as ingest

    read = ingest.read_requests
    spent = {"read": 0.0}

    def timed_read(*a, **k):
        c = time.process_time()
        try:
            return read(*a, **k)
        finally:
            spent["read"] += time.process_time() - c

    ingest.read_requests = timed_read
    sys.argv = ["kvsim", *sys.argv[sys.argv.index("--") + 1:]]
    c0 = time.process_time()
    try:
        app()
    except SystemExit:
        pass
    call = time.process_time() - c0
    sys.stdout.flush()
    err = sys.stderr
    rows = _loaded()
    print(f"import {T1 - T0:.3f} CPU-s, call {call:.3f} CPU-s, trace read "
          f"{spent['read']:.3f} CPU-s; {len(rows)} functions loaded from numba's cache "
          f"({sum(len(h) for _n, _d, h in rows)} signatures)", file=err)
    print("each loaded again (numba's cache object, as the run did; its set-up already "
          "paid):\nCPU s   cache MB  function", file=err)
    total = 0.0
    for name, d, sigs in rows:
        c = time.process_time()
        for sig in sigs:
            d._cache.load_overload(sig, d.targetctx)
        t = time.process_time() - c
        total += t
        print(f"{t:6.3f} {_cache_bytes(name) / 1e6:9.2f}  {name}", file=err)
    print(f"{total:6.3f}  all", file=err)
    err.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
