"""Wall and CPU time of one kvsim command from empty (or warm) caches, as a user runs it.

    python bench/bench_cold_compile.py CACHE_DIR [--fresh] -- compare --profile \
        deadline_pressure --requests 256 --seed 0 --hbm-gb 8 --engine compiled --json

Sets NUMBA_CACHE_DIR=CACHE_DIR/numba and KVSIM_CACHE_DIR=CACHE_DIR/kvsim before numba is
imported (``--fresh`` empties CACHE_DIR first: a cold run), runs the ``kvsim`` console
script beside this interpreter (``python -c "from kvsim.cli import main; main()"`` where
there is none) as a child process, and prints one JSON line on stderr: wall seconds from
the child's start to its end (interpreter start, imports and exit included, as a user
waits for them), its CPU seconds (user + sys of the command and of the compile and
``--jobs`` workers it forked), and /proc/loadavg before and after.  The command's own
output goes to stdout and stderr as usual.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
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
    script = Path(sys.executable).with_name("kvsim")
    argv0 = ([str(script)] if script.exists()
             else [sys.executable, "-c", "from kvsim.cli import main; main()"])
    load0, t0 = _load(), time.perf_counter()
    code = subprocess.call([*argv0, *cmd])
    wall = time.perf_counter() - t0
    rec = {"command": "kvsim " + " ".join(cmd), "fresh": "--fresh" in flags,
           "exit": code, "wall_s": round(wall, 2),
           "total_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN), 1),
           "loadavg_before": load0, "loadavg_after": _load()}
    print(json.dumps(rec), file=sys.stderr)


if __name__ == "__main__":
    main()
