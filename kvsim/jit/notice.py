"""Who hears that kvsim is about to compile its replay core from an empty cache: the
listener the command line sets (:func:`on_cold_compile`).  Kept apart from
:mod:`kvsim.jit.disk_cache`, which says it (``announce_cold_compile``), so that setting the
listener imports no numba (``kvsim --help`` and ``--version`` never import it)."""

from __future__ import annotations

#: the listener (a callable taking the message), set by the CLI; at most one
LISTENERS: list = []


def on_cold_compile(listener) -> None:
    """Call ``listener(message)`` (once per process) just before kvsim compiles its replay
    core from an empty cache (:func:`kvsim.jit.disk_cache.announce_cold_compile`); ``None``
    removes it.  The command line prints the message on stderr; the library prints nothing
    itself."""
    LISTENERS[:] = [] if listener is None else [listener]
