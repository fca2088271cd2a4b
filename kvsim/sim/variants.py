"""Which replay core runs for a set of policies: a compiled, disk-cached specialisation,
or the interpreted twin of the same source.

Compiled: numba cannot cache a function that receives jitted hooks as arguments (every
process would recompile the loop, ~10 s), but it caches one that calls them as module
globals.  :mod:`kvsim.sim.core` is therefore a *template*: import lines marked
``# HBM-OPS``, ``# DRAM-OPS``, ``# CXL-OPS``, ``# NVME-OPS`` bind the HBM pool operations
(:func:`kvsim.memory.specialize.ops_for` the HBM policy) and each lower tier's operations
(:mod:`kvsim.sim.tier_ops` specialised for its policy), and ``# SPILL`` binds
:mod:`kvsim.sim.spill`, itself a template of the three lower tiers only (so its compiled
code is shared by every HBM policy).  :func:`core_for` writes copies with those lines
rewritten into the kvsim cache folder (name = digest of every source involved, so an edit
makes a new module and a new numba cache entry) and imports them.

Compile cost (numba, per new HBM policy): every function of a
specialised module is compiled again, and each re-optimises the code of the functions it
calls, so the per-policy modules hold only what calls the HBM policy's hooks, and no call
site passes a constant (numba would compile one more specialisation per literal value).

Interpreted (a plain-Python policy anywhere): the same modules re-executed with
``numba.njit`` replaced by the identity decorator, the hooks bound as globals.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import numba

_LOADED: dict[str, ModuleType] = {}
_TIERS = ("DRAM", "CXL", "NVME")


def _source(module: ModuleType) -> str:
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return module.__name__


def _import_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def core_for(hbm_policy, lower_policies, engine: str = "compiled") -> ModuleType:
    """The core module to run for ``hbm_policy`` and the three lower-tier policies
    (:class:`kvsim.policy_registry.Policy` objects)."""
    if engine == "interpreted" or not (hbm_policy.compiled and
                                       all(p.compiled for p in lower_policies)):
        return interpreted(hbm_policy, lower_policies)
    # one variant per process and policy set, even if a source file changes meanwhile
    key = "compiled_" + "_".join(p.module.__name__ for p in [hbm_policy, *lower_policies])
    if key in _LOADED:
        return _LOADED[key]
    _LOADED[key] = _compiled(hbm_policy, lower_policies)
    return _LOADED[key]


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
    """True when the compiled core for these policies is in the disk cache, so the
    compiled engine would start without compiling (see :func:`dispatcher_is_cached`).
    Writes the specialised module files if needed (cheap: text) and imports them, which
    compiles nothing; False at once when a policy is plain Python."""
    if not (hbm_policy.compiled and all(p.compiled for p in lower_policies)):
        return False
    return dispatcher_is_cached(core_for(hbm_policy, lower_policies, "compiled").run)


def _write_module(name: str, text: str) -> ModuleType:
    """Write ``text`` as module ``name`` into the kvsim cache folder (unless it is there
    already) and import it."""
    from kvsim.memory.specialize import cache_dir

    if name in _LOADED:
        return _LOADED[name]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    module = _import_file(name, path)
    _LOADED[name] = module
    return module


def _bind_tiers(src: str, tier_mods: list[ModuleType], what: str) -> str:
    """``src`` with its three ``# DRAM-OPS`` / ``# CXL-OPS`` / ``# NVME-OPS`` lines
    importing ``tier_mods``."""
    n = 0
    for tier, tops in zip(_TIERS, tier_mods):
        line = f"import {tops.__name__} as {tier.lower()}_ops  # {tier}-OPS"
        src, k = re.subn(rf"^from kvsim\.sim import tier_ops as {tier.lower()}_ops  # "
                         rf"{tier}-OPS$", line, src, count=1, flags=re.M)
        n += k
    if n != 3:
        raise RuntimeError(f"{what} lost one of its '# ...-OPS' import lines")
    return src


def _compiled(hbm_policy, lower_policies) -> ModuleType:
    from kvsim import policy_api
    from kvsim.memory import fast
    from kvsim.memory.specialize import ops_for, specialize
    from kvsim.sim import bookkeeping, core, layout, spill, tier_ops, tiers

    tier_mods = [specialize(tier_ops, pol.module) for pol in lower_policies]
    tier_names = [m.__name__ for m in tier_mods]
    shared = [_source(tiers), _source(layout), _source(fast), _source(tier_ops),
              _source(bookkeeping), _source(policy_api)]
    # the lower-tier half (spill.py): depends on the lower policies only, so every HBM
    # policy with the same lower tiers shares its compiled code
    sp_src = _bind_tiers(Path(inspect.getfile(spill)).read_text(encoding="utf-8"), tier_mods,
                         "kvsim.sim.spill")
    digest = hashlib.sha256("\0".join([sp_src] + shared + tier_names).encode()).hexdigest()[:16]
    sp = _write_module(f"kvsim_spill_{digest}", sp_src)

    ops = ops_for(hbm_policy.module)
    src = Path(inspect.getfile(core)).read_text(encoding="utf-8")
    new, n = re.subn(r"^from kvsim\.memory import pool_ops as ops  # HBM-OPS$",
                     f"import {ops.__name__} as ops  # HBM-OPS", src, count=1, flags=re.M)
    new, k = re.subn(r"^from kvsim\.sim import spill as lower  # SPILL$",
                     f"import {sp.__name__} as lower  # SPILL", new, count=1, flags=re.M)
    if n + k != 2:
        raise RuntimeError("kvsim.sim.core lost its '# HBM-OPS' or '# SPILL' import line")
    new = _bind_tiers(new, tier_mods, "kvsim.sim.core")
    # every source whose compiled code the core calls (numba's cache of a caller does not
    # notice an edit of a callee in another file); the module names carry their digests
    parts = [new] + shared + [ops.__name__, sp.__name__] + tier_names
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return _write_module(f"kvsim_core_{digest}", new)


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


def interpreted(hbm_policy, lower_policies) -> ModuleType:
    """The interpreted twin of :mod:`kvsim.sim.core` bound to these policies' hooks.  The
    memory pool, tier and core modules all run as Python (plain dicts for hash maps);
    only a policy's own compiled helpers stay compiled."""
    from kvsim.memory import fast, pool_ops
    from kvsim.sim import bookkeeping, core, spill, tier_ops, tiers

    key = "_".join([hbm_policy.name] + [p.name for p in lower_policies])
    key = re.sub(r"\W", "_", key)
    cached = _LOADED.get("twin_" + key)
    if cached is not None:
        return cached
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
    ops.on_insert = _py(hbm_policy.on_insert)
    ops.on_hit = _py(hbm_policy.on_hit)
    ops.on_remove = _py(hbm_policy.on_remove)
    ops.victim = _py(hbm_policy.victim)
    ops.on_hold = _py(hbm_policy.on_hold)
    ops.on_release = _py(hbm_policy.on_release)
    ops.on_hit_held = _py(hbm_policy.on_hit_held)
    ops.on_miss = _py(hbm_policy.on_miss)
    tw_spill = _twin(spill, key)
    _rebind(tw_spill, twins)
    tw_spill.tr = tw_tiers
    tw = _twin(core, key)
    _rebind(tw, twins)
    tw.mem = tw_fast
    tw.tr = tw_tiers
    tw.ops = ops
    tw.lower = tw_spill
    for tier, pol in zip(_TIERS, lower_policies):
        t_ops = _twin(tier_ops, f"{key}_{tier}")
        _rebind(t_ops, twins)
        t_ops.on_insert = _py(pol.on_insert)
        t_ops.on_hit = _py(pol.on_hit)
        t_ops.on_remove = _py(pol.on_remove)
        t_ops.victim = _py(pol.victim)
        setattr(tw, f"{tier.lower()}_ops", t_ops)
        setattr(tw_spill, f"{tier.lower()}_ops", t_ops)
    tw.INTERPRETED = True
    _LOADED["twin_" + key] = tw
    return tw


