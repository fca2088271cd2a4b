"""Single-tier cache simulator: a key stream through one cache under one policy.

The request loop has libCacheSim's shape (``cache_get_base``): for each access, a hit
calls ``on_hit``; a miss calls ``on_miss`` (with the key's content hash), then ``victim`` +
``on_remove`` while the cache is full, then ``on_insert``.  There are no holds (every
resident key is a candidate), so ``on_hold``/``on_release`` are never called: this is the
stream the HBM replay gives a policy for one-block requests held and released at once
(kvsim.policy.api).  Every object has size 1 (one KV block), so the capacity is a
block count.  Keys are remapped to dense ids ``0..n-1`` in order of first appearance, so
a policy's ``block id`` is the key's identity (ghost lists and frequencies are exact).

The view the policy sees is maintained before each hook: ``last_access_us`` and
``insert_us`` are the access ordinal (virtual time: access ``i`` happens at ``i`` us),
``access_count`` counts accesses since the key entered the cache, ``content_hash`` is
``dense id + 1`` (never 0), and for OFFLINE policies ``next_use`` is the ordinal of the
key's next access (``NEVER`` if none).  Intent fields keep their defaults.

Invariants checked in the loop (a policy that breaks one raises ValueError):
the cache never holds more than ``capacity_blocks`` keys, and every victim is resident.

The loop is one ``numba.njit`` function taking the hooks as arguments, so it is compiled
once per policy (hook functions are part of the specialisation; LLVM inlines them into
the loop).  For a plain-Python policy its interpreted twin (``_replay.py_func``) runs the
same code with Python hooks.  The loop is compiled without reference counting
(``_nrt=False``: it allocates nothing, its caller owns every array), and so are the hooks
of arc, s3fifo, sieve and lfu (``policy_api.njit_hook``): the atomic reference-count
updates on the state and view arrays, once per array per hook call, were most of the
cost of a hook (ARC: 0.69 -> 4.3 M accesses/s at a 1,000-block cache, see
docs/benchmarks.md).

Dedicated loops for lru, fifo, lfu, sieve, s3fifo and arc (:mod:`kvsim.cachesim.fast_loops`):
when the policy is the built-in one (the very hook functions of ``policies/<name>.py``) and
no runners-up are asked for, its hooks run written inline in one loop, with no
``BlockView`` and no hook calls; tests/sim/test_cachesim_fast.py checks each evicts the
same blocks in the same order as the hook path.  ``fast_path=False`` forces the generic
loop.  Figures in docs/benchmarks.md, "Single-tier policies vs libCacheSim".

Fast path for Belady (``_replay_belady``): the built-in ``belady`` policy runs in a
dedicated loop with its heap written inline, when no runners-up are asked for
(``n_alt == 0``).  It is the same max-heap on next use as ``policies/belady.py``, with the
same sift order, so it evicts the SAME blocks in the same order (tests/sim/
test_cachesim_belady_fast.py compares the victim sequences), but it keeps each key beside
its block in the heap array and maintains no ``BlockView``.  Where the generic loop's time
went (``python bench/profile_belady.py``: 10 M-access Zipf stream, 100,000-block cache,
figures in docs/benchmarks.md): 6.9 s in all; the heap work itself 1.6 s (this loop);
the ``key[heap[i]]`` indirection of every comparison +1.25 s; the three per-access view
writes (``next_use``, ``last_access_us``, ``access_count``: random stores into arrays of
one entry per key) +1.0 s; the remainder, ~3 s, is the hook calls (the reference counts
of the state and view arrays, see above) and the ``resident`` array.  (These figures
predate the ``_nrt=False`` loop.)  The
tiered replay keeps using the hooks of ``policies/belady.py``; ``fast_path=False`` forces
the generic loop here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kvsim.cachesim import fast_loops as fast
from kvsim.cachesim import ghost_loops as ghost
from kvsim.core.errors import KvsimInputError
from kvsim.jit.decorators import njit
from kvsim.policy.api import NEVER, new_block_view
from kvsim.policy.hooks import (
    H_HIT,
    H_INSERT,
    H_MISS,
    H_REMOVE,
    H_VICTIM,
    is_uniform,
    policy_value,
    view_ref,
)
from kvsim.policy.registry import Policy, get_policy

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas as pd

#: Keys whose value range is at most this many times the stream length (plus a constant)
#: are remapped through a direct table (O(n)); wider keys are sorted (np.unique).
_DIRECT_REMAP_FACTOR = 4
_DIRECT_REMAP_SLACK = 1 << 22


@dataclass(frozen=True)
class CacheResult:
    """Outcome of one simulation.  ``hits + misses == accesses``;
    ``evictions == misses - (number of keys resident at the end)``."""

    policy: str
    offline: bool  # True: the result is a bound (the policy read the future)
    capacity_blocks: int
    accesses: int
    hits: int
    misses: int
    evictions: int
    unique_keys: int
    miss_ratio: float
    #: Dense ids evicted, in order (only with ``record_victims=True``; empty otherwise).
    victims: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    #: Original key of every dense id (``keys_by_id[victims]`` gives evicted keys).
    keys_by_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)


@njit(cache=True)
def _remap_direct(keys, lo, span):
    table = np.full(span, -1, np.int64)
    ids = np.empty(keys.shape[0], np.int64)
    uniq = np.empty(keys.shape[0], np.int64)
    n = 0
    for i in range(keys.shape[0]):
        k = keys[i] - lo
        d = table[k]
        if d < 0:
            d = n
            table[k] = d
            uniq[n] = keys[i]
            n += 1
        ids[i] = d
    return ids, uniq[:n].copy()


@njit(cache=True)
def _first_seen_order(inverse, n_unique):
    """Relabel np.unique's sorted ids by order of first appearance."""
    relabel = np.full(n_unique, -1, np.int64)
    n = 0
    out = np.empty(inverse.shape[0], np.int64)
    for i in range(inverse.shape[0]):
        u = inverse[i]
        if relabel[u] < 0:
            relabel[u] = n
            n += 1
        out[i] = relabel[u]
    return out, relabel


