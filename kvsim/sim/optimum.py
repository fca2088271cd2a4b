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
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvsim.ingest.serial import CacheStream

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class OptimumResult:
    """Per request (arrival order): hit blocks of its prompt chain."""

    capacity_blocks: int
    hit_blocks: np.ndarray
    evictions: int
    bypassed: int


def next_uses(chain: np.ndarray) -> np.ndarray:
    """``out[i]``: index of the next access to ``chain[i]`` after ``i`` (NEVER if none)."""
    out = np.full(len(chain), NEVER, np.int64)
    last: dict[int, int] = {}
    for i in range(len(chain) - 1, -1, -1):
        h = int(chain[i])
        out[i] = last.get(h, NEVER)
        last[h] = i
    return out


def cache_optimum(stream: CacheStream, capacity_blocks: int) -> OptimumResult:
    """Belady with bypass over ``stream`` (module docstring).  Deterministic."""
    cap = int(capacity_blocks)
    chain = stream.chain
    off = stream.offsets
    nxt = next_uses(chain)
    key: dict[int, int] = {}  # resident block -> its next use
    depth: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, block), lazily deleted
    hits = np.zeros(stream.num_requests, np.int64)
    evictions = bypassed = 0
    for k in range(stream.num_requests):
        a, b = int(off[k]), int(off[k + 1])
        j = a
        while j < b and int(chain[j]) in key:  # the prefix lookup
            h = int(chain[j])
            key[h] = int(nxt[j])
            heapq.heappush(heap, (-key[h], -(j - a), h))
            j += 1
        hits[k] = j - a
        for i in range(j, b):  # the insertions, in chain order
            h = int(chain[i])
            if h in key:  # resident past a miss (only if the cache was not chain-consistent)
                key[h] = int(nxt[i])
                heapq.heappush(heap, (-key[h], -(i - a), h))
                continue
            x = int(nxt[i])
            if x == NEVER:
                bypassed += b - i
                break
            if len(key) >= cap:
                while True:  # the farthest next use (lazy deletion of stale entries)
                    nk, nd, v = heap[0]
                    if key.get(v) == -nk and depth.get(v) == -nd:
                        break
                    heapq.heappop(heap)
                if -nk <= x:  # nothing cached is used later than x: bypass it
                    bypassed += b - i
                    break
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
    hit_blk = int(res.hit_blocks[w:].sum())
    lookup = int(prompt.sum())
    pblk = int(((prompt + bs - 1) // bs).sum())
    rate = hit_blk * bs / lookup if lookup else float("nan")
    return {"hbm_hit_rate": rate, "prefix_hit_rate": rate, "dram_hit_rate": 0.0,
            "cxl_hit_rate": 0.0, "nvme_hit_rate": 0.0,
            "block_hit_rate": hit_blk / pblk if pblk else float("nan"),
            "hbm_block_hit_rate": hit_blk / pblk if pblk else float("nan"),
            "lookup_tokens": lookup, "hit_tokens": hit_blk * bs, "prompt_blocks": pblk,
            "hit_blocks": hit_blk, "evictions": res.evictions, "evictions_hbm": res.evictions,
            "requests": int(len(prompt)), "warmup_requests": w}
