"""Plain-Python reference of the block pool: vLLM v1's classes, small enough to trust.

Mirrors ``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``, ``FreeKVCacheBlockQueue``),
``block_pool.py`` (``BlockPool``) and ``kv_cache_manager.py`` (``KVCacheManager``), with
kvsim's additions (fork / copy-on-write, swap preemption, per-tenant counters) written the
same plain way.  There is ONE free queue, as in vLLM -- the compiled core
(:mod:`kvsim.memory.fast`) splits it in two, and tests/memory/test_differential.py checks
that both give the same block ids and counters.  Semantics: docs/memory-model.md.

Block hashes are given by the caller (``kvsim.ingest.vllm_hashing`` or the event file); 0 means
"no hash" (a partial block, or unknown content).
"""

from __future__ import annotations

from kvsim.memory.fast import (
    COUNTER_NAMES,
    KIND_EVICTED,
    KIND_HIT,
    KIND_NEW,
    KIND_REVIVED,
    PREEMPT_SWAP,
    AllocResult,
)


class KVCacheBlock:
    """One physical block.  ``ref_cnt`` = number of block tables naming it."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free", "is_null")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = 0  # 0 = none; set while registered in the prefix index
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None
        self.is_null = False


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks (ref_cnt 0) with fake head and tail, so a hit can
    remove a block from the middle in O(1).  Head = next to be reused."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.head = KVCacheBlock(-1)
        self.tail = KVCacheBlock(-1)
        self.head.next_free = self.tail
        self.tail.prev_free = self.head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def popleft(self) -> KVCacheBlock:
        block = self.head.next_free
        assert block is not self.tail, "free queue is empty"
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            last = self.tail.prev_free
            last.next_free = block
            block.prev_free = last
            block.next_free = self.tail
            self.tail.prev_free = block
            self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the front, ``blocks[0]`` first."""
        for block in reversed(blocks):
            first = self.head.next_free
            self.head.next_free = block
            block.prev_free = self.head
            block.next_free = first
            first.prev_free = block
            self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out, cur = [], self.head.next_free
        while cur is not self.tail:
            out.append(cur)
            cur = cur.next_free
        return out


