"""The live-offload replay's two hot loops, :meth:`LiveReplay._spill_many` and
:meth:`LiveReplay._fetch_many` (kvsim/modes/live/live_offload.py), kept apart so that module stays
readable: under thrashing (a batch whose contexts exceed HBM) nearly all CPU time is spent
moving blocks here.  ``self`` is the :class:`LiveReplay`.

Two implementations with the same effects, bit for bit (tests/sim/test_live_runs.py):

* :func:`spill_run` / :func:`fetch_run` (the default): a unit's top ``k`` blocks, or a
  request's missing blocks, move as one *run*: the per-block bookkeeping (tier, slot,
  free-slot stack, per-priority counts, link bytes) is a handful of numpy array
  operations over the run, and the policy hooks are called exactly where the block loop
  calls them (a unit that becomes non-empty during a fetch is inserted with the view of
  its first fetched block, before the rest of its blocks are counted).  Blocks held by
  more than one request (shared prefix blocks) update their holders block by block.
* :func:`spill_many` / :func:`fetch_many` (``SimConfig(engine="interpreted")``): the
  reference, one block at a time, inlining what :meth:`LiveReplay._spill` / ``_fetch`` do.

Measured on long_context_extreme (48 requests, HBM 12,000 blocks, lru; 10.2 M blocks
spilled, 10.1 M fetched): docs/benchmarks.md, "Live offload".
"""

from __future__ import annotations

import numpy as np

from kvsim.bounds.live_optimal import unlend
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import Priority, Tier

#: Fewest blocks moved as a run; fewer move block by block (same effects): a run's numpy
#: calls cost ~50-100 us, a block ~3 us (profiled on long_context_extreme, 48 requests,
#: deadline: 40 % of spill/fetch calls moved 1-3 blocks; docs/benchmarks.md, "Live
#: offload").  Tests set it to 0 to check runs of every length against the block loop.
RUN_MIN_BLOCKS = 16
HBM = int(Tier.HBM)  # LiveReplay.b_tier of a block in HBM
UNPINNED, PINNED = 0, 1  # LiveReplay's pin class of a pinned unit
PR_CRIT = int(Priority.DECODE_CRITICAL)


def prefetch_wasted(self, b: int) -> None:
    """Prefetched block ``b`` leaves HBM before any holder read it: a wasted prefetch."""
    self.b_pf[b] = False
    self.c["prefetches_wasted"] += 1
    for h in self.b_holders[b]:
        self.pf_unused[h].discard(b)


def _unit_spilled(self, r: int, cls: int, k: int) -> None:
    """``k`` blocks of request ``r``'s unit ``cls`` were spilled: count them, and take the
    unit out of the policy once it holds nothing."""
    self.c["live_spills"] += k
    if cls == PINNED:
        self.c["pinned_spills"] += k
    u = self.C + 2 * r + cls
    if not self.stack[r][cls] and self.in_pol[u]:
        self._remove(u, cls)


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
            raise _tiers_full()
        used[t] += 1
        b_tier[b] = t
        b_slot[b] = -1
        self.link_bytes[t] += bb
        for h in holders[b]:
            spilled[h][b] = None
            has_spilled[h] = None
        if self.b_pf[b]:
            prefetch_wasted(self, b)
    _unit_spilled(self, r, cls, k)


def fetch_many(self, rr: int, miss: dict, per_tier: list) -> bool:
    """Fetch the blocks of request ``rr``'s ``miss`` (in order) into free slots while there
    are some: :meth:`_fetch` of each in turn, inlined (the replay's hot loop under
    thrashing), except that a shared block owned by another request becomes ``rr``'s
    (see :func:`own_fetched`).  Adds to ``per_tier``; True if a fetched block was
    pinned or DECODE_CRITICAL."""
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
        if b_req[b] != rr:
            own_fetched(self, b, rr)
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