def remap_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids in order of first appearance: ``(ids, keys_by_id)``, with
    ``keys_by_id[ids] == keys``."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if keys.shape[0] == 0:
        return keys.copy(), keys.copy()
    lo, hi = int(keys.min()), int(keys.max())
    span = hi - lo + 1
    if 0 < span <= _DIRECT_REMAP_FACTOR * keys.shape[0] + _DIRECT_REMAP_SLACK:
        return _remap_direct(keys, lo, span)
    uniq, inverse = np.unique(keys, return_inverse=True)
    ids, relabel = _first_seen_order(inverse.astype(np.int64), uniq.shape[0])
    keys_by_id = np.empty(uniq.shape[0], np.int64)
    keys_by_id[relabel] = uniq
    return ids, keys_by_id


@njit(cache=True)
def next_use_of(ids, n_unique):
    """``out[i]`` = index of the next access to ``ids[i]`` after ``i``, NEVER if none."""
    last = np.full(n_unique, NEVER, np.int64)
    out = np.empty(ids.shape[0], np.int64)
    for i in range(ids.shape[0] - 1, -1, -1):
        out[i] = last[ids[i]]
        last[ids[i]] = i
    return out


@njit(cache=True)
def _replay(ids, next_use, capacity, pol, view, alt_blocks, alt_scores, victims_out,
            resident):
    """The request loop.  ``pol = (state, hooks)`` (:mod:`kvsim.policy.hooks`: the hooks are
    first-class functions, so this loop is compiled once for every policy and cached on
    disk).  ``resident`` is a zeroed bool array of one entry per dense id
    (allocated by the caller: the loop is compiled without reference counting, numba's
    ``_nrt=False``, so it allocates nothing; see ``policy_api.njit_hook`` for why).
    Returns ``(hits, misses, evictions, resident_at_end)``; raises ValueError when the
    policy breaks an invariant."""
    state = pol[0]
    on_miss, on_insert, on_hit = pol[1][H_MISS], pol[1][H_INSERT], pol[1][H_HIT]
    on_remove, victim = pol[1][H_REMOVE], pol[1][H_VICTIM]
    n_ids = view.access_count.shape[0]
    record = victims_out.shape[0] > 0
    use_next = next_use.shape[0] > 0
    n_res = 0
    hits = 0
    misses = 0
    evictions = 0
    for i in range(ids.shape[0]):
        b = ids[i]
        now = float(i)
        if use_next:
            view.next_use[b] = next_use[i]
        if resident[b]:
            hits += 1
            view.last_access_us[b] = now
            view.access_count[b] += 1
            on_hit(state, view, b, now)
            continue
        misses += 1
        on_miss(state, view, view.content_hash[b], now)
        while n_res >= capacity:
            v, reason, n_alt = victim(state, view, now, alt_blocks, alt_scores)
            if v < 0 or v >= n_ids or not resident[v]:
                raise ValueError("policy named a victim that is not a resident block")
            on_remove(state, view, v)
            resident[v] = False
            n_res -= 1
            if record:
                victims_out[evictions] = v
            evictions += 1
        view.insert_us[b] = now
        view.last_access_us[b] = now
        view.access_count[b] = 1
        on_insert(state, view, b, now)
        resident[b] = True
        n_res += 1
    return hits, misses, evictions, n_res


