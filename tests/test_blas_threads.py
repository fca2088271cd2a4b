"""The ``kvsim`` command runs numpy's BLAS on one thread (``kvsim._single_threaded_blas``):
OpenBLAS starts a worker thread per further core when numpy loads, and each spins before it
sleeps, ~0.1 CPU-s of every run on 2 cores (docs/benchmarks.md, "Per-process floor:
OpenBLAS's threads").  A program importing kvsim keeps its BLAS as it set it, and so does a
user who set ``OPENBLAS_NUM_THREADS``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import sys\n"
         "if sys.argv[1] == 'command': sys.argv[0] = 'kvsim'  # as the console script\n"
         "import kvsim, numpy, os\n"
         "print(os.environ.get('OPENBLAS_NUM_THREADS', '-'), len(os.listdir('/proc/self/task')))\n")


def _probe(kind: str, **extra) -> list[str]:
    env = {k: v for k, v in os.environ.items()  # OpenBLAS reads all three
           if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, "-c", PROBE, kind], capture_output=True,
                          text=True, check=True, env={**env, **extra}).stdout.split()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_command_starts_no_blas_worker_threads():
    assert _probe("command") == ["1", "1"]  # the main thread alone
    assert _probe("command", OPENBLAS_NUM_THREADS="3")[0] == "3"  # the user's setting
    env, threads = _probe("library")
    assert env == "-"  # a program importing kvsim: untouched
    if (os.cpu_count() or 1) > 1:
        assert int(threads) > 1  # OpenBLAS's workers, as numpy starts them
