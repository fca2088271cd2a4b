"""Speculative decoding in vLLM's scheduler step (:mod:`kvsim.engine.vllm_step`): how many
of a request's scheduled draft tokens the target model accepts.

vLLM's rejection sampler accepts a prefix of the drafts: draft ``j`` counts only when
drafts ``0 .. j-1`` were accepted.  kvsim draws each draft's acceptance deterministically
from ``(seed, request, tokens generated before the step, j)`` with the same counter-based
uniform as kvsim's own scheduler (:func:`kvsim.engine.scheduler_blocks._uniform`: SplitMix64
of the four, 53 bits): draft ``j`` is accepted when ``u < p``, ``p`` the request's
``spec_accept_prob``.  So the same trace and seed give the same accepted counts under both
schedulers; ``p = 1`` accepts every draft, ``p = 0`` none.  docs/simulate.md,
"Speculative decoding under vLLM's scheduler".

``p`` is carried in the scheduler's int64 request table as ``ceil(p * 2**53)``
(:func:`acceptance_units`): ``u = m / 2**53`` with ``m`` an integer, so ``u < p`` exactly
when ``m < ceil(p * 2**53)``.
"""

from __future__ import annotations

import numpy as np

from kvsim.ingest.hashing import mix64
from kvsim.jit.decorators import njit

#: 2**53: the uniform's resolution (53 bits of SplitMix64, as kvsim's scheduler draws)
UNITS = 1 << 53


def acceptance_units(p) -> np.ndarray:
    """``ceil(p * 2**53)`` per request (int64); ``p`` in [0, 1] (clipped), NaN refused
    (ValueError, as ``math.ceil`` refuses it).  Exact in floating point: ``p * 2**53``
    only shifts the exponent, and its ceiling is an integer <= 2**53 (one numpy pass: a
    Python loop per request cost ~2 ms per replica on the Mooncake trace)."""
    p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    if np.isnan(p).any():
        raise ValueError("cannot convert float NaN to integer")
    return np.asarray(np.ceil(p * UNITS)).astype(np.int64)


@njit(cache=True)
def accepted_drafts(seed, i, gen, drafts, units):
    """How many of ``drafts`` scheduled draft tokens request ``i`` accepts in the step
    after it generated ``gen`` tokens: the accepted prefix (module docstring)."""
    a = 0
    while a < drafts:
        z = mix64(np.uint64(seed) ^ mix64(np.uint64(i) ^ mix64(np.uint64(gen * 64 + a))))
        if np.int64(z >> np.uint64(11)) >= units:
            break
        a += 1
    return a


_MASK = (1 << 64) - 1


def _py_mix64(x: int) -> int:
    """SplitMix64's finaliser in plain Python integers (the witness of ``mix64``)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def py_uniform_m(seed: int, i: int, gen: int, j: int) -> int:
    """The 53-bit integer ``m`` of draft ``j``'s uniform ``u = m / 2**53`` (plain Python;
    :func:`accepted_drafts` draws the same)."""
    z = _py_mix64((seed & _MASK) ^ _py_mix64((i & _MASK) ^ _py_mix64((gen * 64 + j) & _MASK)))
    return z >> 11
