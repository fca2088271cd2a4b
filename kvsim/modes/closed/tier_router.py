"""The ``tiered`` router: KV-aware routing that prices a cached prefix by where it sits.

Dynamo's KV router (the ``prefix`` router, :mod:`kvsim.modes.closed.cluster`) scores a replica
by ``overlap_weight x (prompt blocks - cached prefix blocks) + active blocks``: a block
cached in host memory or in a shared store counts like one in HBM, although it costs a
transfer (llm-d router issue #1952 asks for exactly this weighting).  ``tiered`` keeps
the same form and units (blocks of prefill work) but charges each cached block what it
costs to use it, relative to recomputing it:

    cost_w = (prompt blocks - cached_w)                        recomputed blocks
           + sum over lower tiers t of n_tw x xfer_t / r       promoted blocks
           + sum over tiers t with n_tw > 0 of (lat_t + backlog_tw) / r
           + active_blocks_w                                   load (as ``prefix``)

where ``cached_w`` is the longest chain of the prompt's blocks cached on replica ``w``
(HBM, then the lower tiers, or the cluster's shared tier: the admission lookup),
``n_tw`` how many of them sit in lower tier ``t`` (0 = HBM: free), ``xfer_t`` = block
bytes / the tier's up bandwidth (its link's, the slowest hop), ``lat_t`` the tier's
latency (once per batch), ``backlog_tw`` how long replica ``w``'s link to tier ``t`` is
still busy with transfers already queued (``--link-model queue``; 0 otherwise), and ``r``
the prefill time of one block (:func:`kvsim.engine.timing.step_time.prefill_cost_us` of
one block at position 0, the step-time model's marginal cost).  The lowest cost wins;
ties: fewest outstanding requests, then lowest index (as ``prefix``).
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.engine import scheduler as S
from kvsim.engine.scheduler_blocks import _cached_prefix
from kvsim.engine.timing.step_time import prefill_cost_us

#: An empty lower-tier table (tiers.hash_slot needs a power of two of entries): the HBM
#: part of the admission lookup alone.
_NO_LOWER = np.zeros(4, dtype=np.int64)


def placement(e, hb: np.ndarray, nb: int, prompt_tokens: int, B: int) -> tuple[int, list]:
    """(HBM prefix blocks, [blocks in tier 1, 2, 3]) of a prompt on engine ``e``."""
    from kvsim.jit.disk_cache import setup_func
    from kvsim.replay.kernel.tiers import hash_slot
    from kvsim.replay.variants import runs_interpreted as interpreted

    sc = e.sched
    phk, phv, tk = sc.lookup
    rk = sc.slot_args[20]
    python = interpreted([e])  # the interpreted engine: Python while cold
    cached_prefix, slot = (setup_func(f, python) for f in (_cached_prefix, hash_slot))
    n_hbm = int(cached_prefix(hb, nb, prompt_tokens, B, rk, phk, phv, _NO_LOWER))
    total = int(cached_prefix(hb, nb, prompt_tokens, B, rk, phk, phv, tk))
    per_tier = [0, 0, 0]
    for k in range(n_hbm, total):
        i = int(slot(tk, hb[k]))
        per_tier[(int(tk[i + 1]) & 3) - 1] += 1
    return n_hbm, per_tier


def route(engines: list, hb: np.ndarray, nb: int, prompt_tokens: int, B: int,
          waiting_blocks: list, load: list) -> int:
    """The replica ``tiered`` picks (see the module's docstring)."""
    from kvsim.jit.disk_cache import setup_func
    from kvsim.replay.variants import runs_interpreted as interpreted

    best, best_key = 0, None
    block_us = setup_func(prefill_cost_us, interpreted(engines))  # Python while cold
    for w, e in enumerate(engines):
        n_hbm, per_tier = placement(e, hb, nb, prompt_tokens, B)
        r = max(float(block_us(e.sched.fp, 0, B)), 1e-9)
        X = e.run.X
        now = e.clock_us
        cost = float(nb - n_hbm - sum(per_tier))
        for t, n in enumerate(per_tier, start=1):
            if n:
                backlog = max(0.0, float(X[t, L.X_UP_FREE_US]) - now)
                cost += (n * e.block_bytes / X[t, L.X_UP_BYTES_PER_US]
                         + X[t, L.X_UP_LAT_US] + backlog) / r
        active = int(e.sched.st[S.S_HELD]) + waiting_blocks[w]
        key = (cost + active, load[w], w)
        if best_key is None or key < best_key:
            best, best_key = w, key
    return best
