"""Deterministic 63-bit content hashes (never Python's per-process randomised ``hash()``).

Two building blocks:

* :func:`mix64` - the SplitMix64 finaliser (Steele, Lea, Flood, "Fast splittable
  pseudorandom number generators", OOPSLA 2014; the constants are those of
  ``java.util.SplittableRandom``), a bijective 64-bit mixer.  Compiled with numba so the
  lowering can chain-hash millions of blocks per second.
* :func:`name_hash` - BLAKE2b-64 of a string (namespaces: a conversation id, a model name).

Chain rule used by the lowering (vLLM's ``hash(parent, tokens, extra_keys)`` with content
ids standing in for tokens)::

    h(block k) = fold(mix64(h(block k-1) ^ K0), ids of the native blocks it overlaps,
                      offset of its first token inside the first of them)
    h(block -1) = mix64(namespace)      # the root ("NONE_HASH") for one hash space

masked to 63 bits, with 0 replaced by 1 (0 is ``NO_HASH``).  Equal hashes therefore mean
equal content ids for every token up to the end of the block: the same prefix.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import njit

MASK63 = np.int64(0x7FFFFFFFFFFFFFFF)
_K0 = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio (SplitMix64 increment)
_M1 = np.uint64(0xBF58476D1CE4E5B9)  # SplitMix64 finaliser multipliers
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def mix64(x):
    """SplitMix64 finaliser of a uint64 (bijective)."""
    z = np.uint64(x) + _K0
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, inline="always")
def finish63(z):
    """uint64 -> int64 in 1 .. 2^63-1 (never NO_HASH = 0)."""
    h = np.int64(z & np.uint64(0x7FFFFFFFFFFFFFFF))
    if h == 0:
        h = np.int64(1)
    return h


@njit(cache=True)
def chain_hash(parent, ids, first, last, offset):
    """Hash of a block whose tokens overlap native ids ``ids[first..last]`` (inclusive),
    starting ``offset`` tokens into ``ids[first]``, chained onto ``parent`` (int64)."""
    z = mix64(np.uint64(parent) ^ _K0)
    for j in range(first, last + 1):
        z = mix64(z ^ mix64(np.uint64(ids[j])))
    z = mix64(z ^ np.uint64(offset))
    return finish63(z)


#: salt of :func:`partial_tag` (any fixed value; ASCII "partial!")
_PARTIAL_SALT = np.uint64(0x7061727469616C21)


@njit(cache=True, inline="always")
def partial_tag(num_tokens):
    """The 63-bit tag a partial block of ``num_tokens`` identified tokens XORs into its
    hash (:func:`partial_hash`)."""
    return finish63(mix64(np.uint64(num_tokens) ^ _PARTIAL_SALT))


@njit(cache=True)
def partial_hash(h, num_tokens):
    """The hash of a *partial* block (``num_tokens`` below the block size) whose tokens the
    trace identifies only by the id of the full block they start (Mooncake's last hash id):
    ``h`` (the id's chain hash) XOR a tag of the token count.  So it matches no full block
    (vLLM hashes only full blocks; once decode fills the block its content is the prompt
    tail plus output tokens, which no full prompt block holds), only the same partial
    block of another request (same id, same token count)."""
    v = np.int64(h) ^ partial_tag(num_tokens)
    if v == 0:
        v = np.int64(1)
    return v


@njit(cache=True)
def root_hash(namespace):
    """The chain root (vLLM's NONE_HASH) of one hash space."""
    return finish63(mix64(np.uint64(namespace)))


def name_hash(name: str) -> int:
    """Deterministic 63-bit id of a string (BLAKE2b, 8-byte digest), never 0."""
    value = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(),
                           "little") & 0x7FFFFFFFFFFFFFFF
    return value or 1


@njit(cache=True)
def token_block_ids(tokens, block_size, namespace):
    """Chain ids of the FULL ``block_size``-token blocks of a token-id sequence (vLLM's
    rule: the trailing partial block gets no id).  ``namespace`` seeds the root."""
    nfull = tokens.shape[0] // block_size
    out = np.empty(nfull, dtype=np.int64)
    h = root_hash(namespace)
    for b in range(nfull):
        z = mix64(np.uint64(h) ^ _K0)
        for i in range(b * block_size, (b + 1) * block_size):
            z = mix64(z ^ np.uint64(tokens[i]))
        h = finish63(z)
        out[b] = h
    return out


@njit(cache=True)
def namespaced_ids(namespace, raw):
    """Map a trace's local ids into one namespace: ``mix64(namespace ^ mix64(id))``, 63-bit,
    never 0.  Equal outputs <=> equal (namespace, id) pairs (up to 63-bit collisions)."""
    out = np.empty(raw.shape[0], dtype=np.int64)
    for i in range(raw.shape[0]):
        out[i] = finish63(mix64(np.uint64(namespace) ^ mix64(np.uint64(raw[i]))))
    return out
