"""Worker processes that never outlive the command that started them.

``compare --jobs N`` and ``sweep --jobs N`` run cells in a forked process pool
(:func:`process_pool`).  Each worker, as it starts:

* asks Linux to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``
  through ctypes), then checks that the parent is still the one that forked it (the
  parent may have died before the prctl call);
* on other systems (no prctl), runs a daemon thread that polls ``os.getppid()`` every
  0.5 s and exits the worker when the parent changed.

So SIGKILL of the parent leaves no worker behind.  When the parent stops on an exception,
Ctrl-C or SIGTERM (the CLI turns SIGTERM into an exception), :func:`process_pool` kills
the workers before re-raising instead of waiting for their running cells, and removes the
temporary files their unfinished outputs left (``kvsim.core.fsutil.remove_temporaries_of``).  A worker ignores
SIGINT (Ctrl-C in a terminal reaches the whole process group): the parent decides.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

#: linux/prctl.h
PR_SET_PDEATHSIG = 1


def _set_parent_death_signal() -> bool:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)``; False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int, period_s: float = 0.5) -> None:
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(period_s)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


def worker_init(parent_pid: int) -> None:
    """Initializer of every pool worker (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the CLI's handler is the parent's
    if not _set_parent_death_signal():
        _watch_parent(parent_pid)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def kill_workers(executor) -> None:
    """SIGKILL every worker of a ``ProcessPoolExecutor`` and stop it without waiting."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.kill()
    with contextlib.suppress(Exception):
        executor.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(timeout=5)
    # their atomic outputs' temporary files (.NAME.PID.*.tmp) would stay: remove them
    from kvsim.core.fsutil import remove_temporaries_of

    remove_temporaries_of({proc.pid for proc in procs if proc.pid is not None})


@contextlib.contextmanager
def process_pool(jobs: int) -> Iterator:
    """A forked ``ProcessPoolExecutor`` of ``jobs`` workers tied to this process's life;
    on any exception (KeyboardInterrupt and SIGTERM included) the workers are killed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("fork")
    ex = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=worker_init,
                             initargs=(os.getpid(),))
    try:
        yield ex
    except BaseException:
        kill_workers(ex)
        raise
    ex.shutdown(wait=True)
