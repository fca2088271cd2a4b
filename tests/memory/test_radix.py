"""Radix-tree mode (SGLang RadixCache style): exact tests, and where it differs from
vLLM's hash chain."""

from __future__ import annotations

from kvsim.ingest.vllm_hashing import request_hashes
from kvsim.memory.fast import KIND_HIT, KIND_NEW, KIND_REVIVED
from kvsim.memory.radix import RadixCache
from kvsim.memory.reference import KVCacheManager

BS = 4


def toks(*blocks):
    return [t for v in blocks for t in [v] * BS]


def test_radix_sharing_and_lru_leaf_eviction():
    rc = RadixCache(9, BS)  # 8 usable
    t = toks(1, 2, 3) + [9]
    a = rc.open_seq()
    ra = rc.allocate(a, request_hashes(t, BS), len(t))
    assert (ra.n_hit, ra.blocks, ra.kinds) == (0, [1, 2, 3, 4], [KIND_NEW] * 4)
    b = rc.open_seq()
    tb = toks(1, 2, 5) + [9]
    rb = rc.allocate(b, request_hashes(tb, BS), len(tb))
    assert (rb.n_hit, rb.blocks, rb.kinds) == (2, [1, 2, 5, 6], [KIND_HIT] * 2 + [KIND_NEW] * 2)
    rc.check_invariants()
    rc.free(a)  # leaf 3 unlocked at clock 3; private partial 4 back to the allocator
    rc.free(b)  # leaf 5 and the shared path 1, 2 at clock 4
    rc.check_invariants()
    assert sorted(rc.free_blocks) == [4, 6, 7, 8]
    assert rc.num_free_blocks() == 8
    # a newcomer revives the path 1, 2, 3 (LRU touch), no recompute
    c = rc.open_seq()
    rc_ = rc.allocate(c, request_hashes(t, BS), len(t))
    assert (rc_.n_hit, rc_.blocks, rc_.kinds) == (3, [1, 2, 3, 4], [KIND_REVIVED] * 3 + [KIND_NEW])
    rc.free(c)
    # demand 6 blocks: 4 free (4, 6, 7, 8), then evict LRU leaves: 5 (clock 4) before 3
    # (clock 6); then 3 is gone and 2 is a leaf -- but only 2 evictions are needed
    d = rc.open_seq()
    rd = rc.allocate(d, [0] * 6, 24)
    assert rd.blocks == [3, 4, 5, 6, 7, 8]
    assert rc.counters["evicted_blocks"] == 2
    assert rc.lookup(request_hashes(t, BS), len(t)) == [1, 2]  # the head survived
    rc.check_invariants()


def test_radix_refused_allocation_changes_nothing():
    rc = RadixCache(5, BS)
    a = rc.open_seq()
    rc.allocate(a, request_hashes(toks(1, 2), BS), 8)
    rc.free(a)
    b = rc.open_seq()
    assert rc.allocate(b, [0] * 5, 20) is None
    assert rc.lookup(request_hashes(toks(1, 2, 3), BS), 12) == [1, 2]
    assert sorted(rc.free_blocks) == [3, 4] and rc.counters["alloc_failures"] == 1
    rc.check_invariants()