#: Belady's dedicated loop (key domain, fused remap): kvsim.cachesim.fast_loops.replay_belady.
_replay_belady = fast.replay_belady


def _builtin(pol: Policy, name: str) -> bool:
    """True when ``pol`` runs exactly the hooks of the built-in ``policies/<name>.py``."""
    import importlib

    from kvsim.policy import api as policy_api

    mod = importlib.import_module(f"kvsim.policies.{name}")
    on_miss = getattr(mod, "on_miss", policy_api.noop_hook)
    return (pol.on_insert is mod.on_insert and pol.on_hit is mod.on_hit
            and pol.on_remove is mod.on_remove and pol.victim is mod.victim
            and pol.on_miss is on_miss)


def _dedicated(pol: Policy, capacity: int, params: dict):
    """The dedicated loop of a built-in policy (kvsim.cachesim.fast_loops, cachesim_ghost)
    as a function of ``(keys, lo, table, victims_out, uniq_out, ahead)``, or None."""
    simple = {"lru": fast.replay_lru, "fifo": fast.replay_fifo, "lfu": fast.replay_lfu,
              "sieve": fast.replay_sieve, "arc": ghost.replay_arc}
    if pol.name in simple and _builtin(pol, pol.name):
        loop = simple[pol.name]
        return lambda k, lo, table, out, uniq, ahead: loop(k, lo, table, capacity, out, uniq,
                                                           ahead)
    if pol.name == "s3fifo" and _builtin(pol, "s3fifo"):
        from kvsim.policies import s3fifo as mod

        # the same sizes as s3fifo.init
        small = int(capacity * float(params.get("small_size_ratio", mod.SMALL_SIZE_RATIO)))
        gcap = int(capacity * float(params.get("ghost_size_ratio", mod.GHOST_SIZE_RATIO)))
        return lambda k, lo, table, out, uniq, ahead: ghost.replay_s3fifo(
            k, lo, table, capacity, small, gcap, mod.MOVE_TO_MAIN_THRESHOLD, out, uniq, ahead)
    return None


def _is_builtin_belady(pol: Policy) -> bool:
    from kvsim.policies import belady  # the built-in module (policies/belady.py)

    return (pol.on_insert is belady.on_insert and pol.on_hit is belady.on_hit
            and pol.on_remove is belady.on_remove and pol.victim is belady.victim
            and not hasattr(pol.module, "on_miss"))


@dataclass(frozen=True)
class PreparedKeys:
    """A key stream remapped once for many simulations (see :func:`prepare_keys`)."""

    ids: np.ndarray  # dense id of each access, 0..unique-1 in order of first appearance
    keys_by_id: np.ndarray  # original key of each dense id
    next_use: np.ndarray  # index of the next access to the same key (NEVER if none)


def prepare_keys(keys: np.ndarray) -> PreparedKeys:
    """Remap ``keys`` to dense ids and compute next-use ordinals (for offline policies).

    Raises KvsimInputError unless ``keys`` is a 1-D integer array.
    """
    keys = np.asarray(keys)
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise KvsimInputError(f"expected a 1-D integer array, got {keys.dtype} with shape "
                              f"{keys.shape}", None, None, "keys")
    ids, keys_by_id = remap_keys(keys)
    return PreparedKeys(ids, keys_by_id, next_use_of(ids, max(int(keys_by_id.shape[0]), 1)))


def _resolve(policy: str | Policy) -> Policy:
    return get_policy(policy) if isinstance(policy, str) else policy


