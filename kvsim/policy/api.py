"""The policy interface: the one kvsim module a policy may import.

A placement policy orders the **eviction candidates** of one tier and names a victim when
the tier needs room.  Candidates are the blocks resident in the tier that nobody holds:
in HBM, blocks with reference count 0 that stay cached for reuse (vLLM's free queue); in
a lower tier (DRAM, CXL, NVMe) and in the single-tier simulator, every resident block.

Block history survives reuse
----------------------------
A policy's knowledge of a block lasts **as long as the block's content is resident in the
tier, held or cached**; only eviction or invalidation ends it.  The hooks name the
transition, so a policy can keep (say) an LFU count or a SIEVE visited bit across the
many times a cached prefix block is held by a request and released again:

``on_insert(state, view, b, now_us)``
    New content entered the tier in block ``b``: its state begins.  ``b`` is a candidate.
    In HBM a new block is held by the request that allocated it, so ``on_hold(b)``
    follows at once; the replay calls both once ``b``'s view describes the new content
    (after the victims evicted for it were demoted and logged).  Intent fields change
    while a block is held: read them again in ``on_release``.
``on_hit(state, view, b, now_us)``
    The content of ``b`` was accessed again: a single-tier or lower-tier hit (``b`` stays a
    candidate), or an HBM prefix hit, on a cached block (then ``on_hold(b)`` follows) or on
    a block other requests already hold (``b`` is not a candidate; policies that define
    ``on_hold`` receive these, see the defaults below).
``on_hold(state, view, b)``
    A cached HBM block is held again by a request: it stops being a candidate, its state is
    kept.  Never called in a tier without holds.
``on_release(state, view, b, now_us)``
    The last holder released ``b``: it is a candidate again.  For recency policies this is
    an access (a running request reads all its blocks at every step until it finishes);
    vLLM's free queue appends it here.  The view is current (intent, ``last_access_us``).
``on_remove(state, view, b)``
    ``b`` was evicted (after ``victim`` named it) or invalidated: its state ends.
    Only ever called for a candidate.
``victim(state, view, now_us, alt_blocks, alt_scores) -> (block, reason_code, n_alt)``
    Name the *candidate* to evict (never a held block; it is *not* removed yet: the core
    calls ``on_remove``).  Return -1 when there is no candidate.  The policy may write up
    to ``alt_blocks.shape[0]`` runners-up (the next candidates it would have chosen) with
    their scores into the two arrays and returns how many it wrote; the decision log
    records them.  Scores are "higher = more worth keeping"; the victim's own score goes
    in ``alt_scores[0]`` with ``alt_blocks[0] == block`` when ``n_alt >= 1``.
``on_miss(state, view, h, now_us)`` (optional)
    Content with hash ``h`` (``view.content_hash`` of the block it will occupy) was
    requested and is not resident: it will be inserted (``on_insert``) after the
    evictions made to fit it.  Called once, before those ``victim`` calls.  Policies with
    ghost lists (ARC, S3-FIFO) look ``h`` up there, exactly as libCacheSim does in
    ``find``.  Block ids are slots, so ghosts must be keyed by content, not by ``b``.

``prefetch_rank(view, b, now_us) -> float`` (optional; plain Python or ``njit``)
    Live offload only (``--live-offload``, kvsim/modes/live/live_prefetch.py).  ``b`` is a
    *unit* of the live replay: one running request's resident (or spilled) blocks of one
    pin class, its view the request's latest step (``last_access_us``, ``deadline_us``,
    ``slack_us``, ``target_decode_step``, ``phase``) and its most urgent block
    (``priority``).  Return when its spilled blocks are expected to be needed, smaller =
    sooner; ``inf`` = do not prefetch.  After each step the replay brings back spilled
    blocks in rank order within the link's per-step budget, displacing the policy's own
    ``victim`` only when that victim ranks later.  Default (hook absent): no prefetch,
    every spilled block is fetched on demand and stalls the step that needs it.  The
    built-ins that define it: ``deadline`` (deadline minus slack, deadlines still ahead
    only) and ``intent`` (priority and phase rank, deadlines still ahead only).

Legal sequences per block: ``on_insert`` (``on_hit``)* then any number of rounds of
``on_hold`` (``on_hit``)* ``on_release`` (``on_hit``)*, ended by ``on_remove`` (only while
a candidate).  Same stream, same tier, one decision each: a single-tier access of a
resident block is ``on_hit``; the HBM replay of a one-block request that is held and
released at once is ``on_hit, on_hold, on_release`` (hit) or ``on_miss, [victim,
on_remove], on_insert, on_hold, on_release`` (miss).  A built-in policy treats
``on_hold`` + ``on_release`` with nothing in between as no change of order, so both
streams give the same victims.

Defaults.  A policy may define only ``on_insert``, ``on_hit``, ``on_remove`` and
``victim`` (about 30 lines).  Then ``on_hold`` is its ``on_remove`` and ``on_release`` its
``on_insert``, and it does not receive ``on_hit`` for held blocks: it forgets a block
while the block is held and sees its release as a fresh insertion (what it knows about
the block's past lives in the view: ``insert_us``, ``access_count``, ``last_access_us``).
``on_hold`` and ``on_release`` come as a pair (define both or neither).

A policy is one module (``policies/<name>.py``, or a user file given with
``--policy-file``) defining the hooks above and:

``NAME: str``, ``DESCRIPTION: str``
    Registry name and a one-line description (shown by ``kvsim compare --help``).
``OFFLINE: bool`` (default False)
    True for policies that read the future (``view.next_use``), such as Belady's MIN.
    Their results are labelled as bounds, never as achievable.
``IN_DEFAULT_LIST: bool`` (default True)
    False keeps the policy out of ``kvsim compare``'s default list (it runs when named in
    ``--policies``): ``quota_lru``, which is ``lru`` unless tenant quotas are given.
``REASONS: tuple[str, ...]``
    Sentences explaining a choice, indexed by the reason code ``victim`` returns, e.g.
    ``("least recently used: idle for the longest time",)``.
``init(capacity_blocks: int, num_slots: int, params: dict) -> PolicyState``
    Plain Python.  Returns the policy's state, sized by ``num_slots`` (block ids of this
    tier run from 0 to ``num_slots - 1``), built with :func:`policy_state`: numpy arrays
    in four fixed-width groups, ``state.i64[k]`` (int64), ``state.f64[k]`` (float64),
    ``state.i8[k]`` (int8) and ``state.i64_2d[k]`` (2-D int64), unused slots empty.  One
    numba type for every policy, so ONE compiled replay core runs every policy's hooks
    (passed to it as first-class functions, :mod:`kvsim.policy.hooks`).  A policy names its
    slots (``PREV, NEXT, ENDS = 0, 1, 2``; ``dll_push_tail(state.i64[PREV], ...)``).
    A plain-Python policy may return anything (a tuple of lists, say): its hooks run
    interpreted.  A policy whose hooks are ``njit`` but whose ``init`` returns another
    type (the tuple form before kvsim 0.2) runs interpreted too, with a one-line note.
``explain(row: dict, now_us: float) -> dict[str, float]`` (optional, plain Python)
    The named score terms of one block given its logged intent fields, for
    ``kvsim log explain``.  Scored policies should provide it.

The hooks are ``numba.njit`` functions for built-ins (the replay loop is compiled once
for all policies; each policy compiles only its own hooks, one signature each, cached on
disk).  Plain Python functions work too: the core then runs its interpreted twin, the
same code, slower.  A policy must be deterministic: no global random state; if it needs
randomness it seeds a generator from ``params["seed"]`` in ``init``.  The live-offload
replay (kvsim/modes/live/live_offload.py) also passes ``params["live_offload"] = True``: a
policy may rank running requests' units differently there (deadline does).  A lower tier's
policy (DRAM, CXL, NVMe) also gets ``params["max_contents"]``: at most this many distinct
contents (``view.content_hash``) reach that tier in the run (the replay's bound, which does
not grow when the same contents come again); a policy keeping state per content it no longer
holds (ARC's and S3-FIFO's ghosts) sizes it by the smaller of that and its capacity's bound,
the same decisions in less memory when the tier is larger than the trace's contents.

The view
--------
``view`` is a :class:`BlockView`: read-only per-block arrays of the tier, indexed by block
id, maintained by the core.  A policy must not write to it.  ``view.tenant`` is the tenant of
the request that brought the block's content into the tier; with per-tenant quotas
(``SimConfig.tenant_quotas``) ``init``'s ``params`` also carry ``"tenant_quotas"`` (``{tier:
((tenant, cap_blocks, share_blocks), ...)}``) and ``"tier"`` (the tier this instance serves);
``policies/quota_lru.py`` uses both (docs/policies.md, "Tenant quotas").
"""

