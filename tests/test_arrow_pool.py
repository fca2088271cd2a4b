"""The ``kvsim`` command allocates Arrow's buffers from jemalloc on Linux
(``kvsim._arrow_jemalloc``: an event file's replay frees and allocates ~40 MB of decoded
columns per batch, which mimalloc, pyarrow's default, gives back to the kernel and faults in
again; docs/benchmarks.md, "16-token replay: Arrow's memory pool").  A program importing
kvsim keeps pyarrow's default, and so does a user who chose a pool."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("import sys\n"
         "if sys.argv[1] == 'command': sys.argv[0] = 'kvsim'  # as the console script\n"
         "import kvsim, pyarrow\n"
         "print(pyarrow.default_memory_pool().backend_name)\n")


def _backend(kind: str, **extra) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    return subprocess.run([sys.executable, "-c", PROBE, kind], capture_output=True,
                          text=True, check=True, env={**env, **extra}).stdout.strip()


def _has_jemalloc() -> bool:
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_jemalloc(),
                    reason="jemalloc: pyarrow's Linux wheels")
def test_the_command_allocates_arrow_buffers_from_jemalloc():
    default = _backend("library")
    assert default != "jemalloc"  # pyarrow's own default (mimalloc), kept by a library user
    assert _backend("command") == "jemalloc"
    assert _backend("command", ARROW_DEFAULT_MEMORY_POOL="system") == "system"  # the user's
