"""Live KV offload (``--live-offload``): HBM holds fewer blocks than the running requests'
contexts; a running request's blocks may be spilled to DRAM / CXL / NVMe and must be back
in HBM before the step that reads them (docs/memory-model.md, "Live offload").

Rules (docs/cost-model.md, "Live offload", gives each with its source):

* **Need.** An ``ACCESS`` row (request ``r`` is in this step's batch) needs every block of
  ``r``'s table in HBM at that moment (kvsim's granularity rule, schema.py: an ACCESS reads
  every block of the table).  The requests of one step are served in row order, so a batch
  larger than HBM still runs (a block fetched for one request may be spilled for the next,
  as FlexGen-style block streaming does).  A request whose table alone exceeds HBM cannot
  run: :class:`~kvsim.core.errors.KvsimInputError` naming ``--hbm-blocks``.
* **Stall.** The missing blocks of an ACCESS are fetched on demand: per lower tier one
  batched DMA, ``latency_t + bytes / up_bandwidth_t`` (:class:`kvsim.engine.cost_model.
  TierCosts.promote_us`, today's promotion cost), added to the step.
* **Spill.** A block that must leave HBM goes to the first enabled lower tier with room
  (DRAM, then CXL, then NVMe); its bytes cross that tier's link downwards, asynchronously
  (no stall), as the tiered replay's demotions.
* **Who is spilled.** The HBM policy under test chooses, through its own hooks
  (:mod:`kvsim.policy.registry`), among *units*: each running request's resident blocks
  form up to two units, its unpinned blocks and its pinned blocks (pin requested, or
  DECODE_CRITICAL), and each finished, cached (hashed, ref 0) block is a unit of its own.
  A policy names a unit; the replay spills that unit's most recently placed block (a
  request's blocks are spilled tail-first, as vLLM's offloading LRU does), and asks
  again while it needs room.  Pinned units are a second instance of the same policy,
  asked only when no unpinned unit and no cached block is left.  Ranking units keeps the
  replay O(requests) per step (the bound's exceptions: kvsim/bounds/live_optimal.py).
* **Recency.** A unit's view is its request's: ``last_access_us`` is the start of the
  request's latest step (stamped per request, as the tiered core stamps blocks at
  release), intent fields are those of the unit's top block, with the request-level
  intent (request-level INTENT rows) over them.  A request's step is ``on_hit`` of its
  units; a unit the policy names while its own request is being served is taken out of
  the candidates (``on_hold``) and put back (``on_release``) when the request's rows end.
* **Prefetch** (:mod:`kvsim.modes.live.live_prefetch`): after each step's rows, the policy's
  optional ``prefetch_rank`` hook orders the spilled blocks to bring back within the
  link's per-step budget.
* **Prefix cache.** Hashed full prompt blocks are shared as in vLLM (chain lookup at
  admission, stop at the first miss); a finished request's hashed blocks stay in HBM as
  cached units, dropped (not spilled: the tiered replay's model) when chosen.

Python API: :func:`kvsim.modes.live.live_metrics.simulate_live` ``(trace_path, policy, config) -> SimResult`` (what
``kvsim.api.simulate`` runs when ``config.live_offload`` is set).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kvsim.bounds.live_optimal import cached_next, exact_top, settle, unlend
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import EventKind, Phase, Priority, Tier
from kvsim.modes.live import live_moves
from kvsim.modes.live.live_moves import (
    fetch_many,
    fetch_one,
    fetch_run,
    spill_many,
    spill_one,
    spill_run,
)
from kvsim.policy.api import NEVER, new_block_view
from kvsim.policy.hooks import HOOK_NAMES, hooks_for, is_uniform, policy_value, view_ref

K_STEP, K_ARRIVE, K_ALLOCATE, K_ACCESS, K_INTENT, K_COMMIT, K_FORK, K_FREE = (
    int(EventKind.STEP), int(EventKind.ARRIVE), int(EventKind.ALLOCATE),
    int(EventKind.ACCESS), int(EventKind.INTENT), int(EventKind.COMMIT),
    int(EventKind.FORK), int(EventKind.FREE))
PH_DECODE, PH_VERIFY, PH_DRAFT = int(Phase.DECODE), int(Phase.VERIFY), int(Phase.DRAFT)
PH_IDLE = int(Phase.IDLE)
PR_CRIT = int(Priority.DECODE_CRITICAL)
TOKEN_PHASES = (PH_DECODE, PH_VERIFY, PH_DRAFT)
HBM = int(Tier.HBM)  # b_tier value of a block in HBM; 1, 2, 3 = DRAM, CXL, NVMe; -1 = freed
UNPINNED, PINNED = 0, 1
_ALT = np.zeros(0, np.int64)
_ALT_S = np.zeros(0, np.float64)


class LivePolicy:
    """One instance of a registry policy over the replay's unit slots (hooks only)."""

    def __init__(self, pol, capacity: int, num_slots: int, seed: int) -> None:
        self.pol = pol
        state = pol.init(capacity, num_slots, {"seed": seed, "live_offload": True})
        if pol.compiled and is_uniform(state):
            # one pointer (kvsim.policy.hooks.StateRef): the signature the hooks are compiled
            # for anyway, and one object to pass per call instead of 35 arrays
            state = policy_value(pol, state, True)[0]
        self.state = state
        self.size = 0


