"""The order of cached free blocks is pluggable: the same golden scenario under a LIFO
order evicts the shared prefix in the opposite order; empties still go first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from kvsim.ingest.vllm_hashing import request_hashes
from kvsim.memory.fast import KIND_EVICTED, KIND_NEW, PoolConfig
from kvsim.memory.pool_handle import FastPool

BS = 16
COMMON = [i for i in range(3) for _ in range(BS)]


def load_lifo():
    name = "kvsim_tests_memory_lifo_order"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).with_name("lifo_order.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_golden_scenario_under_lifo_order():
    pool = FastPool(PoolConfig(11, BS, max_seqs=4, max_blocks_per_seq=16, debug=True),
                    order=load_lifo())
    assert pool.ops.__name__ == "kvsim.memory.pool_ops"  # one compiled pool, every order
    r0, r1 = pool.open_seq(), pool.open_seq()
    assert pool.allocate(r0, request_hashes(COMMON + [3] * 7, BS), 55).blocks == [1, 2, 3, 4]
    assert pool.allocate(r1, request_hashes(COMMON + [3] * 5, BS), 53).blocks == [1, 2, 3, 5]
    pool.free(r0)
    pool.free(r1)
    assert pool.empties() == [5, 4, 6, 7, 8, 9, 10]
    r2 = pool.open_seq()
    a2 = pool.allocate(r2, request_hashes(COMMON + [3] * 6, BS), 54)
    assert (a2.n_hit, a2.blocks) == (3, [1, 2, 3, 5])
    pool.free(r2)
    r3 = pool.open_seq()
    a3 = pool.allocate(r3, request_hashes([99] * 160, BS), 160)
    # released 3, 2, 1 (tail-first): LIFO evicts 1 first -- the shared head goes first
    assert a3.blocks == [5, 4, 6, 7, 8, 9, 10, 1, 2, 3]
    assert a3.kinds == [KIND_NEW] * 7 + [KIND_EVICTED] * 3
    pool.check_invariants()