def test_radix_vs_hash_chain_duplicate_blocks():
    """A prompt of exactly k full blocks may hit only k-1 (the last token is recomputed).
    vLLM then allocates a second block with the same hash (no de-duplication); the radix
    tree keeps one node and frees the duplicate.  Same hits, different memory."""
    t = toks(1, 2)  # exactly 2 full blocks, 8 tokens: at most 7 may hit -> 1 block
    h = request_hashes(t, BS)
    v = KVCacheManager(6, BS)
    r = RadixCache(6, BS)
    for pool in (v, r):
        a = pool.open_seq()
        assert pool.allocate(a, h, 8).blocks == [1, 2]
        pool.free(a)
        b = pool.open_seq()
        assert pool.allocate(b, h, 8).n_hit == 1
    assert v.table(1) == [1, 3]  # block 3 duplicates block 2's hash
    assert sorted(x.block_id for x in v.pool.cached[h[1]].values()) == [2, 3]
    assert r.table(1) == [1, 2]  # shares the tree's copy
    assert r.counters["dedup_blocks"] == 1
    v.free(1)
    r.free(1)
    # both: 5 usable blocks.  vLLM holds 3 cached copies (2 of them identical), radix 2.
    assert sum(1 for x in v.pool.blocks if x.block_hash) == 3
    assert len(r.node_of) == 2
    # vLLM's eviction order is its free queue (release order, tail-first): the empties,
    # then 2 (X), 3 (X again), 1 (P); radix evicts only leaves: X (2), then P (1).
    assert v.free_queue() == [4, 5, 2, 3, 1]
    c_v, c_r = v.open_seq(), r.open_seq()
    assert v.allocate(c_v, [0] * 4, 16).blocks == [4, 5, 2, 3]
    assert r.allocate(c_r, [0] * 4, 16).blocks == [2, 3, 4, 5]
    # 4 new blocks cost vLLM two evictions (both copies of X), the radix tree one
    assert (v.counters["evicted_blocks"], r.counters["evicted_blocks"]) == (2, 1)
    # both kept the head P
    assert v.lookup(request_hashes(toks(1, 2, 7), BS), 12) == [1]
    assert r.lookup(request_hashes(toks(1, 2, 7), BS), 12) == [1]
    v.check_invariants()
    r.check_invariants()


def test_radix_caching_off_shares_nothing():
    rc = RadixCache(9, BS, enable_caching=False)
    t = toks(1, 2) + [3]
    a, b = rc.open_seq(), rc.open_seq()
    rc.allocate(a, request_hashes(t, BS), len(t))
    assert rc.allocate(b, request_hashes(t, BS), len(t)).n_hit == 0
    assert rc.table(b) == [4, 5, 6]
    rc.free(a)
    rc.free(b)
    assert sorted(rc.free_blocks) == list(range(1, 9)) and not rc.node_of


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(num_blocks=st.integers(3, 12),
       ops=st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 2), max_size=4),
                              st.integers(0, BS - 1), st.integers(0, 7)), max_size=30))
def test_radix_invariants_on_random_sequences(num_blocks, ops):
    """Invariants hold after every step and a refused allocation changes nothing."""
    rc = RadixCache(num_blocks, BS)
    live: list[int] = []
    for admit, blocks, partial, pick in ops:
        if admit or not live:
            t = toks(*blocks) + [9] * partial
            if not t:
                continue
            s = rc.open_seq()
            before = (sorted(rc.free_blocks), len(rc.node_of))
            if rc.allocate(s, request_hashes(t, BS), len(t)) is None:
                assert (sorted(rc.free_blocks), len(rc.node_of)) == before
                rc.close_seq(s)
            else:
                live.append(s)
        else:
            s = live.pop(pick % len(live))
            rc.free(s)
            rc.close_seq(s)
        rc.check_invariants()


def test_compare_schemes_on_one_stream():
    """The same stream through both schemes: the duplicate-block case of the test above,
    repeated; exact counts per scheme."""
    from kvsim.memory.compare import compare_schemes

    t = toks(1, 2)  # exactly 2 full blocks: each admission hits 1 block
    h = request_hashes(t, BS)
    df = compare_schemes([(h, 8)] * 3 + [([0] * 4, 16)], num_blocks=6, block_size=BS,
                         max_running=1)
    v, r = df.iloc[0], df.iloc[1]
    assert (v.scheme, r.scheme) == ("vllm-hash-chain", "sglang-radix")
    assert (v.query_tokens, v.hit_tokens) == (r.query_tokens, r.hit_tokens) == (40, 8)
    assert (v.refused, r.refused) == (0, 0)
    # vLLM registers a new copy of the second block at each rerun (3 blocks, one hash);
    # the 4-block request then evicts all 3 copies.  The tree kept one copy: 1 eviction
    assert (v.evicted_blocks, r.evicted_blocks) == (3, 1)
    assert (v.dedup_blocks, r.dedup_blocks) == (0, 2)