class LiveReplay:
    """All state of one live-offload replay.  Slots ``0..C-1`` are HBM block slots (a cached
    block is its own unit, at its slot); unit ``C + 2r + cls`` is request ``r``'s resident
    blocks of pin class ``cls``."""

    def __init__(self, pol, costs, block_bytes: int, num_requests: int, block_size: int,
                 next_access, prefetch: bool, seed: int = 0) -> None:
        self.costs = costs
        self.C = C = int(costs[0].capacity_blocks)
        self.block_bytes = block_bytes
        self.B = block_size
        self.NR = NR = num_requests
        self.num_slots = C + 2 * NR
        self.view = new_block_view(self.num_slots)
        # the view as compiled hooks take it (kvsim.policy.hooks.ViewRef, same arrays)
        self.hook_view = view_ref(self.view) if pol.compiled else self.view
        self.pols = (LivePolicy(pol, C, self.num_slots, seed),
                     LivePolicy(pol, C, self.num_slots, seed))
        # the hooks as the policy's values: compiled, each CompiledHook compiles for its
        # declared signature before Python calls it (a direct call of the njit function
        # would compile it for an inferred return type, which the compiled core's typed
        # value then refuses: "mismatch of return type")
        self.hooks = SimpleNamespace(**dict(zip(HOOK_NAMES, hooks_for(pol, pol.compiled))))
        self.offline = bool(pol.offline)
        self.next_access = next_access  # kvsim.bounds.live_optimal.NextUse (offline only)
        self.ordinal = 0  # row ordinal being replayed
        self.access_intent = None  # intent of the ACCESS row being replayed
        self.prefetch_rank = getattr(pol.module, "prefetch_rank", None) if prefetch else None
        self.tier_cap = [0] + [int(c.capacity_blocks) for c in costs[1:]]
        self.tier_used = [0, 0, 0, 0]
        self.free_slots = list(range(C - 1, -1, -1))  # pop() gives slot 0 first
        self.slot_block = np.full(C, -1, np.int64)
        self.in_pol = [False] * self.num_slots  # unit is a candidate of its policy instance
        self.held_units: list[int] = []  # units of the served request taken out (on_hold)
        self.lent: dict[int, int] = {}  # bound only: block -> admission it waits for
        self.lent_to: dict[int, set] = {}  # (kvsim/bounds/live_optimal.py, exact_top)
        # per block (global id 0..nb-1): numpy arrays (grown by doubling) for what the
        # move loops touch per block (kvsim/modes/live/live_moves.py moves runs of blocks with
        # array operations), Python lists for the rest
        self.nb = 0
        self.b_req = np.zeros(0, np.int64)
        self.b_tier = np.zeros(0, np.int64)
        self.b_slot = np.zeros(0, np.int64)
        self.b_ref = np.zeros(0, np.int64)
        self.b_cls = np.zeros(0, np.int64)
        self.b_prio = np.zeros(0, np.int64)  # b_intent[b][1]
        self.b_pf = np.zeros(0, np.bool_)  # prefetched, not used yet
        self.b_pin = np.zeros(0, np.bool_)  # pin requested
        self.b_intent: list[tuple] = []  # (phase, prio, rprio, deadline, slack, target, rc)
        self.b_hash: list[int] = []
        self.b_idx: list[int] = []  # position in its request's table (chain depth)
        self.b_holders: list[list[int]] = []
        self.index: dict[int, int] = {}  # content hash -> block (held or cached in HBM)
        # per request
        self.table: list[dict] = [dict() for _ in range(NR)]  # block_index -> block
        self.stack = [[[], []] for _ in range(NR)]  # resident owned blocks per pin class
        self.spilled: list[dict] = [dict() for _ in range(NR)]  # blocks needed, not in HBM
        self.has_spilled: dict[int, None] = {}  # requests with spilled blocks (ordered)
        self.pf_unused: list[set] = [set() for _ in range(NR)]
        self.last_us = [0.0] * NR
        self.count = [0] * NR
        self.req_intent: list[tuple | None] = [None] * NR
        self.req_pin = [False] * NR
        self.req_prio = [0] * NR  # priority of the latest request-level INTENT
        self.ucnt = [[0, 0, 0, 0] for _ in range(2 * NR)]  # per unit: blocks per priority
        self.chain = [True] * NR  # admission lookup still hitting
        self.accessed = [False] * NR
        self.arrival_us = [-1.0] * NR
        self.ttft_deadline = [-1] * NR
        self.first_tok = [-1.0] * NR
        self.last_tok = [-1.0] * NR
        self.ntok = [0] * NR
        self.req_stall_us = [0.0] * NR
        self.req_fetched = [0] * NR
        self.next_use_of = [NEVER] * NR
        if next_access is not None:
            for r, o in next_access.first_access.items():
                if 0 <= r < NR:
                    self.next_use_of[r] = o
        # step state
        self.cur_req = -1
        self.step = -1
        self.start_us = 0.0
        self.dur_us = 0.0
        self.stall_us = 0.0
        self.prev_end = 0.0
        self.now_us = 0.0
        self.runs = True  # move runs of blocks at once (False: block by block, the reference)
        self.step_tokens: list[tuple[int, int]] = []
        self.step_rows: list[tuple] = []
        self.first_tokens: list[int] = []
        self.live_blocks = 0
        self.peak_live = 0
        self.c = {k: 0 for k in COUNTERS}
        self.c_us = {"stall_us": 0.0, "decode_stall_us": 0.0}
        self.link_bytes = [0, 0, 0, 0]

    # ---- policy plumbing ----------------------------------------------------------------
    def _unit(self, r: int, cls: int) -> int:
        return self.C + 2 * r + cls

    def _fill_unit(self, u: int, b: int) -> None:
        """The view of unit ``u`` from its top block ``b`` and its request."""
        v = self.view
        r = self.b_req[b]
        ph, pr, rp, dl, sl, tg, rc = self.b_intent[b]
        cnt = self.ucnt[u - self.C]
        pr = 3 if cnt[3] else 2 if cnt[2] else 1 if cnt[1] else 0  # its most urgent block
        ri = self.req_intent[r]
        if ri is not None:  # the request's latest step / request-level intent
            ph, rp, dl, sl, tg = ri[0], ri[2], ri[3], ri[4], ri[5]
        if self.req_prio[r] > pr:
            pr = self.req_prio[r]
        v.last_access_us[u] = self.last_us[r]
        v.access_count[u] = self.count[r]
        v.phase[u] = ph
        v.priority[u] = pr
        v.request_priority[u] = rp
        v.deadline_us[u] = dl
        v.slack_us[u] = sl
        v.target_decode_step[u] = tg
        v.recompute_cost_us[u] = rc
        v.size_bytes[u] = self.block_bytes
        v.pinned[u] = self.b_cls[b] == PINNED
        v.content_hash[u] = 0
        v.next_use[u] = self.next_use_of[r]

    def _fill_cached(self, s: int, b: int) -> None:
        v = self.view
        ph, pr, rp, dl, sl, tg, rc = self.b_intent[b]
        v.last_access_us[s] = self.now_us
        v.insert_us[s] = self.now_us
        v.access_count[s] = 1
        v.phase[s] = PH_IDLE if ph < 4 else ph
        v.priority[s] = min(pr, 2)
        v.request_priority[s] = rp
        v.deadline_us[s] = -1
        v.slack_us[s] = 0
        v.target_decode_step[s] = -1
        v.recompute_cost_us[s] = rc
        v.size_bytes[s] = self.block_bytes
        v.pinned[s] = False
        v.content_hash[s] = self.b_hash[b]
        v.next_use[s] = cached_next(self, b)  # the bound (kvsim/bounds/live_optimal.py)

    def _insert(self, u: int, cls: int) -> None:
        p = self.pols[cls]
        self.hooks.on_insert(p.state, self.hook_view, u, self.now_us)
        self.in_pol[u] = True
        p.size += 1

    def _remove(self, u: int, cls: int) -> None:
        p = self.pols[cls]
        self.hooks.on_remove(p.state, self.hook_view, u)
        self.in_pol[u] = False
        p.size -= 1

    def _push(self, b: int) -> None:
        """``b`` (owned by ``b_req[b]``) became resident: top of its request's stack."""
        r, cls = self.b_req[b], self.b_cls[b]
        st = self.stack[r][cls]
        st.append(b)
        k = 2 * r + cls
        u = self.C + k
        pr = self.b_intent[b][1]
        self.ucnt[k][0 if pr < 0 else 3 if pr > 3 else pr] += 1
        if len(st) == 1 and u not in self.held_units:
            self.view.insert_us[u] = self.now_us
            self._fill_unit(u, b)
            self._insert(u, cls)

    def _pop_from(self, b: int) -> None:
        r, cls = self.b_req[b], self.b_cls[b]
        st = self.stack[r][cls]
        if st and st[-1] == b:
            st.pop()
        else:
            st.remove(b)
        k = 2 * r + cls
        u = self.C + k
        pr = self.b_intent[b][1]
        self.ucnt[k][0 if pr < 0 else 3 if pr > 3 else pr] -= 1
        if not st and self.in_pol[u]:
            self._remove(u, cls)

    def _victim(self) -> tuple[int, int]:
        """(unit, class) the policy names; held back units of the served request first."""
        for cls in (UNPINNED, PINNED):
            p = self.pols[cls]
            while p.size > 0:
                u, _, _ = self.hooks.victim(p.state, self.hook_view, self.now_us, _ALT, _ALT_S)
                u = int(u)
                if u < 0:
                    break
                if u >= self.C and (u - self.C) // 2 == self.cur_req:
                    self.hooks.on_hold(p.state, self.hook_view, u)
                    self.in_pol[u] = False
                    p.size -= 1
                    self.held_units.append(u)
                    continue
                return u, cls
        raise KvsimInputError(
            f"HBM of {self.C} blocks cannot hold request {self.cur_req}'s blocks",
            None, None, "--hbm-blocks")

    def _make_room(self, n: int = 1) -> None:
        """At least ``n`` free HBM slots: the policy's victim unit gives up its top blocks
        (spilled) or, a cached block, is dropped; asked again while room is missing.  A
        victim unit gives up as many blocks as are missing at once: the policy is not
        told of a spill that leaves the unit non-empty (no hook changes its state), so it
        would name the same unit again; one ``victim`` call per unit, not per block."""
        free = self.free_slots
        while len(free) < n:
            u, cls = self._victim()
            if u < self.C:  # a cached block: dropped
                b = self.slot_block[u]
                self._remove(u, cls)
                self._drop_cached(b)
                self.c["evictions_hbm"] += 1
            else:
                r, k = (u - self.C) // 2, n - len(free)
                if self.offline:  # the bound: shared blocks needed sooner leave the unit
                    k = exact_top(self, r, cls, k)
                self._spill_many(r, cls, k)

    # ---- block moves --------------------------------------------------------------------
    def _spill_many(self, r: int, cls: int, k: int) -> None:
        """Spill the top ``k`` blocks of request ``r``'s unit ``cls`` (kvsim/modes/live/live_moves.py:
        as one run from ``RUN_MIN_BLOCKS`` blocks, else block by block; same effects)."""
        run = self.runs and k >= live_moves.RUN_MIN_BLOCKS
        (spill_run if run else spill_many)(self, r, cls, k)

    def _fetch_many(self, r: int, miss: dict, per_tier: list) -> bool:
        """Fetch request ``r``'s missing blocks ``miss`` while HBM has free slots (likewise);
        True if one was pinned or DECODE_CRITICAL."""
        run = self.runs and min(len(miss), len(self.free_slots)) >= live_moves.RUN_MIN_BLOCKS
        return (fetch_run if run else fetch_many)(self, r, miss, per_tier)

    _spill = spill_one  # kvsim/modes/live/live_moves.py: one block (prefetch's displacement)
    _fetch = fetch_one

    def _drop_cached(self, b: int) -> None:
        s = self.b_slot[b]
        self.slot_block[s] = -1
        self.free_slots.append(s)
        self.b_tier[b] = -1
        self.b_slot[b] = -1
        if self.index.get(self.b_hash[b]) == b:
            del self.index[self.b_hash[b]]

    def _release(self, b: int, r: int) -> None:
        """Request ``r`` stops holding ``b`` (its FREE)."""
        self.b_holders[b].remove(r)
        self.b_ref[b] -= 1
        self.spilled[r].pop(b, None)
        if not self.spilled[r]:
            self.has_spilled.pop(r, None)
        self.pf_unused[r].discard(b)
        if self.b_ref[b] > 0:
            if self.b_req[b] == r:  # hand the block to the next holder
                if self.b_tier[b] == HBM:
                    self._pop_from(b)
                self.b_req[b] = self.b_holders[b][0]
                self.b_cls[b] = self._cls_of(b)
                if self.b_tier[b] == HBM:
                    self._push(b)
            return
        self.live_blocks -= 1
        if self.lent:
            unlend(self, b)
        if self.b_pf[b]:
            self.b_pf[b] = False
            self.c["prefetches_wasted"] += 1
        t = self.b_tier[b]
        if t == HBM:
            self._pop_from(b)
            h = self.b_hash[b]
            if h != 0 and self.index.get(h) == b:  # finished, cached: a candidate
                s = self.b_slot[b]
                self._fill_cached(s, b)
                self.view.insert_us[s] = self.now_us
                self._insert(s, UNPINNED)
            else:
                self._drop_cached(b)
        else:
            self.tier_used[t] -= 1
            self.b_tier[b] = -1
            if self.index.get(self.b_hash[b]) == b:
                del self.index[self.b_hash[b]]

    def _grow(self) -> None:
        """Double the per-block arrays (amortised O(1) per allocated block)."""
        n = max(1024, 2 * len(self.b_req))
        for name in ("b_req", "b_tier", "b_slot", "b_ref", "b_cls", "b_prio", "b_pf", "b_pin"):
            a = getattr(self, name)
            g = np.zeros(n, a.dtype)
            g[:len(a)] = a
            setattr(self, name, g)

    def _cls_of(self, b: int) -> int:
        crit = self.b_intent[b][1] == PR_CRIT
        return PINNED if (self.b_pin[b] or crit or self.req_pin[self.b_req[b]]) else UNPINNED

    # ---- rows ---------------------------------------------------------------------------
    def _serve(self, r: int) -> None:
        """Rows of request ``r`` start (the previous request's rows ended)."""
        if r == self.cur_req:
            return
        self._end_serve()
        self.cur_req = r

    def _end_serve(self) -> None:
        r = self.cur_req
        if r < 0:
            return
        for u in self.held_units:
            cls = (u - self.C) % 2
            st = self.stack[(u - self.C) // 2][cls]
            if st:
                self._fill_unit(u, st[-1])
                p = self.pols[cls]
                self.hooks.on_release(p.state, self.hook_view, u, self.now_us)
                self.in_pol[u] = True
                p.size += 1
        self.held_units = []
        self.cur_req = -1

    def allocate(self, r: int, idx: int, h: int, ntok: int, intent: tuple, pin: bool) -> None:
        self._serve(r)
        old = self.table[r].get(idx)
        if old is not None:  # rewritten in place (copy on write): a new block replaces it
            self._release(old, r)
        if h != 0 and ntok == self.B and self.chain[r] and not self.accessed[r]:
            self.c["lookup_blocks"] += 1
            b = self.index.get(h, -1)
            if b >= 0 and self.b_tier[b] >= 0:
                self.c["hit_blocks"] += 1
                self.table[r][idx] = b
                self.b_holders[b].append(r)
                self.b_ref[b] += 1
                if self.lent and self.lent.get(b) == r:
                    unlend(self, b)
                if self.b_ref[b] == 1:  # revive a cached block
                    s = self.b_slot[b]
                    if self.in_pol[s]:
                        self._remove(s, UNPINNED)
                    self.b_req[b] = r
                    self.b_intent[b] = intent
                    self.b_prio[b] = intent[1]
                    self.b_pin[b] = pin
                    self.b_cls[b] = self._cls_of(b)
                    self.live_blocks += 1
                    self._push(b)
                elif self.b_tier[b] != HBM:
                    self.spilled[r][b] = None
                    self.has_spilled[r] = None
                return
            self.chain[r] = False
        elif h != 0:
            self.chain[r] = False
        self._make_room(1)
        slot = self.free_slots.pop()
        b = self.nb
        if b == len(self.b_req):
            self._grow()
        self.nb = b + 1
        self.b_req[b] = r
        self.b_tier[b] = HBM
        self.b_slot[b] = slot
        self.b_ref[b] = 1
        self.b_pf[b] = False
        self.b_pin[b] = pin
        self.b_intent.append(intent)
        self.b_prio[b] = intent[1]
        self.b_hash.append(h if ntok == self.B else 0)
        self.b_idx.append(idx)
        self.b_holders.append([r])
        self.b_cls[b] = self._cls_of(b)
        self.slot_block[slot] = b
        self.table[r][idx] = b
        if self.b_hash[b] != 0 and self.b_hash[b] not in self.index:
            self.index[self.b_hash[b]] = b
        self.live_blocks += 1
        self.peak_live = max(self.peak_live, self.live_blocks)
        if len(self.table[r]) > self.C:
            raise KvsimInputError(f"request {r} holds {len(self.table[r])} blocks, more than "
                                  f"the HBM's {self.C}; expected a larger HBM", None, None,
                                  "--hbm-blocks")
        self._push(b)

    def access(self, r: int, ordinal: int, phase: int, prio: int, deadline: int,
               ntok: int) -> None:
        self._serve(r)
        if self.lent_to and self.lent_to.get(r):
            settle(self, r)  # the bound: blocks lent to r that it did not hit go back
        self.accessed[r] = True
        miss = self.spilled[r]
        stall = 0.0
        critical = prio == PR_CRIT or deadline >= 0
        if miss:
            per_tier = [0, 0, 0, 0]
            while miss:  # (making room may spill a resident block r shares with its
                # owner: it joins miss, is fetched into r's own unit and stays)
                self._make_room(len(miss))
                if self._fetch_many(r, miss, per_tier):
                    critical = True
            for t in (1, 2, 3):
                if per_tier[t]:
                    stall += self.costs[t].promote_us(per_tier[t] * self.block_bytes)
            n = sum(per_tier)
            self.c["blocks_fetched"] += n
            self.req_fetched[r] += n
        if self.pf_unused[r]:  # a shared block is useful once, at its first read
            for b in self.pf_unused[r]:
                if self.b_pf[b]:
                    self.b_pf[b] = False
                    self.c["prefetches_useful"] += 1
                for h in self.b_holders[b]:
                    if h != r:
                        self.pf_unused[h].discard(b)
            self.pf_unused[r] = set()
        self.last_us[r] = self.now_us
        self.count[r] += 1
        if self.access_intent is not None:
            self.req_intent[r] = self.access_intent
        if self.next_access is not None:
            self.next_use_of[r] = self.next_access.after_access.get(ordinal, NEVER)
        for cls in (UNPINNED, PINNED):  # the request read its blocks: an access
            u = self._unit(r, cls)
            st = self.stack[r][cls]
            if self.in_pol[u] and st:
                self._fill_unit(u, st[-1])
                self.hooks.on_hit(self.pols[cls].state, self.hook_view, u, self.now_us)
        token = phase in TOKEN_PHASES and ntok > 0
        if stall > 0:
            self.stall_us += stall
            self.req_stall_us[r] += stall
            self.c["stalls"] += 1
            self.c_us["stall_us"] += stall
            if token:
                self.c["decode_stalls"] += 1
                self.c_us["decode_stall_us"] += stall
                if critical:
                    self.c["decode_critical_stalls"] += 1
        if token:
            self.step_tokens.append((r, deadline))

    def intent(self, r: int, idx: int, intent: tuple, pin: bool) -> None:
        if idx < 0:  # request-level: over every block of the request
            self.req_intent[r] = intent[:6]
            self.req_prio[r] = intent[1]
            if (pin or intent[1] == PR_CRIT) and not self.req_pin[r]:
                self.req_pin[r] = True
                self._reclass(r)
            return
        b = self.table[r].get(idx)
        if b is None:
            return
        res = self.b_tier[b] == HBM  # resident: in its owner's unit, counted there
        if res:
            if self.b_req[b] == r:
                self._serve(r)
            self._pop_from(b)
        self.b_intent[b], self.b_prio[b], self.b_pin[b] = intent, intent[1], pin
        if res or self.b_req[b] == r:
            self.b_cls[b] = self._cls_of(b)
        if res:
            self._push(b)

    def _reclass(self, r: int) -> None:
        """Request ``r`` became pinned: its unpinned resident blocks join the pinned unit."""
        self._serve(r)
        for b in list(self.stack[r][UNPINNED]):
            self._pop_from(b)
            self.b_cls[b] = PINNED
            self._push(b)
        for b in self.table[r].values():
            if self.b_req[b] == r:
                self.b_cls[b] = PINNED

    def free(self, r: int, idx: int) -> None:
        self._serve(r)
        if idx >= 0:
            b = self.table[r].pop(idx, None)
            if b is not None:
                self._release(b, r)
            return
        for i in sorted(self.table[r], reverse=True):  # tail first (vLLM)
            self._release(self.table[r][i], r)
        self.table[r] = {}
        self.spilled[r] = {}
        self.has_spilled.pop(r, None)
        self._end_serve()


COUNTERS = ("live_spills", "pinned_spills", "blocks_fetched", "stalls", "decode_stalls",
            "decode_critical_stalls", "prefetches", "prefetches_useful", "prefetches_wasted",
            "evictions_hbm", "lookup_blocks", "hit_blocks", "tpot_deadline_misses",
            "ttft_deadline_misses")


__all__ = ["LiveReplay", "COUNTERS"]