from __future__ import annotations

import sys
from collections import namedtuple

import numpy as np

# re-exported: policies import only this module
from kvsim.core.schema import Phase, Priority, Tier  # noqa: F401

#: "Never used again" in ``BlockView.next_use``.
NEVER = np.iinfo(np.int64).max

#: Fields of :class:`BlockView`, each a numpy array indexed by the tier's block id.
BLOCK_VIEW_FIELDS = (
    "last_access_us",  # float64: engine time of the block's latest access
    "insert_us",  # float64: engine time the block entered this tier
    "access_count",  # int64: accesses since the content first entered this tier
    "phase",  # int8: Phase of the request that last touched it
    "priority",  # int8: Priority (COLD..DECODE_CRITICAL)
    "request_priority",  # int8: 0..100
    "deadline_us",  # int64: absolute deadline of the next expected use, -1 = none
    "slack_us",  # int64: slack at the last intent update
    "target_decode_step",  # int64: step at which it is next needed, -1 = unknown
    "recompute_cost_us",  # float64: prefill time to recompute the block
    "size_bytes",  # int64
    "pinned",  # bool: pin requested (DECODE_CRITICAL implies it); policies should avoid
    "next_use",  # int64: OFFLINE ONLY: ordinal of the next access, NEVER if none
    "content_hash",  # int64: content identity (0 = none)
    "tenant",  # int32: tenant of the request that brought the content into the tier (0 default)
)

