"""``optimal``: the offline optimum of a prefix-chained KV cache in cache mode.

Model (cache mode, docs/simulate.md): requests in arrival order; request ``k`` looks up
its chain of full blocks (a hit only while the prefix is unbroken), then may keep any of
its blocks, evicting any others, so that at most ``capacity`` blocks stay cached.  Every
block has the same size, and a hit is worth its tokens (one block = ``block`` tokens).

Algorithm: Belady's MIN with bypass over the flattened block accesses, ties toward the
deeper block.  After a request's lookup, each missing block ``x`` (in chain order) is
kept if the cache has room, or if the cached block used farthest in the future is used
later than ``x`` (that block is evicted); otherwise ``x`` is bypassed and so is the rest
of the chain.  A parent is next used no later than its child (every request that uses the
child uses the parent first), so the farthest-next-use block, ties broken toward depth,
is always a leaf: the cache stays chain-consistent (never a block without its parent)
without any extra rule.  This is kvcache-simulator's ``optimal`` (``policies.py``,
``simulate_trie_policy(optimal=True)``) with next uses counted per block access instead of
per request.

Exactness: for unit-size blocks the hits are maximal over every eviction/bypass schedule
of the model, chain-consistent or not (tests/sim/test_optimum.py: brute force over all
post-request cache states on random prefix-tree traces, hypothesis).  With a warm-up the
solver still optimises the whole trace and reports the measured requests' hits, as
kvcache-simulator does.  It bounds every online policy's cache-mode hits at the same
capacity (those policies make a subset of the same choices).

Productions (the engine-mode bound: a request that looks up only part of its chain, its
capped prompt, and offers the rest, decode-filled blocks, for insertion): a block can
then be dropped and loaded again for free by a request that produces it without looking
it up, so keeping a chain-inconsistent cache can pay (keep a child, let the parent be
re-produced before both are looked up), which chain-order Belady misses (a 6-request
case: 8 hits against brute force's 9).  The solver therefore optimises the relaxation
where blocks are independent: a looked-up block hits whenever it is resident, and
keeping a block pays only up to its next occurrence if that occurrence is a lookup
(:func:`next_uses`).  Belady with bypass is exact for independent unit-size items, and
every schedule of the prefix model is one of the relaxation's with no more hits, so the
result is an upper bound on the prefix model's optimum; with full lookups (cache mode)
Belady's cache stays chain-consistent and the two are equal (both checked against brute
force in tests/sim/test_optimum.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvsim.engine.serial_lowering import CacheStream

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class OptimumResult:
    """Per request (arrival order): hit blocks of its prompt chain."""

    capacity_blocks: int
    hit_blocks: np.ndarray
    evictions: int
    bypassed: int


def next_uses(chain: np.ndarray, is_lookup: np.ndarray | None = None) -> np.ndarray:
    """``out[i]``: when keeping ``chain[i]`` after position ``i`` next pays: the index of the
    block's next occurrence if that occurrence is a *lookup*, NEVER if the block never
    occurs again or its next occurrence is a *production* (a position that only offers it
    for insertion: the block can be loaded there again for free, so holding it until then
    saves nothing).  Every position is a lookup unless ``is_lookup`` says otherwise."""
    out = np.full(len(chain), NEVER, np.int64)
    last: dict[int, int] = {}
    for i in range(len(chain) - 1, -1, -1):
        h = int(chain[i])
        out[i] = last.get(h, NEVER)
        last[h] = i if is_lookup is None or is_lookup[i] else NEVER
    return out


def cache_optimum(stream: CacheStream, capacity_blocks: int) -> OptimumResult:
    """Belady with bypass over ``stream`` (module docstring).  Deterministic."""
    cap = int(capacity_blocks)
    chain = stream.chain
    off = stream.offsets
    look = stream.lookups()
    is_lookup = np.zeros(len(chain), bool)
    for k in range(stream.num_requests):
        is_lookup[off[k]:off[k] + look[k]] = True
    nxt = next_uses(chain, is_lookup)
    key: dict[int, int] = {}  # resident block -> when keeping it next pays
    depth: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, block), lazily deleted
    hits = np.zeros(stream.num_requests, np.int64)
    evictions = bypassed = 0
    for k in range(stream.num_requests):
        a, b = int(off[k]), int(off[k + 1])
        for i in range(a, a + int(look[k])):  # the lookup: every resident looked-up block
            if int(chain[i]) in key:
                hits[k] += 1
        for i in range(a, b):  # refresh what is resident, insert the rest in chain order
            h = int(chain[i])
            x = int(nxt[i])
            if h in key:
                key[h] = x
                heapq.heappush(heap, (-x, -(i - a), h))
                continue
            if x == NEVER:
                bypassed += 1
                continue
            if len(key) >= cap:
                while True:  # the farthest next use (lazy deletion of stale entries)
                    nk, nd, v = heap[0]
                    if key.get(v) == -nk and depth.get(v) == -nd:
                        break
                    heapq.heappop(heap)
                if -nk <= x:  # nothing cached is used later than x: bypass it
                    bypassed += 1
                    continue
                heapq.heappop(heap)
                del key[v]
                del depth[v]
                evictions += 1
            key[h] = x
            depth[h] = i - a
            heapq.heappush(heap, (-x, -(i - a), h))
    return OptimumResult(cap, hits, evictions, bypassed)


def optimum_summary(stream: CacheStream, capacity_blocks: int, warmup: int = 0) -> dict:
    """Hit-rate keys of a cache-mode summary for ``optimal`` (measured after ``warmup``
    requests): ``hbm_hit_rate``/``prefix_hit_rate`` token-weighted, ``block_hit_rate``."""
    res = cache_optimum(stream, capacity_blocks)
    bs = int(stream.block_size_tokens)
    w = max(int(warmup), 0)
    prompt = stream.prompt_tokens[w:]
    hits = res.hit_blocks[w:]
    hit_blk = int(hits.sum())
    # a hit on an identified partial last block is worth its tokens, not a block's
    tails = stream.tails()[w:]
    full_hit = (tails > 0) & (hits == np.diff(stream.offsets)[w:])
    hit_tok = hit_blk * bs - int((bs - tails[full_hit]).sum())
    lookup = int(prompt.sum())
    pblk = int(((prompt + bs - 1) // bs).sum())
    rate = hit_tok / lookup if lookup else float("nan")
    return {"hbm_hit_rate": rate, "prefix_hit_rate": rate, "dram_hit_rate": 0.0,
            "cxl_hit_rate": 0.0, "nvme_hit_rate": 0.0,
            "block_hit_rate": hit_blk / pblk if pblk else float("nan"),
            "hbm_block_hit_rate": hit_blk / pblk if pblk else float("nan"),
            "lookup_tokens": lookup, "hit_tokens": hit_tok, "prompt_blocks": pblk,
            "hit_blocks": hit_blk, "evictions": res.evictions, "evictions_hbm": res.evictions,
            "requests": int(len(prompt)), "warmup_requests": w}


def engine_bound(trace_path, config, facts=None):
    """``optimal`` in engine mode: the offline bound on the event file's fixed schedule
    (:func:`kvsim.engine.serial_lowering.bound_stream_from_events`).  Returns a
    :class:`kvsim.replay.driver.SimResult` whose summary has the engine keys; latency keys
    are NaN (a bound on hits, not a replay).

    * ``hbm_hit_rate`` bounds every policy's HBM hit rate: the optimum with the HBM pool's
      capacity (the replay's HBM content, held or cached, never exceeds it);
    * ``prefix_hit_rate`` bounds hits from any tier: the optimum with the sum of the tier
      capacities (a block counted once however many tiers hold it);
    * ``block_hit_rate`` / ``hbm_block_hit_rate``: the same per block.
    Exact for the schedule in the file; a scheduler that reacts to hits (closed loop,
    issue #15) would change the schedule, so the bound holds for this schedule only.
    Preempted reruns re-produce blocks the entries do not model: with preemptions the
    bound is not guaranteed (``docs/policies.md``)."""
    import pandas as pd

    from kvsim.engine.serial_lowering import bound_stream_from_events
    from kvsim.replay.driver import SimResult, _open, resolve_tiers, scan_trace
    from kvsim.replay.metrics import SUMMARY_KEYS

    with _open(trace_path) as reader:
        header = reader.header
    bs = int(header.block_size_tokens)
    if facts is None:
        facts = scan_trace(trace_path, bs, config.batch_rows)
    _, costs = resolve_tiers(config, header, facts)
    bound = bound_stream_from_events(trace_path, config.batch_rows)
    warmup = config.warmup_count(facts.num_requests)
    measured = set(int(r) for r in facts.measured_requests(warmup))
    take = np.array([adm and int(r) in measured
                     for r, adm in zip(bound.owner, bound.is_admission)], bool)
    lookup = int(sum(bound.prompt_tokens[r] for r in measured if r in bound.prompt_tokens))
    pblk = int(sum((bound.prompt_tokens[r] + bs - 1) // bs for r in measured
                   if r in bound.prompt_tokens))
    hbm_cap = int(costs[0].capacity_blocks)
    total_cap = int(sum(c.capacity_blocks for c in costs))
    hbm = cache_optimum(bound.stream, hbm_cap)
    anyt = hbm if total_cap == hbm_cap else cache_optimum(bound.stream, total_cap)
    h_hbm = int(hbm.hit_blocks[take].sum())
    h_any = int(anyt.hit_blocks[take].sum())
    nan = float("nan")
    s = {k: nan for k in SUMMARY_KEYS}
    rate = lambda x, d: x / d if d else nan  # noqa: E731
    s.update(policy="optimal", offline=True, mode="engine", events=facts.num_rows,
             requests=len(measured), warmup_requests=warmup,
             hbm_hit_rate=rate(h_hbm * bs, lookup), prefix_hit_rate=rate(h_any * bs, lookup),
             block_hit_rate=rate(h_any, pblk), hbm_block_hit_rate=rate(h_hbm, pblk),
             lookup_tokens=lookup, hit_tokens=h_any * bs, prompt_blocks=pblk,
             hit_blocks=h_any, evictions_hbm=hbm.evictions,
             hbm_capacity_blocks=hbm_cap, dram_capacity_blocks=int(costs[1].capacity_blocks),
             cxl_capacity_blocks=int(costs[2].capacity_blocks),
             nvme_capacity_blocks=int(costs[3].capacity_blocks))
    cfg = config.to_dict()
    cfg.update(optimum="offline bound on the fixed schedule of the event file "
               "(kvsim.bounds.optimal.engine_bound): hbm_hit_rate at the HBM capacity, "
               "prefix_hit_rate at the sum of the tier capacities")
    return SimResult("optimal", True, s, pd.DataFrame(), pd.DataFrame(), cfg,
                     str(trace_path), costs, {})
