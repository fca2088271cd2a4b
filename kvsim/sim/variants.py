"""Which replay core runs: the one compiled core, or its interpreted twin.

Compiled: :mod:`kvsim.sim.core` (with :mod:`kvsim.memory.pool_ops`,
:mod:`kvsim.sim.tier_ops`, :mod:`kvsim.sim.spill` and the closed loop's
:mod:`kvsim.sim.closed_step`) is compiled ONCE for every policy and cached on disk by
numba: a policy reaches it as a value, ``(state, hooks)`` (:mod:`kvsim.memory.hooks`),
whose hooks are first-class functions compiled per policy for one fixed signature.  So the
first run compiles the core (once per kvsim version and machine), each new policy only
its own hooks, and later processes load everything from numba's cache.

Interpreted (a plain-Python policy, a policy whose state is not a
:class:`kvsim.policy_api.PolicyState`, or ``engine="interpreted"``): the same modules
re-executed with ``numba.njit`` replaced by the identity decorator (:func:`interpreted`),
the hooks' plain-Python functions passed as the same tuple.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import numba

_LOADED: dict[str, ModuleType] = {}


def core_for(hbm_policy, lower_policies, engine: str = "compiled") -> ModuleType:
    """The core module to run: :mod:`kvsim.sim.core` itself when ``engine`` is
    ``compiled`` and every policy has compiled hooks, else the interpreted twin."""
    if engine == "interpreted" or not (hbm_policy.compiled and
                                       all(p.compiled for p in lower_policies)):
        return interpreted()
    from kvsim.sim import core

    return core


def is_compiled(core_module: ModuleType) -> bool:
    """True for the compiled core (hooks must then be :class:`kvsim.memory.hooks.CompiledHook`)."""
    return not getattr(core_module, "INTERPRETED", False)


def policy_value(policy, state, core_module: ModuleType) -> tuple:
    """``(state, hooks)``: ``policy`` as the value the core takes (see
    :mod:`kvsim.memory.hooks`)."""
    from kvsim.memory import hooks

    return hooks.policy_value(policy, state, is_compiled(core_module))


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


def compiled_is_cached(hbm_policy, lower_policies) -> bool:
    """True when the compiled engine would start without compiling: the core's entry point
    and every hook of these policies are in numba's disk cache (see
    :func:`dispatcher_is_cached`).  False at once when a policy is plain Python."""
    from kvsim.memory.hooks import hooks_are_cached
    from kvsim.numba_cache import seal_all
    from kvsim.sim import core

    if not (hbm_policy.compiled and all(p.compiled for p in lower_policies)):
        return False
    seal_all()
    return dispatcher_is_cached(core.run) and all(
        hooks_are_cached(p) for p in [hbm_policy, *lower_policies])


def _import_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _identity_njit(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda func: func


def _twin(module: ModuleType, suffix: str) -> ModuleType:
    """``module`` re-executed with njit = identity (a fresh, independent module)."""
    name = f"{module.__name__}__interpreted_{suffix}"
    saved = numba.njit
    numba.njit = _identity_njit
    try:
        return _import_file(name, Path(inspect.getfile(module)))
    finally:
        numba.njit = saved


def _py(func):
    return getattr(func, "py_func", func)


def _rebind(module: ModuleType, twins: dict[str, ModuleType]) -> None:
    """Point every compiled function ``module`` imported from a twinned module at its
    interpreted twin (so no compiled code receives Python objects)."""
    for attr, value in list(vars(module).items()):
        py = getattr(value, "py_func", None)
        if py is not None and py.__module__ in twins:
            setattr(module, attr, getattr(twins[py.__module__], py.__name__))


def interpreted() -> ModuleType:
    """The interpreted twin of :mod:`kvsim.sim.core` (one per process, every policy): the
    memory pool, tier and core modules all run as Python (plain dicts for hash maps); a
    policy's hooks arrive as values (:func:`policy_value`), and only a policy's own
    compiled helpers stay compiled."""
    from kvsim.memory import fast, pool_ops
    from kvsim.sim import bookkeeping, core, spill, tier_ops, tiers

    cached = _LOADED.get("twin")
    if cached is not None:
        return cached
    key = "py"
    tw_fast = _twin(fast, key)
    tw_tiers = _twin(tiers, key)
    tw_book = _twin(bookkeeping, key)
    twins = {fast.__name__: tw_fast, tiers.__name__: tw_tiers, bookkeeping.__name__: tw_book}
    _rebind(tw_fast, twins)
    _rebind(tw_tiers, twins)
    _rebind(tw_book, twins)
    tw_book.tr = tw_tiers
    ops = _twin(pool_ops, key)
    _rebind(ops, twins)
    t_ops = _twin(tier_ops, key)
    _rebind(t_ops, twins)
    tw_spill = _twin(spill, key)
    _rebind(tw_spill, twins)
    tw_spill.tr = tw_tiers
    tw_spill.tier_ops = t_ops
    tw = _twin(core, key)
    _rebind(tw, twins)
    tw.mem = tw_fast
    tw.tr = tw_tiers
    tw.ops = ops
    tw.lower = tw_spill
    tw.tier_ops = t_ops
    tw.INTERPRETED = True
    _LOADED["twin"] = tw
    return tw


_RUN_VALUES: dict[tuple, object] = {}


def core_run_value(core_module: ModuleType, run_args: tuple):
    """``core_module.run`` as the closed loop's step driver takes it (its last argument):
    the interpreted twin's Python function, or, compiled, a first-class function value
    (:class:`kvsim.memory.hooks.CompiledHook` of ``run``'s one signature, the types of
    ``run_args``), so :func:`kvsim.sim.closed_step.advance` calls ``run`` indirectly (once
    per engine step) and its compile does not link and re-optimise all of ``run``;
    memoised per signature."""
    if not is_compiled(core_module):
        return core_module.run
    from numba import typeof

    from kvsim.memory.hooks import CompiledHook

    arg_types = tuple(typeof(a) for a in run_args)
    if arg_types not in _RUN_VALUES:
        core_module.run.compile(arg_types)  # or loads it from numba's disk cache
        sig = core_module.run.overloads[arg_types].signature
        _RUN_VALUES[arg_types] = CompiledHook(core_module.run, sig)
    return _RUN_VALUES[arg_types]


def closed_for(core_module: ModuleType) -> ModuleType:
    """The closed loop's step driver for ``core_module`` (what :func:`core_for` returned):
    :mod:`kvsim.sim.closed_step` itself for the compiled core (compiled once, cached), or
    its interpreted twin calling the interpreted core."""
    from kvsim.sim import closed_step

    if not is_compiled(core_module):
        key = "closed_twin"
        if key not in _LOADED:
            tw = _twin(closed_step, "py")
            tw.core_mod = core_module
            _LOADED[key] = tw
        return _LOADED[key]
    return closed_step
