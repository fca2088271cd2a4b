"""Which replay core runs for a set of policies: a compiled, disk-cached specialisation,
or the interpreted twin of the same source.

Compiled: numba cannot cache a function that receives jitted hooks as arguments (every
process would recompile the loop, ~10 s), but it caches one that calls them as module
globals.  :mod:`kvsim.sim.core` is therefore a *template*: four import lines marked
``# HBM-OPS``, ``# DRAM-HOOKS``, ``# CXL-HOOKS``, ``# NVME-HOOKS`` bind the HBM pool
operations (:func:`kvsim.memory.specialize.ops_for` the HBM policy) and each lower tier's
policy hooks.  :func:`core_for` writes a copy with those lines rewritten into the kvsim
cache folder (name = digest of every source involved, so an edit makes a new module and a
new numba cache entry) and imports it.

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
_PREFIX = {"DRAM": "d", "CXL": "c", "NVME": "n"}


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
    from kvsim.memory import fast
    from kvsim.memory.specialize import cache_dir, ops_for
    from kvsim.sim import core, layout, tiers

    ops = ops_for(hbm_policy.module)
    src = Path(inspect.getfile(core)).read_text(encoding="utf-8")
    new = re.sub(r"^from kvsim\.memory import pool_ops as ops  # HBM-OPS$",
                 f"import {ops.__name__} as ops  # HBM-OPS", src, count=1, flags=re.M)
    for tier, pol in zip(_TIERS, lower_policies):
        p = _PREFIX[tier]
        line = (f"from {pol.module.__name__} import on_hit as {p}_h, on_insert as {p}_i, "
                f"on_remove as {p}_r, victim as {p}_v  # {tier}-HOOKS")
        new, n = re.subn(rf"^from .* # {tier}-HOOKS$", line, new, count=1, flags=re.M)
        if n != 1:
            raise RuntimeError(f"kvsim.sim.core lost its '# {tier}-HOOKS' line")
    parts = [new, _source(tiers), _source(layout), _source(fast), ops.__name__]
    parts += [_source(p.module) for p in lower_policies]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    name = f"kvsim_core_{digest}"
    if name in _LOADED:
        return _LOADED[name]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != new:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, path)
    module = _import_file(name, path)
    _LOADED[name] = module
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


def interpreted(hbm_policy, lower_policies) -> ModuleType:
    """The interpreted twin of :mod:`kvsim.sim.core` bound to these policies' hooks."""
    from kvsim.memory import pool_ops
    from kvsim.sim import core, tiers

    key = "_".join([hbm_policy.name] + [p.name for p in lower_policies])
    key = re.sub(r"\W", "_", key)
    cached = _LOADED.get("twin_" + key)
    if cached is not None:
        return cached
    ops = _twin(pool_ops, key)
    ops.on_insert = _py(hbm_policy.on_insert)
    ops.on_hit = _py(hbm_policy.on_hit)
    ops.on_remove = _py(hbm_policy.on_remove)
    ops.victim = _py(hbm_policy.victim)
    tw_tiers = _twin(tiers, key)
    tw = _twin(core, key)
    tw.ops = ops
    tw.tr = tw_tiers
    for tier, pol in zip(_TIERS, lower_policies):
        p = _PREFIX[tier]
        setattr(tw, f"{p}_i", _py(pol.on_insert))
        setattr(tw, f"{p}_h", _py(pol.on_hit))
        setattr(tw, f"{p}_r", _py(pol.on_remove))
        setattr(tw, f"{p}_v", _py(pol.victim))
    _LOADED["twin_" + key] = tw
    return tw
