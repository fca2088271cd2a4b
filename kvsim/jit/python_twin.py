"""Plain-Python twins of numba functions: what the interpreted engine runs a policy's hooks as.

A hook's ``py_func`` is plain Python, but the helpers it calls by global name (its own
module's ``@njit`` functions, :mod:`kvsim.policy.api`'s list and heap helpers) are numba
dispatchers, and a call from Python compiles each of them for the types Python passes (a
NamedPolicyState tuple, a BlockView): ~20 CPU-s for deadline's helpers in a small run whose
engine was picked to compile nothing, 68 CPU-s of the default test step from empty caches
(docs/benchmarks.md, "The default test step").

:func:`python_twin` returns ``func``'s code over a copy of its module's globals in which
every dispatcher the code reads by name is replaced by that dispatcher's own twin
(recursively, one copy per module, shared by its twins): a twin runs no compiled code.  The
copy is taken once: a module that rebinds one of its globals later is not seen by its twins
(kvsim's policies never do).  A dispatcher reached another way (an attribute of a module, a
closure cell) stays compiled: slower to start, same result.
"""

from __future__ import annotations

import types

from numba.core.dispatcher import Dispatcher


def python_twin(func):
    """``func`` (a numba dispatcher or a plain function) as plain Python calling no compiled
    code through its globals; its ``py_func`` (or ``func`` itself) when it reads no
    dispatcher."""
    return _twin(func, {}, {})


def _names(code: types.CodeType) -> set[str]:
    """Every name ``code`` and the code nested in it (comprehensions, inner functions) load
    by name: globals among them."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _twin(func, memo: dict, module_globals: dict):
    py = func.py_func if isinstance(func, Dispatcher) else func
    if not isinstance(py, types.FunctionType):
        return func
    if id(py) in memo:
        return memo[id(py)]
    reads = [n for n in _names(py.__code__)
             if isinstance(py.__globals__.get(n), Dispatcher)]
    if not reads:
        memo[id(py)] = py
        return py
    g = module_globals.get(id(py.__globals__))
    if g is None:
        g = module_globals[id(py.__globals__)] = dict(py.__globals__)
    twin = types.FunctionType(py.__code__, g, py.__name__, py.__defaults__, py.__closure__)
    twin.__kwdefaults__ = py.__kwdefaults__
    twin.__qualname__ = py.__qualname__
    twin.__doc__ = py.__doc__
    twin.__wrapped__ = func
    memo[id(py)] = twin
    for name in reads:
        value = py.__globals__[name]
        g[name] = _twin(value, memo, module_globals)
    return twin
