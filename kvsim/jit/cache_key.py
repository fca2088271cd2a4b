"""Where numba caches kvsim's compiled code: a directory keyed on kvsim's compiled sources.

numba keys a cached function on its own source file (numba 0.68: a hash of the file; older
releases: its modification time and size), not on the functions it calls: after an edit
of ``kvsim/memory/fast.py`` the cached ``kvsim.replay.kernel.core.run``, which has
``fast``'s code compiled into it, would still load and run the old code.  Its index key
also leaves out the code-generation settings (``NUMBA_OPT``, the vectorizers,
``NUMBA_BOUNDSCHECK``), so code compiled at one optimisation level would load under
another.

kvsim therefore points numba's cache at a directory named by :func:`key`, a hash of every
source file whose code or constants the compiled replay contains (:data:`SOURCES`) and of
those settings: ``$NUMBA_CACHE_DIR/kvsim-<key>``, or ``~/.cache/kvsim/numba/kvsim-<key>``
(``$XDG_CACHE_HOME`` honoured) when ``NUMBA_CACHE_DIR`` is not set.  Any edit of one of
those files, or another setting, is another directory: numba compiles afresh there and
never sees the old entries.  This uses ``NUMBA_CACHE_DIR`` only, numba's documented
cache-location setting (every numba release in kvsim's pinned range reads it); it is set
in ``os.environ`` by :func:`configure`, which ``kvsim/__init__.py`` runs before any of
kvsim's compiled modules is imported (numba picks a function's cache directory when the
function is decorated).  It holds for every numba function of the process, the user's
too (they are cached in the same keyed directory).

This module imports nothing of numba (kvsim's package import runs it).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

#: Modules whose source reaches compiled code (code or constants), in a fixed order:
#: the replay core and what it links, the single-tier loops, and the decorator that decides
#: the compile options.  A module that is missing (moved) hashes as ``?``.
SOURCES = ("kvsim.core.schema", "kvsim.core.codes", "kvsim.policy.api", "kvsim.policy.structs", "kvsim.memory.fast",
           "kvsim.memory.fifo_order", "kvsim.policy.state_access", "kvsim.policy.hooks",
           "kvsim.memory.pool_ref", "kvsim.memory.pool_ops", "kvsim.jit.prefetch",
           "kvsim.core.layout", "kvsim.engine.timing.step_time", "kvsim.ingest.hashing",
           "kvsim.replay.kernel.tiers", "kvsim.replay.kernel.bookkeeping",
           "kvsim.replay.kernel.links",
           "kvsim.replay.kernel.tier_ops", "kvsim.replay.kernel.spill",
           "kvsim.replay.kernel.offload",
           "kvsim.replay.kernel.placement", "kvsim.replay.kernel.core",
           "kvsim.replay.kernel.core_ref", "kvsim.replay.kernel.run_ref",
           "kvsim.replay.kernel.engine_ref",
           "kvsim.engine.scheduler_state",
           "kvsim.engine.scheduler_blocks", "kvsim.engine.scheduler",
           "kvsim.replay.kernel.closed_step", "kvsim.replay.kernel.closed_ffwd",
           "kvsim.engine.vllm_pool", "kvsim.engine.vllm_layout", "kvsim.engine.vllm_step",
           "kvsim.engine.vllm_spec",
           "kvsim.engine.vllm_rows", "kvsim.engine.vllm_value", "kvsim.engine.vllm_resets",
           "kvsim.cachesim.simulator",
           "kvsim.cachesim.fast_loops", "kvsim.cachesim.ghost_loops", "kvsim.jit.decorators",
           "kvsim.jit.struct_type",
           # every other module with compiled code (tests/safety/test_compile_cache.py
           # fails when one is missing): its own edits, and what it inlines
           "kvsim.workload.generator", "kvsim.modes.closed.closed_facts",
           "kvsim.events.seen_set", "kvsim.replay.prepass", "kvsim.replay.id_map",
           "kvsim.cachesim.curves", "kvsim.backends.kernels",
           "kvsim.results.log_blocks", "kvsim.results.log_pending",
           "kvsim.memory.throughput", "kvsim.backends.cuda", "kvsim.jit.cache_guard")
#: numba's code-generation settings that its cache index does not key on.
SETTINGS = ("NUMBA_OPT", "NUMBA_LOOP_VECTORIZE", "NUMBA_SLP_VECTORIZE", "NUMBA_BOUNDSCHECK")
_KEYED = re.compile(r"kvsim-[0-9a-f]{16}")
_PACKAGE = Path(__file__).resolve().parent.parent


def _source_path(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "kvsim":
        return None
    base = _PACKAGE.joinpath(*parts[1:])
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def key(sources: tuple[str, ...] = SOURCES) -> str:
    """sha256 (16 hex digits) of the text of every module of ``sources`` and of the
    ``SETTINGS`` in this process's environment."""
    h = hashlib.sha256()
    for name in sources:
        path = _source_path(name)
        h.update(name.encode())
        h.update(path.read_bytes() if path is not None else b"?")
    for name in SETTINGS:
        h.update(f"{name}={os.environ.get(name, '')};".encode())
    return h.hexdigest()[:16]