def closed_for(core_module: ModuleType) -> ModuleType:
    """The closed loop's step driver (:mod:`kvsim.sim.closed_step`) bound to
    ``core_module`` (what :func:`core_for` returned): a compiled copy whose ``# CORE``
    import line names that core (cached by numba like the core), or the interpreted twin
    calling the interpreted core."""
    from kvsim.sim import closed_step, layout, sched_blocks, scheduler

    if getattr(core_module, "INTERPRETED", False):
        key = "closed_twin_" + core_module.__name__
        if key not in _LOADED:
            tw = _twin(closed_step, re.sub(r"\W", "_", core_module.__name__))
            tw.core_mod = core_module
            _LOADED[key] = tw
        return _LOADED[key]
    src = Path(inspect.getfile(closed_step)).read_text(encoding="utf-8")
    new, n = re.subn(r"^from kvsim\.sim import core as core_mod  # CORE$",
                     f"import {core_module.__name__} as core_mod  # CORE", src, count=1,
                     flags=re.M)
    if n != 1:
        raise RuntimeError("kvsim.sim.closed_step lost its '# CORE' import line")
    parts = [new, core_module.__name__, _source(scheduler), _source(sched_blocks),
             _source(layout)]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return _write_module(f"kvsim_closed_{digest}", new)
