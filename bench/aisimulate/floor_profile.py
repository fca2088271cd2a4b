"""Where a warm kvsim run's non-engine CPU goes (issue 34, the per-process floor):

    python bench/aisimulate/floor_profile.py [--profile OUT.prof] -- simulate --request-trace ...

Runs kvsim's command in this process, as ``kvsim_run.py`` does, and prints one JSON object on
stderr: the CPU seconds (``time.process_time``) of importing numpy, numba and ``kvsim.cli``,
numba's one-time set-up at its first cached load (``BaseContext.refresh``), every load of a
compiled library from numba's disk cache (count, CPU, the ``.nbc`` bytes read, by function),
and the command's total.  ``--profile`` also writes a cProfile of the command (compiled calls
are attributed to their Python caller).  For measuring only: it wraps numba's cache loader
*in this script's process*; kvsim itself writes nothing into numba.
"""

from __future__ import annotations

import json
import os
import sys
import time

T = time.process_time
c_start = T()
import numpy  # noqa: E402,F401

c_numpy = T()
import numba  # noqa: E402,F401

c_numba = T()
from numba.core import base, caching  # noqa: E402

LOADS: list[dict] = []
REFRESH = [0.0, 0]
#: CPU of the closed loop's ``Engine.advance`` (the engine's steps, its compiled calls), and
#: the cache loads and set-up that happened inside it (subtracted: reported as loads)
ENGINE = {"cpu_s": 0.0, "calls": 0, "depth": 0, "loads_inside_s": 0.0}
_refresh = base.BaseContext.refresh
_load = caching.Cache._load_overload


def _timed_refresh(self):
    t = T()
    try:
        return _refresh(self)
    finally:
        dt = T() - t
        REFRESH[0] += dt
        REFRESH[1] += 1
        if ENGINE["depth"]:
            ENGINE["loads_inside_s"] += dt


def _timed_load(self, sig, target_context):
    t = T()
    out = _load(self, sig, target_context)
    dt = T() - t
    size = 0
    try:
        f = self._cache_file
        key = self._index_key(sig, target_context.codegen())
        overloads = f._load_index()
        if key in overloads:
            size = os.path.getsize(os.path.join(f._cache_path, overloads[key]))
    except Exception:  # noqa: BLE001 - size is informative only
        pass
    if ENGINE["depth"]:
        ENGINE["loads_inside_s"] += dt
    LOADS.append({"fn": self._name.split(" ")[1] if " " in self._name else self._name,
                  "cpu_s": dt, "bytes": size, "hit": out is not None})
    return out


base.BaseContext.refresh = _timed_refresh
caching.Cache._load_overload = _timed_load

c_patch = T()
import kvsim  # noqa: E402,F401

c_kvsim = T()
from kvsim.cli import app  # noqa: E402

c_cli = T()


def _time_engine() -> None:
    from kvsim.modes.closed import closed_loop

    advance = closed_loop.Engine.advance

    def timed(self, *a, **k):
        t = T()
        ENGINE["depth"] += 1
        try:
            return advance(self, *a, **k)
        finally:
            ENGINE["depth"] -= 1
            ENGINE["cpu_s"] += T() - t
            ENGINE["calls"] += 1

    closed_loop.Engine.advance = timed


def main() -> None:
    argv = sys.argv[1:]
    prof = None
    if argv and argv[0] == "--profile":
        prof, argv = argv[1], argv[2:]
    cmd = argv[argv.index("--") + 1:]
    sys.argv = ["kvsim", *cmd]
    p0 = T()
    _time_engine()  # imports the closed loop's modules: in the command's CPU, as without it
    code = 0
    pr = None
    if prof:
        import cProfile

        pr = cProfile.Profile()
        pr.enable()
    try:
        app()
    except SystemExit as e:
        code = e.code or 0
    if pr is not None:
        pr.disable()
        pr.dump_stats(prof)
    call = T() - p0
    sys.stdout.flush()
    loads = sorted(LOADS, key=lambda r: -r["cpu_s"])
    rec = {"numpy_import_s": c_numpy - c_start, "numba_import_s": c_numba - c_numpy,
           "kvsim_pkg_import_s": c_kvsim - c_patch, "kvsim_cli_import_s": c_cli - c_kvsim,
           "call_cpu_s": call,
           "engine_advance_cpu_s_excl_loads": ENGINE["cpu_s"] - ENGINE["loads_inside_s"],
           "engine_advance_calls": ENGINE["calls"], "refresh_s": REFRESH[0], "loads": len(LOADS),
           "load_cpu_s": sum(r["cpu_s"] for r in LOADS),  # refresh() runs before each, not in it
           "load_bytes": sum(r["bytes"] for r in LOADS), "exit": code,
           "per_load": [{**r, "cpu_s": round(r["cpu_s"], 4)} for r in loads]}
    print(json.dumps(rec), file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
