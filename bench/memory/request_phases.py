"""Where the closed loop's memory goes, phase by phase (issue 38, "Memory"): runs
``kvsim simulate --request-trace T --json`` in this process with its phases wrapped, and
prints, per phase, the resident set before and after it and the peak while it ran.

    python bench/memory/request_phases.py --trace /tmp/x10.jsonl [--tracemalloc] \\
        [-- --replicas 8 --router prefix]

Phases (in the order they run): ``read`` (the request trace into the Request table),
``size`` (the table checked against the limits), ``prepare`` (cost model, unadmittable
requests dropped, block ids as CSR), ``hashes`` (vLLM's block hashes of every request),
``engines`` (each replica's ``Engine``), ``block_facts`` (the prompt-block facts),
``run`` (the engine steps), ``finish`` and ``summary`` (the per-request results and
serving metrics).  The peak of a phase is ``VmHWM`` after ``/proc/self/clear_refs`` was
reset at its start (Linux).  ``--tracemalloc`` also reports the Python/numpy bytes each
phase kept (tracemalloc; numba's own allocations are not traced) and its top lines.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import tracemalloc
from pathlib import Path

ROWS: list[dict] = []
_TRACE = {"on": False}


def _status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 2**20  # kB -> GiB
    return out


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def wrap(mod, name: str, phase: str) -> None:
    fn = getattr(mod, name)

    @functools.wraps(fn)
    def inner(*a, **k):
        before = _status()["VmRSS"]
        snap = tracemalloc.take_snapshot() if _TRACE["on"] else None
        _reset_peak()
        t0 = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            s = _status()
            row = {"phase": phase, "rss_before_gib": before, "rss_after_gib": s["VmRSS"],
                   "peak_gib": s["VmHWM"], "cpu_s": time.process_time() - t0}
            if snap is not None:
                now = tracemalloc.take_snapshot()
                diff = now.compare_to(snap, "lineno")
                row["traced_kept_mib"] = sum(d.size_diff for d in diff) / 2**20
                row["top"] = [f"{d.traceback[0].filename.split('kvsim/')[-1]}:"
                              f"{d.traceback[0].lineno} {d.size_diff / 2**20:+.1f} MiB"
                              for d in diff[:6]]
            ROWS.append(row)
    setattr(mod, name, inner)


def install() -> None:
    import kvsim.cli.simulate as cs
    import kvsim.modes.closed.closed_facts as cf
    import kvsim.modes.closed.cluster as cl
    import kvsim.modes.closed.routing as ro
    import kvsim.modes.closed.serving_metrics as sm

    wrap(cs, "request_table", "read")
    wrap(cs, "size_table", "size")
    wrap(cl, "prepare", "prepare")
    wrap(cl, "vllm_hashes", "hashes")
    wrap(cf, "block_facts", "block_facts")
    wrap(ro, "_run_cluster", "run")
    wrap(cl, "_run_cluster", "run")
    wrap(sm, "cluster_summary", "summary")
    eng = cl.Engine
    for meth, phase in (("__init__", "engine"), ("advance", "run"), ("finish", "finish")):
        orig = getattr(eng, meth)
        holder = type("H", (), {meth: orig})
        wrap(holder, meth, phase)
        setattr(eng, meth, getattr(holder, meth))


def _trim_before(phases) -> None:
    import ctypes

    import kvsim.modes.closed.closed_facts as cf
    import kvsim.modes.closed.cluster as cl

    trim = ctypes.CDLL("libc.so.6").malloc_trim
    targets = {"block_facts": (cf, "block_facts"), "run": (cl.Engine, "advance")}
    for ph in phases:
        mod, name = targets[ph]
        fn = getattr(mod, name)

        def inner(*a, _fn=fn, _done=[], **k):  # noqa: B006 (once per phase)
            if not _done:
                _done.append(trim(0))
            return _fn(*a, **k)
        setattr(mod, name, inner)


class _SetupDone(Exception):
    """Raised at the run's first step under ``--setup-only``."""


def _stop_at_run() -> None:
    """The run's first step (one replica: ``Engine.advance``; routed: ``_run_cluster``)
    ends the command: the set-up's phases are all measured by then."""
    import kvsim.modes.closed.cluster as cl
    import kvsim.modes.closed.routing as ro

    def stop(*a, **k):
        raise _SetupDone
    ro._run_cluster = cl._run_cluster = stop
    cl.Engine.advance = stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--trim", action="store_true",
                    help="glibc malloc_trim(0) before block_facts and before the run (what "
                         "the ingest's freed heap holds on to)")
    ap.add_argument("--setup-only", action="store_true",
                    help="stop when the run's first step starts: the read and set-up phases "
                         "only (their peaks, in a fraction of a long trace's time)")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    if a.tracemalloc:
        tracemalloc.start(1)
        _TRACE["on"] = True
    import kvsim.cli  # noqa: F401  (imports first: not a phase)
    from kvsim.cli import app

    install()
    if a.setup_only:
        _stop_at_run()
    if a.trim:
        _trim_before(("block_facts", "run"))
    start = _status()["VmRSS"]
    _reset_peak()
    argv = ["simulate", "--request-trace", a.trace, "--json", *a.extra]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            app(argv, standalone_mode=False)
        except (SystemExit, _SetupDone):
            pass
    end = _status()
    # consecutive calls of one phase (advance per arrival, Engine per replica) merged
    merged: list[dict] = []
    for r in ROWS:
        if merged and merged[-1]["phase"] == r["phase"]:
            m = merged[-1]
            m["rss_after_gib"] = r["rss_after_gib"]
            m["peak_gib"] = max(m["peak_gib"], r["peak_gib"])
            m["cpu_s"] += r["cpu_s"]
            m["calls"] += 1
        else:
            merged.append({**r, "calls": 1})
    print(f"start (after imports) RSS {start:.3f} GiB; end RSS {end['VmRSS']:.3f} GiB")
    print("| phase | calls | RSS before | RSS after | kept | peak in phase | CPU s |"
          + (" traced kept MiB |" if a.tracemalloc else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if a.tracemalloc else ""))
    for m in merged:
        print(f"| {m['phase']} | {m['calls']} | {m['rss_before_gib']:.3f} | "
              f"{m['rss_after_gib']:.3f} | {1024 * (m['rss_after_gib'] - m['rss_before_gib']):+.0f} MiB | "
              f"{m['peak_gib']:.3f} | {m['cpu_s']:.1f} |"
              + (f" {m.get('traced_kept_mib', 0):+.1f} |" if a.tracemalloc else ""))
    if a.tracemalloc:
        for m in merged:
            if m.get("top"):
                print(m["phase"], "; ".join(m["top"]))
    if not a.setup_only:
        s = json.loads(buf.getvalue())["policies"][0]
        print(json.dumps({k: s[k] for k in ("requests", "steps", "ttft_p99_us",
                                            "hbm_hit_rate")}))
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": merged, "start_gib": start,
                                           "argv": sys.argv}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
