"""Block-pool operations that call the eviction-order hooks (passed in as the policy value).

These functions are the part of the pool that asks the order policy (kvsim.policy.api
hooks) for decisions.  The policy sees every block with a content hash from the moment its
content enters HBM until it is evicted (block history survives reuse):

- allocation: a prefix hit on a cached block is ``on_hit`` + ``on_hold`` (revive), on a
  block other requests hold ``on_hit_held`` (``on_hit``, or nothing for a policy without
  hold hooks); each new hashed block is announced by ``on_miss(hash)`` before the
  ``victim`` + ``on_remove`` calls that make room for it;
- :func:`admit` (called once the caller has written the new blocks' views): each new
  hashed block ``on_insert`` + ``on_hold`` (it is held by its request);
- release: a hashed block whose last holder lets go ``on_release`` (a candidate again);
- copy-on-write and preemption (a release).

``pst`` is the policy as one value, ``(state, hooks)`` (:mod:`kvsim.policy.hooks`): the
hooks are first-class functions, so these functions are compiled ONCE for every policy
(and cached on disk by numba); the interpreted engine runs the same source with the
hooks' plain-Python functions.

Semantics, arguments and return values: see :mod:`kvsim.memory` and
``docs/memory-model.md``.  Invariants (``fast.INVARIANTS``) hold after every function
here; with ``PoolConfig(debug=True)``, :class:`kvsim.memory.pool_handle.FastPool` checks
them after each call (the check is not compiled into these functions: the replay core,
which calls them ~10 M times a trace, never runs it, and it was ~1 MB of the LLVM IR a
cold compile of the core optimised and machine-compiled again in every operation).
"""

import numpy as np

from kvsim.jit.decorators import njit
from kvsim.jit.prefetch import prefetch
from kvsim.memory.fast import (
    C_ADMISSIONS,
    C_ALLOC_FAILURES,
    C_COW_BYTES,
    C_COW_COPIES,
    C_EVICTED_BLOCKS,
    C_HIT_BLOCKS,
    C_HIT_TOKENS,
    C_NEW_BLOCKS,
    C_PREEMPT_RECOMPUTE,
    C_PREEMPT_SWAP,
    C_QUERY_TOKENS,
    C_RELEASED_BLOCKS,
    C_RERUN_ADMISSIONS,
    C_RERUN_HIT_TOKENS,
    C_RERUN_QUERY_TOKENS,
    C_REVIVED_BLOCKS,
    C_SWAP_OUT_BLOCKS,
    C_SWAP_OUT_BYTES,
    F_BLOCK_BYTES,
    F_BLOCK_SIZE,
    F_CACHING,
    F_LRU,
    F_NUM_BLOCKS,
    KIND_EVICTED,
    KIND_HIT,
    KIND_NEW,
    KIND_REVIVED,
    PREEMPT_SWAP,
    S_N_CAND,
    S_N_EMPTY,
    S_N_HELD,
    _empty_push_back,
    _empty_push_front,
    _empty_unlink,
    _home,
    _index_remove,
    index_add,
    index_remove,
    pool_cache_block,
    pool_lookup,
)
from kvsim.policy.api import dll_contains, dll_move_to_tail, dll_push_tail, dll_remove, list_walk
from kvsim.policy.hooks import (
    H_HIT,
    H_HIT_HELD,
    H_HOLD,
    H_INSERT,
    H_MISS,
    H_RELEASE,
    H_REMOVE,
    H_VICTIM,
)

#: The built-in lru's list in its state's ``i64`` group (policies/lru.py ``STATE``: links
#: ``prev``, ``nxt``, ends ``[head, tail, size]``; checked by kvsim.replay.driver).
LRU_PREV, LRU_NXT, LRU_ENDS = 0, 1, 2

