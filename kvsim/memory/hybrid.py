"""The hybrid KV-cache pool: per-layer-group managers over one shared block pool, as vLLM
0.33.0's ``HybridKVCacheCoordinator`` runs them (docs/memory-model.md, "Hybrid models").

Plain Python, written from ``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py`` and ``block_pool.py``; tests/memory/test_hybrid_vllm.py
checks it block id for block id against vLLM's own manager on a recording
(tests/fixtures/vllm_hybrid.json, bench/vllm/record_hybrid.py).

* One pool of ``num_blocks`` blocks (+ the null block, id 0) and one free queue (vLLM's
  ``FreeKVCacheBlockQueue``: :class:`kvsim.memory.reference.FreeKVCacheBlockQueue`); every
  group draws its blocks from it.  A block's prefix-cache key is ``(hash, group)``.
* ``full``: ``FullAttentionManager``: every block kept until the request ends; hits are the
  longest run of cached blocks from the start.
* ``sliding_window``: ``SlidingWindowManager``: before each allocation the blocks wholly
  outside the window (``num_computed - window + 1`` tokens skipped) are freed -- they stay
  cached and evictable -- and replaced by the null block; a hit needs only the last
  ``cdiv(window - 1, block_size)`` blocks before the hit point, searched right to left.
* ``mamba`` (Mamba2, Gated DeltaNet: a model's ``"linear"`` layers; Nemotron-H's MLP
  layers are in no group): ``MambaManager`` with ``mamba_cache_mode="align"``: one state block per
  request (the state after the last computed token, at block index ``cdiv(tokens, bs) - 1``),
  the previous state freed once passed; a state is cached only when a step ends exactly
  on a block boundary, and a hit is the rightmost cached boundary state.
* Block sizes: the scheduler block size is the lcm of the groups' block sizes, the hash
  block size their gcd (vLLM: ``KVCacheManager(scheduler_block_size, hash_block_size)``);
  hybrid hits are multiples of the scheduler block size.

Not modelled (vLLM options off by default): EAGLE / MTP drops, speculative Mamba blocks,
prefill checkpoints, fine-grained partial hash hits, sparse retention
(``prefix_cache_retention_interval``), KV connectors, DCP / PCP.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from kvsim.memory.reference import FreeKVCacheBlockQueue, KVCacheBlock

FULL, SLIDING_WINDOW, MAMBA = "full", "sliding_window", "mamba"
KINDS = (FULL, SLIDING_WINDOW, MAMBA)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group: its kind, block size (tokens) and sliding window (tokens)."""

    kind: str
    block_size: int
    sliding_window: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"group kind {self.kind!r}: expected one of {KINDS}")
        if self.block_size <= 0:
            raise ValueError("group block_size must be positive")
        if self.kind == SLIDING_WINDOW and self.sliding_window <= 0:
            raise ValueError("a sliding_window group needs a positive sliding_window")


def model_groups(model, block_size_tokens: int = 16, kv_dtype: str = "auto"):
    """The KV-cache groups vLLM 0.33 builds for a catalog model, and the bytes one block id
    costs: ``(groups, layers_per_group, block_id_bytes)``.

    Layers of one kind form one bucket; buckets are split into groups of equal size
    (``kv_cache_planning``: the smallest bucket's layer count, or the largest when it is
    under 1.5x the smallest; the last group of a bucket padded), so a block id holds one
    page of ``layers_per_group`` layers whatever its group.  A linear-attention hybrid's
    block is first raised to cover a state page (:func:`kvsim.spec.kvsize.hybrid_block_size`);
    its Mamba groups take that block size (``mamba_cache_mode="align"``)."""
    from kvsim.spec.kvsize import hybrid_block_size, kv_bytes_per_layer_token

    bs = hybrid_block_size(model, block_size_tokens, kv_dtype)
    buckets = [(FULL, model.num_full_layers, 0),
               (SLIDING_WINDOW, model.num_sliding_layers, model.sliding_window or 0),
               (MAMBA, model.num_linear_layers, 0)]
    buckets = [b for b in buckets if b[1] > 0]
    smallest = min(n for _, n, _ in buckets)
    largest = max(n for _, n, _ in buckets)
    size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for kind, n, window in buckets:
        groups += [GroupSpec(kind, bs, window)] * _cdiv(n, size)
    page = bs * kv_bytes_per_layer_token(model, kv_dtype)
    if model.num_linear_layers:
        page = max(page, model.linear_state_bytes)
    return groups, size, size * page


