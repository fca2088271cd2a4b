"""Prefetch of spilled live blocks in the live-offload mode: a policy decision within a
per-step link budget (docs/cost-model.md, "Live offload: prefetch").

After a step's rows, the policy's optional hook ``prefetch_rank(view, u, now_us) -> float``
(kvsim/policy/api.py; smaller = needed sooner, ``inf`` = do not prefetch) ranks every
running request that has spilled blocks, on the view of that request's unit.  Requests are
served in rank order (ties: request id), each request's spilled blocks in the order they
were spilled, while the link budget lasts:

* **Budget.** The transfers run beside the step's compute (copy engines overlap compute,
  as the demotions of docs/cost-model.md), so each lower tier's link may carry, per step,
  ``max(0, duration_us - latency_t) x up_bandwidth_t`` bytes (one batched DMA per tier per
  step: its latency once).  A block that fits is in HBM before the next step starts:
  its transfer is hidden.
* **Room.** A free HBM slot, else the policy's victim (the same ``victim`` hook as demand
  fetches), but only when the victim is needed *later* than the block it would make room
  for: ``prefetch_rank(victim) > prefetch_rank(request)``; otherwise prefetching stops
  for this step (bringing a block back by spilling a more urgent one is a loss), as it
  stops when the victim is a request with prefetched blocks it has not read yet.
* **Accounting.** ``prefetches`` (issued, one per block); ``prefetches_useful``: the
  block's request read it while it was still in HBM; ``prefetches_wasted``: it was spilled
  again, or its request released it, before that read.  Useful + wasted <= issued (the
  rest were still waiting when the trace ended).

Policies without ``prefetch_rank`` (lru, fifo, lfu, sieve, arc, s3fifo, vllm, hotcold,
predictive: no foresight of when a request runs next) fetch on demand only.
``SimConfig.prefetch = False`` (``--no-prefetch``) turns prefetch off for every policy.
"""

from __future__ import annotations

import math


def prefetch_step(rep, duration_us: float) -> None:
    """Issue this step's prefetches on :class:`kvsim.modes.live.live_offload.LiveReplay` ``rep``."""
    rank_fn = rep.prefetch_rank
    if rank_fn is None or not rep.has_spilled:
        return
    budget = [0.0, 0.0, 0.0, 0.0]
    for t in (1, 2, 3):
        c = rep.costs[t]
        if c.capacity_blocks > 0:
            budget[t] = max(0.0, duration_us - c.up_latency_us) * c.up_bytes_per_s / 1e6
    ranked = []
    for r in rep.has_spilled:
        sp = rep.spilled[r]
        b = next(iter(sp))
        u = rep._unit(r, rep.b_cls[b])
        rep._fill_unit(u, b)
        rank = float(rank_fn(rep.view, u, rep.now_us))
        if not math.isinf(rank) and not math.isnan(rank):
            ranked.append((rank, r))
    ranked.sort()
    bb = rep.block_bytes
    for rank, r in ranked:
        if budget[1] < bb and budget[2] < bb and budget[3] < bb:
            return  # every link's budget is spent: nothing more can move this step
        for b in list(rep.spilled[r]):
            t = rep.b_tier[b]
            if t <= 0 or budget[t] < bb:
                continue
            if not rep.free_slots and not _displace(rep, rank_fn, r, rank):
                return
            slot = rep.free_slots.pop()
            budget[t] -= bb
            if budget[t] < bb and budget[1] < bb and budget[2] < bb and budget[3] < bb:
                _issue(rep, b, slot)
                return
            _issue(rep, b, slot)


def _issue(rep, b: int, slot: int) -> None:
    """Prefetch spilled block ``b`` into free ``slot``."""
    rep._fetch(b, slot)
    rep.b_pf[b] = True
    for h in rep.b_holders[b]:
        rep.pf_unused[h].add(b)
    rep.c["prefetches"] += 1


def _displace(rep, rank_fn, r: int, rank: float) -> bool:
    """Free one HBM slot for request ``r``'s prefetch if the policy's victim is needed later
    than ``r``; False (nothing done) otherwise."""
    for cls in (0, 1):
        p = rep.pols[cls]
        if p.size == 0:
            continue
        u, _, _ = rep.hooks.victim(p.state, rep.hook_view, rep.now_us, rep_alt(), rep_alt_s())
        u = int(u)
        if u < 0:
            continue
        if u >= rep.C and ((u - rep.C) // 2 == r or rep.pf_unused[(u - rep.C) // 2]):
            return False  # never displace r itself, nor blocks prefetched and not yet used
        if not float(rank_fn(rep.view, u, rep.now_us)) > rank:
            return False
        if u < rep.C:
            b = rep.slot_block[u]
            rep._remove(u, cls)
            rep._drop_cached(b)
            rep.c["evictions_hbm"] += 1
        else:
            rv = (u - rep.C) // 2
            rep._spill(rep.stack[rv][cls][-1])
        return True
    return False


def rep_alt():
    from kvsim.modes.live.live_offload import _ALT

    return _ALT


def rep_alt_s():
    from kvsim.modes.live.live_offload import _ALT_S

    return _ALT_S
