"""The guard around user policies (``--policy-file``): a misbehaving policy stops the run
with one line naming the policy file, the hook and what it did; it cannot change results.

:func:`guard_policy` is applied by the loader (:func:`kvsim.policy.registry.load_policy_file`)
to every hook the module defines (whatever hooks the contract has: the wrapping is
generic), so every engine that runs the policy (the tiered replay's interpreted twin,
``kvsim.cachesim.simulator``) runs the guarded hooks.  Per call:

* **the view is read-only**: the hook receives a :class:`~kvsim.policy.api.BlockView` of
  read-only numpy views of the same buffers the core writes (no copy; a write raises
  ``ValueError: assignment destination is read-only``, which stops the run);
* **exceptions** raised by a hook (or by ``init``) stop the run, ``SystemExit`` and any
  other ``BaseException`` included (a policy calling ``sys.exit(3)`` is a policy error,
  exit 2, never kvsim's exit); Ctrl-C and SIGTERM pass through;
* **stdout is kvsim's**: what a hook (or the module, at import) prints goes to stderr,
  so ``--json`` output stays JSON;
* **return values are checked**: ``victim`` must return ``(block, reason, n_alt)`` of
  integers with ``block`` a current candidate (the guard tracks the candidate set from
  ``on_insert`` / ``on_release`` (enter) and ``on_hold`` / ``on_remove`` (leave)) or -1
  only when there is none, ``0 <= reason < len(REASONS)`` and ``0 <= n_alt <=
  alt_blocks.shape[0]``; every other hook (``on_insert``, ``on_hit``, ``on_hold``,
  ``on_release``, ``on_remove``, ``on_miss``) must return None; ``init`` must return a
  tuple.  Every hook field of the Policy is wrapped, so a hook added to the contract is
  guarded (exceptions, read-only view) without a change here.

Each violation raises :class:`~kvsim.core.errors.KvsimInputError` (exit 2):
``error: /path/my_policy.py: field 'victim': policy hook returned 7, not a current
candidate (...)``.

Compiled user hooks (``numba.njit`` functions in a ``--policy-file``) are accepted and run
through their Python source (``py_func``) under the same guard: a compiled hook could
write into the core's arrays and no check could run between its calls.  They are
therefore as slow as plain-Python hooks; built-in and entry-point policies are trusted and
run compiled.  The guard protects against mistakes, not malice: a policy file is Python
code run in the kvsim process.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import numpy as np

from kvsim.core.errors import INTERRUPTS, KvsimInputError
from kvsim.policy.api import BlockView

#: Hook name -> number of positional parameters (see kvsim.policy.api).
HOOK_ARITY = {"on_insert": 4, "on_hit": 4, "on_remove": 3, "victim": 5}
#: Optional hooks and their arity.
OPTIONAL_HOOK_ARITY = {"on_miss": 4, "on_hold": 3, "on_release": 4}

#: Hooks whose contract is "returns nothing".
VOID_HOOKS = ("on_insert", "on_hit", "on_remove", "on_miss", "on_hold", "on_release",
              "on_hit_held")
#: Hooks after which block ``b`` (argument 3) is a candidate / is not one (kvsim.policy.api:
#: on_insert and on_release make it a candidate; on_hold (held by a request) and
#: on_remove (evicted) end that).  Any other hook leaves the candidate set as it was.
ENTER_HOOKS = ("on_insert", "on_release")
LEAVE_HOOKS = ("on_remove", "on_hold")
_STATES_KEPT = 16  # candidate sets of this many recent states (runs) are remembered


@contextlib.contextmanager
def policy_stdout_to_stderr():
    """Run user code with ``sys.stdout`` pointing at stderr (a policy's ``print()``)."""
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = saved


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Guard:
    """State shared by the wrapped hooks of one policy: candidate sets per policy state,
    read-only views per view object."""

    def __init__(self, policy) -> None:
        self.source = policy.source
        self.name = policy.name
        self.num_reasons = len(policy.reasons)
        self.candidates: dict[int, tuple[Any, set[int]]] = {}
        self.views: dict[int, tuple[Any, BlockView]] = {}

    def fail(self, hook: str, what: str) -> KvsimInputError:
        return KvsimInputError(f"policy {self.name!r} {what}", self.source, None, hook)

    def cand(self, state: Any) -> set[int]:
        entry = self.candidates.get(id(state))
        if entry is None or entry[0] is not state:
            if len(self.candidates) >= _STATES_KEPT:
                self.candidates.pop(next(iter(self.candidates)))
            entry = (state, set())
            self.candidates[id(state)] = entry
        return entry[1]

    def read_only(self, view: Any) -> Any:
        if not isinstance(view, tuple) or not hasattr(view, "_fields"):
            return view
        entry = self.views.get(id(view))
        if entry is None or entry[0] is not view:
            arrays = []
            for arr in view:
                if isinstance(arr, np.ndarray):
                    arr = arr.view()
                    arr.flags.writeable = False
                arrays.append(arr)
            if len(self.views) >= _STATES_KEPT:
                self.views.pop(next(iter(self.views)))
            entry = (view, type(view)(*arrays))
            self.views[id(view)] = entry
        return entry[1]

    def block_id(self, hook: str, value: Any) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise self.fail(hook, f"returned a block {_shown(value)}, expected an integer")
        return int(value)

    def check_victim(self, out: Any, state: Any, alt_blocks: Any) -> None:
        hook = "victim"
        if not isinstance(out, tuple) or len(out) != 3:
            raise self.fail(hook, f"returned {_shown(out)}, expected a tuple (block, "
                            "reason_code, n_alt)")
        b = self.block_id(hook, out[0])
        for what, v in (("reason_code", out[1]), ("n_alt", out[2])):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
                raise self.fail(hook, f"returned {what} {_shown(v)}, expected an integer")
        reason, n_alt = int(out[1]), int(out[2])
        cands = self.cand(state)
        if b == -1:
            if cands:
                raise self.fail(hook, f"returned -1 (no victim) while {len(cands):,} "
                                "candidates exist")
            return
        if b not in cands:
            raise self.fail(hook, f"returned block {b}, not a current candidate "
                            f"({len(cands):,} candidates)")
        if not 0 <= reason < self.num_reasons:
            raise self.fail(hook, f"returned reason_code {reason}, expected 0.."
                            f"{self.num_reasons - 1} (an index into REASONS)")
        cap = int(alt_blocks.shape[0]) if hasattr(alt_blocks, "shape") else 0
        if not 0 <= n_alt <= cap:
            raise self.fail(hook, f"returned n_alt {n_alt}, expected 0..{cap} (the "
                            "length of alt_blocks)")


def _wrap_hook(guard: _Guard, hook: str, func: Callable) -> Callable:
    target = getattr(func, "py_func", func)  # compiled user hooks run as Python
    name = getattr(target, "__name__", hook)
    # a default (on_hold = the module's on_remove, ...) is named by its own name too
    label = hook if name in (hook, "_python_noop") else f"{name} (as {hook})"

    @functools.wraps(target)
    def guarded(state, view, *args):
        ro = guard.read_only(view)
        saved = sys.stdout
        sys.stdout = sys.stderr  # the policy's print(): stderr (policy_stdout_to_stderr)
        try:
            out = target(state, ro, *args)
        except (KvsimInputError, *INTERRUPTS):
            raise
        except BaseException as exc:  # SystemExit too: a policy never ends kvsim
            raise guard.fail(label, f"raised {type(exc).__name__}: {exc}") from None
        finally:
            sys.stdout = saved
        if hook == "victim":
            guard.check_victim(out, state, args[1] if len(args) > 1 else None)
            return int(out[0]), int(out[1]), int(out[2])
        if hook in VOID_HOOKS and out is not None:
            raise guard.fail(label, f"returned {_shown(out)}, expected None (the hook "
                             "returns nothing)")
        if args and hook in ENTER_HOOKS + LEAVE_HOOKS:
            b = int(args[0])
            cands = guard.cand(state)
            if hook in ENTER_HOOKS:
                cands.add(b)
            else:
                cands.discard(b)
        return out

    guarded.__kvsim_guarded__ = True
    return guarded


def _wrap_init(guard: _Guard, func: Callable) -> Callable:
    @functools.wraps(func)
    def init(capacity_blocks, num_slots, params):
        try:
            with policy_stdout_to_stderr():
                state = func(capacity_blocks, num_slots, params)
        except (KvsimInputError, *INTERRUPTS):
            raise
        except BaseException as exc:
            raise guard.fail("init", f"raised {type(exc).__name__}: {exc}") from None
        if not isinstance(state, tuple):
            raise guard.fail("init", f"returned {_shown(state)}, expected a tuple (the "
                             "policy state)")
        guard.candidates.pop(id(state), None)
        return state

    return init


def guard_policy(policy):
    """``policy`` (a :class:`kvsim.policy.registry.Policy`) with every hook and ``init``
    wrapped by the guard; ``compiled`` becomes False (the guarded hooks are Python)."""
    guard = _Guard(policy)
    names = {f.name for f in fields(policy)}
    changes: dict[str, Any] = {"init": _wrap_init(guard, policy.init), "compiled": False}
    hooks = [f.name for f in fields(policy) if f.name.startswith("on_")
             or f.name in (*HOOK_ARITY, *OPTIONAL_HOOK_ARITY)]
    for hook in hooks:
        if hook in names and callable(getattr(policy, hook)):
            changes[hook] = _wrap_hook(guard, hook, getattr(policy, hook))
    return replace(policy, **changes)
