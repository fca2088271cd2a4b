"""Where inside one compiled kvsim function perf's samples fall, instruction by instruction
(docs/benchmarks.md, "16-token paths: bound by the memory they touch, not by when it is asked for"):

    perf record -F 999 -o P.data -- python bench/aisimulate/perf_ips.py record \
        --name _hbm_evicted_range --dump D -- simulate ...
    python bench/aisimulate/perf_ips.py report P.data D [--top 8] [--context 12]

``record`` runs a kvsim command in this process (as ``perf_map.py`` does), then writes
``/tmp/perf-PID.map`` naming every kvsim dispatcher's JIT functions for ``perf report``,
and copies the machine code of each function whose symbol contains ``--name`` from this
process's memory into ``D/<address>-<size>.bin`` (read only: numba's engine gives the
addresses, nothing of numba is changed).  ``report`` counts ``perf script``'s sample
addresses inside each dumped function and prints the hottest ones with the instructions
before them (``objdump`` of the dump): a sample lands on the oldest instruction not yet
retired, so a load that misses shows as heat on it or on the instruction after it, and a
software prefetch that waits for a free miss buffer as heat just after the prefetch.
Needs ``perf`` and binutils' ``objdump``; x86-64 only.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def record(name: str, dump: Path, argv: list[str]) -> None:
    sys.path.insert(0, str(HERE))
    import perf_map

    perf_map._run_kvsim(argv)
    items = sorted(perf_map._jit_functions().items())
    ends = [a for a, _ in items[1:]] + ([items[-1][0] + 4096] if items else [])
    dump.mkdir(parents=True, exist_ok=True)
    found = 0
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as fh:
        for (addr, sym), nxt in zip(items, ends):
            size = min(nxt - addr, 1 << 20)  # up to the next function
            fh.write(f"{addr:x} {size:x} {sym}\n")
            if name in sym and not sym.startswith("cpython."):  # not numba's wrapper
                (dump / f"{addr:x}-{size:x}.bin").write_bytes(ctypes.string_at(addr, size))
                found += 1
    print(f"mapped {len(items)} functions, dumped {found} matching {name!r} to {dump}",
          file=sys.stderr)
    os._exit(0)  # as kvsim's console script ends


def _disassemble(path: Path, addr: int) -> list[tuple[int, str]]:
    out = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64",
                          f"--adjust-vma={addr:#x}", str(path)], capture_output=True,
                         text=True, check=True).stdout
    lines = []
    for line in out.splitlines():
        head, _, rest = line.partition(":")
        try:
            lines.append((int(head.strip(), 16), rest.strip()))
        except ValueError:
            continue
    return lines


def report(data: str, dump: Path, top: int, context: int) -> None:
    funcs = []
    for p in sorted(dump.glob("*.bin")):
        a, s = p.stem.split("-")
        funcs.append((int(a, 16), int(s, 16), p))
    ips = subprocess.run(["perf", "script", "-i", data, "-F", "ip"], capture_output=True,
                         text=True, check=True).stdout.split()
    total = len(ips)
    for addr, size, path in funcs:
        hits = collections.Counter(int(x, 16) for x in ips
                                   if addr <= int(x, 16) < addr + size)
        n = sum(hits.values())
        print(f"== {path.name}: {n} of {total} samples ({100 * n / max(total, 1):.1f} %)")
        code = _disassemble(path, addr)
        index = {a: i for i, (a, _) in enumerate(code)}
        for ip, k in hits.most_common(top):
            print(f"-- {ip:#x}: {k} samples ({100 * k / max(n, 1):.1f} % of the function)")
            i = index.get(ip)
            if i is None:
                continue
            for a, text in code[max(0, i - context): i + 2]:
                print(f"   {'>' if a == ip else ' '} {a:x}: {text}")


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "record":
        cut = argv.index("--")
        ap = argparse.ArgumentParser(prog="perf_ips.py record")
        ap.add_argument("--name", required=True)
        ap.add_argument("--dump", type=Path, required=True)
        a = ap.parse_args(argv[1:cut])
        record(a.name, a.dump, argv[cut + 1:])
        return
    ap = argparse.ArgumentParser(prog="perf_ips.py report")
    ap.add_argument("mode", choices=["report"])
    ap.add_argument("data")
    ap.add_argument("dump", type=Path)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--context", type=int, default=12)
    a = ap.parse_args(argv)
    report(a.data, a.dump, a.top, a.context)


if __name__ == "__main__":
    main()
