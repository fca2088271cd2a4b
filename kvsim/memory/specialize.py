"""Compile a template module against one policy's hooks, with numba's on-disk cache.

Numba cannot cache a function that receives another jitted function as an argument (the
argument's type names that very function object, so every process recompiles, ~10 s per
entry point).  It *can* cache a function that calls a jitted function through a module
global.  So a module whose functions call ``on_insert`` / ``on_hit`` / ``on_remove`` /
``victim`` (and ``on_hold`` / ``on_release`` / ``on_hit_held`` / ``on_miss``) as globals,
imported on lines ending in ``# HOOKS`` (exactly one) or ``# HOOKS-<WORD>``, is a
*template*: for another policy we write a copy whose hook lines import that policy's hooks
(or the defaults of :func:`kvsim.policy_api.hook_bindings`) instead, into
a cache folder, and import it.  The copy's name carries a digest of the template and of the
policy's source, so an edit to either makes a new module (and a new numba cache entry).

``ops_for(order)`` does this (always, even for the template's own order) for :mod:`kvsim.memory.pool_ops`; ``specialize`` is the same
for any template (the replay may use it for its own loop).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from kvsim.memory import fifo_order


def cache_dir() -> Path:
    """Where generated modules go: $KVSIM_CACHE_DIR/specialized, else
    ~/.cache/kvsim/specialized (a temp folder if that cannot be created)."""
    env = os.environ.get("KVSIM_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "kvsim"
    return base / "specialized"


_HOOKS_LINE = re.compile(r"^from [\w.]+ import ([\w ,]+?)  # (HOOKS(?:-[A-Z]+)?)$", re.MULTILINE)


def _hook_source(order: ModuleType, bound: str) -> tuple[str, str]:
    """(module, function) a template's hook name ``bound`` is imported from for
    ``order`` (defaults of :func:`kvsim.policy_api.hook_bindings`; a missing ``on_miss``
    or ``on_hit_held`` is :func:`kvsim.policy_api.noop_hook`)."""
    from kvsim import policy_api

    if bound == "on_miss":
        return ((order.__name__, "on_miss") if hasattr(order, "on_miss")
                else ("kvsim.policy_api", "noop_hook"))
    target = policy_api.hook_bindings(order).get(bound, "missing")
    if target == "missing":
        raise ValueError(f"template imports unknown hook {bound!r}")
    if target is None:
        return ("kvsim.policy_api", "noop_hook")
    return (order.__name__, target)


def _rewrite_hooks_line(match: re.Match, order: ModuleType) -> str:
    by_module: dict[str, list[str]] = {}
    for item in match.group(1).split(","):
        bound = item.split(" as ")[-1].strip()
        mod, func = _hook_source(order, bound)
        by_module.setdefault(mod, []).append(func if func == bound else f"{func} as {bound}")
    lines = [f"from {mod} import {', '.join(names)}" for mod, names in by_module.items()]
    lines[0] += f"  # {match.group(2)}"
    return "\n".join(lines)


_loaded: dict[str, ModuleType] = {}


def specialize(template: ModuleType, order: ModuleType,
               depends: tuple[ModuleType, ...] = ()) -> ModuleType:
    """A copy of ``template`` whose HOOKS line imports ``order``'s hooks.  ``order`` must
    be importable by its ``__name__`` (it is when loaded normally, or registered in
    ``sys.modules`` by a loader).  ``depends``: modules whose jitted functions the template
    calls; their source goes into the digest, because numba's cache of a caller does not
    notice an edit of a callee in another file (a stale cache would run old code)."""
    if sys.modules.get(order.__name__) is not order:
        raise ValueError(f"policy module {order.__name__!r} is not in sys.modules; "
                         "register it there before specialising")
    for hook in ("on_insert", "on_hit", "on_remove", "victim"):
        if not hasattr(order, hook):
            raise ValueError(f"policy module {order.__name__!r} lacks {hook}()")
    src = Path(inspect.getfile(template)).read_text(encoding="utf-8")
    policy_src = _source(order)
    new_src, n = _HOOKS_LINE.subn(lambda m: _rewrite_hooks_line(m, order), src)
    if n < 1 or src.count("  # HOOKS\n") != 1:
        raise ValueError(f"template {template.__name__} has no single '# HOOKS' import line")
    from kvsim import policy_api  # the helpers every built-in policy's hooks call

    dep_src = [_source(m) for m in (*depends, policy_api)]
    digest = hashlib.sha256("\0".join([src, policy_src] + dep_src).encode()).hexdigest()[:16]
    stem = re.sub(r"\W", "_", f"{template.__name__}__{order.__name__}")
    name = f"kvsim_specialized_{stem}_{digest}"
    if name in _loaded:
        return _loaded[name]
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # read-only home: fall back to the temp folder
        folder = Path(tempfile.gettempdir()) / f"kvsim-{os.getuid()}" / "specialized"
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != new_src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(new_src, encoding="utf-8")
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _loaded[name] = module
    return module


def _source(module: ModuleType) -> str:
    try:
        return inspect.getsource(module)
    except (OSError, TypeError):
        return module.__name__


def ops_for(order: ModuleType | None = None) -> ModuleType:
    """The pool operations (:mod:`kvsim.memory.pool_ops`) compiled for ``order``'s hooks
    (None: vLLM's FIFO-of-release order, :mod:`kvsim.memory.fifo_order`).  Always a
    generated copy named by a digest of pool_ops, fast and the policy, so the numba cache
    can never serve code compiled against an older ``fast.py``."""
    from kvsim.memory import fast, pool_ops

    return specialize(pool_ops, order if order is not None else fifo_order, depends=(fast,))
