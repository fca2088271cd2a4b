"""Miss counts equal libCacheSim 0.3.5's on small streams, algorithm by algorithm.

The streams are written as libCacheSim ``oracleGeneral`` binary traces (the format that
carries each request's next access time, which its Belady needs) and replayed by its C
loop (``process_trace``).  S3-FIFO is compared at capacities >= 20 only: below that
libCacheSim's small queue holds at most one object and its S3-FIFO refuses to cache
anything (documented in docs/policies.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.cachesim.simulator import next_use_of, remap_keys, simulate_cache

lcs = pytest.importorskip("libcachesim", reason="libcachesim (test extra) is not installed")

ORACLE_DTYPE = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                         ("next_access_vtime", "<i8")])
CLASSES = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "arc": "ARC", "sieve": "Sieve",
           "s3fifo": "S3FIFO", "belady": "Belady"}


def write_oracle_trace(keys: np.ndarray, path) -> None:
    ids, _ = remap_keys(keys)
    nxt = next_use_of(ids, int(ids.max()) + 1)
    rec = np.zeros(len(keys), ORACLE_DTYPE)
    rec["clock_time"] = np.arange(len(keys))
    rec["obj_id"] = keys.astype(np.uint64) + 1
    rec["obj_size"] = 1
    rec["next_access_vtime"] = np.where(nxt == np.iinfo(np.int64).max, -1, nxt)
    rec.tofile(path)


def lcs_misses(path, n: int, capacity: int, policy: str) -> int:
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    # hashpower 16: a 64k-bucket table (the default 2^24 buckets costs 128 MB per cache)
    cache = getattr(lcs, CLASSES[policy])(capacity, hashpower=16)
    miss_ratio, _ = cache.process_trace(reader)
    return round(miss_ratio * n)


def streams():
    rng = np.random.default_rng(2024)
    out = []
    for n, universe, alpha in ((3000, 300, 1.1), (5000, 2000, 1.3), (2000, 60, 1.5)):
        out.append((rng.zipf(alpha, n) % universe).astype(np.int64))
    # a scan-heavy stream: loops larger than the cache mixed with a hot set
    out.append(np.concatenate([np.tile(np.arange(150), 6), rng.integers(0, 30, 1500)]))
    return out


@pytest.mark.parametrize("policy", sorted(CLASSES))
def test_miss_counts_equal_libcachesim(policy, tmp_path):
    for i, keys in enumerate(streams()):
        path = tmp_path / f"s{i}.oracleGeneral.bin"
        write_oracle_trace(keys, path)
        caps = (20, 50, 137) if policy == "s3fifo" else (1, 3, 20, 50, 137)
        for cap in caps:
            ours = simulate_cache(keys, cap, policy).misses
            theirs = lcs_misses(path, len(keys), cap, policy)
            assert ours == theirs, f"{policy} stream {i} capacity {cap}"
