"""CPU time of the spill files (kvsim.core.spill.SpillFile, unbuffered) against buffered
``tempfile.TemporaryFile`` (main before session 21): docs/benchmarks.md, "Spill files written
unbuffered".  Usage: ``python bench/bench_spill_write.py``."""

from __future__ import annotations

import tempfile
import time

import numpy as np

from kvsim.core import spill
from kvsim.results import step_records as sr


def buffered(prefix: str):
    return tempfile.TemporaryFile(prefix=prefix, dir=spill._tmpdir())


def bench(make) -> float:
    rows = np.random.default_rng(0).random((1024, 12))
    vals = rows[:, 0].copy()
    spill.SpillFile.new = staticmethod(make)
    t = time.process_time()
    r = spill.SpilledRows(12, mem_rows=0)
    for _ in range(2000):  # 2,048,000 rows, 192 MB
        r.append(rows)
    s = sum(len(c) for c in r.iter_chunks())
    r.close()
    v = sr.Float64Values(mem_values=0)
    for _ in range(4000):  # 4,096,000 values, 32 MB, 1,024 a call
        v.append(vals)
    n = sum(len(c) for c in v.chunks())
    v.close()
    assert s == 2_048_000 and n == 4_096_000
    return time.process_time() - t


def main() -> None:
    unbuffered = spill.SpillFile.new
    res: dict[str, list[float]] = {"buffered": [], "unbuffered": []}
    for _ in range(3):  # alternated
        res["buffered"].append(bench(buffered))
        res["unbuffered"].append(bench(unbuffered))
    spill.SpillFile.new = unbuffered
    print({k: [round(x, 3) for x in v] for k, v in res.items()},
          "min", {k: round(min(v), 3) for k, v in res.items()})


if __name__ == "__main__":
    main()
