"""numba's disk cache of kvsim's compiled code, kept honest by public means only.

* Where: numba's cache directory is keyed on the text of every source file whose code
  reaches compiled code and on the code-generation settings (:mod:`kvsim.jit.cache_key`,
  set up by ``kvsim/__init__.py`` through ``NUMBA_CACHE_DIR``): an edit or another
  ``NUMBA_OPT`` is another directory, so stale code never loads.
* What: the compile options are decided at decoration time (:mod:`kvsim.jit.decorators`:
  no C wrapper where nothing takes a function as a value).

Nothing here writes into numba (tests/test_no_numba_patches.py).  Until #31 this module
patched numba's code generation (linked-only functions), its dispatchers' typing of calls
(one signature per callee) and its cache stamps; docs/jit.md says what removing that cost.

:func:`seal` and :func:`seal_all` are kept for their callers: they only make sure the
compiled modules are imported (decorated) and that numba caches where kvsim says.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import os
import threading
import time
from types import ModuleType

from kvsim.jit.cache_key import SOURCES, cache_dir, key
from kvsim.jit.decorators import FIRST_CLASS
from kvsim.jit.notice import LISTENERS as _NOTICE
from kvsim.jit.notice import on_cold_compile

#: The single-tier loops' sources (their modules import it; the cache key covers them).
SINGLE_TIER = ("kvsim.jit.prefetch", "kvsim.cachesim.fast_loops", "kvsim.cachesim.ghost_loops")
#: kvsim's compiled modules of the replay, in an order they can be imported in.
COMPILED = ("kvsim.policy.api", "kvsim.policy.structs", "kvsim.memory.fast",
            "kvsim.memory.fifo_order", "kvsim.policy.hooks", "kvsim.memory.pool_ref",
            "kvsim.memory.pool_ops", "kvsim.replay.kernel.tiers",
            "kvsim.replay.kernel.bookkeeping", "kvsim.replay.kernel.links",
            "kvsim.replay.kernel.tier_ops", "kvsim.replay.kernel.offload",
            "kvsim.replay.kernel.spill", "kvsim.replay.kernel.placement",
            "kvsim.replay.kernel.core", "kvsim.replay.kernel.core_ref",
            "kvsim.replay.kernel.run_ref", "kvsim.engine.timing.step_time",
            "kvsim.ingest.hashing", "kvsim.engine.scheduler",
            "kvsim.engine.scheduler_blocks", "kvsim.replay.kernel.closed_step", "kvsim.replay.kernel.closed_ffwd",
            "kvsim.replay.kernel.engine_ref",
            "kvsim.engine.vllm_pool", "kvsim.engine.vllm_step", "kvsim.engine.vllm_spec",
            "kvsim.engine.vllm_rows")
#: (The single-tier simulator, ``kvsim.cachesim.simulator``, is not one of them: its users
#: import it; :func:`seal_all` importing it cost every replay ~7 ms of imports and numba
#: decorations of loops it never runs.)


def check_cache_dir() -> None:
    """Raise when numba would not cache in kvsim's keyed directory (the environment was
    changed after kvsim was imported: kvsim's code could load stale)."""
    from numba.core import config

    want = cache_dir({"NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")})
    if os.path.normpath(config.CACHE_DIR or "") != os.path.normpath(want):
        raise RuntimeError(
            f"numba caches in {config.CACHE_DIR!r}, not kvsim's keyed directory {want!r}: "
            "set NUMBA_CACHE_DIR / NUMBA_OPT before importing kvsim (docs/jit.md)")


def seal(module: ModuleType, *args, **kws) -> None:  # noqa: ARG001 - kept for callers
    """No-op kept for its callers (numba is no longer patched; see the module docstring)."""


_SEALED = False


def seal_all() -> None:
    """Import every module of ``COMPILED`` and check the cache directory (once)."""
    global _SEALED
    if _SEALED:
        return
    check_cache_dir()
    for name in COMPILED:
        importlib.import_module(name)
    _SEALED = True