class BlockPool:
    """All blocks, the free queue and the prefix index ``hash -> {block_id: block}``
    (insertion-ordered; several blocks may share a hash: no de-duplication)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached: dict[int, dict[int, KVCacheBlock]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, h: int) -> KVCacheBlock | None:
        blocks = self.cached.get(h)
        return next(iter(blocks.values())) if blocks else None

    def cache_block(self, block: KVCacheBlock, h: int) -> None:
        assert block.block_hash == 0 and h != 0
        block.block_hash = h
        self.cached.setdefault(h, {})[block.block_id] = block

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> int:
        h = block.block_hash
        if h == 0:
            return 0
        del self.cached[h][block.block_id]
        if not self.cached[h]:
            del self.cached[h]
        block.block_hash = 0
        return h

    def get_new_blocks(self, n: int) -> list[tuple[KVCacheBlock, int]]:
        """Pop ``n`` blocks from the head; each with the hash it lost (0 if none)."""
        assert n <= self.free_block_queue.num_free_blocks
        out = []
        for _ in range(n):
            block = self.free_block_queue.popleft()
            evicted = self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
            out.append((block, evicted))
        return out

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered: list[KVCacheBlock]) -> int:
        """Release ``ordered`` (first = evicted first): unhashed blocks reaching 0 go to the
        head in that order, hashed ones to the tail (with caching off, all to the tail)."""
        for block in ordered:
            assert block.ref_cnt > 0, "double free"
            block.ref_cnt -= 1
        without, with_hash, seen = [], [], set()
        for block in ordered:
            if block.ref_cnt == 0 and not block.is_null and block.block_id not in seen:
                seen.add(block.block_id)
                if block.block_hash == 0 and self.enable_caching:
                    without.append(block)
                else:
                    with_hash.append(block)
        self.free_block_queue.prepend_n(without)
        self.free_block_queue.append_n(with_hash)
        return len(without) + len(with_hash)

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks


class KVCacheManager:
    """Block tables of seqs over one :class:`BlockPool`, plus counters (same names and
    meaning as ``fast.COUNTER_NAMES``).  Seq slots are handed out lowest id first."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 block_bytes: int = 0, max_tenants: int = 1):
        self.pool = BlockPool(num_blocks, enable_caching)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_bytes = block_bytes
        self.tables: dict[int, list[KVCacheBlock]] = {}
        self.tenant: dict[int, int] = {}
        self.rerun: dict[int, bool] = {}
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.tenant_query_tokens = [0] * max_tenants
        self.tenant_hit_tokens = [0] * max_tenants
        self.block_hits = [0] * num_blocks

    # -- seqs ---------------------------------------------------------------------------
    def open_seq(self, tenant: int = 0) -> int:
        seq = 0
        while seq in self.tables:
            seq += 1
        self.tables[seq] = []
        self.tenant[seq] = tenant
        self.rerun[seq] = False
        return seq

    def close_seq(self, seq: int) -> None:
        assert not self.tables[seq], "close_seq: free the seq first"
        del self.tables[seq], self.tenant[seq], self.rerun[seq]

    def table(self, seq: int) -> list[int]:
        return [b.block_id for b in self.tables[seq]]

    # -- prefix cache -------------------------------------------------------------------
    def lookup(self, hashes: list[int], num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix (changes nothing)."""
        return [b.block_id for b in self.get_computed_blocks(hashes, num_tokens)]

    def get_computed_blocks(self, hashes: list[int], num_tokens: int) -> list[KVCacheBlock]:
        """Longest cached prefix: stop at the first miss, at most num_tokens-1 tokens."""
        if not self.enable_caching:
            return []
        out = []
        for h in hashes[:max(0, (num_tokens - 1) // self.block_size)]:
            block = self.pool.get_cached_block(h) if h else None
            if block is None:
                break
            out.append(block)
        return out

    def allocate(self, seq: int, hashes: list[int], num_tokens: int = 0) -> AllocResult | None:
        table = self.tables[seq]
        admission = not table
        hits = self.get_computed_blocks(hashes, num_tokens) if admission else []
        n_new = len(hashes) - len(hits)
        n_revive = sum(1 for b in hits if b.ref_cnt == 0)
        if n_new + n_revive > self.pool.get_num_free_blocks():
            self.counters["alloc_failures"] += 1
            return None
        kinds = [KIND_REVIVED if b.ref_cnt == 0 else KIND_HIT for b in hits]
        self.counters["revived_blocks"] += n_revive
        self.counters["hit_blocks"] += len(hits)
        for b in hits:
            self.block_hits[b.block_id] += 1
        self.pool.touch(hits)
        new = self.pool.get_new_blocks(n_new)
        evicted = [0] * len(hits)
        for block, lost in new:
            kinds.append(KIND_EVICTED if lost else KIND_NEW)
            evicted.append(lost)
            self.counters["evicted_blocks" if lost else "new_blocks"] += 1
        if self.enable_caching:
            for (block, _), h in zip(new, hashes[len(hits):]):
                if h:
                    self.pool.cache_block(block, h)
        table.extend(hits + [b for b, _ in new])
        if admission:
            hit_tokens = len(hits) * self.block_size
            if self.rerun[seq]:
                self.rerun[seq] = False
                self.counters["rerun_admissions"] += 1
                self.counters["rerun_query_tokens"] += num_tokens
                self.counters["rerun_hit_tokens"] += hit_tokens
            else:
                self.counters["admissions"] += 1
                self.counters["query_tokens"] += num_tokens
                self.counters["hit_tokens"] += hit_tokens
                self.tenant_query_tokens[self.tenant[seq]] += num_tokens
                self.tenant_hit_tokens[self.tenant[seq]] += hit_tokens
        return AllocResult(len(hits), [b.block_id for b in table[-len(hashes):]] if hashes
                           else [], kinds, evicted)

    def cache_block(self, seq: int, index: int, h: int) -> None:
        block = self.tables[seq][index]
        if self.enable_caching and h and block.block_hash == 0:
            self.pool.cache_block(block, h)

    # -- forks, writes, release -----------------------------------------------------------
    def fork(self, parent: int, child: int) -> None:
        assert not self.tables[child]
        for block in self.tables[parent]:
            block.ref_cnt += 1
        self.tables[child] = list(self.tables[parent])
        self.counters["forks"] += 1

    def write_last(self, seq: int) -> int:
        """Copy-on-write of the last block if shared: 1 copied, 0 not needed, -1 no room."""
        table = self.tables[seq]
        old = table[-1]
        if old.ref_cnt <= 1:
            return 0
        if self.pool.get_num_free_blocks() == 0:
            self.counters["alloc_failures"] += 1
            return -1
        (block, lost), = self.pool.get_new_blocks(1)
        self.counters["evicted_blocks" if lost else "new_blocks"] += 1
        old.ref_cnt -= 1
        table[-1] = block
        self.counters["cow_copies"] += 1
        self.counters["cow_bytes"] += self.block_bytes
        return 1

    def _release(self, seq: int, first: int) -> None:
        table = self.tables[seq]
        released = table[first:]
        del table[first:]
        self.counters["released_blocks"] += self.pool.free_blocks(list(reversed(released)))

    def free(self, seq: int) -> None:
        self._release(seq, 0)

    def free_tail(self, seq: int, n: int) -> None:
        self._release(seq, len(self.tables[seq]) - n)

    def preempt(self, seq: int, mode: int) -> int:
        m = len(self.tables[seq])
        if mode == PREEMPT_SWAP:
            self.counters["preempt_swap"] += 1
            self.counters["swap_out_blocks"] += m
            self.counters["swap_out_bytes"] += m * self.block_bytes
        else:
            self.counters["preempt_recompute"] += 1
        self._release(seq, 0)
        self.rerun[seq] = True
        return m

    # -- inspection -----------------------------------------------------------------------
    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def ref_cnt(self, b: int) -> int:
        return self.pool.blocks[b].ref_cnt

    def check_invariants(self) -> None:
        """Every block 1..N-1 is free xor referenced; ref counts equal table references;
        free blocks are exactly those with ref 0; the index matches block hashes."""
        blocks = self.pool.blocks
        free = {b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()}
        assert len(free) == self.pool.get_num_free_blocks()
        assert 0 not in free and blocks[0].ref_cnt == 0
        refs = [0] * len(blocks)
        for table in self.tables.values():
            for b in table:
                refs[b.block_id] += 1
        for b in blocks[1:]:
            assert b.ref_cnt == refs[b.block_id], f"block {b.block_id}: ref count"
            assert (b.ref_cnt == 0) == (b.block_id in free), f"block {b.block_id}: free xor held"
        for h, group in self.pool.cached.items():
            for bid, b in group.items():
                assert b.block_hash == h and b.block_id == bid
        assert sum(len(g) for g in self.pool.cached.values()) == sum(
            1 for b in blocks if b.block_hash)