def simulate_cache(keys: np.ndarray | PreparedKeys, capacity_blocks: int,
                   policy: str | Policy, *, params: dict | None = None, n_alt: int = 0,
                   record_victims: bool = False, fast_path: bool = True) -> CacheResult:
    """Replay ``keys`` (one access each, object size 1) through a cache of
    ``capacity_blocks`` under ``policy`` and count hits and misses.

    ``keys`` is an integer array or a :class:`PreparedKeys` (remapped once, reused).
    ``params`` go to the policy's ``init`` (e.g. ``{"seed": 1}``); ``n_alt`` is the size of
    the runners-up arrays handed to ``victim`` (0 = none).  With ``record_victims`` the
    evicted dense ids are returned in order (``result.victims``).  Deterministic.
    The built-in ``belady`` runs in a dedicated loop (same victims, see the module
    docstring) unless ``n_alt > 0`` or ``fast_path=False``.
    """
    pol = _resolve(policy)
    if int(capacity_blocks) < 1:
        raise KvsimInputError(f"expected an integer >= 1, got {capacity_blocks!r}", None,
                              None, "capacity_blocks")
    capacity = int(capacity_blocks)
    if not isinstance(keys, PreparedKeys):
        keys = np.asarray(keys)
        if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
            raise KvsimInputError(f"expected a 1-D integer array, got {keys.dtype} with "
                                  f"shape {keys.shape}", None, None, "keys")
    fast_ok = fast_path and int(n_alt) == 0
    belady = fast_ok and _is_builtin_belady(pol)
    loop = _dedicated(pol, capacity, dict(params or {})) if fast_ok and not belady else None
    if belady or loop is not None:
        return _run_dedicated(pol, keys, capacity, loop, record_victims)
    if isinstance(keys, PreparedKeys):
        ids, keys_by_id = keys.ids, keys.keys_by_id
        next_use = keys.next_use if pol.offline else np.zeros(0, np.int64)
    else:
        ids, keys_by_id = remap_keys(keys)
        next_use = (next_use_of(ids, max(int(keys_by_id.shape[0]), 1)) if pol.offline
                    else np.zeros(0, np.int64))
    n_unique = int(keys_by_id.shape[0])
    num_slots = max(n_unique, 1)
    victims = np.zeros(ids.shape[0] if record_victims else 0, np.int64)
    state = pol.init(capacity, num_slots, dict(params or {}))
    view = new_block_view(num_slots)
    view.content_hash[:] = np.arange(1, num_slots + 1, dtype=np.int64)
    alt_blocks = np.zeros(int(n_alt), np.int64)
    alt_scores = np.zeros(int(n_alt), np.float64)
    compiled = pol.compiled and is_uniform(state)  # else the loop's Python twin
    loop = _replay if compiled else _replay.py_func
    hits, misses, evictions, _ = loop(ids, next_use, capacity,
                                      policy_value(pol, state, compiled),
                                      view_ref(view) if compiled else view,
                                      alt_blocks, alt_scores, victims,
                                      np.zeros(num_slots, np.bool_))
    return _result(pol, capacity, ids, n_unique, hits, misses, evictions, victims,
                   record_victims, keys_by_id)


def _run_dedicated(pol, keys, capacity, loop, record_victims) -> CacheResult:
    """A dedicated loop (``loop``, or Belady's when None) on the keys themselves (the remap
    fused into the loop, :mod:`kvsim.cachesim.fast_loops`), or on prepared dense ids."""
    if isinstance(keys, PreparedKeys):
        arr, lo, keys_by_id = keys.ids, 0, keys.keys_by_id
        span = max(int(keys_by_id.shape[0]), 1)
    else:
        arr, lo, span, keys_by_id = fast.key_domain(keys, remap_keys)
    table = fast.new_table(span)
    ahead = fast.prefetch_distance(span)  # prefetch only a table bigger than the L2
    uniq = np.empty(min(int(arr.shape[0]), span), np.int64)
    victims = np.zeros(arr.shape[0] if record_victims else 0, np.int64)
    if loop is None:
        next_use = (keys.next_use if isinstance(keys, PreparedKeys)
                    else fast.next_use_keys(arr, lo, fast.next_use_table(arr.shape[0], span),
                                            ahead))
        hits, misses, evictions, _, n_unique = _replay_belady(arr, lo, table, next_use,
                                                              capacity, victims, uniq, ahead)
    else:
        hits, misses, evictions, _, n_unique = loop(arr, lo, table, victims, uniq, ahead)
    if keys_by_id is None:
        keys_by_id = uniq[:n_unique].copy()
    return _result(pol, capacity, arr, int(keys_by_id.shape[0]), hits, misses, evictions,
                   victims, record_victims, keys_by_id)


def _result(pol, capacity, ids, n_unique, hits, misses, evictions, victims, record_victims,
            keys_by_id) -> CacheResult:
    n = int(ids.shape[0])
    return CacheResult(policy=pol.name, offline=pol.offline, capacity_blocks=capacity,
                       accesses=n, hits=int(hits), misses=int(misses),
                       evictions=int(evictions), unique_keys=n_unique,
                       miss_ratio=(misses / n) if n else 0.0,
                       victims=victims[:evictions] if record_victims else victims,
                       keys_by_id=keys_by_id)


def miss_ratio_curve(keys: np.ndarray, capacities, policy: str | Policy, *,
                     params: dict | None = None) -> pd.DataFrame:
    """Miss ratio at each capacity: DataFrame with columns ``capacity_blocks, accesses,
    hits, misses, miss_ratio`` (one row per capacity, in the given order)."""
    import pandas as pd

    rows = []
    for cap in capacities:
        r = simulate_cache(keys, int(cap), policy, params=params)
        rows.append({"capacity_blocks": r.capacity_blocks, "accesses": r.accesses,
                     "hits": r.hits, "misses": r.misses, "miss_ratio": r.miss_ratio})
    return pd.DataFrame(rows, columns=["capacity_blocks", "accesses", "hits", "misses",
                                       "miss_ratio"])