def dispatcher_is_cached(dispatcher) -> bool:
    """True when numba's on-disk cache holds code of ``dispatcher`` (an ``njit(cache=True)``
    function) that this process can load instead of compiling: its index file
    (``<module>.<function>-<line>.py3XX.nbi``, in the ``__pycache__`` folder beside the
    module or under ``$NUMBA_CACHE_DIR``) exists, was written by this numba version for the
    module file's current stamp (modification time and size), and has an entry for this
    machine (numba's codegen "magic tuple": CPU name and features) and this function's
    bytecode.  Reads one small pickle; compiles nothing.  (Uses numba's cache object, the
    same code numba runs to decide whether to load; any error reads as "not cached".)"""
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None:  # NullCache: cache=False
        return False
    try:
        want = cache._index_key(None, dispatcher.targetctx.codegen())[1:]
        return any(tuple(key[1:]) == want for key in cache_file._load_index())
    except Exception:  # noqa: BLE001 - an unreadable index means "compile"
        return False


def cached_signatures(dispatcher) -> list[tuple]:
    """The argument types of each entry of ``dispatcher``'s disk-cache index that this
    process could load (:func:`dispatcher_is_cached`'s test, entry by entry); ``[]`` when
    none or unreadable.  For a function compiled once per kind of argument
    (``closed_step.advance``: once per scheduler), which kinds are cached."""
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None:
        return []
    try:
        want = cache._index_key(None, dispatcher.targetctx.codegen())[1:]
        return [tuple(key[0]) for key in cache_file._load_index() if tuple(key[1:]) == want]
    except Exception:  # noqa: BLE001 - an unreadable index means "compile"
        return []


#: The longest a process waits for another process's compile of the same cache entry
#: (:func:`compile_once`) before it compiles the entry itself: a process that holds the
#: lock but does not run (stopped in a debugger, suspended with Ctrl-Z) must not block
#: others for ever.  The longest compile of one entry, ``closed_step.advance`` with what
#: it links, is ~60 CPU-s on the 2-core reference VM (docs/benchmarks.md, "Cold compile");
#: the wait allows three times that.
COMPILE_LOCK_WAIT_S = 180.0
_HELD = threading.local()


def _entry_lock_path(dispatcher, args: tuple) -> str | None:
    """The lock file of one cache entry: ``<numba cache dir>/.locks/<hash>.lock``, the hash
    of the function's module, name, first line and argument types; None when numba caches
    nowhere (no cache directory)."""
    from numba.core import config

    folder = config.CACHE_DIR or os.environ.get("NUMBA_CACHE_DIR", "")
    if not folder:
        return None
    f = dispatcher.py_func
    name = (f"{f.__module__}.{f.__qualname__}:{f.__code__.co_firstlineno}:"
            f"{f.__code__.co_filename}:{args}")
    return os.path.join(folder, ".locks", hashlib.sha256(name.encode()).hexdigest()[:32] + ".lock")


