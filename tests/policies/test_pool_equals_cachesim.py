"""The HBM pool (compiled pool_ops, the replay's allocation/release code) fed one-block
requests that are held and released at once makes the same decisions as the single-tier
simulator: same hits, same victims, for every online built-in policy.  This is the hook
contract's promise (kvsim.policy.api): ``on_hit, on_hold, on_release`` for a hit and
``on_miss, victims, on_insert, on_hold, on_release`` for a miss leave a policy's order as
a single-tier hit / miss would.  (Offline policies read ``next_use``, which only the
replay fills in; the cache-mode reduction test covers them.)"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.cachesim.simulator import simulate_cache
from kvsim.memory.fast import PoolConfig
from kvsim.memory.pool_handle import FastPool
from kvsim.policy.registry import list_policies

ONLINE = [p for p in list_policies() if not p.offline and p.source == "builtin"]


def _keys(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.2, 3000) % 200).astype(np.int64)


def _pool_run(policy, keys, capacity):
    pool = FastPool(PoolConfig(num_blocks=capacity + 1, block_size_tokens=1,
                               max_seqs=2, max_blocks_per_seq=1), order=policy.module)
    hits = 0
    victims = []
    for i, k in enumerate(keys):
        now = float(i)
        seq = pool.open_seq()
        res = pool.allocate(seq, [int(k) + 1], num_tokens=2, now_us=now)  # 1 block may hit
        b = res.blocks[0]
        if res.n_hit:
            hits += 1
            pool.view.access_count[b] += 1
        elif res.evicted_hashes[0] != 0:
            victims.append(res.evicted_hashes[0] - 1)
        pool.view.last_access_us[b] = now
        pool.free(seq, now_us=now)
        pool.close_seq(seq)
    return hits, victims


@pytest.mark.slow
@pytest.mark.parametrize("policy", ONLINE, ids=[p.name for p in ONLINE])
@pytest.mark.parametrize("capacity", [7, 40])
def test_pool_with_one_block_requests_equals_single_tier(policy, capacity):
    keys = _keys(5)
    ref = simulate_cache(keys, capacity, policy, record_victims=True)
    hits, victims = _pool_run(policy, keys, capacity)
    assert hits == ref.hits
    assert victims == [int(x) for x in ref.keys_by_id[ref.victims]]
