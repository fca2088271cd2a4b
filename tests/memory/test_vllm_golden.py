"""vLLM's own golden scenario (tests/v1/core/test_prefix_caching.py::test_prefill),
on both implementations: block ids, hits, free-queue order and eviction order exactly."""

from __future__ import annotations

from kvsim.ingest.vllm_hashing import request_hashes
from kvsim.memory.fast import KIND_EVICTED, KIND_HIT, KIND_NEW, KIND_REVIVED

from .conftest import counters

BS = 16
COMMON = [i for i in range(3) for _ in range(BS)]  # 3 full blocks: 0*16, 1*16, 2*16


def test_prefill_golden(make_pool):
    pool = make_pool(11, BS)
    # req0: 3 full blocks + 7 tokens: a full miss
    r0 = pool.open_seq()
    a0 = pool.allocate(r0, request_hashes(COMMON + [3] * 7, BS), 55)
    assert (a0.n_hit, a0.blocks, a0.kinds) == (0, [1, 2, 3, 4], [KIND_NEW] * 4)
    # req1: same 48 tokens + 5: hits [1, 2, 3] while req0 holds them, gets [5]
    r1 = pool.open_seq()
    a1 = pool.allocate(r1, request_hashes(COMMON + [3] * 5, BS), 53)
    assert (a1.n_hit, a1.blocks) == (3, [1, 2, 3, 5])
    assert a1.kinds == [KIND_HIT, KIND_HIT, KIND_HIT, KIND_NEW]
    assert [pool.ref_cnt(b) for b in range(1, 6)] == [2, 2, 2, 1, 1]
    assert len(pool.free_queue()) == 5
    pool.free(r0)
    pool.free(r1)
    # partial (unhashed) 5, 4 prepended; untouched 6..10; hashed 3, 2, 1 appended tail-first
    assert pool.free_queue() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    # req2: 48 + 6 tokens: hits the freed-but-cached [1, 2, 3] (revived), reuses [5]
    r2 = pool.open_seq()
    a2 = pool.allocate(r2, request_hashes(COMMON + [3] * 6, BS), 54)
    assert (a2.n_hit, a2.blocks) == (3, [1, 2, 3, 5])
    assert a2.kinds == [KIND_REVIVED] * 3 + [KIND_NEW]
    assert pool.free_queue() == [4, 6, 7, 8, 9, 10]
    pool.free(r2)
    # req3: 160 tokens of 99: a miss; takes every free block in queue order
    r3 = pool.open_seq()
    a3 = pool.allocate(r3, request_hashes([99] * 160, BS), 160)
    assert a3.n_hit == 0
    assert a3.blocks == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert a3.kinds == [KIND_NEW] * 7 + [KIND_EVICTED] * 3
    common = request_hashes(COMMON, BS)
    assert a3.evicted_hashes == [0] * 7 + [common[2], common[1], common[0]]
    assert pool.free_queue() == []
    pool.check_invariants()
    c = counters(pool)
    assert (c["admissions"], c["query_tokens"], c["hit_tokens"]) == (4, 55 + 53 + 54 + 160,
                                                                     96)
    assert (c["hit_blocks"], c["revived_blocks"], c["new_blocks"], c["evicted_blocks"]) == (
        6, 3, 4 + 1 + 1 + 7, 3)


def test_lookup_does_not_change_ref_counts_and_caps_at_num_tokens_minus_one(make_pool):
    pool = make_pool(11, BS)
    r0 = pool.open_seq()
    hashes = request_hashes(COMMON, BS)  # exactly 3 full blocks, 48 tokens
    pool.allocate(r0, hashes, 48)
    before = [pool.ref_cnt(b) for b in range(11)]
    # 48 tokens: at most 47 may hit -> only 2 full blocks
    assert pool.lookup(hashes, 48) == [1, 2]
    assert pool.lookup(hashes, 49) == [1, 2, 3]
    assert [pool.ref_cnt(b) for b in range(11)] == before
    # an identical 48-token prompt: 2 hits, the third block is new although its hash is
    # cached (no de-duplication): 2 blocks now carry the same hash
    r1 = pool.open_seq()
    a = pool.allocate(r1, hashes, 48)
    assert (a.n_hit, a.blocks) == (2, [1, 2, 4])
    pool.check_invariants()
