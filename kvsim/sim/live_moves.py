"""The live-offload replay's two hot loops, :meth:`LiveReplay._spill_many` and
:meth:`LiveReplay._fetch_many` (kvsim/sim/live_offload.py), kept apart so that module stays
readable: under thrashing (a batch whose contexts exceed HBM) nearly all CPU time is spent
moving blocks here, so both inline what :meth:`LiveReplay._spill` / ``_fetch`` do per
block (same effects, same order).  ``self`` is the :class:`LiveReplay`."""

from __future__ import annotations

from kvsim.errors import KvsimInputError
from kvsim.schema import Priority

HBM = 0  # LiveReplay.b_tier of a block in HBM
PINNED = 1  # LiveReplay's pin class of a pinned unit
PR_CRIT = int(Priority.DECODE_CRITICAL)


def spill_many(self, r: int, cls: int, k: int) -> None:
    """Spill the top ``k`` blocks of request ``r``'s unit ``cls`` (fewer if it has
    fewer): :meth:`_spill` of each top block in turn, with the unit's bookkeeping done
    once (the replay's hot loop under thrashing)."""
    st = self.stack[r][cls]
    k = min(k, len(st))
    if k <= 0:
        return
    cnt = self.ucnt[2 * r + cls]
    b_slot, b_tier, b_intent = self.b_slot, self.b_tier, self.b_intent
    slot_block, free, used, cap = self.slot_block, self.free_slots, self.tier_used, \
        self.tier_cap
    spilled, has_spilled, holders = self.spilled, self.has_spilled, self.b_holders
    bb = self.block_bytes
    for _ in range(k):
        b = st.pop()
        pr = b_intent[b][1]
        cnt[0 if pr < 0 else 3 if pr > 3 else pr] -= 1
        s = b_slot[b]
        slot_block[s] = -1
        free.append(s)
        t = 1
        while t <= 3 and used[t] >= cap[t]:
            t += 1
        if t > 3:
            raise KvsimInputError("the lower tiers are full of spilled live blocks; "
                                  "expected more DRAM/CXL/NVMe (--dram-gb) or a larger "
                                  "HBM", None, None, "--dram-gb")
        used[t] += 1
        b_tier[b] = t
        b_slot[b] = -1
        self.link_bytes[t] += bb
        for h in holders[b]:
            spilled[h][b] = None
            has_spilled[h] = None
        if self.b_pf[b]:
            self.b_pf[b] = False
            self.c["prefetches_wasted"] += 1
            for h in holders[b]:
                self.pf_unused[h].discard(b)
    self.c["live_spills"] += k
    if cls == PINNED:
        self.c["pinned_spills"] += k
    u = self.C + 2 * r + cls
    if not st and self.in_pol[u]:
        self._remove(u, cls)


def fetch_many(self, miss: dict, per_tier: list) -> bool:
    """Fetch the blocks of ``miss`` (in order) into free slots while there are some:
    :meth:`_fetch` of each in turn, inlined (the replay's hot loop under thrashing).
    Adds to ``per_tier``; True if a fetched block was pinned or DECODE_CRITICAL."""
    crit = False
    free, used, b_tier, b_slot, slot_block = (self.free_slots, self.tier_used,
                                              self.b_tier, self.b_slot, self.slot_block)
    b_req, b_cls, b_intent, stack, ucnt = (self.b_req, self.b_cls, self.b_intent,
                                           self.stack, self.ucnt)
    spilled, has_spilled, holders, in_pol = (self.spilled, self.has_spilled,
                                             self.b_holders, self.in_pol)
    bb, C = self.block_bytes, self.C
    for b in list(miss):
        if not free:
            break
        cls = b_cls[b]
        pr = b_intent[b][1]
        if cls == PINNED or pr == PR_CRIT:
            crit = True
        t = b_tier[b]
        used[t] -= 1
        self.link_bytes[t] += bb
        per_tier[t] += 1
        slot = free.pop()
        b_tier[b] = HBM
        b_slot[b] = slot
        slot_block[slot] = b
        for h in holders[b]:
            sp = spilled[h]
            sp.pop(b, None)
            if not sp:
                has_spilled.pop(h, None)
        r = b_req[b]
        st = stack[r][cls]
        st.append(b)
        k = 2 * r + cls
        ucnt[k][0 if pr < 0 else 3 if pr > 3 else pr] += 1
        if len(st) == 1:
            u = C + k
            if u not in self.held_units and not in_pol[u]:
                self.view.insert_us[u] = self.now_us
                self._fill_unit(u, b)
                self._insert(u, cls)
    return crit
