"""Measure the compiled pool's speed on a synthetic shared-prefix workload.

``python -m kvsim.memory.throughput`` prints block operations per second of the compiled
core (:mod:`kvsim.memory.pool_ops` under vLLM's order) and of the plain-Python reference
on the same request stream, and their ratio, all measured in one run.  Timing is printed,
never asserted in tests.

The workload (deterministic, explicit ``numpy.random.Generator``): requests draw a prefix
family (Zipf-like over ``num_families``), a shared prefix of ``prefix_blocks`` and a
private tail of up to ``max_private_blocks``; at most ``max_running`` are resident; the
oldest finishes first.  A "block operation" is one block allocated (hit or new) or
released.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from kvsim.memory import fast, pool_ops
from kvsim.memory.pool_handle import FastPool


@dataclass(frozen=True)
class Throughput:
    requests: int
    block_ops: int
    fast_block_ops_per_s: float
    reference_block_ops_per_s: float
    hit_tokens: int
    query_tokens: int

    @property
    def speedup(self) -> float:
        return self.fast_block_ops_per_s / self.reference_block_ops_per_s


def make_workload(num_requests: int, seed: int = 0, num_families: int = 64,
                  prefix_blocks: int = 8, max_private_blocks: int = 24):
    """Hashes of every request's blocks, as a padded 2D int64 array + lengths."""
    rng = np.random.default_rng(seed)
    width = prefix_blocks + max_private_blocks
    hashes = np.zeros((num_requests, width), dtype=np.int64)
    lengths = np.zeros(num_requests, dtype=np.int64)
    weights = 1.0 / np.arange(1, num_families + 1)
    weights /= weights.sum()
    fam = rng.choice(num_families, size=num_requests, p=weights)
    private = rng.integers(1, max_private_blocks + 1, size=num_requests)
    for r in range(num_requests):
        f = int(fam[r])
        hashes[r, :prefix_blocks] = (f + 1) * 1_000_003 + np.arange(1, prefix_blocks + 1)
        n = prefix_blocks + int(private[r])
        hashes[r, prefix_blocks:n] = (r + 1) * 7_000_001 + np.arange(int(private[r]))
        hashes[r, n - 1] = 0  # a partial last block
        lengths[r] = n
    return hashes, lengths


def _run_python(allocate, free, open_seq, close_seq, hashes, lengths, block_size,
                max_running):
    running: list[int] = []
    ops = 0
    for r in range(hashes.shape[0]):
        if len(running) >= max_running:
            s = running.pop(0)
            free(s)
            close_seq(s)
        s = open_seq()
        n = int(lengths[r])
        res = allocate(s, hashes[r, :n], n * block_size - block_size // 2)
        if res is None:
            close_seq(s)
            continue
        ops += 2 * n
        running.append(s)
    return ops


def make_driver(ops):
    """A compiled request loop over ``ops`` (``pool_ops`` or a specialised copy)."""
    allocate, free = ops.allocate, ops.free

    @njit
    def drive(st, pst, view, out, hashes, lengths, block_size, max_running):
        ring = np.full(max_running, -1, dtype=np.int64)
        head = 0
        count = 0
        block_ops = 0
        for r in range(hashes.shape[0]):
            if count == max_running:
                s = ring[head]
                free(st, pst, view, s, 0.0)
                fast.seq_close(st, s)
                head = (head + 1) % max_running
                count -= 1
            s = fast.seq_open(st, 0)
            n = lengths[r]
            k = allocate(st, pst, view, s, hashes[r], n, n * block_size - block_size // 2,
                         0.0, out)
            if k < 0:
                fast.seq_close(st, s)
                continue
            block_ops += 2 * n
            ring[(head + count) % max_running] = s
            count += 1
        return block_ops

    return drive


def measure(num_requests: int = 200_000, num_blocks: int = 4096, block_size: int = 16,
            max_running: int = 64, seed: int = 0,
            reference_requests: int = 20_000) -> Throughput:
    """Run the same stream through both implementations and time them."""
    from kvsim.memory.reference import KVCacheManager

    hashes, lengths = make_workload(num_requests, seed)
    cfg = fast.PoolConfig(num_blocks, block_size, max_seqs=max_running + 1,
                          max_blocks_per_seq=hashes.shape[1])
    drive = make_driver(pool_ops)
    warm = FastPool(cfg)
    drive(warm.st_c, warm.pol, warm.view_c, warm.out, hashes[:10], lengths[:10], block_size,
          max_running)  # compile
    pool = FastPool(cfg)
    t0 = time.process_time()
    block_ops = drive(pool.st_c, pool.pol, pool.view_c, pool.out, hashes, lengths, block_size,
                      max_running)
    fast_s = time.process_time() - t0
    ref = KVCacheManager(num_blocks, block_size)
    m = min(reference_requests, num_requests)
    t0 = time.process_time()
    ref_ops = _run_python(lambda s, h, t: ref.allocate(s, list(h), t), ref.free,
                          ref.open_seq, ref.close_seq, hashes[:m], lengths[:m], block_size,
                          max_running)
    ref_s = time.process_time() - t0
    c = pool.counters()
    return Throughput(num_requests, int(block_ops), block_ops / fast_s, ref_ops / ref_s,
                      c["hit_tokens"], c["query_tokens"])


if __name__ == "__main__":
    res = measure()
    print(f"requests={res.requests} block_ops={res.block_ops} "
          f"hit_rate={res.hit_tokens / res.query_tokens:.3f}")
    print(f"fast: {res.fast_block_ops_per_s / 1e6:.2f} M block ops/s; "
          f"reference: {res.reference_block_ops_per_s / 1e6:.3f} M block ops/s; "
          f"ratio {res.speedup:.0f}x")
