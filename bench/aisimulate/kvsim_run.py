"""One kvsim closed-loop run as a user types it, run by bench_vs_aisimulate.py:

    python bench/aisimulate/kvsim_run.py [--calls N] -- simulate --request-trace ... --json

Imports kvsim's command line, then runs the command in this process and prints one JSON
line on stderr (after the command's own output): the CPU seconds of the import and of the
command (``time.process_time``: every thread of this process; numba's cache loading and any
compile are in the command's), its wall seconds.  The command's ``--json`` goes to stdout.
``--calls N`` runs the same command N times in this process, as a sweep through the Python
API or a notebook does (the later calls' output is written to a buffer, not stdout), and
adds each call's CPU seconds (``calls_cpu_s``): the later calls pay no import, no numba
set-up and no cache load.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time

# as the kvsim command starts (kvsim._single_threaded_blas: this script is not named kvsim,
# so kvsim's own check does not see a command): numpy's BLAS on one thread
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
c0 = time.process_time()
from kvsim.cli import app  # noqa: E402

c1 = time.process_time()


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--")
    calls = int(argv[argv.index("--calls") + 1]) if "--calls" in argv[:cut] else 1
    cmd = argv[cut + 1:]
    per_call, code, wall = [], 0, 0.0
    for i in range(calls):
        sys.argv = ["kvsim", *cmd]
        t0, p0 = time.perf_counter(), time.process_time()
        out = sys.stdout
        if i:
            sys.stdout = io.StringIO()  # the same output, not printed again
        try:
            app()
        except SystemExit as e:  # typer exits
            code = code or e.code or 0
        finally:
            sys.stdout = out
        per_call.append(time.process_time() - p0)
        if not i:
            wall = time.perf_counter() - t0
        sys.stdout.flush()
    rec = {"import_cpu_s": c1 - c0, "call_cpu_s": per_call[0], "call_wall_s": wall,
           "calls_cpu_s": per_call, "exit": code}
    print(json.dumps(rec), file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)  # as kvsim's console script ends (kvsim.cli.main)


if __name__ == "__main__":
    main()
