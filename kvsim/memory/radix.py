"""A radix-tree prefix cache (SGLang ``RadixCache`` style), selectable instead of vLLM's
hash chain so users can compare the two.  Plain Python (not compiled): fine for
comparisons on small and medium traces; the replay's compiled core uses the hash chain.

Model (SGLang ``python/sglang/srt/mem_cache/radix_cache.py`` with ``page_size`` = block
size):

* A tree of cached blocks: a node is one FULL block, keyed under its parent by the
  block's content key (the chain hash: it already encodes the whole prefix, so keying by
  hash under a parent is keying by tokens).  Every node has a physical block.
* ``lock_ref`` of a node = number of seqs whose table contains it (SGLang ``inc_lock_ref``
  on the matched path); a seq holding a node holds its ancestors too (prefix property).
* Lookup (``match_prefix``) walks from the root while children match, at most
  ``num_tokens - 1`` tokens (SGLang caps the prefix at ``len(input_ids) - 1``), and
  touches the matched nodes (``last_access``).  It changes no lock.
* New full blocks are inserted into the tree when allocated (SGLang inserts after the
  prefill chunk that computed them; the simulator has no compute in between) as long as
  the chain from the root is unbroken.  Insert **de-duplicates**: if the key is already a
  child, the seq shares that node and the block it had computed is freed (SGLang frees
  the duplicate KV indices in ``cache_unfinished_req``); counted in ``dedup_blocks``.
* Release (SGLang ``cache_finished_req``): touch the seq's path root-to-leaf, unlock it;
  private blocks (partial, unhashed, or off an unbroken chain) go back to the allocator.
* Eviction: LRU over unlocked LEAVES only (heap by ``last_access``, ties by block id);
  evicting a leaf may make its parent an evictable leaf.  A cached prefix therefore never
  loses a middle block while a longer one survives (vLLM's free queue can).
* Free blocks are handed out lowest id first (SGLang's paged allocator sorts its free
  pages before reuse).

Simplifications (documented in docs/memory-model.md): one node per block (SGLang nodes can
hold several pages and are evicted whole); a logical clock instead of
``time.monotonic()``; an allocation that does not fit evicts nothing (checked first).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from kvsim.memory.fast import KIND_EVICTED, KIND_HIT, KIND_NEW, KIND_REVIVED, AllocResult

COUNTERS = ("admissions", "query_tokens", "hit_tokens", "hit_blocks", "revived_blocks",
            "new_blocks", "evicted_blocks", "alloc_failures", "dedup_blocks")


@dataclass(eq=False)
class Node:
    key: int  # chain hash of the block (0 for the root)
    block: int  # physical block id (-1 for the root)
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0


class RadixCache:
    """Block tables over a radix tree of cached blocks.  Seqs are ints (lowest free first).

    Invariants (:meth:`check_invariants`): every block 1..N-1 is exactly one of free, a
    tree node, or a private block of exactly one seq; a node's ``lock_ref`` equals the
    number of seq tables naming its block; a locked node's parent is locked at least as
    often; an evictable node (unlocked) has only unlocked descendants.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.root = Node(0, -1, None, lock_ref=1)
        self.free_blocks = list(range(1, num_blocks))  # a heap: lowest id first
        self.node_of: dict[int, Node] = {}  # block id -> tree node
        self.tables: dict[int, list[int]] = {}
        self.clock = 0
        self.counters = dict.fromkeys(COUNTERS, 0)

    # -- helpers --------------------------------------------------------------------------
    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def evictable_size(self) -> int:
        return sum(1 for n in self.node_of.values() if n.lock_ref == 0)

    def num_free_blocks(self) -> int:
        """Free plus evictable (the radix counterpart of vLLM's free queue length)."""
        return len(self.free_blocks) + self.evictable_size()

    def _match(self, hashes: list[int], num_tokens: int) -> list[Node]:
        if not self.enable_caching:
            return []
        out, node = [], self.root
        for h in hashes[:max(0, (num_tokens - 1) // self.block_size)]:
            child = node.children.get(h) if h else None
            if child is None:
                break
            out.append(child)
            node = child
        return out

    def _evict(self, n: int) -> list[int]:
        """Evict ``n`` unlocked leaves, least recently used first; return their blocks."""
        heap = [(x.last_access, x.block, x) for x in self.node_of.values()
                if x.lock_ref == 0 and not x.children]
        heapq.heapify(heap)
        out = []
        while len(out) < n:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.key]
            del self.node_of[leaf.block]
            out.append(leaf.block)
            if parent is not self.root and parent.lock_ref == 0 and not parent.children:
                heapq.heappush(heap, (parent.last_access, parent.block, parent))
        self.counters["evicted_blocks"] += len(out)
        return out

    # -- API ------------------------------------------------------------------------------
    def open_seq(self, tenant: int = 0) -> int:
        seq = 0
        while seq in self.tables:
            seq += 1
        self.tables[seq] = []
        return seq

    def close_seq(self, seq: int) -> None:
        assert not self.tables[seq]
        del self.tables[seq]

    def table(self, seq: int) -> list[int]:
        return list(self.tables[seq])

    def lookup(self, hashes: list[int], num_tokens: int) -> list[int]:
        return [n.block for n in self._match(hashes, num_tokens)]

    def allocate(self, seq: int, hashes: list[int], num_tokens: int = 0) -> AllocResult | None:
        table = self.tables[seq]
        admission = not table
        hits = self._match(hashes, num_tokens) if admission else []
        need = len(hashes) - len(hits)
        unlocked_hits = sum(1 for x in hits if x.lock_ref == 0)
        if need > len(self.free_blocks) + self.evictable_size() - unlocked_hits:
            self.counters["alloc_failures"] += 1
            return None
        now = self._tick()
        kinds = []
        for x in hits:  # lock the matched path
            kinds.append(KIND_REVIVED if x.lock_ref == 0 else KIND_HIT)
            self.counters["revived_blocks"] += x.lock_ref == 0
            x.lock_ref += 1
            x.last_access = now
        blocks = [x.block for x in hits]
        evicted_blocks = self._evict(max(0, need - len(self.free_blocks)))
        for b in evicted_blocks:
            heapq.heappush(self.free_blocks, b)
        # the tree node the next new block would hang under (None: chain broken)
        parent = (hits[-1] if hits else self.root) if admission else self._tail_node(table)
        for h in hashes[len(hits):]:
            b = heapq.heappop(self.free_blocks)
            kinds.append(KIND_EVICTED if b in evicted_blocks else KIND_NEW)
            self.counters["new_blocks"] += 1
            if self.enable_caching and h and parent is not None:
                existing = parent.children.get(h)
                if existing is not None:  # de-duplicate: share the tree's copy
                    heapq.heappush(self.free_blocks, b)
                    self.counters["dedup_blocks"] += 1
                    existing.lock_ref += 1
                    existing.last_access = now
                    b, parent = existing.block, existing
                else:
                    node = Node(h, b, parent, lock_ref=1, last_access=now)
                    parent.children[h] = node
                    self.node_of[b] = node
                    parent = node
            else:
                parent = None  # a private block ends the cacheable chain
            blocks.append(b)
        table.extend(blocks)
        if admission:
            self.counters["admissions"] += 1
            self.counters["query_tokens"] += num_tokens
            self.counters["hit_tokens"] += len(hits) * self.block_size
            self.counters["hit_blocks"] += len(hits)
        return AllocResult(len(hits), blocks, kinds, [0] * len(blocks))

    def _tail_node(self, table: list[int]) -> Node | None:
        """The node of the table's last block if the whole table is an unbroken tree path."""
        if not table:
            return self.root
        node = self.node_of.get(table[-1])
        return node if node is not None and len(table) == self._depth(node) else None

    @staticmethod
    def _depth(node: Node) -> int:
        d = 0
        while node.parent is not None:
            d += 1
            node = node.parent
        return d

    def free(self, seq: int) -> None:
        """Touch the path root-to-leaf (SGLang re-inserts at finish), unlock it, return
        private blocks to the allocator."""
        table = self.tables[seq]
        now = self._tick()
        for b in table:
            node = self.node_of.get(b)
            if node is not None:
                node.last_access = now
        for b in reversed(table):
            node = self.node_of.get(b)
            if node is not None:
                node.lock_ref -= 1
            else:
                heapq.heappush(self.free_blocks, b)
        table.clear()

    def check_invariants(self) -> None:
        refs: dict[int, int] = {}
        for table in self.tables.values():
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        free = set(self.free_blocks)
        assert len(free) == len(self.free_blocks), "a block is free twice"
        for b in range(1, self.num_blocks):
            node = self.node_of.get(b)
            if node is not None:
                assert b not in free, f"block {b}: free and in the tree"
                assert node.lock_ref == refs.get(b, 0), f"block {b}: lock_ref"
                assert node.parent.children.get(node.key) is node
                if node.parent is not self.root:
                    assert node.parent.lock_ref >= node.lock_ref, f"block {b}: parent"
            elif b in free:
                assert b not in refs, f"block {b}: free and held"
            else:
                assert refs.get(b, 0) == 1, f"block {b}: private block not held once"
        assert 0 not in free and 0 not in refs
