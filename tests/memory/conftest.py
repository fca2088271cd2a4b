"""Both pool implementations behind one constructor, so each exact test runs on both."""

from __future__ import annotations

import pytest

from kvsim.memory.fast import PoolConfig
from kvsim.memory.pool_handle import FastPool
from kvsim.memory.reference import KVCacheManager


def make_fast(num_blocks, block_size, enable_caching=True, block_bytes=0, max_tenants=1):
    return FastPool(PoolConfig(num_blocks, block_size, enable_caching=enable_caching,
                               max_seqs=16, max_blocks_per_seq=64, block_bytes=block_bytes,
                               max_tenants=max_tenants, debug=True))


def make_reference(num_blocks, block_size, enable_caching=True, block_bytes=0,
                   max_tenants=1):
    return KVCacheManager(num_blocks, block_size, enable_caching, block_bytes, max_tenants)


def counters(pool) -> dict[str, int]:
    c = pool.counters
    return c() if callable(c) else dict(c)


@pytest.fixture(params=["fast", "reference"])
def make_pool(request):
    return make_fast if request.param == "fast" else make_reference
