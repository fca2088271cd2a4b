"""CPU copy kernels over the combined K/V pool (numba, compiled once, cached on disk).

The pool kernels move whole blocks across every layer and both K and V in one call; the pool is
``(layers, 2, pool_blocks, chunk_words)``, the block store (host tier, staging buffer) is
``(store_blocks, layers, 2, chunk_words)``.  Each copies exactly ``ids.size`` blocks and
writes nothing else.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _copy_words(src, dst):  # pragma: no cover - compiled
    """``dst[:] = src[:]`` for one (layer, K|V) chunk of a block."""
    for w in range(src.shape[0]):
        dst[w] = src[w]


@njit(cache=True)
def pool_to_store(pool, block_ids, store, store_slots):  # pragma: no cover - compiled
    """``store[store_slots[i], l, kv, :] = pool[l, kv, block_ids[i], :]`` for all i, l, kv."""
    for i in range(block_ids.size):
        for layer in range(pool.shape[0]):
            for kv in range(2):
                _copy_words(pool[layer, kv, block_ids[i]], store[store_slots[i], layer, kv])


@njit(cache=True)
def store_to_pool(store, store_slots, pool, block_ids):  # pragma: no cover - compiled
    """``pool[l, kv, block_ids[i], :] = store[store_slots[i], l, kv, :]`` for all i, l, kv."""
    for i in range(block_ids.size):
        for layer in range(pool.shape[0]):
            for kv in range(2):
                _copy_words(store[store_slots[i], layer, kv], pool[layer, kv, block_ids[i]])


@njit(cache=True)
def store_to_store(src, src_slots, dst, dst_slots):  # pragma: no cover - compiled
    """``dst[dst_slots[i]] = src[src_slots[i]]`` (whole blocks) for all i."""
    for i in range(src_slots.size):
        for layer in range(src.shape[1]):
            for kv in range(2):
                _copy_words(src[src_slots[i], layer, kv], dst[dst_slots[i], layer, kv])


@njit(cache=True)
def fill_splitmix(flat, seed):  # pragma: no cover - compiled
    """``flat[i] = splitmix64(seed * 2**32 + i)`` truncated to the word width (Steele,
    Lea, Flood: "Fast splittable pseudorandom number generators", OOPSLA 2014)."""
    base = np.uint64(seed) * np.uint64(0x100000000)
    for i in range(flat.size):
        z = base + np.uint64(i) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        flat[i] = z ^ (z >> np.uint64(31))