# Built-in lru in HBM.  When ``st.cfg[F_LRU]`` is 1 (set by the replay's driver when the
# HBM policy is the built-in lru, and for vLLM's compiled pools, whose order
# kvsim.memory.fifo_order keeps the same list: ``fifo_order.use_inline``), :func:`allocate`
# (its prefix hits' ``on_hit``, ``on_hold`` and ``on_hit_held`` = lru's ``on_hit`` too) and
# :func:`_release` run lru's hooks as their list operations, and :func:`admit`,
# :func:`cache_block` and :func:`cache_blocks` skip the pair they would run (INSERT_HOLD
# below) (kvsim.policy.api
# ``dll_*``, ``list_walk``; lru has no ``on_miss``) on the policy's arrays, read once per
# call, instead of calling them as first-class functions (each call passes two counted
# structrefs and loads the arrays again: docs/benchmarks.md, "Speed: tiered replay of
# 16-token traces").  Same operations on the same state: same results.
#
# INSERT_HOLD.  A block whose content enters the pool held (a new block cached while its
# request holds it) gets ``on_insert`` then ``on_hold``: on the inline list, a push at the
# tail and the removal of the same block, which leave the links, the ends and the count
# exactly as they were (kvsim.policy.api ``dll_push_tail``, ``dll_remove``).  So the inline
# path skips the pair; its order enters the list at the block's release.
#
# No reference counts.  :func:`allocate`, :func:`free`, :func:`cache_blocks` and
# :func:`clear_cache` (the operations vLLM's compiled scheduler step calls,
# kvsim.engine.vllm_step) are compiled ``_nrt=False``: they allocate nothing and return no
# array, so every array and structref they take is borrowed from the caller (with counting,
# each call counted them on entry and exit).  They read the PoolRef's, ViewRef's and policy
# state's members through kvsim.policy.state_access's borrowing lowering, which needs no
# NRT.  A callee without its own ``_nrt`` setting is compiled under its caller's, so marking
# them here (not only the vLLM step) makes them count-free wherever they are linked in.


@njit(cache=True, inline="always")
def _evict_one(st, pst, view, now_us, out, i):
    """The policy's victim leaves the candidate set and the prefix index (its hash goes to
    out.evicted_hash[i]); the caller holds it next."""
    b, reason, n_alt = pst[1][H_VICTIM](pst[0], view, now_us, out.alt_blocks[i], out.alt_scores[i])
    if b < 1 or b >= st.cfg[F_NUM_BLOCKS] or not st.in_cand[b]:
        raise ValueError("order policy: victim() named a block that is not a candidate")
    pst[1][H_REMOVE](pst[0], view, b)
    st.in_cand[b] = False
    st.sc[S_N_CAND] -= 1
    out.kind[i] = KIND_EVICTED
    out.evicted_hash[i] = _index_remove(st, b)
    out.reason[i] = reason
    out.n_alt[i] = n_alt
    st.counters[C_EVICTED_BLOCKS] += 1
    return b


@njit(cache=True, inline="always")
def _take_block(st, pst, view, now_us, out, i):
    """Pop one new block: an empty one, else the policy's victim (evicted: unhashed)."""
    if st.sc[S_N_EMPTY] > 0:
        b = st.e_next[st.cfg[F_NUM_BLOCKS]]
        _empty_unlink(st, b)
        out.kind[i] = KIND_NEW
        out.evicted_hash[i] = 0
        out.reason[i] = -1
        out.n_alt[i] = 0
        st.counters[C_NEW_BLOCKS] += 1
        return b
    return _evict_one(st, pst, view, now_us, out, i)


