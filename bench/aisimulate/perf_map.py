"""Run a kvsim command in this process, then write ``/tmp/perf-PID.map`` naming the JIT
functions of every kvsim dispatcher's code library (their addresses from numba's engine;
read only, nothing of numba is changed), so that ``perf report`` names kvsim's compiled
functions (docs/benchmarks.md, "vs NVIDIA AISimulate", where the CPU goes):

    perf record -F 999 -o P.data -- python bench/aisimulate/perf_map.py -- simulate ...
    perf report -i P.data --sort sym --stdio
"""

from __future__ import annotations

import os
import sys


def _run_kvsim(argv: list[str]) -> None:
    from kvsim.cli import app

    sys.argv = ["kvsim", *argv]
    try:
        app()
    except SystemExit:
        pass


def _jit_functions() -> dict[int, str]:
    from numba.core.dispatcher import Dispatcher

    libs = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("kvsim") or mod is None:
            continue
        for v in list(vars(mod).values()):
            if isinstance(v, Dispatcher):
                for cres in v.overloads.values():
                    libs[id(cres.library)] = cres.library
    addrs: dict[int, str] = {}
    for lib in libs.values():
        for m in (getattr(lib, "_shared_module", None), getattr(lib, "_final_module", None)):
            if m is None:
                continue
            for f in m.functions:
                if f.is_declaration:
                    continue
                try:
                    a = lib._codegen._engine.get_function_address(f.name)
                except Exception:  # noqa: BLE001 - a symbol the engine does not hold
                    a = 0
                if a:
                    addrs[a] = f.name
    return addrs


def main() -> None:
    _run_kvsim(sys.argv[sys.argv.index("--") + 1:])
    items = sorted(_jit_functions().items())
    ends = [a for a, _ in items[1:]] + [items[-1][0] + 4096] if items else []
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as fh:
        for (a, n), nxt in zip(items, ends):
            fh.write(f"{a:x} {min(nxt - a, 1 << 20):x} {n}\n")  # size: up to the next one
    print(f"mapped {len(items)} functions", file=sys.stderr)
    os._exit(0)


if __name__ == "__main__":
    main()
