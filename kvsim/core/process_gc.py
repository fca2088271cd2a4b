"""The ``kvsim`` command's garbage-collector thresholds.

A ``kvsim`` process allocates most of its Python objects once, as it starts: the imports
(numba, numpy, pandas, kvsim's ~90 modules) and numba's loading of cached code build
~160,000 objects that live until the process ends.  Python's default thresholds
(``gc.get_threshold()`` = (700, 10, 10)) scan them again and again while they are being
built: a warm 1-replica Mooncake run (bench/aisimulate/kvsim_run.py) spent 0.23 CPU-s of its
2.8 in 469 collections, 3 of them full (``gc.callbacks``, load ~15, 2026-11-29;
docs/benchmarks.md, "Per-process fixed costs").  With
:data:`CLI_THRESHOLDS` the same run makes 47 collections (0.08 CPU-s; 40 of them small ones
while ``kvsim.cli`` is imported, before the command sets them) and none full.

Cyclic garbage is still collected: a young collection every :data:`CLI_THRESHOLDS`\\[0]
container allocations, a full one after 20 x 10 of those.  Only the command line sets them
(:class:`kvsim.cli.common.KvsimGroup` as the command starts; they stay for the rest of the
process, which the command owns: :func:`use_cli_thresholds`); ``import kvsim`` (and
``import kvsim.cli``) as a library leaves the interpreter's collector as it found it.
"""

from __future__ import annotations

import gc

#: (young, middle, old) thresholds of :func:`gc.set_threshold` while a command runs.
#: 50,000: measured above (1-replica Mooncake: 469 -> 5 collections, gc CPU 0.23 -> 0.08 s,
#: peak RSS unchanged at 344 MB); 100,000 saved another 0.01 s only.  20 and 10: a full
#: collection after ~10 M container allocations, which a long closed loop still reaches.
CLI_THRESHOLDS = (50_000, 20, 10)


def use_cli_thresholds() -> None:
    """Set :data:`CLI_THRESHOLDS` for the rest of the process.  Not given back when the
    command returns: going back to a young threshold of 700 with tens of thousands of
    objects allocated since the last collection starts a collection of all of them at once
    (measured: 0.056 CPU-s as the 100-request run ended, 2026-11-29)."""
    gc.set_threshold(*CLI_THRESHOLDS)