BlockView = namedtuple("BlockView", BLOCK_VIEW_FIELDS)

_VIEW_DTYPES = {
    "last_access_us": np.float64,
    "insert_us": np.float64,
    "access_count": np.int64,
    "phase": np.int8,
    "priority": np.int8,
    "request_priority": np.int8,
    "deadline_us": np.int64,
    "slack_us": np.int64,
    "target_decode_step": np.int64,
    "recompute_cost_us": np.float64,
    "size_bytes": np.int64,
    "pinned": np.bool_,
    "next_use": np.int64,
    "content_hash": np.int64,
    "tenant": np.int32,
}


def new_block_view(num_slots: int) -> BlockView:
    """A zeroed view for a tier of ``num_slots`` blocks (``deadline_us`` etc. set to -1)."""
    arrays = {name: np.zeros(num_slots, dtype=_VIEW_DTYPES[name]) for name in BLOCK_VIEW_FIELDS}
    arrays["deadline_us"][:] = -1
    arrays["target_decode_step"][:] = -1
    arrays["next_use"][:] = NEVER
    return BlockView(**arrays)


# ---- the uniform policy state --------------------------------------------------------

#: Widths of the four groups of :class:`PolicyState` (the most any built-in needs:
#: deadline's five heaps take 21 int64 and 5 float64 arrays).  Unused slots hold an empty
#: array.  Raising a width changes the state's numba type: every compiled hook and the
#: core recompile once.
STATE_I64 = 24
STATE_F64 = 6
STATE_I8 = 4
STATE_I64_2D = 1

#: A policy's state: fixed-width tuples of 1-D int64 / float64 / int8 arrays and of 2-D
#: int64 arrays.  Build it with :func:`policy_state`.
PolicyState = namedtuple("PolicyState", ("i64", "f64", "i8", "i64_2d"))


def _group(arrays, width: int, dtype, ndim: int, name: str) -> tuple:
    arrays = tuple(arrays)
    if len(arrays) > width:
        raise ValueError(f"policy_state: {len(arrays)} {name} arrays, at most {width}")
    out = []
    for k, a in enumerate(arrays):
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ndim \
                or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"policy_state: {name}[{k}] must be a writeable C-contiguous "
                             f"{ndim}-D {np.dtype(dtype).name} array")
        out.append(a)
    empty = np.zeros((0,) * ndim, dtype)
    return tuple(out) + (empty,) * (width - len(out))


