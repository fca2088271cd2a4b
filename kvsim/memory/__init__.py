"""Paged, ref-counted, prefix-shared KV memory: the HBM block pool of the replay.

Two implementations of one model (vLLM v1 prefix caching, see ``docs/memory-model.md``):

* :mod:`kvsim.memory.reference` -- plain Python classes mirroring vLLM's (``BlockPool``
  with a doubly linked ``FreeKVCacheBlockQueue``, a hash->blocks prefix index, a
  ``KVCacheManager``-like facade).  Obviously correct, slow; the oracle of the tests.
* :mod:`kvsim.memory.fast` -- the compiled core: state in numpy arrays, ``@njit``
  functions the replay calls from inside its own compiled loop.

plus :mod:`kvsim.memory.pool_ops` (the operations that consult the eviction order),
:mod:`kvsim.policy.hooks` (a policy as one value, ``(state, hooks)``, for the compiled code),
:mod:`kvsim.memory.fifo_order` (the default order of cached free blocks: vLLM's),
:mod:`kvsim.memory.radix` (SGLang RadixCache-style alternative, plain Python),
:mod:`kvsim.memory.compare` (``compare_schemes``: hash chain vs radix on one stream),
:mod:`kvsim.ingest.vllm_hashing` (prefix-chain block hashes) and
:mod:`kvsim.memory.throughput` (``python -m kvsim.memory.throughput``).

Vocabulary
----------
*block id*: a stable physical id ``0 .. num_blocks-1``; 0 is the reserved null block, never
handed out.  *seq*: a slot ``0 .. max_seqs-1`` naming one block table (a request, or one
branch of a fork).  *empty block*: ref count 0, no hash (never used, or freed unhashed).
*cached block*: ref count 0 with a hash, kept for reuse; the set of cached blocks is the
eviction-candidate set of :mod:`kvsim.policy.api`, ordered by a policy.  vLLM's free queue
is exactly ``[empty blocks] + [cached blocks in release order]``, so vLLM's behaviour is
"empties first, then the FIFO-of-release order" (:mod:`kvsim.memory.fifo_order`).

Fast-core API (stable; ``kvsim.memory.fast`` + ``kvsim.memory.pool_ops``)
------------------------------------------------------------------------
Python side::

    PoolConfig(num_blocks: int, block_size_tokens: int, enable_caching: bool = True,
               max_seqs: int = 1024, max_blocks_per_seq: int = 8192,
               block_bytes: int = 0, max_tenants: int = 1, debug: bool = False)  # frozen

    pool = FastPool(config, order=None)   # order: a policy module (policy_api hooks) or
                                          # None = FIFO of release (vLLM's exact order)
    pool.st      # PoolState namedtuple of numpy arrays (prefix index: an open-addressing
                 # table hash -> first block); pass it to the njit functions below
    pool.pst     # the order policy's state (kvsim.policy.api.PolicyState, from its init())
    pool.pol     # (state, hooks): the order as the value the pool_ops functions take
    pool.view    # kvsim.policy.api.BlockView indexed by block id; the CALLER fills fields
    pool.view_c  # the same arrays as a ViewRef (kvsim.policy.hooks): what ops take
    pool.ops     # kvsim.memory.pool_ops (compiled once for every order)
    pool.out     # AllocOut namedtuple of scratch arrays (blocks, kind, evicted_hash,
                 # reason, n_alt: length max_blocks_per_seq; alt_blocks, alt_scores:
                 # (max_blocks_per_seq, MAX_ALT)) -- per allocated block, the victim's
                 # reason code and runners-up when it evicted a cached block
    # Python conveniences with the same meaning as the njit functions:
    pool.open_seq(tenant=0) -> int; pool.close_seq(seq)
    pool.lookup(hashes, num_tokens) -> list[int]
    pool.allocate(seq, hashes, num_tokens, now_us=0.0) -> AllocResult | None
    pool.cache_block(seq, index, h); pool.fork(parent, child)
    pool.write_last(seq, now_us=0.0) -> int (0 no copy, 1 copied, -1 no room)
    pool.free(seq, now_us=0.0); pool.free_tail(seq, n, now_us=0.0)
    pool.preempt(seq, mode, now_us=0.0) -> int (blocks released)
    pool.table(seq) -> list[int]; pool.ref_cnt(b) -> int; pool.block_hash(b) -> int
    pool.free_queue() -> list[int]   # vLLM order: empties then candidates in policy order
    pool.counters() -> dict[str, int]; pool.check_invariants()  # raises AssertionError

Why ``ops`` and ``pol``: the operations that consult the order live in
:mod:`kvsim.memory.pool_ops` and take the order as a value, ``pol = (state, hooks)``
(:mod:`kvsim.policy.hooks`: the state as one pointer, the hooks as numba first-class
functions of one signature), so they are compiled once for every order and cached on disk;
each order compiles only its own hooks.

njit functions.  In ``kvsim.memory.fast`` (no hooks)::

    seq_open(st, tenant) -> seq (-1 if no slot)         seq_close(st, seq)
    pool_lookup(st, hashes, n, num_tokens, out_blocks) -> n_hit
        # prefix hits over hashes[:n], stop at first miss (0 = NO_HASH is a miss), at most
        # (num_tokens - 1) // block_size blocks; changes nothing
    pool_cache_block(st, seq, index, h)   # a held block became full: give it hash h
    pool_fork(st, parent, child)          # child (open, empty) shares every block: ref+1
    pick_preemption_victim(running, n_running, request_priority, arrival, by_priority)
        -> index into running: the last one, or (by_priority) the lowest request_priority,
           ties -> the latest arrival (vLLM v1 Scheduler)
    pool_check(st) -> 0 if every invariant holds, else a positive code (fast.INVARIANTS)

In ``ops = pool.ops`` (``kvsim.memory.pool_ops``; ``pst`` below is ``pool.pol``, ``view``
``pool.view_c``)::

    ops.allocate(st, pst, view, seq, hashes, n, num_tokens, now_us, out) -> n_hit, or -1
        # append n blocks to seq's table.  If the table is empty and caching is on, first
        # the prefix lookup (hits are shared: ref+1; a cached hit is revived: on_hit then
        # on_remove).  The other blocks are new: an empty block if any, else the policy's
        # victim (its hash is dropped from the index; out.evicted_hash[i] gets it).  New
        # blocks with hashes[i] != 0 are registered in the prefix index (pass 0 for
        # partial blocks).  out.blocks[i] = block id; out.kind[i] = KIND_HIT (shared, was
        # held), KIND_REVIVED (was cached), KIND_NEW (was empty), KIND_EVICTED (replaced a
        # cached block).  -1: does not fit, NOTHING changed (vLLM's rule).
    ops.write_last(st, pst, view, seq, now_us, out) -> 0 | 1 | -1
        # a write into seq's LAST block: if it is shared (ref > 1) copy it to a new block
        # first (counted in cow_copies / cow_bytes); out.blocks[0] = the new block
    ops.free(st, pst, view, seq, now_us)          # release tail-first; ref 0: hashed ->
                                                  # candidate (on_insert), else empties head
    ops.free_tail(st, pst, view, seq, n, now_us)  # release the last n blocks (tail-first)
    ops.preempt(st, pst, view, seq, mode, now_us) -> blocks released
        # mode PREEMPT_RECOMPUTE (0) or PREEMPT_SWAP (1, blocks counted as swapped out);
        # the seq stays open with an empty table; its next admission counts as a rerun

Counters: ``st.counters[C_*]`` (int64), names in ``COUNTER_NAMES``; per tenant
``st.tenant_query_tokens`` / ``st.tenant_hit_tokens``; per block ``st.block_hits``; per
seq ``st.seq_query_tokens`` / ``st.seq_hit_tokens``.
"""

from kvsim.memory.fast import (  # noqa: F401
    AllocResult,
    PoolConfig,
)
from kvsim.memory.pool_handle import FastPool  # noqa: F401
