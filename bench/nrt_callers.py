"""Which compiled functions call numba's reference counts (``NRT_incref`` / ``NRT_decref``)
during a kvsim command, by sampling their callers with gdb (docs/benchmarks.md, "Speed: the
16-token replay's counted references").

    python bench/nrt_callers.py [--rounds 20] [--per-round 200] -- simulate --trace T ...

perf names kvsim's JIT functions (bench/aisimulate/perf_map.py) but cannot say who calls
``NRT_incref``: numba defines it in every code library as a small leaf function, and perf's
call graphs stop there (no frame pointers or unwind tables in the JIT code).  This script
runs the command twice in one process: after the first run (which loads the compiled code)
it maps every JIT function's address (as perf_map.py does), then, while the second run
goes, a thread attaches gdb ``--rounds`` times, puts a breakpoint on every copy of the two
functions, and records the return address at the top of the stack for the next
``--per-round`` calls: the caller.  Calls, not time: each count is one atomic update.
Samples of one round are consecutive calls, so spread them over many rounds.  Prints the
share of sampled calls per (function, caller), and per caller site (offset in bytes).

Needs gdb and ptrace rights (root, or ``kernel.yama.ptrace_scope = 0``); read only: gdb
only reads registers and the stack, and detaches.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "aisimulate"))
import perf_map  # noqa: E402

GDB_SCRIPT = """
import gdb
gdb.execute("set pagination off")
bps = [gdb.Breakpoint("*%d" % a, internal=True) for a in ADDRS]
res = []
for _ in range(N):
    gdb.execute("continue", to_string=True)
    res.append((int(gdb.parse_and_eval("$pc")), int(gdb.parse_and_eval("*(unsigned long*)$sp"))))
for b in bps:
    b.delete()
with open(OUT, "w") as f:
    f.write("".join("%d %d\\n" % r for r in res))
gdb.execute("detach")
"""


def short(name: str) -> str:
    """``kvsim.replay.kernel.spill._hbm_evicted_range`` from numba's mangled name."""
    if not name.startswith("_ZN"):
        return name[:60]
    rest, parts = name[3:], []
    while rest and rest[0].isdigit():
        n = int(re.match(r"\d+", rest).group())
        d = len(str(n))
        parts.append(rest[d:d + n])
        rest = rest[d + n:]
    return ".".join(parts) or name[:60]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=200)
    ap.add_argument("--delay-s", type=float, default=2.0, help="before the first round")
    ap.add_argument("--top", type=int, default=30)
    argv = sys.argv[1:]
    cut = argv.index("--")
    a = ap.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    so = sys.stdout
    sys.stdout = open(os.devnull, "w")  # the command's own output (both runs)
    perf_map._run_kvsim(cmd)
    items = sorted(perf_map._jit_functions().items())
    addrs = [x for x, _ in items]
    nrt = [x for x, n in items if n in ("NRT_incref", "NRT_decref")]
    tmp = Path(tempfile.mkdtemp(prefix="nrt_callers_"))
    (tmp / "s.py").write_text(GDB_SCRIPT)
    pid = os.getpid()

    def sampler() -> None:
        time.sleep(a.delay_s)
        for k in range(a.rounds):
            py = f"python ADDRS={nrt!r}; N={a.per_round}; OUT={str(tmp / f'r{k}.txt')!r}"
            subprocess.run(["gdb", "-q", "-batch", "-p", str(pid), "-ex", py, "-x",
                            str(tmp / "s.py")], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
            time.sleep(0.2)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        perf_map._run_kvsim(cmd)
    finally:
        sys.stdout = so

    def name(x: int) -> tuple[str, int]:
        i = bisect.bisect_right(addrs, x) - 1
        return (short(items[i][1]), x - items[i][0]) if i >= 0 else ("?", 0)

    by_fn: collections.Counter = collections.Counter()
    by_site: collections.Counter = collections.Counter()
    for f in sorted(tmp.glob("r*.txt")):
        for line in f.read_text().split("\n"):
            if line:
                pc, ret = map(int, line.split())
                callee = name(pc)[0]
                caller, off = name(ret)
                by_fn[(callee, caller)] += 1
                by_site[(callee, caller, off)] += 1
    rounds = len(list(tmp.glob("r*.txt")))
    shutil.rmtree(tmp, ignore_errors=True)
    total = sum(by_fn.values()) or 1
    print(f"{total} sampled calls, {rounds} rounds")
    for (callee, caller), v in by_fn.most_common(a.top):
        print(f"{100 * v / total:5.1f} %  {callee:10s} <- {caller}")
    print("by call site:")
    for (callee, caller, off), v in by_site.most_common(a.top):
        print(f"{100 * v / total:5.1f} %  {callee:10s} <- {caller} +{off}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