def policy_state(i64=(), f64=(), i8=(), i64_2d=()) -> PolicyState:
    """The :class:`PolicyState` holding these arrays, in order (``state.i64[0]`` is
    ``i64[0]``, ...), padded to the fixed widths with empty arrays.  Arrays are kept, not
    copied; each must be C-contiguous, writeable and of the group's dtype (int8 for
    flags: numba has no cheaper bool array)."""
    return PolicyState(_group(i64, STATE_I64, np.int64, 1, "i64"),
                       _group(f64, STATE_F64, np.float64, 1, "f64"),
                       _group(i8, STATE_I8, np.int8, 1, "i8"),
                       _group(i64_2d, STATE_I64_2D, np.int64, 2, "i64_2d"))



def _state_class(module: str | None, fields: list[str]) -> type:
    """The interpreted hooks' namedtuple of ``fields``, set as an attribute of the module
    that declared the spec (under a name derived from the fields), so that it is found by
    that name in every process.  numba types a namedtuple argument by its class and keys
    its disk cache by the argument types, pickled by reference only when the class can be
    found by module and name (else by value: a new class at each load, never equal to the
    live one).  A class made anew in each process, named nowhere, made every interpreted
    run compile the policy's njit helpers again (~20 CPU-s for deadline's) and add one more
    entry to each one's cache index (40 after a few test runs)."""
    import hashlib

    cls = namedtuple("NamedPolicyState", fields)
    mod = sys.modules.get(module) if module else None
    if mod is None:
        return cls
    name = "_NamedPolicyState_" + hashlib.sha1(",".join(fields).encode()).hexdigest()[:12]
    old = getattr(mod, name, None)
    if isinstance(old, type) and getattr(old, "_fields", None) == tuple(fields):
        return old  # the module executed again in this process: the same class
    cls.__module__, cls.__qualname__ = module, name
    setattr(mod, name, cls)
    return cls


class StateSpec:
    """The names of a policy's state arrays, declared once at the top of the policy::

        STATE = StateSpec(i64=("prev", "nxt", "t1", "t2", ("ghosts", 7)), f64=("p",),
                          i8=("where",))

    Each entry of a group is a name (one array) or ``(name, n)`` (``n`` consecutive arrays,
    read as a tuple: a ghost pool, a heap).  ``init`` returns ``STATE.new(prev=..., ...)``
    (a :class:`PolicyState`, every name given, in the declared order), and each hook
    begins with ``state = STATE.of(state)``; from there ``state.t1`` is the array named
    ``t1``.  Compiled, ``STATE.of`` reinterprets the one StateRef type every policy shares
    (the core and the hook signatures stay the same for all policies) as a typed view of
    the same struct, and ``state.t1`` loads exactly what ``state.i64[2]`` loads
    (:mod:`kvsim.policy.state_access`); interpreted, it returns the PolicyState with the
    names as properties.  ``state.i64[k]`` keeps working on both."""

    GROUPS = ("i64", "f64", "i8", "i64_2d")
    _WIDTH = {"i64": STATE_I64, "f64": STATE_F64, "i8": STATE_I8, "i64_2d": STATE_I64_2D}

    def __init__(self, i64=(), f64=(), i8=(), i64_2d=()):
        layout = []
        for group, entries in zip(self.GROUPS, (i64, f64, i8, i64_2d)):
            k = 0
            for e in entries:
                name, n = (e, 0) if isinstance(e, str) else (str(e[0]), int(e[1]))
                if not name.isidentifier() or name in self.GROUPS or name == "of" \
                        or name.startswith("_"):
                    raise ValueError(f"StateSpec: bad name {name!r}")
                if any(name == x[0] for x in layout):
                    raise ValueError(f"StateSpec: {name!r} declared twice")
                layout.append((name, group, k, n))
                k += max(n, 1)
            if k > self._WIDTH[group]:
                raise ValueError(f"StateSpec: {k} {group} arrays, at most {self._WIDTH[group]}")
        self.layout = tuple(layout)
        #: the module that declared it (numba's alias analysis names ``STATE.of`` by it)
        self.module = sys._getframe(1).f_globals.get("__name__")
        #: interpreted hooks' view: a namedtuple of the names and the four groups (numba
        #: types it as it is, so the policy's njit helpers compile for it too)
        self._cls = _state_class(self.module, [e[0] for e in self.layout] + list(self.GROUPS))
        self._last = (None, None)

    def index(self, name: str) -> tuple[str, int]:
        """``(group, k)``: where ``name``'s (first) array lives (``state.<group>[k]``)."""
        for n_, group, start, _ in self.layout:
            if n_ == name:
                return group, start
        raise KeyError(name)

    def new(self, **arrays) -> PolicyState:
        """The :class:`PolicyState` holding these arrays (one keyword per declared name; a
        tuple of ``n`` arrays for an ``(name, n)`` entry)."""
        want = {e[0] for e in self.layout}
        if set(arrays) != want:
            raise ValueError(f"StateSpec.new: missing {sorted(want - set(arrays))}, "
                             f"unknown {sorted(set(arrays) - want)}")
        groups = {g: [] for g in self.GROUPS}
        for name, group, _, n in self.layout:
            if n == 0:
                groups[group].append(arrays[name])
            else:
                part = tuple(arrays[name])
                if len(part) != n:
                    raise ValueError(f"StateSpec.new: {name} takes {n} arrays, got {len(part)}")
                groups[group].extend(part)
        return policy_state(**groups)

    def of(self, state):
        """``state`` with the declared names as attributes: interpreted hooks get a
        namedtuple of the same arrays (the last one built is kept, so a run of hook calls
        builds it once); compiled hooks the typed view of :mod:`kvsim.policy.state_access`."""
        if isinstance(state, self._cls):
            return state
        src, out = self._last
        if src is state:
            return out
        values = [getattr(state, g)[k] if n == 0 else tuple(getattr(state, g)[k:k + n])
                  for _, g, k, n in self.layout]
        out = self._cls(*values, *state)
        self._last = (state, out)
        return out

    def __repr__(self) -> str:
        return f"StateSpec({', '.join(e[0] for e in self.layout)})"


