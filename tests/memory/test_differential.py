"""Differential test: the compiled core and the plain-Python reference agree on every block
id, kind, evicted hash, ref count, free-queue position and counter over random sequences of
alloc / append / fill / fork / write / free / free_tail / preempt, with every invariant
checked after each step (the fast pool runs with debug=True: it checks inside each op)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.ingest.vllm_hashing import block_hashes, request_hashes
from kvsim.memory.fast import PoolConfig
from kvsim.memory.pool_handle import FastPool
from kvsim.memory.reference import KVCacheManager

BS = 2

prompt = st.tuples(st.lists(st.integers(0, 2), min_size=0, max_size=5),  # full blocks
                   st.integers(0, BS - 1))  # tokens of a trailing partial block
admit = st.tuples(st.just("admit"), prompt, st.integers(0, 1))
op = st.one_of(
    admit,
    admit,
    st.tuples(st.just("append"), st.integers(0, 7)),
    st.tuples(st.just("fill"), st.integers(0, 7), st.integers(0, 2)),
    st.tuples(st.just("fork"), st.integers(0, 7)),
    st.tuples(st.just("write"), st.integers(0, 7)),
    st.tuples(st.just("free"), st.integers(0, 7)),
    st.tuples(st.just("free_tail"), st.integers(0, 7), st.integers(1, 3)),
    st.tuples(st.just("preempt"), st.integers(0, 7), st.integers(0, 1)),
    st.tuples(st.just("readmit"), st.integers(0, 7)),
)


def check_same(fast: FastPool, ref: KVCacheManager, handles: dict) -> None:
    fast.check_invariants()
    ref.check_invariants()
    for h, (sf, sr) in handles.items():
        assert fast.table(sf) == ref.table(sr), f"seq {h}"
    n = fast.config.num_blocks
    assert [fast.ref_cnt(b) for b in range(n)] == [ref.ref_cnt(b) for b in range(n)]
    assert [fast.block_hash(b) for b in range(n)] == [ref.pool.blocks[b].block_hash
                                                      for b in range(n)]
    assert fast.free_queue() == ref.free_queue()
    assert fast.counters() == ref.counters
    assert list(fast.st.tenant_query_tokens) == ref.tenant_query_tokens
    assert list(fast.st.tenant_hit_tokens) == ref.tenant_hit_tokens
    assert list(fast.st.block_hits) == ref.block_hits


def _sequences(test):
    """``test(num_blocks, caching, first, rest)`` over random pools and op sequences (the
    same examples for every test that takes them)."""
    return settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])(
        given(num_blocks=st.integers(5, 16), caching=st.booleans(),
              first=st.lists(admit, min_size=2, max_size=5),
              rest=st.lists(op, min_size=5, max_size=40))(test))


@_sequences
def test_fast_matches_reference(num_blocks, caching, first, rest):
    _run(num_blocks, caching, first + rest, inline=False)


@_sequences
def test_fast_matches_reference_with_the_order_inline(num_blocks, caching, first, rest):
    """vLLM's order run as the pool's inline list operations (``fifo_order.use_inline``,
    as vLLM's compiled pools run it, skipping the on_insert + on_hold pair of a block cached
    while held) agrees with the reference as the hooks do."""
    _run(num_blocks, caching, first + rest, inline=True)


def _run(num_blocks, caching, ops, inline):
    fast = FastPool(PoolConfig(num_blocks, BS, enable_caching=caching, max_seqs=8,
                               max_blocks_per_seq=32, block_bytes=10, max_tenants=2,
                               debug=True))
    if inline:
        from kvsim.memory import fifo_order

        fifo_order.use_inline(fast.st)
    ref = KVCacheManager(num_blocks, BS, caching, block_bytes=10, max_tenants=2)
    handles: dict[int, tuple[int, int]] = {}  # test handle -> (fast seq, reference seq)
    prompts: dict[int, list[int]] = {}
    tokens: dict[int, list[int]] = {}  # tokens written so far, per handle
    next_handle = 0

    def pick(i):
        keys = sorted(handles)
        return keys[i % len(keys)] if keys else None

    for step in ops:
        kind = step[0]
        h = pick(step[1]) if kind not in ("admit",) else None
        if kind == "admit":
            if len(handles) >= 8:
                continue
            (blocks, partial), tenant = step[1], step[2]
            toks = [t for v in blocks for t in [v] * BS] + [9] * partial
            if not toks:
                continue
            sf, sr = fast.open_seq(tenant), ref.open_seq(tenant)
            hashes = request_hashes(toks, BS)
            a = fast.allocate(sf, hashes, len(toks))
            b = ref.allocate(sr, hashes, len(toks))
            assert a == b
            handles[next_handle] = (sf, sr)
            prompts[next_handle] = toks
            tokens[next_handle] = list(toks) if a is not None else []
            next_handle += 1
        elif h is None:
            continue
        elif kind == "append":  # a decode step starting a new block
            sf, sr = handles[h]
            if not fast.table(sf):
                continue
            assert fast.allocate(sf, [0], 0) == ref.allocate(sr, [0], 0)
        elif kind == "fill":  # the last block became full: give it a chain hash
            sf, sr = handles[h]
            m = len(fast.table(sf))
            if m == 0:
                continue
            full = (tokens[h] + [step[2]] * (m * BS))[:m * BS]
            hh = block_hashes(full, BS)[m - 1]
            fast.cache_block(sf, m - 1, hh)
            ref.cache_block(sr, m - 1, hh)
        elif kind == "fork":
            if len(handles) >= 8:
                continue
            sf, sr = handles[h]
            cf, cr = fast.open_seq(), ref.open_seq()
            fast.fork(sf, cf)
            ref.fork(sr, cr)
            handles[next_handle] = (cf, cr)
            prompts[next_handle] = prompts[h]
            tokens[next_handle] = list(tokens[h])
            next_handle += 1
        elif kind == "write":
            sf, sr = handles[h]
            if not fast.table(sf):
                continue
            assert fast.write_last(sf) == ref.write_last(sr)
        elif kind == "free":
            sf, sr = handles.pop(h)
            fast.free(sf)
            ref.free(sr)
            fast.close_seq(sf)
            ref.close_seq(sr)
        elif kind == "free_tail":
            sf, sr = handles[h]
            n = min(step[2], len(fast.table(sf)))
            fast.free_tail(sf, n)
            ref.free_tail(sr, n)
        elif kind == "preempt":
            sf, sr = handles[h]
            assert fast.preempt(sf, step[2]) == ref.preempt(sr, step[2])
        elif kind == "readmit":  # a preempted (or emptied) seq is scheduled again
            sf, sr = handles[h]
            if fast.table(sf):
                continue
            toks = prompts[h]
            hashes = request_hashes(toks, BS)
            assert fast.allocate(sf, hashes, len(toks)) == ref.allocate(sr, hashes, len(toks))
        check_same(fast, ref, handles)
    for name, value in fast.counters().items():
        TOTALS[name] = TOTALS.get(name, 0) + value


TOTALS: dict[str, int] = {}


def test_random_sequences_exercised_every_path():
    """The random sequences above really hit, revive, evict, refuse, copy and preempt
    (runs after test_fast_matches_reference in file order)."""
    if not TOTALS:
        import pytest

        pytest.skip("run together with test_fast_matches_reference")
    for name in ("hit_blocks", "revived_blocks", "evicted_blocks", "alloc_failures",
                 "cow_copies", "forks", "preempt_recompute", "preempt_swap",
                 "rerun_hit_tokens"):
        assert TOTALS[name] > 0, name