@contextlib.contextmanager
def entry_lock(dispatcher, args: tuple, wait_s: float | None = None):
    """Hold the cross-process lock of ``dispatcher``'s cache entry for ``args`` (argument
    types) while the body runs: an exclusive ``fcntl.flock`` on its lock file, which the
    kernel releases when the holder's file is closed or the holder dies (a killed process
    leaves no stale lock).  Waits at most ``wait_s`` (default :data:`COMPILE_LOCK_WAIT_S`),
    then runs the body without the lock.  A no-op where there is no ``fcntl`` (Windows),
    no cache directory or no writable lock file: the lock only saves work, the result
    never depends on it."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    path = _entry_lock_path(dispatcher, args) if fcntl is not None else None
    fd = None
    if path is not None:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fd is not None:
            deadline = time.monotonic() + (COMPILE_LOCK_WAIT_S if wait_s is None else wait_s)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        compile_log(f"waited past {path}: compiling without the lock")
                        break
                    time.sleep(0.05)
                except OSError:  # a file system without flock
                    break
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def compile_once(dispatcher, sig) -> None:
    """``dispatcher.compile(sig)`` (numba's public compile: it loads the entry from the disk
    cache when there, else compiles and saves it), with at most one process compiling
    one cache entry at a time: two processes that miss the same entry at the same moment
    (``compare --jobs 2`` workers, pytest-xdist workers) would both compile it; with
    :func:`entry_lock` around it the second waits, then loads what the first saved.  No
    lock when this process already has the entry, when the function is not cached on disk
    (``cache=False``), or inside another :func:`compile_once` of this thread (one lock at
    a time per process: no lock-order deadlock between processes)."""
    from numba.core import sigutils

    args, _ = sigutils.normalize_signature(sig)
    args = tuple(args)
    if (args in dispatcher.overloads or getattr(getattr(dispatcher, "_cache", None),
                                                "_cache_file", None) is None
            or getattr(_HELD, "depth", 0)):
        _compile_unsaved(dispatcher, sig, args)
        return
    _HELD.depth = 1
    try:
        with entry_lock(dispatcher, args):
            _compile_unsaved(dispatcher, sig, args)
    finally:
        _HELD.depth = 0


#: Why a disk refuses a write: full, quota, ``ulimit -f`` (kvsim.core.fsutil's list).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _compile_unsaved(dispatcher, sig, args: tuple) -> None:
    """``dispatcher.compile(sig)``; when the compile succeeded but numba could not save it
    to a full disk (numba adds the overload, then saves it), one warning line and the run
    goes on with the code in memory (main: exit 1, "disk full", naming no path)."""
    try:
        dispatcher.compile(sig)
    except OSError as exc:
        if exc.errno not in _NO_ROOM or args not in dispatcher.overloads:
            raise
        if not getattr(_compile_unsaved, "warned", False):
            _compile_unsaved.warned = True
            import sys

            sys.stderr.write(f"warning: numba cache: cannot save compiled code in "
                             f"{os.environ.get('NUMBA_CACHE_DIR') or cache_dir()} "
                             f"({exc.strerror}); it is kept for this run only (free space "
                             "there, or set KVSIM_CACHE_DIR to another folder)\n")


def compile_for(dispatcher, args: tuple) -> tuple | None:
    """Before a compiled function's first call from Python with ``args``: compile (or load)
    it for their types through :func:`compile_once`, so that two processes (pytest-xdist
    workers, ``compare --jobs``) do not both compile it; the call then finds the entry.
    Returns the types (numba's dispatcher's, ``typeof_pyval``: the key of
    ``dispatcher.overloads``); None, doing nothing, for a plain Python function (the
    interpreted twin)."""
    if getattr(dispatcher, "overloads", None) is None:
        return None
    types = tuple(dispatcher.typeof_pyval(a) for a in args)
    if types not in dispatcher.overloads:
        compile_once(dispatcher, types)
    return types


def compiled_call(dispatcher, *args):
    """``dispatcher(*args)``, compiled or loaded first through :func:`compile_for`: for a
    compiled function called from Python once or a few times per run (its typing of the
    arguments is paid at each call)."""
    compile_for(dispatcher, args)
    return dispatcher(*args)


def cold(dispatcher) -> bool:
    """True when ``dispatcher`` is neither compiled in this process nor in numba's disk
    cache: a call from Python would compile it."""
    seal_all()  # the cache folder checked, every compiled module imported (once)
    return not (dispatcher.overloads or dispatcher_is_cached(dispatcher))


_PYTHON = threading.local()  # python_while_cold's switch, per thread


@contextlib.contextmanager
def python_while_cold(on: bool = True):
    """While active (in this thread), :func:`setup_func` called without ``python`` takes
    ``on``: a replay on the interpreted engine (:func:`kvsim.replay.driver.execute`) runs the
    passes it calls from Python as their twins while cold, however deep the call."""
    before = getattr(_PYTHON, "on", False)
    _PYTHON.on = on
    try:
        yield
    finally:
        _PYTHON.on = before


def setup_func(dispatcher, python: bool | None = None):
    """What a set-up pass or a router calls from Python a few times a run or once an arrival
    (the closed loop's block hashes and facts, the routers' prefix lookups): for the
    interpreted engine (``python``) while ``dispatcher`` is cold (:func:`cold`; decided once
    a process), its plain-Python twin (:func:`kvsim.jit.python_twin.python_twin`, integer
    overflow wrapping as compiled), so that a small first run compiles nothing for it; else
    ``dispatcher``.  The same results either way.  ``python`` None: as
    :func:`python_while_cold` says (off outside it)."""
    if python is None:
        python = getattr(_PYTHON, "on", False)
    if not python:
        return dispatcher
    f = _SETUP.get(dispatcher)
    if f is None:
        f = _SETUP[dispatcher] = _quiet_twin(dispatcher) if cold(dispatcher) else dispatcher
    return f


#: :func:`setup_func`'s choice per dispatcher, for the interpreted engine
_SETUP: dict = {}


def _quiet_twin(dispatcher):
    import numpy as np

    from kvsim.jit.python_twin import python_twin

    twin = python_twin(dispatcher)

    def call(*args):
        with np.errstate(over="ignore"):  # hashes wrap, as compiled
            return twin(*args)

    return call


def setup_call(dispatcher, *args, python: bool = False):
    """``dispatcher(*args)`` as :func:`setup_func` picks it (compiled: through
    :func:`compiled_call`, one process compiling at a time)."""
    f = setup_func(dispatcher, python)
    return compiled_call(dispatcher, *args) if f is dispatcher else f(*args)


def compile_log(msg: str) -> None:
    """One line on stderr when ``$KVSIM_COMPILE_LOG`` is set: the split's timeline (when
    each worker finished, how long this process waited for one), seconds since the
    process started; for bench/ and profiling, silent otherwise."""
    if os.environ.get("KVSIM_COMPILE_LOG"):
        import sys

        sys.stderr.write(f"[kvsim compile {time.monotonic() - _T0:7.1f} s, pid {os.getpid()}] "
                         f"{msg}\n")


_T0 = time.monotonic()

#: Wall seconds of a cold compile of the replay core on the 2-core reference VM: the
#: README job's cold run, from empty caches in a fresh install, was 62.5 s of which 5.2 s is
#: the replay itself (docs/benchmarks.md, "The README main job", 2026-11-29, load 0.7), so
#: the compile was ~57 s; since one ``advance`` is compiled per scheduler (session 16) the
#: same cold run takes 0.75x the CPU and 0.64x the wall of the old code measured side by side
#: at load ~16 (docs/benchmarks.md, "Cold compile: one scheduler per compile"): ~43 s; the
#: notice rounds it and says it is paid once.
COLD_COMPILE_S = 45

_ANNOUNCED = False


def cold_compile_message() -> str:
    return (f"compiling the replay core (first run, about {COLD_COMPILE_S} s on 2 cores; "
            "cached on disk for later runs)")


def announce_cold_compile() -> None:
    """Tell the listener (:func:`kvsim.jit.notice.on_cold_compile`) that a compile of the
    replay core is about to start; once per process (forked workers inherit that it was
    said)."""
    global _ANNOUNCED
    if _ANNOUNCED:
        return
    _ANNOUNCED = True
    for listener in _NOTICE:
        listener(cold_compile_message())


__all__ = ["COLD_COMPILE_S", "COMPILED", "FIRST_CLASS", "SINGLE_TIER", "SOURCES",
           "announce_cold_compile", "cached_signatures", "check_cache_dir", "cold_compile_message",
           "compile_for", "compile_once", "compiled_call", "entry_lock", "key",
           "on_cold_compile", "seal", "seal_all"]
