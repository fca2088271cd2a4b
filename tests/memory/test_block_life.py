"""The life of a cached block (issue 5), caching off, refused allocations, extra keys,
decode blocks becoming full -- exact block ids and ref counts on both implementations."""

from __future__ import annotations

import pytest

from kvsim.ingest.vllm_hashing import request_hashes
from kvsim.memory.fast import KIND_EVICTED, KIND_NEW, KIND_REVIVED

from .conftest import counters

BS = 4


def toks(*blocks):
    """Tokens of full blocks, block i all equal to blocks[i]."""
    return [t for v in blocks for t in [v] * BS]


def test_life_of_a_cached_block(make_pool):
    pool = make_pool(9, BS)  # 8 usable blocks
    a_tokens = toks(1, 2, 3) + [4, 4]  # 3 full + partial
    a = pool.open_seq()
    ra = pool.allocate(a, request_hashes(a_tokens, BS), len(a_tokens))
    assert (ra.n_hit, ra.blocks) == (0, [1, 2, 3, 4])  # first request: no hit
    # identical prompt: shares every full block but the tail
    b = pool.open_seq()
    rb = pool.allocate(b, request_hashes(a_tokens, BS), len(a_tokens))
    assert (rb.n_hit, rb.blocks) == (3, [1, 2, 3, 5])
    assert [pool.ref_cnt(x) for x in rb.blocks] == [2, 2, 2, 1]
    # diverges mid-way (after block 1): shares only the common full-block prefix
    c_tokens = toks(1, 9, 3) + [4, 4]
    c = pool.open_seq()
    rc = pool.allocate(c, request_hashes(c_tokens, BS), len(c_tokens))
    assert (rc.n_hit, rc.blocks) == (1, [1, 6, 7, 8])
    assert [pool.ref_cnt(x) for x in range(1, 9)] == [3, 2, 2, 1, 1, 1, 1, 1]
    assert pool.free_queue() == []
    # pool sized exactly: free b and c, then demand blocks
    pool.free(c)
    pool.free(b)
    # c released tail-first: 8 (unhashed) -> head; 7, 6 hashed -> tail; 1 still held
    # b: 5 (unhashed) -> head; 3, 2, 1 still held by a
    assert pool.free_queue() == [5, 8, 7, 6]
    pool.free(a)
    assert pool.free_queue() == [4, 5, 8, 7, 6, 3, 2, 1]
    # a newcomer with a's prompt is revived without recompute: hits [1, 2, 3]
    d = pool.open_seq()
    rd = pool.allocate(d, request_hashes(a_tokens, BS), len(a_tokens))
    assert (rd.n_hit, rd.blocks) == (3, [1, 2, 3, 4])
    assert rd.kinds == [KIND_REVIVED] * 3 + [KIND_NEW]
    pool.free(d)
    assert pool.free_queue() == [4, 5, 8, 7, 6, 3, 2, 1]
    # demand 6 new blocks: empties first, then private tails (7, 6), the shared head last
    e = pool.open_seq()
    re_ = pool.allocate(e, [0] * 6, 24)
    assert re_.blocks == [4, 5, 8, 7, 6, 3]
    assert re_.kinds == [KIND_NEW] * 3 + [KIND_EVICTED] * 3
    assert pool.free_queue() == [2, 1]
    # the shared head survived: a's prefix still hits 2 blocks, the 3rd was evicted
    assert pool.lookup(request_hashes(a_tokens, BS), len(a_tokens)) == [1, 2]
    pool.check_invariants()


def test_caching_off_shares_nothing(make_pool):
    pool = make_pool(9, BS, enable_caching=False)
    t = toks(1, 2, 3) + [4]
    a, b = pool.open_seq(), pool.open_seq()
    assert pool.allocate(a, request_hashes(t, BS), len(t)).blocks == [1, 2, 3, 4]
    rb = pool.allocate(b, request_hashes(t, BS), len(t))
    assert (rb.n_hit, rb.blocks) == (0, [5, 6, 7, 8])
    pool.free(a)
    # nothing hashed; freed blocks appended tail-first (vLLM with caching off)
    assert pool.free_queue() == [4, 3, 2, 1]
    pool.free(b)
    assert pool.free_queue() == [4, 3, 2, 1, 8, 7, 6, 5]
    c = pool.open_seq()
    assert pool.allocate(c, request_hashes(t, BS), len(t)).n_hit == 0
    assert counters(pool)["hit_tokens"] == 0
    pool.check_invariants()


