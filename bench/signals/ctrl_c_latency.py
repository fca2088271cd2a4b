"""How long after Ctrl-C a kvsim command ends (issue 38, "Ctrl-C at any moment").

Python serves a signal between two bytecodes of the main thread, so a long compiled call
(numba) delays Ctrl-C until it returns.  Each case starts the command as a child with
``KVSIM_PROGRESS_INTERVAL_S=0`` (a progress line at every update), waits for its first
progress line that counts work done (compiled code is running, warm cache), sleeps a
random 0 .. ``--spread`` s, sends SIGINT and times the exit (wall, from the signal to the
child's exit, stderr's error line checked); /proc/loadavg before and after.

    python bench/signals/ctrl_c_latency.py --repeat 5 \\
        --trace /work/cache/mc512.parquet \\
        --request-trace ../shared/traces/mooncake/conversation_trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PROGRESS = re.compile(r"^progress: .*?: ([0-9,]+)")


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def one(argv: list[str], spread_s: float, rng: random.Random, timeout_s: float,
        cold: bool = False) -> dict:
    env = dict(os.environ, KVSIM_PROGRESS_INTERVAL_S="0")
    if cold:  # an empty compile cache: the signal lands in the compile
        env["KVSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvsim-ctrlc-cache-")
    # SIGINT's default in the child: a background job (``&``, nohup) starts with SIGINT
    # ignored, inherited by its children, and Python then ignores Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", *argv], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = threading.Event()
    lines: list[str] = []

    def drain() -> None:
        for line in proc.stderr:
            lines.append(line)
            m = PROGRESS.match(line)
            if (m and int(m.group(1).replace(",", "")) > 0) or \
                    (cold and line.startswith("compiling ")):
                started.set()
        started.set()  # the child ended (or closed stderr) before any progress

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    started.wait(timeout_s)
    if proc.poll() is not None:
        t.join()
        return {"error": "ended before the signal", "stderr": "".join(lines)[-400:]}
    time.sleep(rng.uniform(0, spread_s))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"error": f"still running {timeout_s} s after SIGINT"}
    dt = time.monotonic() - t0
    t.join()
    if cold:
        shutil.rmtree(env["KVSIM_CACHE_DIR"], ignore_errors=True)
    errs = [x for x in lines if x.startswith("error: ")]
    return {"latency_s": round(dt, 3), "exit": proc.returncode, "error_line": errs[-1:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="an event file (simulate --trace)")
    ap.add_argument("--request-trace", help="a Mooncake request trace (closed loop)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spread", type=float, default=2.0, help="random delay, seconds")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold", type=int, default=0,
                    help="also N runs of simulate --trace with an empty compile cache, "
                         "signalled 0 .. --cold-spread s after the compile note")
    ap.add_argument("--cold-spread", type=float, default=30.0)
    ap.add_argument("--only-cold", action="store_true")
    ap.add_argument("--out", help="JSON results")
    ap.add_argument("--cases", default="generate,trace,request",
                    help="which of generate, trace, request to run")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="kvsim-ctrlc-"))
    cases = {"generate 30k": ["generate", "--profile", "multi_turn_chat", "--requests",
                              "30000", "--out", str(tmp / "g.parquet")]}
    if a.trace:
        cases["simulate --trace"] = ["simulate", "--trace", a.trace, "--decision-log",
                                     str(tmp / "log.parquet")]
    if a.request_trace:
        cases["simulate --request-trace"] = ["simulate", "--request-trace", a.request_trace]
    out = {"load_before": _load(), "cases": {}}
    keep = {"generate": "generate 30k", "trace": "simulate --trace",
            "request": "simulate --request-trace"}
    wanted = {keep[c] for c in a.cases.split(",") if c}
    plan = [] if a.only_cold else [(name, argv, False) for name, argv in cases.items()
                                   if name in wanted]
    if a.cold and a.trace:
        plan.append(("simulate --trace, cold compile", ["simulate", "--trace", a.trace],
                     True))
    for name, argv, cold in plan:
        runs = [one(argv, a.cold_spread if cold else a.spread, rng, a.timeout, cold)
                for _ in range(a.cold if cold else a.repeat)]
        lat = [r["latency_s"] for r in runs if "latency_s" in r]
        out["cases"][name] = {"argv": argv, "runs": runs,
                              "max_s": max(lat) if lat else None,
                              "median_s": sorted(lat)[len(lat) // 2] if lat else None}
        print(f"{name}: max {out['cases'][name]['max_s']} s, median "
              f"{out['cases'][name]['median_s']} s over {len(lat)} runs", flush=True)
    out["load_after"] = _load()
    out["leftovers"] = sorted(p.name for p in tmp.iterdir())
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
