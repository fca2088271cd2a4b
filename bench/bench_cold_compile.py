"""Wall and CPU time of one kvsim command from empty (or warm) caches, split into this
process's CPU and its worker processes' CPU.

    python bench/bench_cold_compile.py CACHE_DIR [--fresh] -- compare --profile \
        deadline_pressure --requests 256 --seed 0 --hbm-gb 8 --engine compiled --json

Sets NUMBA_CACHE_DIR=CACHE_DIR/numba and KVSIM_CACHE_DIR=CACHE_DIR/kvsim before numba is
imported (``--fresh`` empties CACHE_DIR first: a cold run), runs the kvsim CLI in this
process and prints one JSON line on stderr: wall seconds, this process's CPU seconds
(user + sys: the serial part, which bounds the wall time on an idle machine from below),
its children's (the forked compile and ``--jobs`` workers), and /proc/loadavg before and
after.  The command's own output goes to stdout as usual.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "?"


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv or argv.index("--") < 1:
        sys.exit(__doc__)
    cut = argv.index("--")
    cache, flags, cmd = Path(argv[0]), argv[1:cut], argv[cut + 1:]
    if "--fresh" in flags and cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(cache / "numba")
    os.environ["KVSIM_CACHE_DIR"] = str(cache / "kvsim")
    load0, t0 = _load(), time.time()
    sys.argv = ["kvsim", *cmd]
    from kvsim.cli import main as cli

    code = 0
    try:
        cli()
    except SystemExit as exc:
        code = exc.code or 0
    rec = {"command": "kvsim " + " ".join(cmd), "fresh": "--fresh" in flags,
           "exit": code, "wall_s": round(time.time() - t0, 1),
           "self_cpu_s": round(_cpu(resource.RUSAGE_SELF), 1),
           "children_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN), 1),
           "loadavg_before": load0, "loadavg_after": _load()}
    rec["total_cpu_s"] = round(rec["self_cpu_s"] + rec["children_cpu_s"], 1)
    print(json.dumps(rec), file=sys.stderr)


if __name__ == "__main__":
    main()