@njit(cache=True, _nrt=False)  # no reference counts: see below
def allocate(st, pst, view, seq, hashes, n, num_tokens, now_us, out):
    """Append ``n`` blocks to ``seq``'s table (see kvsim.memory).  Returns the number of
    leading prefix-hit blocks, or -1 if the blocks do not fit (then nothing changed)."""
    start = st.seq_len[seq]
    if not st.seq_is_open[seq]:
        raise ValueError("allocate: seq slot is not open")
    if start + n > st.tables.shape[1]:
        raise ValueError("allocate: block table longer than max_blocks_per_seq")
    admission = start == 0
    n_hit = 0
    if admission:
        n_hit = pool_lookup(st, hashes, n, num_tokens, out.blocks)
    # arrays bound once: each attribute access of the state tuple costs a refcount pair
    ref_cnt = st.ref_cnt
    ob = out.blocks
    n_revive = 0
    for i in range(n_hit):
        if ref_cnt[ob[i]] == 0:
            n_revive += 1
    if n - n_hit + n_revive > st.sc[S_N_EMPTY] + st.sc[S_N_CAND]:
        st.counters[C_ALLOC_FAILURES] += 1
        return -1
    sc = st.sc
    row = st.tables[seq]
    in_cand = st.in_cand
    counters = st.counters
    block_hits = st.block_hits
    pol = pst[0]
    hooks = pst[1]
    lru = st.cfg[F_LRU] != 0  # the built-in lru's hooks written out (see above)
    if lru:
        LP, LN, LE = pol.i64[LRU_PREV], pol.i64[LRU_NXT], pol.i64[LRU_ENDS]
    else:
        LP, LN, LE = ref_cnt, ref_cnt, ref_cnt
    okind = out.kind
    oev = out.evicted_hash
    oreason = out.reason
    onalt = out.n_alt
    # touch the hits (vLLM BlockPool.touch), in chain order
    for i in range(n_hit):
        b = ob[i]
        if ref_cnt[b] == 0:
            if lru:  # on_hit (a candidate: in the list), on_hold
                if dll_contains(LP, b):
                    dll_move_to_tail(LP, LN, LE, b)
                dll_remove(LP, LN, LE, b)
            else:
                hooks[H_HIT](pol, view, b, now_us)
                hooks[H_HOLD](pol, view, b)
            in_cand[b] = False
            sc[S_N_CAND] -= 1
            sc[S_N_HELD] += 1
            okind[i] = KIND_REVIVED
            counters[C_REVIVED_BLOCKS] += 1
        else:
            if lru:  # on_hit_held is lru's on_hit (kvsim.policy.api.hook_bindings)
                if dll_contains(LP, b):
                    dll_move_to_tail(LP, LN, LE, b)
            else:
                hooks[H_HIT_HELD](pol, view, b, now_us)
            okind[i] = KIND_HIT
        ref_cnt[b] += 1
        block_hits[b] += 1
        oev[i] = 0
        oreason[i] = -1
        onalt[i] = 0
        row[start + i] = b
    st.counters[C_HIT_BLOCKS] += n_hit
    # new blocks (vLLM get_new_blocks: pop head, drop a stale hash), then cache full ones
    e_next = st.e_next
    e_prev = st.e_prev
    in_empty = st.in_empty
    s = st.cfg[F_NUM_BLOCKS]
    n_from_empty = 0
    caching = st.cfg[F_CACHING] != 0
    # bound once too for the per-block eviction and indexing below: an inlined helper that
    # takes ``st`` (``_evict_one``, ``_index_add``) copies all its arrays, a refcount pair
    # each, per block (at 16-token blocks, 9 M blocks; docs/benchmarks.md)
    block_hash = st.block_hash
    hidx = st.hidx  # keys and values interleaved (kvsim.memory.fast)
    h_next = st.h_next
    h_prev = st.h_prev
    alt_blocks = out.alt_blocks
    alt_scores = out.alt_scores
    v_la = view.last_access_us  # lru's scores (list_walk)
    mask = (hidx.shape[0] >> 1) - 1  # entries - 1 of the prefix index
    # an evicted block leaves the prefix index when the next one is evicted (or after the
    # loop): its entry, prefetched when the block is named, then has the next victim()
    # and on_remove calls to arrive; nothing in between reads the index, and the removals
    # keep their order, so the index is exactly as before (docs/benchmarks.md)
    # the built-in lru's victims are its list's head, then the block after it: when one
    # leaves, the next one's index entry (its hash read from a line asked for one eviction
    # earlier) and the links, hash, flags and hash chain of the one after it are asked
    # for, so the next two evictions find their lines arrived (prefetches change no result)
    pb = -1  # the block whose removal is pending, and its hash
    ph = np.int64(0)
    for i in range(n_hit, n):
        if caching and hashes[i] != 0 and not lru:
            hooks[H_MISS](pol, view, hashes[i], now_us)
        if sc[S_N_EMPTY] > 0:  # the head of the empties (inlined _empty_unlink)
            b = e_next[s]
            nx = e_next[b]
            e_next[s] = nx
            e_prev[nx] = s
            in_empty[b] = False
            sc[S_N_EMPTY] -= 1
            okind[i] = KIND_NEW
            oev[i] = 0
            oreason[i] = -1
            onalt[i] = 0
            n_from_empty += 1
        else:  # _evict_one on the bound arrays
            if lru:  # lru's victim(): the list's head
                b, reason, n_alt = LE[0], 0, 0
                if b >= 0:
                    n_alt = list_walk(LP, LN, LE, alt_blocks[i], alt_scores[i], v_la)
            else:
                b, reason, n_alt = hooks[H_VICTIM](pol, view, now_us, alt_blocks[i],
                                                   alt_scores[i])
            if b < 1 or b >= s or not in_cand[b]:
                raise ValueError("order policy: victim() named a block that is not a "
                                 "candidate")
            if lru:
                dll_remove(LP, LN, LE, b)
                y = LE[0]  # the next victim: its lines asked for now (see below)
                if y >= 0:
                    prefetch(hidx, 2 * _home(block_hash[y], mask))
                    z = LN[y]
                    if z >= 0:
                        prefetch(LP, z)
                        prefetch(LN, z)
                        prefetch(block_hash, z)
                        prefetch(in_cand, z)
                        prefetch(h_next, z)
                        prefetch(h_prev, z)
            else:
                hooks[H_REMOVE](pol, view, b)
            in_cand[b] = False
            sc[S_N_CAND] -= 1
            okind[i] = KIND_EVICTED
            h = block_hash[b]
            prefetch(hidx, 2 * _home(h, mask))  # its index entry: removed at the next eviction
            oev[i] = h
            oreason[i] = reason
            onalt[i] = n_alt
            counters[C_EVICTED_BLOCKS] += 1
            if pb >= 0:
                # the pending removal of block rb (hash rh): fast.index_remove written out
                # on the bound arrays (a call, even with its probe loops inlined, cost 6
                # reference-count updates per evicted block: ~12 % of the 16-token
                # replay's samples; docs/benchmarks.md)
                rb = pb
                rh = ph
                j = _home(rh, mask)  # _hslot (entry j: key at 2j, value at 2j + 1)
                while hidx[2 * j] != rh and hidx[2 * j] != 0:
                    j = (j + 1) & mask
                nx = h_next[rb]
                if nx == rb:  # rb was the only block with this hash: _hdel(hidx, 2 * j)
                    k = j
                    while True:
                        k = (k + 1) & mask
                        kk = hidx[2 * k]
                        if kk == 0:
                            break
                        home = _home(kk, mask)
                        if j <= k:
                            stays = j < home <= k
                        else:
                            stays = home > j or home <= k
                        if not stays:
                            hidx[2 * j] = kk
                            hidx[2 * j + 1] = hidx[2 * k + 1]
                            j = k
                    hidx[2 * j] = 0
                    hidx[2 * j + 1] = -1
                else:
                    p = h_prev[rb]
                    h_next[p] = nx
                    h_prev[nx] = p
                    if hidx[2 * j + 1] == rb:
                        hidx[2 * j + 1] = nx
                h_next[rb] = -1
                h_prev[rb] = -1
                block_hash[rb] = 0
            pb = b
            ph = h
        ref_cnt[b] = 1
        ob[i] = b
        row[start + i] = b
    if pb >= 0:  # the last pending removal, before the new blocks are indexed
        index_remove(block_hash, hidx, h_next, h_prev, pb)
    sc[S_N_HELD] += n - n_hit
    st.counters[C_NEW_BLOCKS] += n_from_empty
    if caching:
        for i in range(n_hit, n):
            if hashes[i] != 0:
                index_add(block_hash, hidx, h_next, h_prev, ob[i], hashes[i])
    st.seq_len[seq] = start + n
    if admission:
        hit_tokens = n_hit * st.cfg[F_BLOCK_SIZE]
        if st.seq_rerun[seq]:
            st.counters[C_RERUN_ADMISSIONS] += 1
            st.counters[C_RERUN_QUERY_TOKENS] += num_tokens
            st.counters[C_RERUN_HIT_TOKENS] += hit_tokens
            st.seq_rerun[seq] = False
        else:
            st.counters[C_ADMISSIONS] += 1
            st.counters[C_QUERY_TOKENS] += num_tokens
            st.counters[C_HIT_TOKENS] += hit_tokens
            t = st.seq_tenant[seq]
            st.tenant_query_tokens[t] += num_tokens
            st.tenant_hit_tokens[t] += hit_tokens
        st.seq_query_tokens[seq] += num_tokens
        st.seq_hit_tokens[seq] += hit_tokens
    return n_hit


