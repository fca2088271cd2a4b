"""Where a cold numba compile of kvsim spends its CPU time, by phase and by function.

Usage: python bench/prof_compile_phases.py <kvsim CLI args...>   (e.g. simulate --profile
deadline_pressure --requests 256 --seed 0 --hbm-gb 8 --policy lru --engine compiled)

Runs the kvsim CLI in this process with a stack of timed regions (process CPU time,
exclusive of nested regions): numba's own events (``numba:compile`` per dispatcher,
``numba:run_pass`` per compiler pass) plus wrappers around numba's codegen steps (LLVM
IR parse + function passes, linking callees' modules in, module optimisation, MCJIT machine
code, cache serialise / write / load).  Prints the exclusive CPU seconds of each phase, of
each function, and how many LLVM functions were machine-compiled in all vs distinct ones
(each numba entry point links and re-codegens its callees).  Set NUMBA_CACHE_DIR and
KVSIM_CACHE_DIR to empty folders first for a cold figure.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

from numba.core import caching, codegen, event

STACK: list[list] = []  # [label, start_cpu, child_cpu]
PHASE: dict[str, float] = defaultdict(float)
FUNC: dict[str, float] = defaultdict(float)
COUNT = {"finalized_functions": 0, "finalizes": 0}
DISTINCT: set[str] = set()
#: LLVM function name -> [times machine-compiled, instructions in its last copy]
COPIES: dict[str, list] = defaultdict(lambda: [0, 0])
FSTACK: list[str] = []


def push(label: str) -> None:
    STACK.append([label, time.process_time(), 0.0])


def pop() -> None:
    label, t0, child = STACK.pop()
    dt = time.process_time() - t0
    PHASE[label] += dt - child
    if FSTACK and label != OVERHEAD:
        FUNC[FSTACK[-1]] += dt - child
    if STACK:
        STACK[-1][2] += dt


class Ev(event.Listener):
    def on_start(self, ev):
        if ev.kind == "numba:compile":
            d = ev.data["dispatcher"]
            FSTACK.append(f"{d.py_func.__module__}.{d.py_func.__name__}")
            push("compile: other (dispatch, cache lookup)")
        else:
            push("pass: " + ev.data["name"])

    def on_end(self, ev):
        pop()
        if ev.kind == "numba:compile":
            FSTACK.pop()


def wrap(cls, name: str, label: str) -> None:
    orig = getattr(cls, name)

    def inner(self, *a, **k):
        push(label)
        try:
            return orig(self, *a, **k)
        finally:
            pop()

    setattr(cls, name, inner)


from numba.core import lowering  # noqa: E402

wrap(lowering.Lower, "create_cpython_wrapper", "lowering: CPython wrapper (Python calls)")
wrap(lowering.Lower, "create_cfunc_wrapper", "lowering: C wrapper (cfunc, first-class)")
L = codegen.CPUCodeLibrary
wrap(L, "add_ir_module", "llvm: parse IR")
wrap(L, "_optimize_functions", "llvm: function passes")
wrap(L, "finalize", "llvm: link callees in")
wrap(L, "_optimize_final_module", "llvm: module optimisation")
wrap(codegen.JITCodeLibrary, "_finalize_specific", "llvm: machine code (MCJIT)")
wrap(L, "serialize_using_object_code", "cache: serialise")
wrap(caching.Cache, "save_overload", "cache: write")
wrap(caching.Cache, "load_overload", "cache: load")

_orig_ffm = L._finalize_final_module
OVERHEAD = "profiler: counting functions (excluded from the totals)"


def _ffm(self):
    push(OVERHEAD)  # counting instructions is this script's cost, not numba's
    for fn in self._final_module.functions:
        if not fn.is_declaration:
            COUNT["finalized_functions"] += 1
            DISTINCT.add(fn.name)
            c = COPIES[fn.name]
            c[0] += 1
            c[1] = sum(1 for b in fn.blocks for _ in b.instructions)
    pop()
    COUNT["finalizes"] += 1
    return _orig_ffm(self)


L._finalize_final_module = _ffm
event.register("numba:compile", Ev())
event.register("numba:run_pass", Ev())


def main() -> None:
    sys.argv = ["kvsim"] + sys.argv[1:]
    from kvsim.cli import app as cli  # app, not main: main ends the process

    c0, w0 = time.process_time(), time.time()
    try:
        cli()
    except SystemExit:
        pass
    cpu, wall = time.process_time() - c0, time.time() - w0
    over = PHASE.pop(OVERHEAD, 0.0)
    tot = sum(PHASE.values())
    print(f"process: {wall:.1f} s wall, {cpu:.1f} CPU-s; inside numba compile: {tot:.1f} CPU-s "
          f"(profiler's own counting, excluded: {over:.1f})")
    groups: dict[str, float] = defaultdict(float)
    for k, v in PHASE.items():
        if k.startswith("pass: "):
            name = k.split(" [")[0]
            k = name if name in ("pass: nopython_type_inference", "pass: native_lowering") \
                else "pass: other numba passes (SSA, inlining, rewrites, ...)"
        groups[k] += v
    print("by phase:")
    for k, v in sorted(groups.items(), key=lambda x: -x[1]):
        print(f"  {v:7.2f}  {k}")
    passes: dict[str, float] = defaultdict(float)
    for k, v in PHASE.items():
        if k.startswith("pass: "):
            passes[k.split(" [")[0][6:]] += v
    print("numba passes (all functions):")
    for k, v in sorted(passes.items(), key=lambda x: -x[1])[:20]:
        print(f"  {v:7.2f}  {k}")
    print("top phase x function:")
    for k, v in sorted(PHASE.items(), key=lambda x: -x[1])[:15]:
        print(f"  {v:7.2f}  {k}")
    print(f"libraries finalized {COUNT['finalizes']}, LLVM functions machine-compiled "
          f"{COUNT['finalized_functions']} ({len(DISTINCT)} distinct)")
    extra = sum((n - 1) * size for n, size in COPIES.values())
    total = sum(n * size for n, size in COPIES.values())
    print(f"LLVM instructions machine-compiled {total} ({total - extra} in distinct "
          f"functions); most re-compiled (copies x instructions, name):")
    kinds: dict[str, int] = defaultdict(int)
    for name, (n, size) in COPIES.items():
        kind = ("CPython wrappers" if name.startswith("_ZN7cpython") else
                "C wrappers (cfunc)" if name.startswith("cfunc.") else "functions")
        kinds[kind] += n * size
    print("  of which: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print("largest CPython wrappers (copies x instructions, name):")
    wr = [(n, size, name) for name, (n, size) in COPIES.items()
          if name.startswith("_ZN7cpython")]
    for n, size, name in sorted(wr, key=lambda x: -x[0] * x[1])[:25]:
        print(f"  {n:4d} x {size:6d}  {name[:110]}")
    for name, (n, size) in sorted(COPIES.items(), key=lambda x: -(x[1][0] - 1) * x[1][1])[:25]:
        print(f"  {n:4d} x {size:6d}  {name[:110]}")
    print("by function (exclusive):")
    for k, v in sorted(FUNC.items(), key=lambda x: -x[1])[:30]:
        print(f"  {v:7.2f}  {k}")
    mods: dict[str, float] = defaultdict(float)
    for k, v in FUNC.items():
        mods[k.rsplit(".", 1)[0]] += v
    print("by module (exclusive, all its functions):")
    for k, v in sorted(mods.items(), key=lambda x: -x[1])[:30]:
        print(f"  {v:7.2f}  {k}")
    print_signatures()


def dispatchers() -> dict[str, object]:
    """Every numba dispatcher defined in a loaded kvsim or policy module, by name."""
    from numba.core.dispatcher import Dispatcher

    out = {}
    for mname, mod in list(sys.modules.items()):
        if mod is None or not (mname.startswith("kvsim") or mname.startswith("policies")):
            continue
        for name, value in list(vars(mod).items()):
            if isinstance(value, Dispatcher) and value.py_func.__module__ == mname:
                out[f"{mname}.{name}"] = value
    return out


def print_signatures() -> None:
    """How many signatures each dispatcher holds in this process (compiled or loaded from
    the cache): a function with two is compiled (or loaded) twice."""
    ds = dispatchers()
    used = {k: d for k, d in ds.items() if d.signatures}
    print(f"dispatchers with code in this process: {len(used)} of {len(ds)}; signatures: "
          f"{sum(len(d.signatures) for d in used.values())}; with more than one:")
    for k, d in sorted(used.items()):
        if len(d.signatures) > 1:
            print(f"  {len(d.signatures)}  {k}")
            for sig in d.signatures:
                print(f"       {str(sig)[:300]}")


if __name__ == "__main__":
    main()
