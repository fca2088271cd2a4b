"""Where one ``kvsim`` command's main thread spends its time, by phase: a replay of an event
file (``simulate --trace``) run in this process, its phases marked by wrapping the driver's
functions (nothing else changes).

    python bench/tok16_phases.py simulate --trace mc16.parquet --policy lru --engine compiled --json

Prints, per phase, wall seconds, the main thread's CPU seconds (``time.thread_time``) and
the whole process's (``time.process_time``: the reader threads too): imports (the CLI,
numba, pyarrow), set-up before the pre-pass, the pre-pass (``scan_trace``: its reads in the
reader thread), the replay's set-up (``_Run``), the replay loop (batches fed to the
compiled core; its reads in the reader thread), the end of the trace and the outputs.
Then the replay loop's parts: the compiled core (``core.run`` calls), the driver's
per-batch work around it (``feed`` minus the core) and the main thread's waits for the
reader.  On an idle 2-core machine the reads run beside the main thread, so the process's
wall is about the main thread's CPU plus its waits; on a loaded one compare CPU seconds.
docs/benchmarks.md, "Speed: the 16-token replay's driver and first touch".
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time

_T0 = time.perf_counter()
_MARKS: list[tuple[str, float, float, float]] = []


def _mark(name: str) -> None:
    _MARKS.append((name, time.perf_counter(), time.thread_time(), time.process_time()))


def main(argv: list[str]) -> int:
    _mark("start")
    from kvsim.cli import app
    from kvsim.events import read_ahead
    from kvsim.replay import driver

    _mark("imports")
    acc = dict(core_wall=0.0, core_cpu=0.0, feed_wall=0.0, feed_cpu=0.0, wait_wall=0.0)
    scan, init, feed, finish, execute = (driver.scan_trace, driver._Run.__init__,
                                         driver._Run.feed, driver._Run.finish, driver.execute)
    nxt = read_ahead.ReadAhead.__next__

    def t_scan(*a, **k):
        _mark("set-up")
        r = scan(*a, **k)
        _mark("pre-pass")
        return r

    def t_init(self, *a, **k):
        _mark("between")
        init(self, *a, **k)
        _mark("replay set-up")
        core, run = self.core, self.core.run

        class _Core:
            def __getattr__(self, name):
                return getattr(core, name)

            @staticmethod
            def run(*args):
                w, c = time.perf_counter(), time.thread_time()
                try:
                    return run(*args)
                finally:
                    acc["core_wall"] += time.perf_counter() - w
                    acc["core_cpu"] += time.thread_time() - c
        self.core = _Core()

    def t_feed(self, cols):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return feed(self, cols)
        finally:
            acc["feed_wall"] += time.perf_counter() - w
            acc["feed_cpu"] += time.thread_time() - c

    def t_next(self):
        if threading.current_thread() is not threading.main_thread():
            return nxt(self)
        w = time.perf_counter()
        try:
            return nxt(self)
        finally:
            acc["wait_wall"] += time.perf_counter() - w

    def t_finish(self):
        _mark("replay loop")
        finish(self)
        _mark("end of trace")

    def t_execute(*a, **k):
        r = execute(*a, **k)
        _mark("tables")
        return r

    driver.scan_trace, driver._Run.__init__, driver._Run.feed = t_scan, t_init, t_feed
    driver._Run.finish, driver.execute = t_finish, t_execute
    read_ahead.ReadAhead.__next__ = t_next
    sys.argv = ["kvsim", *argv]
    out, sys.stdout = sys.stdout, open(os.devnull, "w")
    try:
        app()
    except SystemExit:
        pass
    finally:
        sys.stdout = out
    _mark("summary and output")
    print(f"{'phase':20s} {'wall s':>7s} {'main CPU s':>10s} {'process CPU s':>13s}")
    for (_, w0, t0, p0), (name, w1, t1, p1) in zip(_MARKS, _MARKS[1:]):
        print(f"{name:20s} {w1 - w0:7.3f} {t1 - t0:10.3f} {p1 - p0:13.3f}")
    last = _MARKS[-1]
    print(f"{'total':20s} {last[1] - _T0:7.3f} {last[2]:10.3f} {last[3]:13.3f}")
    print(f"replay loop: core {acc['core_cpu']:.3f} CPU-s ({acc['core_wall']:.3f} s wall), "
          f"driver per batch {acc['feed_cpu'] - acc['core_cpu']:.3f} CPU-s, waits for the "
          f"reader {acc['wait_wall']:.3f} s wall")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(f"user {ru.ru_utime:.2f} s, sys {ru.ru_stime:.2f} s, peak RSS "
          f"{ru.ru_maxrss / 2**20:.3f} GiB, minor faults {ru.ru_minflt}, load "
          f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
