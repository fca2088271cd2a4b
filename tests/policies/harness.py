"""Shared by the policy tests (``from tests.policies.harness import ...``): the policy list
and a hook-level driver that plays the memory core."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.policy.api import new_block_view
from kvsim.policy.hooks import HOOK_NAMES, compiled_hooks, state_ref, view_ref
from kvsim.policy.registry import list_policies, load_policy_file

DATA = Path(__file__).parent / "data"
USER_POLICY_FILE = DATA / "my_mru.py"


def all_policies():
    """Every registered policy plus the example user file (so the contract covers it)."""
    load_policy_file(USER_POLICY_FILE)
    return list_policies()


def policy_ids():
    return [p.name for p in all_policies()]


class Driver:
    """Calls a policy's hooks the way the memory core does and checks every answer.

    ``candidates`` is the candidate set as the core sees it.  ``set_intent`` writes view
    fields before a hook (the core refreshes the view before calling hooks).

    A compiled policy's hooks are called as the replay calls them: the
    :class:`kvsim.policy.hooks.CompiledHook` values, on the state and view as one pointer
    each (``StateRef``, ``ViewRef``: the same arrays as ``state`` and ``view``).  So the
    tests run the specialisation the replay and ``simulate_cache`` run, compiled once per
    policy and shared with them through numba's disk cache, instead of one more
    specialisation for the ``PolicyState`` / ``BlockView`` tuples that only tests used
    (docs/benchmarks.md, "The default test step").  A plain-Python policy's hooks take
    ``state`` and ``view``.
    """

    def __init__(self, policy, capacity: int, num_slots: int, n_alt: int = 0,
                 params: dict | None = None):
        self.p = policy
        self.cap = capacity
        self.view = new_block_view(num_slots)
        self.view.content_hash[:] = np.arange(1, num_slots + 1)
        self.state = policy.init(capacity, num_slots, dict(params or {}))
        if policy.compiled:
            hooks = compiled_hooks(policy)
            self._args = (state_ref(self.state), view_ref(self.view))
        else:
            hooks = tuple(getattr(policy, name) for name in HOOK_NAMES)
            self._args = (self.state, self.view)
        (self._on_insert, self._on_hit, self._on_hold, self._on_release, self._on_remove,
         self._victim, self._on_hit_held, self._on_miss) = hooks
        self.alt_b = np.zeros(n_alt, np.int64)
        self.alt_s = np.zeros(n_alt, np.float64)
        self.candidates: set[int] = set()
        self.held: set[int] = set()
        self.victims: list[int] = []
        self.now = 0.0

    def set_intent(self, b: int, **fields) -> None:
        for name, value in fields.items():
            getattr(self.view, name)[b] = value

    def raw_victim(self, alt_b=None, alt_s=None) -> tuple[int, int, int]:
        """The policy's ``victim`` answer as it is (checked by nobody)."""
        alt_b = self.alt_b if alt_b is None else alt_b
        alt_s = self.alt_s if alt_s is None else alt_s
        v, reason, n_alt = self._victim(*self._args, float(self.now), alt_b, alt_s)
        return int(v), int(reason), int(n_alt)

    def victim(self) -> int:
        v, reason, n_alt = self.raw_victim()
        if not self.candidates:
            assert v == -1
            return v
        assert v in self.candidates, f"{self.p.name}: victim {v} is not a candidate"
        assert 0 <= reason < len(self.p.reasons)
        assert 0 <= n_alt <= self.alt_b.shape[0]
        if n_alt >= 1:
            assert self.alt_b[0] == v, f"{self.p.name}: alt_blocks[0] must be the victim"
            alts = [int(x) for x in self.alt_b[:n_alt]]
            assert len(set(alts)) == n_alt and set(alts) <= self.candidates
        return v

    def evict_one(self) -> int:
        v = self.victim()
        self._on_remove(*self._args, v)
        self.candidates.discard(v)
        self.victims.append(v)
        return v

    def access(self, b: int) -> bool:
        """Single-tier access; returns True on a hit."""
        self.now += 1.0
        if b in self.candidates:
            self.view.last_access_us[b] = self.now
            self.view.access_count[b] += 1
            self._on_hit(*self._args, b, float(self.now))
            return True
        self._on_miss(*self._args, int(self.view.content_hash[b]), float(self.now))
        while len(self.candidates) >= self.cap:
            self.evict_one()
        self.view.insert_us[b] = self.now
        self.view.last_access_us[b] = self.now
        self.view.access_count[b] = 1
        self._on_insert(*self._args, b, float(self.now))
        self.candidates.add(b)
        assert len(self.candidates) <= self.cap
        return False

    def hold(self, b: int, tick: bool = True) -> None:
        """HBM revive: a cached block is hit by a new request, which then holds it
        (``on_hit`` + ``on_hold``)."""
        assert b in self.candidates
        self.now += 1.0 if tick else 0.0
        self.view.last_access_us[b] = self.now
        self.view.access_count[b] += 1
        self._on_hit(*self._args, b, float(self.now))
        self._on_hold(*self._args, b)
        self.candidates.discard(b)
        self.held.add(b)

    def hit_held(self, b: int, tick: bool = True) -> None:
        """A prefix hit on a block another request holds (``on_hit`` for policies with
        hold hooks, nothing otherwise)."""
        assert b in self.held
        self.now += 1.0 if tick else 0.0
        self.view.last_access_us[b] = self.now
        self.view.access_count[b] += 1
        self._on_hit_held(*self._args, b, float(self.now))

    def allocate(self, b: int, tick: bool = True) -> None:
        """HBM: new content in block ``b`` (evicting to make room), held by its request
        (``on_miss``, victims, ``on_insert`` + ``on_hold``)."""
        assert b not in self.candidates and b not in self.held
        self.now += 1.0 if tick else 0.0
        self._on_miss(*self._args, int(self.view.content_hash[b]), float(self.now))
        while len(self.candidates) + len(self.held) >= self.cap:
            assert self.candidates, "no room: every block is held"
            self.evict_one()
        self.view.insert_us[b] = self.now
        self.view.last_access_us[b] = self.now
        self.view.access_count[b] = 1
        self._on_insert(*self._args, b, float(self.now))
        self._on_hold(*self._args, b)
        self.held.add(b)

    def release(self, b: int, tick: bool = True) -> None:
        """The last holder frees ``b``: it becomes a candidate again (``on_release``)."""
        assert b in self.held
        self.now += 1.0 if tick else 0.0
        self.view.last_access_us[b] = self.now
        self._on_release(*self._args, b, float(self.now))
        self.held.discard(b)
        self.candidates.add(b)

    def drain(self) -> list[int]:
        out = []
        while self.candidates:
            out.append(self.evict_one())
        assert self.victim() == -1
        return out

