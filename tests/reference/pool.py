"""HBM as vLLM v1's block pool, written from docs/memory-model.md in plain Python.

Lists and dicts, no arrays except the :class:`kvsim.policy.api.BlockView` the eviction
policy reads (the contract of kvsim/policy/api.py).  vLLM's one free queue is kept as the
docs draw it: ``empties`` (head = reused first) and the policy-ordered candidate set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.jit.python_twin import python_twin
from kvsim.policy.api import new_block_view

MAX_ALT = 8  # runners-up array a pool victim() call receives (kvsim.memory.fast.MAX_ALT)


@dataclass
class Taken:
    """How one block of an allocation was obtained."""

    block: int
    kind: str  # "hit" (shared), "revived" (cached, ref 0 -> 1), "new", "evicted"
    evicted_hash: int = 0
    reason: int = -1
    candidates: list = field(default_factory=list)  # (block, score) victim first


class Hooks:
    """A policy's hooks as plain Python (a built-in's njit hooks and the helpers they call:
    :func:`kvsim.jit.python_twin.python_twin`, which compiles nothing), with the defaults of
    kvsim/policy/api.py resolved from the module itself: no ``on_hold``/``on_release``
    pair -> ``on_remove``/``on_insert``, and no ``on_hit`` for held blocks; no ``on_miss``
    -> nothing."""

    def __init__(self, policy):
        m = policy.module

        def py(f):
            return python_twin(f)

        self.on_insert = py(m.on_insert)
        self.on_hit = py(m.on_hit)
        self.on_remove = py(m.on_remove)
        self.victim = py(m.victim)
        self.keeps_held = hasattr(m, "on_hold")
        self.on_hold = py(m.on_hold) if self.keeps_held else self.on_remove
        self.on_release = py(m.on_release) if self.keeps_held else self.on_insert
        self.on_miss = py(getattr(m, "on_miss", lambda state, view, h, now_us: None))


class Pool:
    """Blocks 1..N-1 (0 is vLLM's null block), ref counts, hash chain index."""

    def __init__(self, num_blocks: int, block_tokens: int, policy, params: dict):
        import numpy as np

        self.n = num_blocks
        self.bs = block_tokens
        self.view = new_block_view(num_blocks)
        self.hooks = Hooks(policy)
        self.pst = policy.init(num_blocks - 1, num_blocks, dict(params))
        self.ref = [0] * num_blocks
        self.hash = [0] * num_blocks  # registered hash, 0 = none
        self.empties = list(range(1, num_blocks))  # head first: never used, by id
        self.cands: set[int] = set()
        self.index: dict[int, list[int]] = {}  # hash -> blocks, registration order
        self.tables: dict[int, list[int]] = {}  # request -> block ids
        self._alt_b = np.zeros(MAX_ALT, np.int64)
        self._alt_s = np.zeros(MAX_ALT, np.float64)

    # -- queries ------------------------------------------------------------------------
    @property
    def held(self) -> int:
        return sum(1 for b in range(1, self.n) if self.ref[b] > 0)

    def lookup(self, hashes: list[int], num_tokens: int) -> list[int]:
        """vLLM get_computed_blocks: the chain up to the first miss, at most
        ``num_tokens - 1`` tokens; the first block registered per hash.  Changes nothing."""
        out = []
        for h in hashes[: max(0, (num_tokens - 1) // self.bs)]:
            if h == 0 or h not in self.index:
                break
            out.append(self.index[h][0])
        return out

    # -- operations ---------------------------------------------------------------------
    def _evict(self, now_us: float) -> Taken:
        b, reason, n_alt = self.hooks.victim(self.pst, self.view, now_us, self._alt_b,
                                             self._alt_s)
        b = int(b)
        assert b in self.cands, f"victim() named {b}, not a candidate"
        alts = [(int(self._alt_b[j]), float(self._alt_s[j])) for j in range(int(n_alt))]
        self.hooks.on_remove(self.pst, self.view, b)
        self.cands.discard(b)
        h = self.hash[b]
        self.index[h].remove(b)
        if not self.index[h]:
            del self.index[h]
        self.hash[b] = 0
        return Taken(b, "evicted", h, int(reason), alts)

    def allocate(self, r: int, hashes: list[int], num_tokens: int, now_us: float):
        """Append ``len(hashes)`` blocks to r's table; an empty table looks its prefix up
        first.  None when it does not fit (then nothing changed: vLLM allocate_slots)."""
        table = self.tables.setdefault(r, [])
        hits = self.lookup(hashes, num_tokens) if not table else []
        revive = sum(1 for b in hits if self.ref[b] == 0)
        if len(hashes) - len(hits) + revive > len(self.empties) + len(self.cands):
            return None
        taken = []
        hk = self.hooks
        for b in hits:  # a prefix hit is an access; a cached block is held again
            if self.ref[b] == 0:
                hk.on_hit(self.pst, self.view, b, now_us)
                hk.on_hold(self.pst, self.view, b)
                self.cands.discard(b)
                taken.append(Taken(b, "revived"))
            else:
                if hk.keeps_held:
                    hk.on_hit(self.pst, self.view, b, now_us)
                taken.append(Taken(b, "hit"))
            self.ref[b] += 1
        for h in hashes[len(hits):]:
            if h != 0:  # content not resident: announced before the victims for its room
                hk.on_miss(self.pst, self.view, h, now_us)
            t = Taken(self.empties.pop(0), "new") if self.empties else self._evict(now_us)
            self.ref[t.block] = 1
            taken.append(t)
        for t, h in zip(taken[len(hits):], hashes[len(hits):]):
            if h != 0:  # full blocks are cached at once (no de-duplication)
                self.hash[t.block] = h
                self.index.setdefault(h, []).append(t.block)
        table.extend(t.block for t in taken)
        return taken

    def admit(self, taken: list, now_us: float) -> None:
        """New content entered HBM (its views written): each new hashed block begins its
        history in the policy, held by its request."""
        for t in taken:
            if t.kind in ("new", "evicted") and self.hash[t.block] != 0:
                self.hooks.on_insert(self.pst, self.view, t.block, now_us)
                self.hooks.on_hold(self.pst, self.view, t.block)

    def cache_block(self, r: int, index: int, h: int, now_us: float) -> int:
        """Block ``index`` of r's table became full: it takes hash ``h`` (after any block
        already registered with it) and enters the policy held.  Returns the block."""
        b = self.tables[r][index]
        if self.hash[b] == 0 and h != 0:
            self.hash[b] = h
            self.index.setdefault(h, []).append(b)
            self.view.content_hash[b] = h
            self.hooks.on_insert(self.pst, self.view, b, now_us)
            self.hooks.on_hold(self.pst, self.view, b)
        return b

    def release(self, r: int, keep: int, now_us: float) -> None:
        """Free r's table entries from ``keep`` on, tail first: unhashed blocks reaching
        ref 0 go to the head of the empties (in tail-first order), hashed ones become
        candidates (on_insert, tail first)."""
        table = self.tables.get(r, [])
        freed = table[keep:][::-1]
        del table[keep:]
        for b in freed:
            self.ref[b] -= 1
            assert self.ref[b] >= 0
        zero = [b for b in freed if self.ref[b] == 0]
        self.empties[0:0] = [b for b in zero if self.hash[b] == 0]
        for b in zero:
            if self.hash[b] != 0:
                self.cands.add(b)
                self.hooks.on_release(self.pst, self.view, b, now_us)

    def fork(self, parent: int, child: int) -> None:
        self.tables[child] = list(self.tables.get(parent, []))
        for b in self.tables[child]:
            self.ref[b] += 1

    def write_last(self, r: int, now_us: float):
        """Copy-on-write of r's last block when shared: the copy's Taken, "none" when no
        copy is needed, None when no block is free."""
        table = self.tables[r]
        old = table[-1]
        if self.ref[old] <= 1:
            return "none"
        if not self.empties and not self.cands:
            return None
        t = Taken(self.empties.pop(0), "new") if self.empties else self._evict(now_us)
        self.ref[t.block] = 1
        self.ref[old] -= 1
        table[-1] = t.block
        return t
