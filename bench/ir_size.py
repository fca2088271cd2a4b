"""Size of the unoptimised LLVM IR numba hands to LLVM in a cold compile, and its CPU time
(docs/benchmarks.md, "Cold compile": the state groups' proxy, issue 17).

Usage: NUMBA_CACHE_DIR=<empty> KVSIM_CACHE_DIR=<empty> python bench/ir_size.py [KVSIM ARGS]

Without arguments: compiles the hooks of each built-in policy with compiled hooks
(:func:`kvsim.replay.precompile.compile_hooks`, which is what ``kvsim compare``'s hooks worker
runs), nothing else (the replay core is not compiled), and prints the process CPU time of
``compile_hooks`` and the IR bytes per hook name summed over policies.  With arguments:
runs that kvsim command in this process (``compare --profile deadline_pressure ...``;
set ``KVSIM_COMPILE_WORKERS=1`` so that nothing compiles in a worker this script does
not see) and prints the IR bytes of the 25 largest libraries on stderr.  IR bytes are each
numba code library's module text as ``CodeLibrary.add_ir_module`` receives it; also
counted: ``NRT_incref``/``NRT_decref`` calls in that text, and ``/proc/loadavg`` before
and after.  With a warm cache it loads instead of compiling: IR 0 bytes.
"""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

from numba.core.codegen import CodeLibrary, CPUCodeLibrary

SIZES: collections.Counter = collections.Counter()
REFOPS: collections.Counter = collections.Counter()
_CLS = CPUCodeLibrary if "add_ir_module" in CPUCodeLibrary.__dict__ else CodeLibrary
_ORIG = _CLS.add_ir_module


def _add_ir_module(self, mod):
    text = str(mod)
    SIZES[self.name] += len(text)
    REFOPS[self.name] += text.count("NRT_incref") + text.count("NRT_decref")
    return _ORIG(self, mod)


def _group(lib_name: str) -> str:
    """``kvsim.policies.lfu.victim`` -> ``victim``; helpers keep their module."""
    parts = lib_name.split(".")
    if len(parts) >= 3 and parts[-3] == "policies":
        return parts[-1] if not parts[-1].startswith("_") else "policy helpers (_*)"
    return ".".join(parts[-2:])


def _report_cli(load0: str) -> None:
    out = sys.stderr
    print(f"pre-opt IR: {sum(SIZES.values()) / 1e6:.2f} MB in {len(SIZES)} libraries, "
          f"{sum(REFOPS.values())} NRT incref/decref calls; process "
          f"{time.process_time():.2f} CPU-s", file=out)
    for name, size in SIZES.most_common(25):
        print(f"  {size / 1e6:7.3f} MB {REFOPS[name]:6d} refops  {name}", file=out)
    print(f"loadavg before: {load0}", file=out)
    print(f"loadavg after:  {Path('/proc/loadavg').read_text().strip()}", file=out)


def main() -> None:
    _CLS.add_ir_module = _add_ir_module
    load0 = Path("/proc/loadavg").read_text().strip()
    if len(sys.argv) > 1:
        import atexit

        from kvsim.cli import app as kvsim_main

        atexit.register(_report_cli, load0)
        sys.argv = ["kvsim"] + sys.argv[1:]
        kvsim_main()
        return
    from kvsim.policy.registry import list_policies
    from kvsim.replay.precompile import compile_hooks

    names = [p.name for p in list_policies() if p.compiled]
    t0, w0 = time.process_time(), time.perf_counter()
    cpu = compile_hooks(names)
    total_cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    by_group: collections.Counter = collections.Counter()
    refs: collections.Counter = collections.Counter()
    for name, size in SIZES.items():
        by_group[_group(name)] += size
        refs[_group(name)] += REFOPS[name]
    print(f"policies: {' '.join(names)}")
    print(f"compile_hooks: {cpu:.2f} CPU-s (process {total_cpu:.2f} CPU-s, {wall:.1f} s wall)")
    print(f"pre-opt IR: {sum(SIZES.values()) / 1e6:.2f} MB in {len(SIZES)} libraries, "
          f"{sum(REFOPS.values())} NRT incref/decref calls")
    for g, size in by_group.most_common():
        print(f"  {size / 1e6:7.3f} MB {refs[g]:6d} refops  {g}")
    print(f"loadavg before: {load0}")
    print(f"loadavg after:  {Path('/proc/loadavg').read_text().strip()}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