def _default_base() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvsim" / "numba"


def cache_dir(environ=os.environ) -> str:
    """The directory numba caches in for this process: ``kvsim-<key>`` under
    ``KVSIM_CACHE_DIR``, else the user's ``NUMBA_CACHE_DIR``, else kvsim's default.  A
    ``NUMBA_CACHE_DIR`` that already names a keyed directory (a worker process inherits
    its parent's) is replaced by this key's directory beside it."""
    base = environ.get("KVSIM_CACHE_DIR", "") or environ.get("NUMBA_CACHE_DIR", "")
    if base and _KEYED.fullmatch(Path(base).name):
        base = str(Path(base).parent)
    root = Path(base) if base else _default_base()
    return str(root / f"kvsim-{key()}")


def _writable(folder: str) -> bool:
    """True when ``folder`` can be created and a file written in it."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".kvsim-probe-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
        return True
    except OSError:
        return False


#: Free space a cache folder must have, else the private temporary cache is used: 128 MiB,
#: twice a full cache (62,976 KiB under ~/.cache/kvsim/numba after the test suite and
#: `kvsim warm`, measured with du, session 22).  numba saves an entry while it compiles the
#: function that calls it, so a full disk failed the run (exit 1, "disk full", no path).
MIN_FREE_BYTES = 128 * 2**20


def _free_bytes(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def fallback_dir() -> str:
    """A private temporary cache (a read-only install, an unwritable HOME, a damaged cache
    that cannot be cleaned): ``$TMPDIR/kvsim-numba-<uid>/kvsim-<key>``."""
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"kvsim-numba-{uid}", f"kvsim-{key()}")


def configure() -> None:
    """Point numba's disk cache at :func:`cache_dir` (``os.environ``; and numba's config,
    when numba was imported before kvsim).  The directory is checked first
    (:func:`kvsim.jit.cache_guard.guard`: damaged files discarded, one warning line);
    when it cannot be written, or cleaned, a private temporary cache is used
    (:func:`fallback_dir`) with one warning line, so a read-only install with no writable
    HOME still runs (``KVSIM_CACHE_DIR`` chooses the place; docs/jit.md)."""
    import sys

    from kvsim.jit.cache_guard import guard

    chosen = cache_dir()
    try:
        if not _writable(chosen):
            raise PermissionError(f"{chosen} is not writable")
        free = _free_bytes(chosen)
        if free < MIN_FREE_BYTES and _free_bytes(__import__("tempfile").gettempdir()) > free:
            raise OSError(f"{chosen} has {free / 2**20:.1f} MiB free, under the "
                          f"{MIN_FREE_BYTES >> 20} MiB a cache may need")
        guard(chosen)
    except OSError as exc:
        fallback = fallback_dir()
        if not os.environ.get("KVSIM_CACHE_FALLBACK"):  # once, not again in subprocesses
            sys.stderr.write(f"warning: numba cache: {exc}; using the private temporary "
                             f"cache {fallback} (set KVSIM_CACHE_DIR to a writable folder)\n")
        os.environ["KVSIM_CACHE_FALLBACK"] = fallback
        chosen = fallback
        with __import__("contextlib").suppress(OSError):
            os.makedirs(chosen, exist_ok=True)
            guard(chosen)
    os.environ["NUMBA_CACHE_DIR"] = chosen
    if "numba" in sys.modules:  # imported before kvsim: make its config see it now
        from numba.core import config

        config.reload_config()