def test_allocation_that_does_not_fit_changes_nothing(make_pool):
    pool = make_pool(6, BS)  # 5 usable
    t = toks(1, 2, 3)
    a = pool.open_seq()
    pool.allocate(a, request_hashes(t, BS), len(t))
    pool.free(a)
    assert pool.free_queue() == [4, 5, 3, 2, 1]
    # t + 3 more full blocks: 3 hits on cached (ref 0) blocks, which must be taken out
    # of the free queue too: 3 revived + 3 new = 6 > 5 free -> refused, nothing changes
    b = pool.open_seq()
    big = t + toks(7, 8, 9)
    assert pool.allocate(b, request_hashes(big, BS), len(big)) is None
    assert pool.free_queue() == [4, 5, 3, 2, 1]
    assert [pool.ref_cnt(x) for x in range(6)] == [0] * 6
    assert pool.table(b) == []
    assert counters(pool)["alloc_failures"] == 1
    assert counters(pool)["admissions"] == 1
    # a smaller one fits and revives
    r = pool.allocate(b, request_hashes(t + [5], BS), len(t) + 1)
    assert (r.n_hit, r.blocks) == (3, [1, 2, 3, 4])
    pool.check_invariants()


def test_extra_keys_namespace_blocks(make_pool):
    pool = make_pool(9, BS)
    t = toks(1, 2) + [3]
    a, b, c = pool.open_seq(), pool.open_seq(), pool.open_seq()
    pool.allocate(a, request_hashes(t, BS, extra=("lora-1",)), len(t))
    assert pool.allocate(b, request_hashes(t, BS, extra=("lora-2",)), len(t)).n_hit == 0
    assert pool.allocate(c, request_hashes(t, BS, extra=("lora-1",)), len(t)).n_hit == 2


def test_decode_block_becomes_full_then_shared(make_pool):
    pool = make_pool(9, BS)
    t = toks(1) + [2, 2]  # 1 full + partial
    a = pool.open_seq()
    pool.allocate(a, request_hashes(t, BS), len(t))  # [1, 2]; block 2 partial, unhashed
    full = toks(1, 2)
    h = request_hashes(full, BS)
    assert pool.lookup(h + [0], 9) == [1]  # block 2 not cached yet
    pool.cache_block(a, 1, h[1])  # two decode tokens filled it
    assert pool.lookup(h + [0], 9) == [1, 2]
    # decode appends a new (partial) block: no lookup on a non-empty table
    r = pool.allocate(a, [0], 0)
    assert (r.n_hit, r.blocks) == (0, [3])
    assert pool.table(a) == [1, 2, 3]
    pool.free_tail(a, 1)  # e.g. a rolled-back draft block
    assert pool.table(a) == [1, 2]
    assert pool.free_queue()[0] == 3
    pool.check_invariants()


def test_bad_pool_sizes_are_input_errors():
    import pytest

    from kvsim.core.errors import KvsimInputError
    from kvsim.memory.fast import PoolConfig

    with pytest.raises(KvsimInputError, match="num_blocks.*>= 2.*null block.*got 1"):
        PoolConfig(1, 16)
    with pytest.raises(KvsimInputError, match="block_size_tokens"):
        PoolConfig(8, 0)


def test_debug_pool_catches_a_broken_invariant_after_an_operation():
    """``PoolConfig(debug=True)``: FastPool checks the invariants after each operation
    (the compiled operations themselves do not), so corrupting the state is caught by
    the next call, naming the invariant; without debug the same call returns."""
    from kvsim.memory.fast import PoolConfig
    from kvsim.memory.pool_handle import FastPool

    for debug in (True, False):
        pool = FastPool(PoolConfig(9, BS, max_seqs=4, max_blocks_per_seq=16, debug=debug))
        a = pool.open_seq()
        pool.allocate(a, request_hashes(toks(1, 2), BS), 2 * BS)
        pool.st.ref_cnt[1] += 1  # a held count no table accounts for
        b = pool.open_seq()
        if debug:
            with pytest.raises(AssertionError, match=r"^invariant \d+ broken: "):
                pool.allocate(b, request_hashes(toks(3), BS), BS)
        else:
            assert pool.allocate(b, request_hashes(toks(3), BS), BS).blocks == [3]
