"""How long a ``kvsim simulate`` command's main thread waits for its trace file's SHA-256
(the parsed-trace and pre-pass caches' key: kvsim/core/parsed_cache.py), in the command as a
user runs it; ``--no-ahead`` replaces ``digest_ahead`` (the hash started in a thread before
the engine's imports) by a no-op, as before it.

    python bench/digest_wait.py simulate --trace mc16.parquet --policy lru --json [--no-ahead]

Prints one line per lookup on stderr: the wait and when it began (seconds after start).
"""

import sys
import time

sys.argv = ["kvsim"] + sys.argv[1:]  # as the console script: the command's defaults
t0 = time.perf_counter()
import kvsim  # noqa: E402,F401
from kvsim.core import parsed_cache as pc  # noqa: E402

_real = pc._digest


def _timed(p, st):
    t = time.perf_counter()
    try:
        return _real(p, st)
    finally:
        sys.stderr.write(f"digest wait {time.perf_counter() - t:.3f} s at {t - t0:.3f} s "
                         "after start\n")


pc._digest = _timed
if "--no-ahead" in sys.argv:
    sys.argv.remove("--no-ahead")
    pc.digest_ahead = lambda path: None

from kvsim.cli import main  # noqa: E402

main()