def spill_one(self, b: int) -> None:
    """Spill resident block ``b`` of a running request (:meth:`LiveReplay._spill`)."""
    self._pop_from(b)
    s = self.b_slot[b]
    self.slot_block[s] = -1
    self.free_slots.append(s)
    t = 1
    while t <= 3 and self.tier_used[t] >= self.tier_cap[t]:
        t += 1
    if t > 3:
        raise _tiers_full()
    self.tier_used[t] += 1
    self.b_tier[b] = t
    self.b_slot[b] = -1
    self.link_bytes[t] += self.block_bytes
    self.c["live_spills"] += 1
    if self.b_cls[b] == PINNED:
        self.c["pinned_spills"] += 1
    for r in self.b_holders[b]:
        self.spilled[r][b] = None
        self.has_spilled[r] = None
    if self.b_pf[b]:
        prefetch_wasted(self, b)


def fetch_one(self, b: int, slot: int) -> int:
    """Bring spilled ``b`` into ``slot``; returns the tier it came from."""
    t = self.b_tier[b]
    self.tier_used[t] -= 1
    self.link_bytes[t] += self.block_bytes
    self.b_tier[b] = HBM
    self.b_slot[b] = slot
    self.slot_block[slot] = b
    for r in self.b_holders[b]:
        sp = self.spilled[r]
        sp.pop(b, None)
        if not sp:
            self.has_spilled.pop(r, None)
    self._push(b)
    return t


def _tiers_full():
    return KvsimInputError("the lower tiers are full of spilled live blocks; expected more "
                           "DRAM/CXL/NVMe (--dram-gb) or a larger HBM", None, None,
                           "--dram-gb")


def own_fetched(self, b: int, r: int) -> None:
    """Spilled shared block ``b``, owned by another request, is fetched for request ``r``:
    it becomes ``r``'s (top of ``r``'s unit, which is held while ``r`` is served).  Left
    in its old owner's unit, making room for ``r``'s next missing block could spill it
    again, and ``r`` would fetch it again: a livelock (seen on main before this rule
    with 24 requests sharing 4 prefixes in a 12-block HBM)."""
    if self.lent:
        unlend(self, b)
    self.b_req[b] = r
    self.b_cls[b] = self._cls_of(b)


def spill_run(self, r: int, cls: int, k: int) -> None:
    """:func:`spill_many` as one run: the top ``k`` blocks of request ``r``'s unit ``cls``,
    top first, each to the first lower tier with room."""
    st = self.stack[r][cls]
    k = min(k, len(st))
    if k <= 0:
        return
    run = st[-k:]
    del st[-k:]
    run.reverse()  # the block loop pops the top first
    blocks = np.array(run, np.int64)
    cnt = self.ucnt[2 * r + cls]
    pc = np.bincount(np.minimum(np.maximum(self.b_prio[blocks], 0), 3), minlength=4)
    for i in range(4):
        cnt[i] -= int(pc[i])
    slots = self.b_slot[blocks]
    self.slot_block[slots] = -1
    self.free_slots.extend(slots.tolist())
    used, cap, bb = self.tier_used, self.tier_cap, self.block_bytes
    start = 0
    for t in (1, 2, 3):  # DRAM, then CXL, then NVMe: the first with room
        room = cap[t] - used[t]
        if room <= 0:
            continue
        n = min(k - start, room)
        self.b_tier[blocks[start:start + n]] = t
        used[t] += n
        self.link_bytes[t] += n * bb
        start += n
        if start == k:
            break
    if start < k:
        raise _tiers_full()
    self.b_slot[blocks] = -1
    holders = self.b_holders
    if self.lent and any(self.lent.get(b) == r for b in run):
        _spilled_lent(self, run)  # the bound: r does not hold the blocks lent to it
        shared = np.zeros(k, np.bool_)
    else:
        self.spilled[r].update(dict.fromkeys(run))  # r, the owner, holds each
        self.has_spilled[r] = None
        shared = self.b_ref[blocks] > 1
    if shared.any():  # the other holders of shared blocks, in run order
        spilled, has_spilled = self.spilled, self.has_spilled
        for b in blocks[shared].tolist():
            for h in holders[b]:
                if h != r:
                    spilled[h][b] = None
                    has_spilled[h] = None
    pf = self.b_pf[blocks]
    if pf.any():
        for b in blocks[pf].tolist():
            prefetch_wasted(self, b)
    _unit_spilled(self, r, cls, k)