def chain_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chain hashes of the full ``block_size`` blocks of ``tokens`` (equal prefixes give
    equal hashes; any collision-free chain hash gives the same hits as vLLM's sha256)."""
    out, parent = [], b""
    for k in range(len(tokens) // block_size):
        chunk = ",".join(map(str, tokens[k * block_size:(k + 1) * block_size]))
        parent = hashlib.sha256(parent + chunk.encode()).digest()
        out.append(int.from_bytes(parent[:8], "little") | 1)
    return out


class _Block(KVCacheBlock):
    __slots__ = ("keys", "key_tokens")

    def __init__(self, block_id: int):
        super().__init__(block_id)
        self.keys: list[tuple] = []   # prefix-cache keys naming this block (first: primary)
        self.key_tokens = 0           # tokens its primary key covers


@dataclass
class HybridRequest:
    """What the pool reads of a request (the caller advances it as vLLM's scheduler does):
    ``tokens`` (prompt + outputs so far), ``num_prompt`` and ``num_computed``."""

    rid: str
    tokens: list[int]
    num_prompt: int
    num_computed: int = 0
    _hashes: list[int] = field(default_factory=list)

    def hashes(self, hash_block_size: int) -> list[int]:
        n = len(self.tokens) // hash_block_size
        if len(self._hashes) != n:
            self._hashes = chain_hashes(self.tokens, hash_block_size)
        return self._hashes


class HybridPool:
    """vLLM's ``KVCacheManager`` over one ``BlockPool`` with one manager per group."""

    def __init__(self, groups: list[GroupSpec], num_blocks: int, max_model_len: int = 1 << 30,
                 max_in_flight_tokens: int | None = None):
        if not groups:
            raise ValueError("a hybrid pool needs at least one group")
        self.groups = list(groups)
        sizes = [g.block_size for g in groups]
        self.scheduler_block_size = math.lcm(*sizes)
        self.hash_block_size = math.gcd(*sizes)
        self.max_model_len = max_model_len
        # vLLM VllmConfig.max_in_flight_tokens (max_num_batched_tokens; KVCacheManager's
        # default: max_model_len): the sliding-window admission cap
        self.max_in_flight_tokens = max_model_len if max_in_flight_tokens is None \
            else max_in_flight_tokens
        self.last_new_ids: list[int] = []  # the block ids the last allocate_slots took
        self.last_uncached_tokens = 0
        self.num_gpu_blocks = num_blocks + 1
        self.blocks = [_Block(i) for i in range(num_blocks + 1)]
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null = self.free_queue.popleft()
        self.null.is_null = True
        self.cached: dict[tuple, dict[int, _Block]] = {}
        n = len(groups)
        self.req_blocks: list[dict[str, list[_Block]]] = [{} for _ in range(n)]
        self.num_cached: list[dict[str, int]] = [{} for _ in range(n)]
        # Mamba "align" state, per group
        self.last_state: list[dict[str, int]] = [{} for _ in range(n)]
        self.retired: list[dict[str, int]] = [{} for _ in range(n)]
        self.allocated: list[set[str]] = [set() for _ in range(n)]
        self.cached_this_step: list[set[tuple]] = [set() for _ in range(n)]
        # attention groups: equal specs looked up together, full attention first
        agroups: list[tuple[GroupSpec, list[int]]] = []
        for i, g in enumerate(groups):
            for spec, ids in agroups:
                if spec == g:
                    ids.append(i)
                    break
            else:
                agroups.append((g, [i]))
        agroups.sort(key=lambda a: a[0].kind != FULL)
        self.attention_groups = agroups
        self.freed_by_window = 0  # blocks freed outside the window / past Mamba states

    # ---- the block pool (vLLM block_pool.py)
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def _view(self, hashes: list[int], bs: int) -> list[int]:
        """The hashes at ``bs`` granularity (``BlockHashListWithBlockSize``): a block's key
        is the chain hash of its last hash block (chained, so it names the whole prefix)."""
        k = bs // self.hash_block_size
        return hashes if k == 1 else [hashes[(j + 1) * k - 1] for j in range(len(hashes) // k)]

    def _get_cached(self, h: int, gids: list[int]) -> list[_Block] | None:
        out = []
        for g in gids:
            d = self.cached.get((h, g))
            if not d:
                return None
            out.append(next(iter(d.values())))
        return out

    def _drop_keys(self, block: _Block) -> None:
        for key in block.keys:
            d = self.cached[key]
            del d[block.block_id]
            if not d:
                del self.cached[key]
        block.keys = []
        block.key_tokens = 0

    def _insert_key(self, block: _Block, key: tuple, num_tokens: int) -> None:
        if not block.keys:
            block.key_tokens = num_tokens
        block.keys.append(key)
        self.cached.setdefault(key, {})[block.block_id] = block

    def _get_new_blocks(self, n: int) -> list[_Block]:
        assert n <= self.free_queue.num_free_blocks, "hybrid pool: out of blocks"
        out = []
        for _ in range(n):
            b = self.free_queue.popleft()
            if b.keys:
                self._drop_keys(b)
            b.ref_cnt = 1
            out.append(b)
            self.last_new_ids.append(b.block_id)
        return out

    def clear_cache(self) -> bool:
        """``BlockPool.reset_prefix_cache``: drop every key, only when no block is held."""
        if self.num_free_blocks() != len(self.blocks) - 1:
            return False
        for b in self.blocks:
            b.keys = []
            b.key_tokens = 0
        self.cached.clear()
        return True

    def _touch(self, blocks: list[_Block]) -> None:
        for b in blocks:
            if b.ref_cnt == 0 and not b.is_null:
                self.free_queue.remove(b)
            b.ref_cnt += 1

    def _free_blocks(self, ordered: list[_Block]) -> None:
        first, last = [], []
        for b in ordered:
            if b.is_null:
                continue
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                (last if b.keys else first).append(b)
        self.free_queue.prepend_n(first)
        self.free_queue.append_n(last)

    # ---- lookups (find_longest_cache_hit of each manager and of the coordinator)
    def _find_full(self, hashes, max_length, gids, spec):
        bs = spec.block_size
        view = self._view(hashes, bs)
        got: list[list[_Block]] = [[] for _ in gids]
        for h in view[:max_length // bs]:
            c = self._get_cached(h, gids)
            if not c:
                break
            for lst, b in zip(got, c):
                lst.append(b)
        hit = len(got[0]) * bs
        hit -= hit % self.scheduler_block_size
        for lst in got:
            del lst[_cdiv(hit, bs):]
        return got, hit

    def _find_sliding(self, hashes, max_length, gids, spec):
        bs, align = spec.block_size, self.scheduler_block_size
        view = self._view(hashes, bs)
        need = _cdiv(spec.sliding_window - 1, bs)
        nmax = max_length // bs
        got = [[self.null] * nmax for _ in gids]
        run, found = 0, False
        for i in range(nmax - 1, -1, -1):
            c = self._get_cached(view[i], gids)
            if c:
                if run == 0 and bs != align and ((i + 1) * bs) % align != 0:
                    continue
                for lst, b in zip(got, c):
                    lst[i] = b
                run += 1
                if run >= need:
                    for lst in got:
                        del lst[i + run:]
                    found = True
                    break
            else:
                run = 0
        if not found:
            for lst in got:
                del lst[run:]
            while bs != align and len(got[0]) * bs % align != 0:
                for lst in got:
                    lst.pop()
        return got, len(got[0]) * bs

    def _find_mamba(self, hashes, max_length, gids, spec):
        bs, align = spec.block_size, self.scheduler_block_size
        view = self._view(hashes, bs)
        got: list[list[_Block]] = [[] for _ in gids]
        for i in range(max_length // bs - 1, -1, -1):
            c = self._get_cached(view[i], gids)
            if c:
                if bs != align and (i + 1) * bs % align != 0:
                    continue
                for lst, b in zip(got, c):
                    lst.extend([self.null] * i)
                    lst.append(b)
                return got, (i + 1) * bs
        return got, 0

    def find_longest_cache_hit(self, hashes: list[int], max_length: int):
        """``HybridKVCacheCoordinator.find_longest_cache_hit``: each attention type accepts
        or shortens the candidate length until none shortens it."""
        n = len(self.groups)
        hit_length = max_length
        blocks_by: list[list[_Block] | None] = [None] * n
        len_by = [0] * n
        simple = len(self.attention_groups) == 2 and self.attention_groups[0][0].kind == FULL
        longest = 0
        find = {FULL: self._find_full, SLIDING_WINDOW: self._find_sliding,
                MAMBA: self._find_mamba}
        while True:
            curr = hit_length
            for spec, gids in self.attention_groups:
                if spec.kind == FULL and blocks_by[gids[0]] is not None:
                    curr = min(curr, len_by[gids[0]])
                    continue
                got, new_len = find[spec.kind](hashes, curr, gids, spec)
                curr = new_len
                longest = max(longest, curr)
                for g, lst in zip(gids, got):
                    blocks_by[g] = lst
                    len_by[g] = new_len
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for spec, gids in self.attention_groups:
            if spec.kind == FULL:
                for g in gids:
                    if blocks_by[g] is not None:
                        del blocks_by[g][_cdiv(hit_length, spec.block_size):]
        # a prefix some group cached beyond the reconciled hit (vLLM's
        # num_uncached_common_prefix_tokens; the scheduler's Mamba split stops there)
        self.last_uncached_tokens = longest - hit_length
        return [b if b is not None else [] for b in blocks_by], hit_length

    def get_computed_blocks(self, req: HybridRequest):
        """The prefix hit: (blocks per group, hit tokens), at most ``tokens - 1`` tokens."""
        return self.find_longest_cache_hit(req.hashes(self.hash_block_size),
                                           len(req.tokens) - 1)

    # ---- per-manager rules
    def _skipped_tokens(self, g: int, num_computed: int) -> int:
        spec = self.groups[g]
        if spec.kind == SLIDING_WINDOW:
            return max(0, num_computed - spec.sliding_window + 1)
        if spec.kind == MAMBA:
            return num_computed - 1
        return 0

    def _remove_skipped(self, g: int, rid: str, num_computed: int) -> None:
        spec = self.groups[g]
        skipped = self._skipped_tokens(g, num_computed)
        if skipped > 0:
            blocks = self.req_blocks[g].setdefault(rid, [])
            last = min(skipped // spec.block_size, len(blocks))
            freed = []
            if spec.kind == MAMBA:
                first = self.retired[g].get(rid, 0)
                if first < last:
                    for i in range(last - 1, first - 1, -1):
                        if not blocks[i].is_null:
                            freed.append(blocks[i])
                            blocks[i] = self.null
                    self.retired[g][rid] = last
            else:
                for i in range(last - 1, -1, -1):
                    if blocks[i].is_null:
                        break
                    freed.append(blocks[i])
                    blocks[i] = self.null
            if freed:
                self.freed_by_window += len(freed)
                self._free_blocks(freed)
        if spec.kind == MAMBA:
            idx = self.last_state[g].get(rid)
            if idx is not None and idx < _cdiv(num_computed, spec.block_size) - 1:
                blocks = self.req_blocks[g][rid]
                if not blocks[idx].is_null:
                    self.freed_by_window += 1
                    self._free_blocks([blocks[idx]])
                    blocks[idx] = self.null

    @staticmethod
    def _evictable(blocks: list[_Block]) -> int:
        return sum(b.ref_cnt == 0 and not b.is_null for b in blocks)

    def admission_cap_blocks(self, g: int) -> int | None:
        """``SlidingWindowSpec.max_admission_blocks_per_request``: the blocks a request can
        hold at once (the window's ``window - 1`` tokens plus the in-flight ones, +1 for a
        window not starting on a block boundary); None for other kinds (no cap)."""
        spec = self.groups[g]
        if spec.kind != SLIDING_WINDOW:
            return None
        tokens = min(spec.sliding_window - 1 + self.max_in_flight_tokens, self.max_model_len)
        return _cdiv(tokens, spec.block_size) + 1

    def _num_to_allocate(self, g: int, rid: str, num_tokens: int, new: list[_Block],
                         total_computed: int, cap: bool = False) -> int:
        spec = self.groups[g]
        held = self.req_blocks[g].get(rid, [])
        if spec.kind == MAMBA:
            if new and new[-1].keys and new[-1].keys[0] in self.cached_this_step[g]:
                return self.num_gpu_blocks + 1
            n = _cdiv(num_tokens, spec.block_size) - len(new) - len(held)
            if n > 0:
                n = min(n, 1)
            return n + self._evictable(new)
        required = _cdiv(num_tokens, spec.block_size)
        if cap and self.admission_cap_blocks(g) is not None:
            required = min(required, self.admission_cap_blocks(g))
        if rid in self.num_cached[g]:
            return max(required - len(held), 0)
        skipped_blocks = self._skipped_tokens(g, total_computed) // spec.block_size
        n = max(required - max(skipped_blocks, len(new) + len(held)), 0)
        skip_new = max(0, skipped_blocks - len(held))
        return n + self._evictable(new[skip_new:])

    def _add_computed(self, g: int, rid: str, new: list[_Block], num_computed: int) -> None:
        spec = self.groups[g]
        blocks = self.req_blocks[g].setdefault(rid, [])
        assert not blocks
        skipped = self._skipped_tokens(g, num_computed) // spec.block_size
        if skipped > 0:
            new = new[skipped:]
        self._touch(new)
        blocks.extend([self.null] * skipped)
        blocks.extend(new)
        self.num_cached[g][rid] = len(blocks)

    def _allocate_new(self, g: int, rid: str, num_tokens: int) -> None:
        spec = self.groups[g]
        blocks = self.req_blocks[g].setdefault(rid, [])
        required = _cdiv(num_tokens, spec.block_size)
        if spec.kind != MAMBA:
            if required > len(blocks):
                blocks.extend(self._get_new_blocks(required - len(blocks)))
            return
        if required <= len(blocks):
            self.allocated[g].add(rid)
            return
        prev = len(blocks)
        if rid in self.allocated[g] or prev > 0:
            self.last_state[g][rid] = prev - 1
        if prev < required - 1:
            blocks.extend([self.null] * (required - 1 - prev))
        blocks.extend(self._get_new_blocks(max(required - len(blocks), 0)))
        self.allocated[g].add(rid)

    def _cache_blocks(self, g: int, req: HybridRequest, num_tokens: int) -> None:
        spec = self.groups[g]
        bs = spec.block_size
        hashes = req.hashes(self.hash_block_size)
        rid = req.rid
        before = self.num_cached[g].get(rid, 0)
        num_full = min(num_tokens, len(hashes) * self.hash_block_size) // bs
        if before < num_full:
            blocks = self.req_blocks[g][rid]
            view = self._view(hashes, bs)
            mask = self._sliding_mask(spec, before, num_full)
            for i in range(before, num_full):
                b = blocks[i]
                if b.is_null or (mask is not None and not mask[i - before]) or not view[i]:
                    continue  # hash 0: content a trace does not know, never cached
                ntok = (i + 1) * bs
                if b.keys:  # a partial entry promoted to the full block
                    self._drop_keys(b)
                self._insert_key(b, (view[i], g), ntok)
                if spec.kind == MAMBA:
                    self.cached_this_step[g].add((view[i], g))
            self.num_cached[g][rid] = num_full
        if spec.kind == FULL and bs != self.hash_block_size:
            self._cache_partial_tail(g, req, num_tokens)

    def _sliding_mask(self, spec: GroupSpec, start: int, end: int) -> list[bool] | None:
        """``SlidingWindowManager.reachable_block_mask`` under dense retention: the blocks
        a hit at some scheduler-block boundary could use."""
        if spec.kind != SLIDING_WINDOW:
            return None
        bs, align = spec.block_size, self.scheduler_block_size
        if align % bs != 0:
            return None
        need = _cdiv(spec.sliding_window - 1, bs)
        per = align // bs
        if need >= per:
            return None
        return [i % per >= per - need for i in range(start, end)]

    def _cache_partial_tail(self, g: int, req: HybridRequest, num_tokens: int) -> None:
        """``FullAttentionManager._cache_partial_tail_block``: the prompt's last hash
        boundary inside a block is registered on that block (a lookup key only
        fine-grained hits use; it makes the block count as cached when freed)."""
        hb = self.hash_block_size
        hashes = req.hashes(hb)
        boundary = min((req.num_prompt - 1) // hb, len(hashes)) * hb
        bs = self.groups[g].block_size
        if boundary == 0 or boundary > num_tokens or boundary % bs == 0:
            return
        blocks = self.req_blocks[g][req.rid]
        idx = boundary // bs
        if idx >= len(blocks) or blocks[idx].is_null:
            return
        b = blocks[idx]
        key = (hashes[boundary // hb - 1], g, "partial")
        if key in b.keys:
            return
        self._insert_key(b, key, boundary)

    # ---- KVCacheManager
    def new_step_starts(self) -> None:
        for s in self.cached_this_step:
            s.clear()

    def allocate_slots(self, req: HybridRequest, num_new_tokens: int, num_new_computed: int = 0,
                       new_computed: list[list[_Block]] | None = None, *,
                       full_sequence_must_fit: bool = False, watermark_blocks: int = 0) -> bool:
        """``KVCacheManager.allocate_slots`` (no lookahead or connector): with
        ``full_sequence_must_fit`` first check that the whole sequence fits (sliding windows
        at their admission cap); free what the windows skipped, check the pool (leaving
        ``watermark_blocks``), adopt the hit, allocate, cache.  False: nothing changed
        (but the blocks the windows skipped stay freed, as in vLLM)."""
        local = req.num_computed + num_new_computed
        total = min(local, self.max_model_len)
        need = min(total + num_new_tokens, self.max_model_len)
        n = len(self.groups)
        new = new_computed if new_computed is not None else [[] for _ in range(n)]
        self.last_new_ids = []
        if full_sequence_must_fit:
            full = min(len(req.tokens), self.max_model_len)
            want = sum(self._num_to_allocate(g, req.rid, full, new[g], total, cap=True)
                       for g in range(n))
            if want + watermark_blocks > self.num_free_blocks():
                return False
        for g in range(n):
            self._remove_skipped(g, req.rid, total)
        want = sum(self._num_to_allocate(g, req.rid, need, new[g], total) for g in range(n))
        if want + watermark_blocks > self.num_free_blocks():
            return False
        if new_computed is not None and any(new_computed):
            if not any(req.rid in self.num_cached[g] for g in range(n)):
                for g in range(n):
                    self._add_computed(g, req.rid, new[g], local)
        for g in range(n):
            self._allocate_new(g, req.rid, need)
        cache_to = min(total + num_new_tokens, len(req.tokens))
        if n > 1:
            cache_to -= cache_to % self.scheduler_block_size
        for g in range(n):
            self._cache_blocks(g, req, cache_to)
        return True

    def free(self, rid: str) -> None:
        """Free the request's blocks, each group's tail first (vLLM ``free``)."""
        for g in range(len(self.groups)):
            self._free_group(g, rid)

    def _free_group(self, g: int, rid: str) -> None:
        """Group ``g``'s part of :meth:`free`."""
        blocks = self.req_blocks[g].pop(rid, [])
        self.num_cached[g].pop(rid, None)
        self.last_state[g].pop(rid, None)
        self.retired[g].pop(rid, None)
        self.allocated[g].discard(rid)
        self._free_blocks(list(reversed(blocks)))

    def block_ids(self, rid: str) -> list[list[int]]:
        return [[b.block_id for b in self.req_blocks[g].get(rid, [])]
                for g in range(len(self.groups))]

    def held_blocks(self, rid: str) -> int:
        """Blocks the request holds (the null block not counted)."""
        return sum(not b.is_null for g in range(len(self.groups))
                   for b in self.req_blocks[g].get(rid, []))