#: How many table entries ahead :func:`_release`'s first loop asks for the lines of a
#: released block (its count, hash, flags and lru links: random lines of the pool's
#: arrays at 16-token blocks, read again by the loops after it).  8 was chosen, not tuned.
#: Prefetches change no result (kvsim.jit.prefetch).
RELEASE_AHEAD = 8


@njit(cache=True, inline="always")
def _release(st, pst, view, seq, first, now_us):
    """Release table entries ``first .. len-1`` of seq, tail first (vLLM free_blocks on
    the reversed list): decrement all, then unhashed blocks that reached 0 go to the head
    of the empties in tail-first order (prepend_n), hashed ones become candidates in
    tail-first order (append_n).  With caching off every block is appended (vLLM)."""
    m = st.seq_len[seq]
    # arrays bound once: each attribute access of the state tuple costs a refcount pair
    row = st.tables[seq]
    ref_cnt = st.ref_cnt
    block_hash = st.block_hash
    in_empty = st.in_empty
    in_cand = st.in_cand
    sc = st.sc
    counters = st.counters
    lru = st.cfg[F_LRU] != 0
    if lru:
        LP, LN, LE = pst[0].i64[LRU_PREV], pst[0].i64[LRU_NXT], pst[0].i64[LRU_ENDS]
    else:
        LP, LN, LE = ref_cnt, ref_cnt, ref_cnt
    for i in range(m - 1, first - 1, -1):
        if i - RELEASE_AHEAD >= first:  # the lines the loops below read, asked for ahead
            a = row[i - RELEASE_AHEAD]
            prefetch(ref_cnt, a)
            prefetch(block_hash, a)
            prefetch(in_empty, a)
            prefetch(in_cand, a)
            prefetch(LP, a)
            prefetch(LN, a)
        b = row[i]
        if ref_cnt[b] <= 0:
            raise ValueError("release: ref count would go below zero")
        ref_cnt[b] -= 1
    caching = st.cfg[F_CACHING] != 0
    if caching:
        # prepend_n(unhashed tail-first): push them front-first in reverse (head-first) order
        for i in range(first, m):
            b = np.int64(row[i])
            if ref_cnt[b] == 0 and block_hash[b] == 0 and not in_empty[b]:
                _empty_push_front(st, b)
                sc[S_N_HELD] -= 1
                counters[C_RELEASED_BLOCKS] += 1
    for i in range(m - 1, first - 1, -1):
        # int64, as every other caller passes a block: the table's int32 made a second
        # specialisation of the hooks (the interpreted engine calls them from Python) and
        # of the lru list's helpers
        b = np.int64(row[i])
        if ref_cnt[b] != 0 or in_empty[b] or in_cand[b]:
            continue
        sc[S_N_HELD] -= 1
        counters[C_RELEASED_BLOCKS] += 1
        if block_hash[b] == 0:
            _empty_push_back(st, b)  # caching off
        else:
            in_cand[b] = True
            sc[S_N_CAND] += 1
            if lru:  # lru's on_release (see "Built-in lru in HBM" above)
                dll_push_tail(LP, LN, LE, b)
            else:
                pst[1][H_RELEASE](pst[0], view, b, now_us)
    st.seq_len[seq] = first


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def admit(st, pst, view, out, first, n, now_us):
    """New content entered HBM: ``on_insert`` + ``on_hold`` for every hashed block of
    ``out.blocks[first:n]`` that :func:`allocate` did not find (it is held by its request).
    Call it right after ``allocate`` succeeded, once the views of those blocks describe the
    new content (the core writes them between the two calls: the views of the blocks the
    policy evicted stay intact until then, for demotion and the decision log)."""
    if st.cfg[F_LRU] != 0:  # inline: on_insert + on_hold leave the list as it was
        return  # (see INSERT_HOLD above)
    ob = out.blocks
    block_hash = st.block_hash
    for i in range(first, n):
        b = ob[i]
        if block_hash[b] != 0:
            pst[1][H_INSERT](pst[0], view, b, now_us)
            pst[1][H_HOLD](pst[0], view, b)


