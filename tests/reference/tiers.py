"""DRAM, CXL, NVMe as docs/simulate.md and docs/cost-model.md describe them, in plain Python.

Each lower tier is a content-addressed cache of hashed blocks (a dict hash -> slot), with
its own eviction policy over every resident block; inclusive (a promotion copies the
block up and the lower copy stays).  A write into a full tier evicts the tier's victim,
which cascades to the next *enabled* tier below (DRAM -> CXL -> NVMe -> dropped).
Writes are asynchronous: bytes on the link, no time.
"""

from __future__ import annotations

import numpy as np

from kvsim.policy.api import BLOCK_VIEW_FIELDS, Priority, new_block_view

from .pool import Hooks

DC = int(Priority.DECODE_CRITICAL)


def view_row(view, b: int) -> dict:
    """Every BlockView field of block ``b``: what a copy of the block carries."""
    return {f: getattr(view, f)[b].item() for f in BLOCK_VIEW_FIELDS}


def candidate(view, owner: tuple[int, int], b: int, score: float) -> dict:
    """One entry of a decision-log row's ``candidates`` (docs/decision-log.md)."""
    return {"content_hash": int(view.content_hash[b]), "request_id": int(owner[0]),
            "block_index": int(owner[1]), "score": float(score),
            "last_access_us": float(view.last_access_us[b]),
            "access_count": int(view.access_count[b]), "priority": int(view.priority[b]),
            "request_priority": int(view.request_priority[b]),
            "deadline_us": int(view.deadline_us[b]), "slack_us": int(view.slack_us[b]),
            "recompute_cost_us": float(view.recompute_cost_us[b]),
            "next_use": int(view.next_use[b]), "phase": int(view.phase[b]),
            "pinned": bool(view.pinned[b])}


class LowerTier:
    def __init__(self, tier: int, capacity_blocks: int, policy, params: dict,
                 n_candidates: int):
        self.tier = tier
        self.cap = capacity_blocks
        slots = max(capacity_blocks, 1)
        self.view = new_block_view(slots)
        self.hooks = Hooks(policy)
        self.pst = policy.init(slots, slots, dict(params))
        self.by_hash: dict[int, int] = {}
        self.owner: dict[int, tuple[int, int]] = {}  # slot -> (request, block index)
        self.fresh = 0  # slots are used 0, 1, 2, ... until the tier is full
        self._alt_b = np.zeros(n_candidates, np.int64)
        self._alt_s = np.zeros(n_candidates, np.float64)

    def find(self, h: int):
        return self.by_hash.get(h)

    def touch(self, slot: int, now_us: float) -> None:
        """A promotion read the block: an access of this tier's copy."""
        self.view.last_access_us[slot] = now_us
        self.view.access_count[slot] += 1
        self.hooks.on_hit(self.pst, self.view, slot, now_us)

    def put(self, block: dict, owner: tuple[int, int], now_us: float):
        """Write ``block`` (view fields); returns the evicted block as
        ``(fields, owner, reason, candidates)`` or None."""
        evicted = None
        if self.fresh < self.cap:
            slot = self.fresh
            self.fresh += 1
        else:
            slot, reason, n_alt = self.hooks.victim(self.pst, self.view, now_us,
                                                    self._alt_b, self._alt_s)
            slot = int(slot)
            assert self.owner.get(slot) is not None, "victim() named a non-resident slot"
            cands = [candidate(self.view, self.owner[int(self._alt_b[j])],
                               int(self._alt_b[j]), self._alt_s[j]) for j in range(int(n_alt))]
            evicted = (view_row(self.view, slot), self.owner.pop(slot), int(reason), cands)
            self.hooks.on_remove(self.pst, self.view, slot)
            del self.by_hash[int(self.view.content_hash[slot])]
        for f, v in block.items():
            getattr(self.view, f)[slot] = v
        self.view.insert_us[slot] = now_us
        self.view.last_access_us[slot] = now_us
        self.owner[slot] = owner
        self.by_hash[int(block["content_hash"])] = slot
        self.hooks.on_insert(self.pst, self.view, slot, now_us)
        return evicted


class LowerTiers:
    """The three lower tiers (index 1..3; a tier of capacity 0 is disabled)."""

    def __init__(self, caps: list[int], policies: list, params: dict, rec, n_candidates: int):
        self.rec = rec  # the replay's recorder: counters and the decision log
        self.t = {i + 1: LowerTier(i + 1, caps[i], policies[i], params, n_candidates)
                  for i in range(3)}
        self.enabled = [i for i in (1, 2, 3) if caps[i - 1] > 0]

    def find(self, h: int):
        """(tier, slot) of the first tier holding ``h``, or None."""
        for i in self.enabled:
            s = self.t[i].find(h)
            if s is not None:
                return i, s
        return None

    def below(self, h: int) -> bool:
        return self.find(h) is not None

    def first(self) -> int:
        return self.enabled[0] if self.enabled else 0

    def spill(self, block: dict, owner: tuple[int, int], dest: int, step: int,
              now_us: float) -> None:
        """Write ``block`` into tier ``dest``; victims cascade down the enabled tiers."""
        rec = self.rec
        tiers = [i for i in self.enabled if i >= dest]
        for j, i in enumerate(tiers):
            out = self.t[i].put(block, owner, now_us)
            rec.add(f"bytes_down_{i}", block["size_bytes"])
            rec.peak(i, len(self.t[i].owner))
            if out is None:
                return
            block, owner, reason, cands = out
            to = tiers[j + 1] if j + 1 < len(tiers) else -1
            rec.add(f"spills_{i}" if to > 0 else f"evictions_{i}", 1)
            rec.log(step, now_us, "DEMOTE" if to > 0 else "EVICT", block["content_hash"],
                    owner[0], owner[1], i, to, block["size_bytes"] if to > 0 else 0, 0.0,
                    block["priority"] == DC, reason, None, cands)
            if to < 0:
                return
