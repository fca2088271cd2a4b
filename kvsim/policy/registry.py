"""The one registry of placement policies.

Sources, in this order: the built-ins (every module of the ``kvsim.policies`` package,
i.e. ``policies/*.py``), third-party packages (entry points in the ``kvsim.policies``
group, each naming a policy module), and user files loaded with :func:`load_policy_file`
(``--policy-file``).  A name may be registered once: a second module with the same
``NAME`` raises :class:`~kvsim.core.errors.KvsimInputError` naming both sources.

A module is validated before it is registered (see :func:`policy_from_module`): the
required names exist with the right types, the four required hooks (and the optional
``on_miss``, ``on_hold``/``on_release``, the last two as a pair) take the documented
number of arguments, and ``REASONS`` is a non-empty tuple of strings.  Hooks may be ``numba.njit``
functions (``compiled=True``: the replay loops are compiled with them) or plain Python
functions (``compiled=False``: the loops run their interpreted twin, slower).

User files are wrapped by :func:`kvsim.policy.guard.guard_policy` when loaded: every hook
sees a read-only view and has its return value checked; a misbehaving hook stops the run
with one line naming the file and the hook.  (Their njit hooks run as Python under the
guard.)
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from kvsim.core.errors import INTERRUPTS, KvsimInputError
from kvsim.policy import api as policy_api
from kvsim.policy.guard import (
    HOOK_ARITY,
    OPTIONAL_HOOK_ARITY,
    guard_policy,
    policy_stdout_to_stderr,
)

ENTRY_POINT_GROUP = "kvsim.policies"


@dataclass(frozen=True)
class Policy:
    """A validated policy module.  ``explain`` is None when the module has none;
    ``on_miss`` is :func:`kvsim.policy.api.noop_hook` (or a Python no-op) when absent;
    ``on_hold``/``on_release``/``on_hit_held`` are the functions the core calls for those
    transitions (defaults: ``on_remove``/``on_insert``/no-op, see kvsim.policy.api)."""

    name: str
    description: str
    offline: bool
    reasons: tuple[str, ...]
    init: Callable[..., tuple]
    on_insert: Callable
    on_hit: Callable
    on_remove: Callable
    victim: Callable
    on_miss: Callable
    on_hold: Callable
    on_release: Callable
    on_hit_held: Callable
    keeps_held: bool
    explain: Callable[[dict, float], dict[str, float]] | None
    compiled: bool
    module: ModuleType
    source: str  # "builtin", "entry point <ep>", or the user file's path
    #: run by ``compare`` when no policy list is given (module attribute ``IN_DEFAULT_LIST``,
    #: default True; quota_lru says False: without quotas it is lru)
    in_default_list: bool = True


def _python_noop(state, view, b, now_us):
    return None


def _is_njit(func: Any) -> bool:
    return hasattr(func, "py_func") and hasattr(func, "signatures")


def _arity(func: Any) -> int | None:
    """Positional parameters without a default (None if the signature is unknown)."""
    target = func.py_func if _is_njit(func) else func
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty)


def policy_from_module(module: ModuleType, source: str) -> Policy:
    """Validate ``module`` against the contract in kvsim.policy.api and wrap it.

    Raises KvsimInputError naming ``source`` and the first thing missing or wrong.
    """
    where = source if source != "builtin" else f"module {module.__name__}"

    def bad(field: str, expected: str) -> KvsimInputError:
        return KvsimInputError(f"policy module: expected {expected}", where, None, field)

    name = getattr(module, "NAME", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise bad("NAME", "a str that is a valid identifier (the registry name)")
    description = getattr(module, "DESCRIPTION", None)
    if not isinstance(description, str) or not description:
        raise bad("DESCRIPTION", "a non-empty one-line str")
    offline = getattr(module, "OFFLINE", False)
    if not isinstance(offline, bool):
        raise bad("OFFLINE", "a bool")
    reasons = getattr(module, "REASONS", None)
    if (not isinstance(reasons, tuple) or not reasons
            or not all(isinstance(r, str) and r for r in reasons)):
        raise bad("REASONS", "a non-empty tuple of non-empty str (indexed by reason code)")
    init = getattr(module, "init", None)
    if not callable(init) or _arity(init) != 3:
        raise bad("init", "a function init(capacity_blocks, num_slots, params)")
    hooks: dict[str, Callable] = {}
    for hook, arity in {**HOOK_ARITY, **OPTIONAL_HOOK_ARITY}.items():
        func = getattr(module, hook, None)
        if func is None and hook in OPTIONAL_HOOK_ARITY:
            continue
        if not callable(func):
            raise bad(hook, f"a function with {arity} parameters")
        if _arity(func) != arity:
            raise bad(hook, f"{arity} positional parameters, got {_arity(func)}")
        hooks[hook] = func
    if ("on_hold" in hooks) != ("on_release" in hooks):
        raise bad("on_hold" if "on_hold" not in hooks else "on_release",
                  "on_hold and on_release both defined, or neither")
    in_default = getattr(module, "IN_DEFAULT_LIST", True)
    if not isinstance(in_default, bool):
        raise bad("IN_DEFAULT_LIST", "a bool")
    explain = getattr(module, "explain", None)
    if explain is not None and (not callable(explain) or _arity(explain) != 2):
        raise bad("explain", "a function explain(row, now_us) -> dict[str, float]")
    compiled_flags = {h: _is_njit(f) for h, f in hooks.items()}
    compiled = all(compiled_flags.values())
    if any(compiled_flags.values()) and not compiled:
        mixed = ", ".join(sorted(h for h, c in compiled_flags.items() if not c))
        raise bad(mixed, "all hooks numba-compiled or all plain Python, not a mix")
    noop = policy_api.noop_hook if compiled else _python_noop
    if compiled:
        # sealed now, before anything can call a hook: a call from Python then compiles
        # it for its declared signature (kvsim.jit.disk_cache), as the replay's value needs
        from kvsim.policy.hooks import seal_policy_module

        seal_policy_module(module)
    on_miss = hooks.get("on_miss", noop)
    held = "on_hold" in hooks
    return Policy(name=name, description=description, offline=offline, reasons=reasons,
                  init=init, on_insert=hooks["on_insert"], on_hit=hooks["on_hit"],
                  on_remove=hooks["on_remove"], victim=hooks["victim"], on_miss=on_miss,
                  on_hold=hooks["on_hold"] if held else hooks["on_remove"],
                  on_release=hooks["on_release"] if held else hooks["on_insert"],
                  on_hit_held=hooks["on_hit"] if held else noop, keeps_held=held,
                  explain=explain, compiled=compiled, module=module, source=source,
                  in_default_list=in_default)


_REGISTRY: dict[str, Policy] = {}
_LOADED = False


def _register(policy: Policy) -> Policy:
    old = _REGISTRY.get(policy.name)
    if old is not None:
        if old.module is policy.module:
            return old
        raise KvsimInputError(f"duplicate policy name '{policy.name}': already registered "
                              f"from {old.source}", policy.source, None, "NAME")
    _REGISTRY[policy.name] = policy
    return policy


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import kvsim.policies as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"kvsim.policies.{info.name}")
        _register(policy_from_module(module, "builtin"))
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        module = ep.load()
        if not isinstance(module, ModuleType):
            raise KvsimInputError("entry point must name a policy module", f"entry point "
                                  f"{ep.name} = {ep.value}", None, None)
        _register(policy_from_module(module, f"entry point {ep.name} = {ep.value}"))


def load_policy_file(path: str | Path) -> Policy:
    """Import a user policy file (``--policy-file``), validate and register it.

    Loading the same file twice returns the registered policy; another module with a
    registered name raises KvsimInputError.
    """
    _load_all()
    path = Path(path)
    if not path.is_file():
        raise KvsimInputError("expected an existing Python file defining a policy module",
                              path, None, None)
    resolved = str(path.resolve())
    for policy in _REGISTRY.values():
        if policy.source == resolved:
            return policy
    mod_name = "kvsim_user_policy_" + hashlib.sha1(resolved.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise KvsimInputError("expected a .py file", path, None, None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with policy_stdout_to_stderr():  # a policy's print() never reaches --json stdout
            spec.loader.exec_module(module)
    except INTERRUPTS:
        sys.modules.pop(mod_name, None)
        raise
    except BaseException as exc:  # a user's file (sys.exit too): one line, exit 2
        sys.modules.pop(mod_name, None)
        raise KvsimInputError(f"could not import policy file: {type(exc).__name__}: {exc}",
                              path, None, None) from None

    # user code runs behind the guard (read-only view, checked returns; kvsim.policy.guard)
    return _register(guard_policy(policy_from_module(module, resolved)))


#: (the ``entry_points`` function asked, whether it listed no policy): read once
_NO_ENTRY_POINTS: tuple = (None, False)


def _load_builtin(name: str) -> None:
    """Register the built-in policy ``name`` alone (its module ``kvsim.policies.<name>``)
    when no policy entry point is installed, so that a run imports only the policies it
    replays, not all thirteen (each module a set of numba dispatchers: about 0.03 CPU-s
    per process; docs/benchmarks.md, "Per-process fixed costs").  Anything else
    (an entry point installed, no such module, a module of another name) is left to
    :func:`_load_all`, which registers every policy and finds duplicate names."""
    global _NO_ENTRY_POINTS
    if _LOADED or name in _REGISTRY or not name.isidentifier() or name.startswith("_"):
        return
    if _NO_ENTRY_POINTS[0] is not entry_points:
        _NO_ENTRY_POINTS = (entry_points, not entry_points(group=ENTRY_POINT_GROUP))
    if not _NO_ENTRY_POINTS[1] or importlib.util.find_spec(f"kvsim.policies.{name}") is None:
        return
    policy = policy_from_module(importlib.import_module(f"kvsim.policies.{name}"), "builtin")
    if policy.name == name:
        _register(policy)


def get_policy(name: str) -> Policy:
    """The registered policy called ``name`` (KvsimInputError listing the known names)."""
    _load_builtin(name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KvsimInputError(f"unknown policy '{name}'; known: {', '.join(sorted(_REGISTRY))}",
                              None, None, "policy") from None


def list_policies(include_policy_files: bool = False) -> list[Policy]:
    """Every installed policy (built-ins and entry points), sorted by name; with
    ``include_policy_files`` also the ``--policy-file`` policies loaded in this process.

    User files are left out by default so that "every policy" (compare's default set, the
    contract tests) never silently grows with whatever file a caller loaded earlier."""
    _load_all()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)
            if include_policy_files or _REGISTRY[n].source == "builtin"
            or _REGISTRY[n].source.startswith("entry point ")]


def resolve_tier_policy(policy, tier: str) -> Policy:
    """:func:`resolve_policy` of a lower tier's policy (``SimConfig.tier_policies``): an
    unknown name is the error of field ``tier_policies`` (the CLI: ``--tier-policy``), not
    of the HBM policy's ``--policy``."""
    try:
        return resolve_policy(policy)
    except KvsimInputError as exc:
        if exc.field != "policy" or exc.path is not None:
            raise
        raise KvsimInputError(f"{tier}: {exc.message}", None, exc.location,
                              "tier_policies") from None


def resolve_policy(policy) -> Policy:
    """``policy`` as a :class:`Policy`: a :class:`Policy` itself, a ``.py`` file (a user
    policy, :func:`load_policy_file`) or a registered name (:func:`get_policy`)."""
    if isinstance(policy, Policy):
        return policy
    text = str(policy)
    if text.endswith(".py"):
        return load_policy_file(text)
    return get_policy(text)
