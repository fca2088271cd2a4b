"""Copy-on-write forks, preemption and hit-rate accounting: exact ref counts and counts."""

from __future__ import annotations

import numpy as np

from kvsim.ingest.vllm_hashing import request_hashes
from kvsim.memory.fast import PREEMPT_RECOMPUTE, PREEMPT_SWAP, pick_preemption_victim

from .conftest import counters

BS = 4
BLOCK_BYTES = 1000


def test_fork_diverge_prune(make_pool):
    pool = make_pool(12, BS, block_bytes=BLOCK_BYTES)
    prompt = [1] * 4 + [2] * 4 + [3] * 2  # 2 full + partial (2 tokens)
    a = pool.open_seq()
    assert pool.allocate(a, request_hashes(prompt, BS), len(prompt)).blocks == [1, 2, 3]
    # beam width 3: fork twice; every block is shared by all three
    b, c = pool.open_seq(), pool.open_seq()
    pool.fork(a, b)
    pool.fork(a, c)
    assert pool.table(b) == pool.table(c) == [1, 2, 3]
    assert [pool.ref_cnt(x) for x in (1, 2, 3)] == [3, 3, 3]
    # each beam writes its next token into the shared partial block 3
    assert pool.write_last(a) == 1  # copied to 4; 3 now shared by b, c
    assert pool.table(a) == [1, 2, 4]
    assert [pool.ref_cnt(x) for x in (1, 2, 3, 4)] == [3, 3, 2, 1]
    assert pool.write_last(b) == 1  # copied to 5
    assert pool.write_last(c) == 0  # c is the last holder of 3: writes in place
    assert pool.table(b) == [1, 2, 5] and pool.table(c) == [1, 2, 3]
    assert [pool.ref_cnt(x) for x in (1, 2, 3, 4, 5)] == [3, 3, 1, 1, 1]
    assert pool.write_last(a) == 0  # already private
    cnt = counters(pool)
    assert (cnt["forks"], cnt["cow_copies"], cnt["cow_bytes"]) == (2, 2, 2 * BLOCK_BYTES)
    # prune beam b: its private block 5 is freed (unhashed -> head); shared ones stay
    pool.free(b)
    pool.close_seq(b)
    assert [pool.ref_cnt(x) for x in (1, 2, 3, 4, 5)] == [2, 2, 1, 1, 0]
    assert pool.free_queue()[0] == 5
    # the surviving beams diverge further: new decode blocks are private
    assert pool.allocate(a, [0], 0).blocks == [5]
    assert pool.allocate(c, [0], 0).blocks == [6]
    pool.free(a)
    pool.free(c)
    # c (freed last) holds the hashed head last: 2, 1 reach ref 0 only then
    assert pool.free_queue() == [6, 3, 5, 4, 7, 8, 9, 10, 11, 2, 1]
    pool.check_invariants()


def test_cow_without_room_changes_nothing(make_pool):
    pool = make_pool(3, BS)  # 2 usable
    a, b = pool.open_seq(), pool.open_seq()
    pool.allocate(a, [0, 0], 8)
    pool.fork(a, b)
    assert pool.write_last(b) == -1
    assert pool.table(b) == [1, 2] and pool.ref_cnt(2) == 2
    assert counters(pool)["alloc_failures"] == 1
    pool.check_invariants()


def test_preemption_recompute_and_rerun_accounting(make_pool):
    pool = make_pool(9, BS, block_bytes=BLOCK_BYTES, max_tenants=2)
    t = [1] * 4 + [2] * 4 + [3]  # 2 full + partial
    a = pool.open_seq(tenant=1)
    pool.allocate(a, request_hashes(t, BS), len(t))
    pool.allocate(a, [0], 0)  # decode block
    assert pool.table(a) == [1, 2, 3, 4]
    assert pool.preempt(a, PREEMPT_RECOMPUTE) == 4
    assert pool.table(a) == []
    assert pool.free_queue() == [4, 3, 5, 6, 7, 8, 2, 1]
    # rerun: the prefix is still cached -> hits, counted apart from first admissions
    r = pool.allocate(a, request_hashes(t, BS), len(t))
    assert (r.n_hit, r.blocks) == (2, [1, 2, 4])
    cnt = counters(pool)
    assert (cnt["admissions"], cnt["query_tokens"], cnt["hit_tokens"]) == (1, 9, 0)
    assert (cnt["rerun_admissions"], cnt["rerun_query_tokens"],
            cnt["rerun_hit_tokens"]) == (1, 9, 8)
    assert cnt["preempt_recompute"] == 1
    assert pool.preempt(a, PREEMPT_SWAP) == 3
    cnt = counters(pool)
    assert (cnt["preempt_swap"], cnt["swap_out_blocks"], cnt["swap_out_bytes"]) == (
        1, 3, 3 * BLOCK_BYTES)
    # per-tenant counts: first admissions only
    b = pool.open_seq(tenant=0)
    pool.allocate(b, request_hashes(t, BS), len(t))
    assert list(pool.tenant_query_tokens if not hasattr(pool, "st")
                else pool.st.tenant_query_tokens) == [9, 9]
    assert list(pool.tenant_hit_tokens if not hasattr(pool, "st")
                else pool.st.tenant_hit_tokens) == [8, 0]
    pool.check_invariants()


def test_pick_preemption_victim():
    running = np.array([7, 3, 5, 9], dtype=np.int64)
    prio = np.zeros(10, dtype=np.int64)
    arrival = np.arange(10, dtype=np.int64)
    # FCFS: the last running request
    assert pick_preemption_victim(running, 4, prio, arrival, False) == 3
    # priority: lowest request_priority; ties -> latest arrival
    prio[[7, 3, 5, 9]] = [50, 10, 10, 80]
    assert pick_preemption_victim(running, 4, prio, arrival, True) == 2  # req 5 (arr 5 > 3)
    prio[5] = 20
    assert pick_preemption_victim(running, 4, prio, arrival, True) == 1  # req 3
    assert pick_preemption_victim(running, 0, prio, arrival, True) == -1
