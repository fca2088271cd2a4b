"""The ``njit`` kvsim's compiled modules use: numba's ``njit``, with kvsim's compile options
decided at decoration time, or (while kvsim builds the interpreted twin) no compile at all.

Options (passed to numba's decorator, nothing set on a dispatcher afterwards):

* ``no_cfunc_wrapper=True`` for every function that compiled code does not take as a
  first-class function value (:data:`FIRST_CLASS`): numba builds beside each compiled
  function a C-callable wrapper that only a first-class function value uses
  (:class:`kvsim.policy.hooks.CompiledHook`: the policies' hooks, and ``core.run`` as
  ``closed_step.advance`` calls it).  ``no_cfunc_wrapper`` is one of the target options
  numba's ``jit`` decorator accepts (``numba.core.cpu.CPUTargetOptions``).  A call from
  Python still works (it goes through numba's CPython wrapper, which is kept).

:func:`helper` is for a small function only compiled code calls, with constants at many of
its call sites (a row appended to a log with a code, ``-1`` for "none"): numba types a call
to a ``njit`` function at the literal type of each constant argument (``f(x, 0)`` as
``Literal[int](0)``) and compiles the callee once per distinct set of constants
(``scheduler._row`` 11 times, ``tiers.log_row`` 14 in the default test step).  ``helper``
is numba's ``register_jitable``: numba types a call to it as it types an ``@overload``,
with the arguments' non-literal types first (``prefer_literal=False``), so one compile
serves every call site; it is compiled into each caller.

The interpreted twin (:func:`kvsim.replay.variants.interpreted`) re-executes the replay's
modules from their source files inside :func:`interpreting`: while it is active this
``njit`` returns the function itself, so the twin's functions are plain Python.  That is
kvsim's own switch; numba is not touched.

The cache directory is keyed on this file's text too (:mod:`kvsim.jit.cache_key`), so a
change of these rules never loads code compiled under the old ones.
"""

from __future__ import annotations

import contextlib
import threading

from numba import njit as _numba_njit
from numba.extending import register_jitable as _register_jitable

#: The functions of kvsim's compiled modules that compiled code takes as first-class
#: function values, by module: they keep numba's C wrapper.  ``core.run``:
#: ``closed_step.advance`` calls it as a value (:class:`kvsim.replay.variants.RunValue`);
#: ``fifo_order``'s are hooks of the built-in policies.
FIRST_CLASS = {
    "kvsim.replay.kernel.core": ("run",),
    "kvsim.policy.api": ("noop_hook",),
    "kvsim.memory.fifo_order": ("on_insert", "on_hit", "on_hold", "on_release", "on_remove",
                                "victim"),
}

_STATE = threading.local()


@contextlib.contextmanager
def interpreting():
    """While active (in this thread), :func:`njit` leaves functions uncompiled."""
    depth = getattr(_STATE, "depth", 0)
    _STATE.depth = depth + 1
    try:
        yield
    finally:
        _STATE.depth = depth


def is_interpreting() -> bool:
    return getattr(_STATE, "depth", 0) > 0


def options_for(func, options: dict) -> dict:
    """numba's options for ``func``: ``options`` plus kvsim's decoration-time rules."""
    out = dict(options)
    if func.__name__ not in FIRST_CLASS.get(func.__module__, ()):
        out.setdefault("no_cfunc_wrapper", True)
    return out


def njit(*args, **options):
    """``numba.njit`` as ``@njit``, ``@njit(**options)``; see the module docstring."""
    if len(args) == 1 and callable(args[0]) and not options:
        return njit()(args[0])
    if args:
        raise TypeError("kvsim.jit.decorators.njit takes no signatures; use numba.njit")

    def decorate(func):
        if is_interpreting():
            return func
        return _numba_njit(**options_for(func, options))(func)

    return decorate


def helper(**options):
    """``@helper(**options)``: ``func`` typed once per non-literal signature however its
    compiled callers pass constants (the module docstring), compiled into each caller with
    ``options`` (numba's ``jit`` options, e.g. ``_nrt=False``; there is nothing of its own
    to cache).  Called from Python it runs as Python.  ``func.jit_options`` holds the
    options, as a dispatcher's ``targetoptions`` does."""

    def decorate(func):
        if is_interpreting():
            return func
        opts = options_for(func, options)
        _register_jitable(**opts)(func)
        func.jit_options = opts
        return func

    return decorate


__all__ = ["FIRST_CLASS", "helper", "interpreting", "is_interpreting", "njit"]
