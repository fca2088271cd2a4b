"""Hit-rate-versus-capacity curves in one pass over a block stream (stack distances).

A *stack policy* (Mattson et al. 1970, "Evaluation techniques for storage hierarchies")
has the inclusion property: the cache of size ``C`` always holds a subset of the cache of
size ``C + 1``.  Each access then has a *stack distance* ``d`` (1-based position of the key
in the policy's priority stack, ``0`` = not in the stack = cold miss) and it hits in every
cache of size ``>= d``.  One pass over the stream gives every capacity at once:
``hits(C) = #{accesses with 1 <= d <= C}``.

- ``lru``: the stack is ordered by recency; ``d`` = number of distinct keys accessed since
  the previous access of the same key, that key included.  Computed in O(N log N) with a
  Fenwick tree over access times holding a 1 at each key's latest access.
- ``belady``: Mattson's OPT stack (demand paging, Belady's MIN: on a miss the resident key
  whose next use is farthest is evicted; the missed key is always inserted).  The stack is
  ordered by *priority* (sooner next use = higher).  On an access to ``x`` at depth ``d``,
  ``x`` goes on top and the old entries ``1..d-1`` are re-sorted by carrying the lowest
  priority seen so far downwards: at each position the higher-priority of (carried, resident)
  stays, the other is carried on; the carried key lands in ``x``'s old slot ``d`` (or at the
  bottom on a miss).  Keys never used again have the lowest priority; once one is carried,
  every later slot keeps its key, so the walk stops there and lands the carry at ``d``
  (``pos`` gives ``d`` in O(1)).  Worst case O(N x distinct keys); on real KV streams, where
  many blocks are used once, the walk is short.  Both curves equal
  :func:`kvsim.cachesim.simulator.simulate_cache` miss counts exactly at every capacity
  (tests/sweep/test_mrc.py).

Sampled mode (SHARDS, Waldspurger et al., FAST'15, "Efficient MRC Construction with
SHARDS"): keep the accesses of a key iff ``hash(key) mod P < R * P`` (spatial sampling: a
key is in or out for the whole trace), compute stack distances of the sampled stream and
scale them by ``1 / R``.  ``adjust=True`` applies SHARDS_adj: the difference between the
expected (``R * N``) and the actual number of sampled accesses is added to the first
distance bucket.  Measured error on the Mooncake conversation trace: docs/sweep.md.

The block stream (what a "key" is) for an event file: :func:`block_stream` -- the
``content_hash`` of every ALLOCATE row of a FULL block with a hash, in file order.  These
are exactly the blocks the tiered replay can find in its prefix cache; docs/sweep.md says
where the curve and the replay's HBM hit rate coincide and where they do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numba import njit

from kvsim.cachesim.simulator import next_use_of, remap_keys
from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.schema import NO_HASH, EventKind

#: Policies with a one-pass curve (stack algorithms).
STACK_POLICIES = ("lru", "belady")
#: Modulus of SHARDS' spatial hash test (Waldspurger et al. use P = 2^24).
SHARDS_MODULUS = 1 << 24
#: Columns of the DataFrame :func:`hit_curve` returns.
CURVE_COLUMNS = ("policy", "capacity_blocks", "accesses", "hits", "misses", "hit_rate",
                 "miss_ratio", "sample_rate")

_NEVER = np.iinfo(np.int64).max  # == kvsim.policy.api.NEVER


# ----------------------------------------------------------------------------------------
# Stack distances (compiled)
# ----------------------------------------------------------------------------------------

@njit(cache=True)
def lru_stack_distances(ids, n_unique):
    """``out[i]`` = LRU stack distance of access ``i`` (1-based), 0 for a first access.

    ``ids`` are dense ids ``0..n_unique-1``.  Fenwick tree over access times: a 1 marks the
    latest access of every key, so the distance is the number of marks in ``[prev, i)``.
    """
    n = ids.shape[0]
    tree = np.zeros(n + 1, np.int64)
    last = np.full(n_unique, -1, np.int64)
    out = np.zeros(n, np.int64)
    marks = 0  # marks in [0, i): one per distinct key seen so far
    for i in range(n):
        x = ids[i]
        p = last[x]
        if p >= 0:
            # prefix(p - 1): marks strictly before p
            s = 0
            j = p
            while j > 0:
                s += tree[j]
                j -= j & (-j)
            out[i] = marks - s
            j = p + 1
            while j <= n:
                tree[j] -= 1
                j += j & (-j)
            marks -= 1
        j = i + 1
        while j <= n:
            tree[j] += 1
            j += j & (-j)
        marks += 1
        last[x] = i
    return out


@njit(cache=True)
def opt_stack_distances(ids, next_use, n_unique):
    """``out[i]`` = OPT (Belady MIN, demand paging) stack distance of access ``i``, 0 for a
    first access.  ``next_use[i]`` is the index of the next access to ``ids[i]`` (NEVER if
    none), as :func:`kvsim.cachesim.simulator.next_use_of` computes.

    Invariant after every access: ``stk[0:depth]`` is the priority stack (``stk[:C]`` is
    MIN's cache of size C for every C), ``pos[stk[k]] == k``.
    """
    n = ids.shape[0]
    stk = np.empty(max(n_unique, 1), np.int64)
    pos = np.full(n_unique, -1, np.int64)
    prio = np.full(n_unique, _NEVER, np.int64)  # next use of the key (smaller = keep)
    out = np.zeros(n, np.int64)
    depth = 0
    for i in range(n):
        x = ids[i]
        d = pos[x]
        if d >= 0:
            out[i] = d + 1
        else:
            d = depth
            depth += 1
        prio[x] = next_use[i]
        if d == 0:
            stk[0] = x
            pos[x] = 0
            continue
        carry = stk[0]
        stk[0] = x
        pos[x] = 0
        k = 1
        while k < d and prio[carry] != _NEVER:
            s = stk[k]
            if prio[s] > prio[carry]:  # s is used later: it is carried down, carry stays
                stk[k] = carry
                pos[carry] = k
                carry = s
            k += 1
        stk[d] = carry
        pos[carry] = d
    return out


@njit(cache=True)
def _splitmix64(x):
    x = (x + np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _shards_mask(keys, threshold, modulus, seed):
    out = np.empty(keys.shape[0], np.bool_)
    s = np.uint64(seed) * np.uint64(0xD1B54A32D192ED03)
    for i in range(keys.shape[0]):
        h = _splitmix64(np.uint64(keys[i]) ^ s)
        out[i] = (h % np.uint64(modulus)) < np.uint64(threshold)
    return out


def shards_mask(keys: np.ndarray, rate: float, seed: int = 0) -> np.ndarray:
    """Boolean mask of the accesses SHARDS keeps at sampling rate ``rate`` (0 < rate <= 1):
    every access of a key is kept or dropped together (a hash of the key, seeded)."""
    if not 0.0 < rate <= 1.0:
        raise bad_value(None, None, "sample_rate", "a rate in (0, 1]", rate)
    threshold = int(round(rate * SHARDS_MODULUS))
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    return _shards_mask(keys, max(threshold, 1), SHARDS_MODULUS, int(seed) & 0xFFFFFFFF)


# ----------------------------------------------------------------------------------------
# Curves
# ----------------------------------------------------------------------------------------

def stack_distances(keys: np.ndarray, policy: str) -> np.ndarray:
    """Stack distance of every access of ``keys`` under ``policy`` (``lru`` | ``belady``);
    0 marks a first access (a miss at every capacity)."""
    if policy not in STACK_POLICIES:
        raise bad_value(None, None, "policy", " | ".join(STACK_POLICIES) +
                        " (stack policies with a one-pass curve)", policy)
    ids, keys_by_id = remap_keys(np.asarray(keys, dtype=np.int64))
    n_unique = int(keys_by_id.shape[0])
    if policy == "lru":
        return lru_stack_distances(ids, n_unique)
    return opt_stack_distances(ids, next_use_of(ids, n_unique), n_unique)


@dataclass(frozen=True)
class DistanceHistogram:
    """Counts of stack distances: ``hits(C) = counts[1:C+1].sum()`` (scaled in sampled mode).

    ``accesses`` is the stream length the curve describes (for SHARDS: the full stream's,
    estimated as sampled / rate); ``scale`` is ``1 / rate``.
    """

    policy: str
    counts: np.ndarray  # counts[d] = accesses with distance d (index 0: cold misses)
    accesses: float
    sampled_accesses: int
    sample_rate: float
    adjustment: float  # SHARDS_adj correction added to the first bucket (0 when exact)

    def hits_at(self, capacities: Sequence[int]) -> np.ndarray:
        """Hits (exact counts when unsampled; estimates scaled to the full stream)."""
        cum = np.cumsum(self.counts) - self.counts[0]  # cum[d] = accesses with 1 <= dist <= d
        caps = np.asarray(capacities, dtype=np.float64)
        # scaled distance d / rate <= C  <=>  d <= floor(C * rate)
        idx = np.floor(caps * self.sample_rate + 1e-9).astype(np.int64)
        idx = np.clip(idx, 0, len(cum) - 1)
        hits = cum[idx].astype(np.float64)
        hits = np.where(idx >= 1, hits + self.adjustment, hits)
        return np.clip(hits / self.sample_rate, 0.0, self.accesses)


def distance_histogram(keys: np.ndarray, policy: str, sample_rate: float = 1.0,
                       seed: int = 0, adjust: bool = True) -> DistanceHistogram:
    """Histogram of stack distances of ``keys`` under ``policy``; with ``sample_rate < 1``
    only the SHARDS sample of the keys is simulated (see the module docstring)."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if keys.ndim != 1:
        raise bad_value(None, None, "keys", "a 1-D integer array", keys.shape)
    n = int(keys.shape[0])
    rate = float(sample_rate)
    sampled = keys
    if rate < 1.0:
        sampled = keys[shards_mask(keys, rate, seed)]
    elif rate != 1.0:
        raise bad_value(None, None, "sample_rate", "a rate in (0, 1]", rate)
    dist = stack_distances(sampled, policy)
    counts = np.bincount(dist, minlength=2).astype(np.int64)
    adj = 0.0
    if rate < 1.0 and adjust:
        adj = rate * n - len(sampled)
    return DistanceHistogram(policy, counts, float(n), int(len(sampled)), rate, adj)


def hit_curve(keys: np.ndarray, capacities: Iterable[int], policies: Sequence[str] = ("lru",
              "belady"), sample_rate: float = 1.0, seed: int = 0,
              adjust: bool = True) -> pd.DataFrame:
    """Hit rate at every capacity (in blocks) for each stack policy, in one pass per policy.

    Returns a DataFrame with :data:`CURVE_COLUMNS`, one row per (policy, capacity) in the
    given orders.  Unsampled, ``hits``/``misses`` are exact integers equal to
    ``simulate_cache(keys, C, policy)``; sampled, they are estimates (floats rounded to
    integers) and ``sample_rate`` says so.
    """
    caps = [int(c) for c in capacities]
    for c in caps:
        if c < 1:
            raise bad_value(None, None, "capacity_blocks", "integers >= 1", c)
    rows = []
    for pol in policies:
        h = distance_histogram(keys, pol, sample_rate, seed, adjust)
        hits = h.hits_at(caps)
        n = int(round(h.accesses))
        for c, hv in zip(caps, hits):
            hv_i = int(round(float(hv)))
            rows.append({"policy": pol, "capacity_blocks": c, "accesses": n, "hits": hv_i,
                         "misses": n - hv_i,
                         "hit_rate": (float(hv) / h.accesses) if h.accesses else 0.0,
                         "miss_ratio": (1.0 - float(hv) / h.accesses) if h.accesses else 0.0,
                         "sample_rate": float(sample_rate)})
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


# ----------------------------------------------------------------------------------------
# Block streams
# ----------------------------------------------------------------------------------------

def block_stream(trace_path: str | Path, batch_rows: int = 1 << 20) -> np.ndarray:
    """The key stream of an event file: ``content_hash`` of every ALLOCATE row of a FULL
    block (``num_tokens == block_size_tokens``) with a hash (``!= NO_HASH``), in file order.

    This is the stream of blocks the replay's prefix cache can hit: partial and unhashed
    blocks are never shared (vLLM hashes full blocks only), so they would only add cold
    misses.  Streams the file; the result holds 8 bytes per such row.
    """
    from kvsim.events import open_events

    parts: list[np.ndarray] = []
    with open_events(trace_path) as reader:
        bs = int(reader.header.block_size_tokens)
        for cols in reader.batches(batch_rows):
            sel = ((cols["kind"] == EventKind.ALLOCATE) & (cols["content_hash"] != NO_HASH)
                   & (cols["num_tokens"] == bs))
            if sel.any():
                parts.append(cols["content_hash"][sel].astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def mooncake_block_stream(path: str | Path) -> np.ndarray:
    """``hash_ids`` of a Mooncake JSONL request trace, request by request, in file order
    (one key per 512-token block; the ids are prefix-chain ids, so equal ids mean equal
    prefixes).  Used to measure SHARDS' error on the real trace (docs/sweep.md)."""
    import json

    from kvsim.core.fsutil import open_text

    out: list[int] = []
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                ids = json.loads(line)["hash_ids"]
            except (ValueError, KeyError, TypeError):
                raise KvsimInputError("expected a JSON object with a 'hash_ids' list",
                                      path, f"line {lineno}", "hash_ids") from None
            if not isinstance(ids, list) or not all(isinstance(v, int) for v in ids):
                raise bad_value(path, f"line {lineno}", "hash_ids", "a list of integers",
                                ids if not isinstance(ids, list) else ids[:3])
            out.extend(ids)
    return np.asarray(out, dtype=np.int64)


__all__ = ["STACK_POLICIES", "CURVE_COLUMNS", "DistanceHistogram", "block_stream",
           "distance_histogram", "hit_curve", "lru_stack_distances", "mooncake_block_stream",
           "opt_stack_distances", "shards_mask", "stack_distances"]
