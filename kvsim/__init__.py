"""kvsim: an offline, trace-driven simulator and policy lab for LLM KV-cache memory.

The data flow is: request trace -> canonical Request table -> MemoryIntent block events
(:mod:`kvsim.core.schema`) -> replay through tiered, paged, prefix-shared KV memory under a
placement policy -> metrics and a decision log.  Every CLI command is a thin shell over a
function in this package; see ``docs/architecture.md``.
"""

__version__ = "0.1.0"


def _numba_defaults() -> None:
    """kvsim's default for numba's LLVM optimisation level: ``NUMBA_OPT=1`` unless the user
    set ``NUMBA_OPT`` (numba's default is 3).  Measured (docs/benchmarks.md, "Cold compile"):
    the cold compile of the closed-loop core falls from 86.5 to 76.7 CPU-s (LLVM's share
    only), while the warm README job, the Mooncake 512 lru replay and single-tier
    ``simulate_cache`` run as fast (within 2-5 %, this box's noise) with identical outputs.
    Set in ``os.environ``, so it holds for every numba compile in this process (numba
    re-reads its environment at each compile).  Then numba's disk cache is pointed at a
    directory keyed on kvsim's compiled sources and these settings
    (:func:`kvsim.jit.cache_key.configure`, ``NUMBA_CACHE_DIR``), so no code compiled from
    other sources or at another level loads.  Both before any compiled module is imported.
    """
    import os

    from kvsim.jit.cache_key import configure

    os.environ.setdefault("NUMBA_OPT", "1")
    configure()  # reloads numba's config when numba was imported before kvsim


def _serve_checkout_subpackages() -> None:
    """Let ``kvsim.policies`` and ``kvsim.profiles`` resolve in a source checkout.

    An installed kvsim has them as real subpackages (pyproject maps ``policies/`` and
    ``profiles/`` there).  Python started in the repository root (``python -m kvsim``) imports
    the checkout's ``kvsim/`` instead, whose folder does not hold them: add the checkout root to
    this package's search path so the same names resolve to the folders beside ``kvsim/``.
    """
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "policies" / "__init__.py").is_file():
        if str(root) not in __path__:
            __path__.append(str(root))


def _starting_the_command() -> bool:
    """True while the ``kvsim`` command (the console script, or ``python -m kvsim``) is
    importing this package: the start of every run, before its own Ctrl-C handling
    (:mod:`kvsim.__main__`) is in place."""
    import sys
    from pathlib import Path

    argv = list(getattr(sys, "orig_argv", ()))
    as_module = "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["kvsim"]
    return as_module or (bool(sys.argv) and Path(sys.argv[0]).name == "kvsim")


def _single_threaded_blas() -> None:
    """The ``kvsim`` command's BLAS runs on one thread: ``OPENBLAS_NUM_THREADS=1`` unless
    the user set it, before numpy is imported (numpy's OpenBLAS reads it when it loads).
    kvsim's only BLAS calls are small least-squares fits (``kvsim.engine.timing.fitted``,
    ``kvsim.analysis.calibrate``), below OpenBLAS's own threading threshold; but OpenBLAS
    starts a worker thread per further core when it loads, and each spins before it sleeps:
    6.3 % of a warm 1-replica Mooncake run's CPU samples (``perf``, ``blas_thread_server``),
    ~0.1 CPU-s a run on 2 cores (docs/benchmarks.md, "Per-process floor: OpenBLAS's
    threads").  Only for the command: a program importing kvsim keeps its BLAS as it set it."""
    import os

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _arrow_jemalloc() -> None:
    """The ``kvsim`` command's Arrow memory pool is jemalloc on Linux
    (``ARROW_DEFAULT_MEMORY_POOL=jemalloc``, read when pyarrow loads) unless the user chose
    one.  pyarrow allocates from mimalloc by default (since Arrow 13), which gives freed pages
    back to the kernel soon after: an event file's replay decodes it a batch at a time (~40 MB
    of columns per 262,144 rows, kvsim.events.read_ahead), each batch freed once replayed,
    so every batch's pages were faulted in and zeroed by the kernel again.  jemalloc keeps
    freed pages for reuse for a while (its dirty-page decay).  The 16-token Mooncake replay,
    alternated runs: system CPU 0.34-0.66 s against 0.70-2.21 s, the same output
    (docs/benchmarks.md, "16-token replay: Arrow's memory pool").  Linux only: pyarrow's
    Linux wheels have jemalloc, and a build without it would print a warning.  Only for the
    command: a program importing kvsim keeps its pool."""
    import os
    import sys

    if sys.platform.startswith("linux"):
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")


try:
    if _starting_the_command():
        _single_threaded_blas()
        _arrow_jemalloc()
    _numba_defaults()
    _serve_checkout_subpackages()
except KeyboardInterrupt:
    # Ctrl-C while the command starts: one line, as anywhere later (issue 38); a program
    # that imports kvsim gets its KeyboardInterrupt as usual
    if not _starting_the_command():
        raise
    import os
    import sys

    sys.stderr.write("error: interrupted (Ctrl-C) while starting; nothing was written\n")
    sys.stderr.flush()
    os._exit(130)