def _spilled_lent(self, run: list) -> None:
    """A run with blocks lent to its unit's request (the bound, kvsim/bounds/live_optimal.py,
    which that request does not hold yet): each block is missing for its holders, block
    by block as :func:`spill_many` records it."""
    spilled, has_spilled, holders = self.spilled, self.has_spilled, self.b_holders
    for b in run:
        for h in holders[b]:
            spilled[h][b] = None
            has_spilled[h] = None


def fetch_run(self, r: int, miss: dict, per_tier: list) -> bool:
    """:func:`fetch_many` as one run: the first ``min(len(miss), free slots)`` blocks of
    request ``r``'s missing blocks ``miss``, in order, into the free slots (top of the
    free-slot stack first)."""
    free = self.free_slots
    n = min(len(miss), len(free))
    if n <= 0:
        return False
    run = list(miss)
    rest = run[n:]
    del run[n:]
    blocks = np.array(run, np.int64)
    sl = free[-n:]
    del free[-n:]
    sl.reverse()  # the block loop pops the top free slot first
    slots = np.array(sl, np.int64)
    bb = self.block_bytes
    tc = np.bincount(self.b_tier[blocks], minlength=4)
    used = self.tier_used
    for t in (1, 2, 3):
        m = int(tc[t])
        if m:
            used[t] -= m
            self.link_bytes[t] += m * bb
            per_tier[t] += m
    b_prio = self.b_prio[blocks]
    foreign = self.b_req[blocks] != r
    if foreign.any():  # own_fetched of each, at once
        fb = blocks[foreign]
        if self.lent:
            for b in fb.tolist():
                unlend(self, b)
        self.b_req[fb] = r
        self.b_cls[fb] = np.where(self.b_pin[fb] | (b_prio[foreign] == PR_CRIT) |
                                  bool(self.req_pin[r]), PINNED, UNPINNED)
    b_cls = self.b_cls[blocks]
    crit = bool(((b_cls == PINNED) | (b_prio == PR_CRIT)).any())
    self.b_tier[blocks] = HBM
    self.b_slot[blocks] = slots
    self.slot_block[slots] = blocks
    miss.clear()  # r holds each: the run leaves r's missing blocks at once
    if rest:
        miss.update(dict.fromkeys(rest))
    else:
        self.has_spilled.pop(r, None)
    shared = self.b_ref[blocks] > 1
    if shared.any():  # and the other holders' missing blocks
        spilled, has_spilled, holders = self.spilled, self.has_spilled, self.b_holders
        for b in blocks[shared].tolist():
            for h in holders[b]:
                if h != r:
                    sp = spilled[h]
                    sp.pop(b, None)
                    if not sp:
                        has_spilled.pop(h, None)
    # onto their owners' stacks, in runs of one unit; a unit that becomes non-empty is
    # inserted (view of its first block) before the rest of its run is counted
    key = 2 * self.b_req[blocks] + b_cls
    pcat = np.minimum(np.maximum(b_prio, 0), 3)  # (np.clip: 10x the call overhead)
    if n == 1 or (key == key[0]).all():
        bounds = [0, n]
    else:
        bounds = [0, *(np.flatnonzero(key[1:] != key[:-1]) + 1).tolist(), n]
    stack, ucnt, C = self.stack, self.ucnt, self.C
    for i, j in zip(bounds[:-1], bounds[1:]):
        k = int(key[i])
        c = k & 1
        st = stack[k >> 1][c]
        cnt = ucnt[k]
        b0 = run[i]
        st.append(b0)
        cnt[int(pcat[i])] += 1
        if len(st) == 1:
            u = C + k
            if u not in self.held_units and not self.in_pol[u]:
                self.view.insert_us[u] = self.now_us
                self._fill_unit(u, b0)
                self._insert(u, c)
        if j > i + 1:
            st.extend(run[i + 1:j])
            pc = np.bincount(pcat[i + 1:j], minlength=4)
            for q in range(4):
                cnt[q] += int(pc[q])
    return crit