@njit(cache=True, _nrt=False)  # no reference counts: see below
def free(st, pst, view, seq, now_us):
    """Release every block of ``seq`` tail-first; the slot stays open, empty."""
    _release(st, pst, view, seq, 0, now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def free_tail(st, pst, view, seq, n, now_us):
    """Release the last ``n`` blocks of ``seq`` (block-level FREE, draft rollback)."""
    m = st.seq_len[seq]
    if n > m:
        raise ValueError("free_tail: more blocks than the table holds")
    _release(st, pst, view, seq, m - n, now_us)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def write_last(st, pst, view, seq, now_us, out):
    """A write into seq's last block.  If another seq shares it (ref > 1), copy it to a
    new private block first (copy-on-write): returns 1 and out.blocks[0] = the copy.
    0 = no copy needed; -1 = a copy is needed but no block is free (nothing changed)."""
    m = st.seq_len[seq]
    if m == 0:
        raise ValueError("write_last: empty table")
    old = st.tables[seq, m - 1]
    if st.ref_cnt[old] <= 1:
        return 0
    if st.sc[S_N_EMPTY] + st.sc[S_N_CAND] == 0:
        st.counters[C_ALLOC_FAILURES] += 1
        return -1
    b = _take_block(st, pst, view, now_us, out, 0)
    out.blocks[0] = b
    st.ref_cnt[b] = 1
    st.sc[S_N_HELD] += 1
    st.ref_cnt[old] -= 1  # stays >= 1: other seqs hold it
    st.tables[seq, m - 1] = b
    st.counters[C_COW_COPIES] += 1
    st.counters[C_COW_BYTES] += st.cfg[F_BLOCK_BYTES]
    return 1


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def preempt(st, pst, view, seq, mode, now_us):
    """Preempt ``seq``: release its blocks tail-first (recompute: vLLM v1; swap: the blocks
    are counted as moved to the next tier first).  Its next admission is a rerun."""
    m = st.seq_len[seq]
    if mode == PREEMPT_SWAP:
        st.counters[C_PREEMPT_SWAP] += 1
        st.counters[C_SWAP_OUT_BLOCKS] += m
        st.counters[C_SWAP_OUT_BYTES] += m * st.cfg[F_BLOCK_BYTES]
    else:
        st.counters[C_PREEMPT_RECOMPUTE] += 1
    _release(st, pst, view, seq, 0, now_us)
    st.seq_rerun[seq] = True
    return m


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def cache_block(st, pst, view, seq, index, h, now_us):
    """Block ``index`` of ``seq`` became full and gets hash ``h`` (vLLM
    cache_full_blocks): its content enters the policy held (``on_insert`` + ``on_hold``)."""
    b = st.tables[seq, index]
    had = st.block_hash[b] != 0
    pool_cache_block(st, seq, index, h)
    if not had and st.block_hash[b] != 0:
        view.content_hash[b] = h
        if st.cfg[F_LRU] == 0:  # inline: the pair leaves the list as it was (INSERT_HOLD)
            pst[1][H_INSERT](pst[0], view, b, now_us)
            pst[1][H_HOLD](pst[0], view, b)


@njit(cache=True, _nrt=False)  # no reference counts: see below
def clear_cache(st, pst, view, now_us, out):
    """vLLM ``BlockPool.reset_prefix_cache``: only when no block is held (returns 0 and
    changes nothing otherwise), every cached block loses its hash and becomes empty, in
    the order the policy would evict them, after the empties already there (vLLM keeps
    its one free queue as it is and drops the hashes).  Returns 1."""
    if st.sc[S_N_HELD] != 0:
        return 0
    while st.sc[S_N_CAND] > 0:
        b, reason, n_alt = pst[1][H_VICTIM](pst[0], view, now_us, out.alt_blocks[0],
                                           out.alt_scores[0])
        if b < 1 or b >= st.cfg[F_NUM_BLOCKS] or not st.in_cand[b]:
            raise ValueError("order policy: victim() named a block that is not a candidate")
        pst[1][H_REMOVE](pst[0], view, b)
        st.in_cand[b] = False
        st.sc[S_N_CAND] -= 1
        _index_remove(st, b)
        _empty_push_back(st, b)
    return 1


@njit(cache=True, _nrt=False)  # no reference counts: see below
def cache_blocks(st, pst, view, seq, first, hashes, now_us):
    """:func:`cache_block` for blocks ``first .. first + len(hashes) - 1`` of ``seq``, in
    order (vLLM ``cache_full_blocks`` of one request in one call)."""
    lru = st.cfg[F_LRU] != 0
    for k in range(hashes.shape[0]):
        b = st.tables[seq, first + k]
        h = hashes[k]
        had = st.block_hash[b] != 0
        pool_cache_block(st, seq, first + k, h)
        if not had and st.block_hash[b] != 0:
            view.content_hash[b] = h
            if not lru:  # inline: the pair leaves the list as it was (INSERT_HOLD)
                pst[1][H_INSERT](pst[0], view, b, now_us)
                pst[1][H_HOLD](pst[0], view, b)