#: The optional pair of hold hooks and the required hook each one defaults to.
HOLD_HOOK_DEFAULTS = {"on_hold": "on_remove", "on_release": "on_insert"}


def keeps_held(module) -> bool:
    """True if ``module`` defines ``on_hold`` and ``on_release`` (it keeps a block's state
    while the block is held, and receives ``on_hit`` for held blocks)."""
    return hasattr(module, "on_hold") and hasattr(module, "on_release")


def hook_bindings(module) -> dict[str, str]:
    """Which function of ``module`` each hook a core calls is bound to: ``on_hold`` and
    ``on_release`` fall back to ``on_remove`` / ``on_insert``; ``on_hit_held`` (``on_hit``
    for a block other requests hold) is ``on_hit``, or None (not called) by default."""
    held = keeps_held(module)
    out = {h: h for h in ("on_hit", "on_insert", "on_remove", "victim")}
    for hook, default in HOLD_HOOK_DEFAULTS.items():
        out[hook] = hook if held else default
    out["on_hit_held"] = "on_hit" if held else None
    return out


# =========================================================================================
# Helpers for policies: the hook decorator, and the data structures of
# kvsim.policy.structs (linked lists, heap, ghost sets) re-exported so that a policy
# imports this module only.
# =========================================================================================
from numba import njit  # noqa: E402  (kept below the contract part on purpose)

# the data structures a policy builds on, re-exported: policies import only this module
from kvsim.policy.structs import (  # noqa: E402, F401
    NIL,
    OUT,
    dll_contains,
    dll_ends,
    dll_links,
    dll_move_to_tail,
    dll_pop_head,
    dll_push_head,
    dll_push_tail,
    dll_remove,
    ghost_find,
    ghost_in,
    ghost_new,
    ghost_pop_head,
    ghost_push_tail,
    ghost_remove,
    heap_contains,
    heap_in,
    heap_new,
    heap_of,
    heap_peek,
    heap_push,
    heap_remove,
    heap_size,
    heap_slots,
    heap_smallest,
    heap_update,
    list_walk,
)


def njit_hook(fn):
    """``numba.njit(cache=True)`` for a hook: the one decorator every built-in hook uses,
    so hooks' compile options change in one place.  A hook may allocate (NRT is on)."""
    return njit(cache=True)(fn)


@njit(cache=True)
def noop_hook(state, view, b, now_us):
    """A hook that does nothing (the default ``on_miss``)."""
    return None
