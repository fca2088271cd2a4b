"""The tiered replay as an executable specification: docs/simulate.md, docs/cost-model.md,
docs/trace-format.md and docs/decision-log.md, one event row at a time, in plain Python.

Written apart from kvsim/replay (no import from it): per-request state in a dataclass, block
records as dicts, HBM in :mod:`tests.reference.pool`, the lower tiers in
:mod:`tests.reference.tiers`.  The policies are shared (their hooks are called through
kvsim.policy.api's contract): they are under test with the replay's use of them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from kvsim.core.schema import EventKind as EV
from kvsim.policy.api import NEVER, Phase, Priority

from .pool import Pool
from .tiers import DC, LowerTiers, candidate, view_row

# The replay's own reason sentences (docs/decision-log.md, column ``reason``), by the
# situation they describe; text: the documented list kvsim.replay.kernel.core.WHY, by position.
WHY_INDEX = {"promote": 0, "prefetch": 1, "recompute": 2, "recompute_rerun": 3,
             "write_through": 4, "write_through_selective": 5, "preempt_last": 6,
             "preempt_priority": 7, "swap_in": 8, "allocate": 9, "hit": 10, "release": 11,
             "revive": 12, "free": 13, "promote_rerun": 14, "backed": 15, "cow": 16}
ACTIONS = {"EVICT": 0, "DEMOTE": 1, "PROMOTE": 2, "PREFETCH": 3, "RECOMPUTE": 4,
           "WRITE_THROUGH": 5, "PREEMPT": 6, "ALLOCATE": 10, "HIT": 11, "RELEASE": 12,
           "REVIVE": 13, "FREE": 14}
ADMIT, RERUN, APPEND = "admit", "rerun", "append"


@dataclass
class Tiering:
    """Capacities and transfer costs, per tier 0..3 (HBM, DRAM, CXL, NVMe)."""

    hbm_blocks: int
    caps: list[int]  # DRAM, CXL, NVMe in blocks (0 = disabled)
    up_lat_us: list[float]  # medium + link latency, per tier
    up_bytes_per_us: list[float]  # min(read, link) bandwidth
    down_lat_us: list[float]
    down_bytes_per_us: list[float]  # min(write, link) bandwidth


@dataclass
class Req:
    rid: int
    state: str = "unseen"  # waiting, running, preempted, done
    prompt: int = 0
    arrive_us: int = 0
    rprio: int = 0
    ttft_dl: int = -1
    bound: bool = False  # deadline-bound: TTFT or decode deadline, or DECODE_CRITICAL
    phase: int = 0  # 0 gathering its prompt, 1 placed, 2 running its steps
    recs: list = field(default_factory=list)  # one dict per block-table entry
    hit_tok: list = field(default_factory=lambda: [0, 0, 0, 0])
    lookup_tok: int = 0
    credit_us: float = 0.0
    credit_rate: float = 0.0
    budget_us: float = 0.0  # prefetch budget: queueing time
    latency_paid: set = field(default_factory=set)  # tiers whose latency was paid
    prefilled: int = 0
    nout: int = 0
    ft_pending: bool = False
    first_us: float = -1.0
    last_us: float = -1.0
    ttft_miss: bool = False
    tpot_missed: int = 0


class Recorder:
    """Counters, peaks and decision-log rows."""

    def __init__(self, log: bool, lifecycle: bool, reasons: list, why: list, k: int):
        self.c = defaultdict(float)
        self.peaks = [0, 0, 0, 0]
        self.rows: list[dict] = []
        self.on, self.life = log, log and lifecycle
        self.reasons, self.why, self.k = reasons, why, k

    def add(self, name: str, v) -> None:
        self.c[name] += v

    def peak(self, tier: int, used: int) -> None:
        self.peaks[tier] = max(self.peaks[tier], used)

    def log(self, step, now_us, action, h, req, bi, frm, to, nbytes, cost, dc, code, why,
            cands=None) -> None:
        if not self.on:
            return
        text = []
        if code >= 0:
            text.append(self.reasons[frm][code])
        if why is not None:
            text.append(self.why[WHY_INDEX[why]])
        cands = (cands or [])[: self.k] or None  # null when none (docs/decision-log.md)
        self.rows.append({
            "seq": len(self.rows), "step": int(step), "time_us": float(now_us),
            "action": ACTIONS[action], "content_hash": int(h), "request_id": int(req),
            "block_index": int(bi), "from_tier": int(frm), "to_tier": int(to),
            "bytes": int(nbytes), "cost_us": float(cost), "decode_critical": bool(dc),
            "reason_code": int(code), "reason": "; ".join(text), "candidates": cands})


class Reference:
    def __init__(self, rows: list[dict], block_tokens: int, policy, lower_policies,
                 tiering: Tiering, config, log: bool):
        self.rows = rows
        self.bs = block_tokens
        self.cfg = config
        self.tg = tiering
        self.offline = bool(policy.offline)
        params = {"seed": config.seed}
        from kvsim.replay.kernel.core import WHY  # the documented sentences (text only)

        self.rec = Recorder(log, config.log_lifecycle,
                            [policy.reasons] + [p.reasons for p in lower_policies], WHY,
                            config.log_candidates)
        self.pool = Pool(tiering.hbm_blocks + 1, block_tokens, policy, params)
        self.view = self.pool.view
        self.tiers = LowerTiers(tiering.caps, lower_policies, params, self.rec,
                                config.log_candidates)
        self.hinfo: dict[int, dict] = {}  # HBM block -> owner, block index, uses
        self.reqs: dict[int, Req] = {}
        self.running: list[Req] = []
        self.pending = None  # the request whose prompt ALLOCATE rows are being gathered
        self.steps: list[float] = []
        self.in_step = False
        self.step = -1
        self.start_us = 0.0
        self.clock_us = 0.0
        self.s = {}  # the open step's duration, saved, stall, extra
        self.tokens_done: list = []  # (request, 1 first token / 2 decode token, deadline)
        self._facts()

    # -- the pre-pass (docs/simulate.md "Streaming": next_use and seen per ALLOCATE) -----
    def _facts(self) -> None:
        self.seen, self.next_use = [], []
        waiting: dict[int, list[int]] = {}  # rows waiting for the next full row of h
        allocs = [r for r in self.rows if r["kind"] == EV.ALLOCATE]
        for o, r in enumerate(allocs):
            # the full content's hash, also on a partial row (cached once full); only a
            # full row is looked up, so only a full row is a *use* of earlier rows
            h = r["content_hash"]
            self.seen.append(h != 0 and h in waiting)
            self.next_use.append(NEVER)
            if h == 0:
                continue
            if r["num_tokens"] == self.bs:
                for w in waiting.get(h, []):
                    self.next_use[w] = o
                waiting[h] = []
            waiting.setdefault(h, []).append(o)
        self.ordinal = 0
        # measurement window (docs/simulate.md): requests in arrival order (ARRIVE time,
        # else first ALLOCATE/ACCESS/FORK row; ties by id); warm-up = the first w of them
        first: dict[int, tuple] = {}
        for r in self.rows:
            if r["kind"] in (EV.ARRIVE, EV.ALLOCATE, EV.ACCESS, EV.FORK):
                first.setdefault(r["request_id"], (r["time_us"], r["request_id"], r["step"]))
        order = sorted(first.values())
        w = self.cfg.warmup_count(len(order))
        self.warmup = w
        self.measured = {rid for _, rid, _ in order[w:]}
        self.warm_step = order[w][2] if 0 < w < len(order) else -1
        self.snapshot = None

    def req(self, r: int) -> Req:
        return self.reqs.setdefault(r, Req(r))

    # -- block records and views ----------------------------------------------------------
    def record(self, row: dict) -> dict:
        o = self.ordinal
        self.ordinal += 1
        full = row["num_tokens"] == self.bs
        return {"hash": row["content_hash"] if full else 0, "full_hash": row["content_hash"],
                "size": row["size_bytes"],
                "tokens": row["num_tokens"], "rcost": row["recompute_cost_us"],
                "pfok": row["prefetch_ok"], "seen": self.seen[o],
                "next_use": self.next_use[o] if self.offline else NEVER, **intent(row)}

    def set_view(self, b: int, rec: dict, now_us: float) -> None:
        """A block's intent fields as the serving layer last stated them (its record)."""
        v = self.view
        v.phase[b], v.priority[b] = rec["phase"], rec["priority"]
        v.request_priority[b], v.deadline_us[b] = rec["request_priority"], rec["deadline_us"]
        v.slack_us[b], v.target_decode_step[b] = rec["slack_us"], rec["target_decode_step"]
        v.pinned[b] = rec["pinned"]
        v.recompute_cost_us[b], v.size_bytes[b] = rec["rcost"], rec["size"]
        v.next_use[b] = rec["next_use"]
        v.last_access_us[b] = now_us

    def log(self, *args, **kw) -> None:
        self.rec.log(self.step, self.start_us, *args, **kw)

    # -- HBM with preemption -------------------------------------------------------------
    def pick_victim(self, exclude: Req):
        """vLLM v1: the last running request; with priority scheduling the lowest
        request_priority, ties to the latest arrival (vLLM: max(priority, arrival))."""
        others = [q for q in self.running if q is not exclude]
        if not others:
            return None
        if not self.cfg.priority_scheduling:
            return others[-1]
        return min(others, key=lambda q: (q.rprio, -q.arrive_us))

    def preempt(self, v: Req) -> None:
        now = self.start_us
        nbytes = sum(rec["size"] for rec in v.recs)
        for b in self.pool.tables.get(v.rid, []):  # its request releases them: recency
            self.view.last_access_us[b] = now
        self.pool.release(v.rid, 0, now)
        cost = 0.0
        swap = self.cfg.preemption == "swap"
        if swap:  # synchronous, charged to the step that needed the room
            self.rec.add("swap_out_bytes", nbytes)
            cost = self.tg.down_lat_us[1] + nbytes / self.tg.down_bytes_per_us[1]
            self.s["extra"] += cost
        self.running.remove(v)
        v.state = "preempted"
        self.rec.add("preemptions", 1)
        self.log("PREEMPT", 0, v.rid, -1, 0, 1 if swap else -1, nbytes if swap else 0, cost,
                 v.bound, -1,
                 "preempt_priority" if self.cfg.priority_scheduling else "preempt_last")

    def allocate(self, q: Req, hashes, num_tokens):
        while True:
            taken = self.pool.allocate(q.rid, hashes, num_tokens, self.start_us)
            if taken is not None:
                self.rec.peak(0, self.pool.held)
                return taken
            v = self.pick_victim(q)
            if v is None:
                return None
            self.preempt(v)

    def hbm_evicted(self, t) -> None:
        """A cached HBM block the policy evicted: demoted (write_back, no copy below) into
        the first enabled tier, or dropped."""
        b, h, info, v = t.block, t.evicted_hash, self.hinfo[t.block], self.view
        backed = self.tiers.below(h)
        dest = self.tiers.first() if (not backed and self.cfg.write_policy == "write_back") else 0
        cands = [candidate(v, (self.hinfo[a]["owner"], self.hinfo[a]["bi"]), a, s)
                 for a, s in t.candidates]
        self.log("DEMOTE" if dest else "EVICT", h, info["owner"], info["bi"], 0,
                 dest or -1, int(v.size_bytes[b]) if dest else 0, 0.0,
                 int(v.priority[b]) == DC, t.reason, "backed" if backed else None, cands)
        if dest:
            self.rec.add("spills_0", 1)
            self.tiers.spill(view_row(v, b), (info["owner"], info["bi"]), dest, self.step,
                             self.start_us)
        else:
            self.rec.add("evictions_0", 1)

    def write_through(self, b: int, q: Req) -> None:
        """HiCache: copy a hashed block down on its first (write_through) or second
        (write_through_selective) use, unless a copy is already below."""
        wp = self.cfg.write_policy
        if wp == "write_back":
            return
        h, info = int(self.view.content_hash[b]), self.hinfo[b]
        if h == 0 or info["uses"] != (1 if wp == "write_through" else 2) or self.tiers.below(h):
            return
        dest = self.tiers.first()
        if not dest:
            return
        self.rec.add("write_throughs", 1)
        self.log("WRITE_THROUGH", h, q.rid, info["bi"], 0, dest, int(self.view.size_bytes[b]),
                 0.0, int(self.view.priority[b]) == DC, -1, wp)
        self.tiers.spill(view_row(self.view, b), (info["owner"], info["bi"]), dest,
                         self.step, self.start_us)

    # -- placing blocks ------------------------------------------------------------------
    def place(self, q: Req, e0: int, mode: str) -> None:
        now, rec, tg = self.start_us, self.rec, self.tg
        recs = q.recs[e0:]
        hashes = [x["hash"] for x in recs]
        nb = len(recs)
        if mode == ADMIT:
            num_tokens = q.prompt
        elif mode == RERUN:  # every full block may hit
            num_tokens = sum(x["tokens"] for x in recs) + 1
        else:
            num_tokens = 0
        promoted = {}  # the chain continued below the HBM hit: e -> (tier, slot)
        if mode != APPEND:
            limit = min(nb, (num_tokens - 1) // self.bs) if num_tokens > 0 else 0
            for e in range(len(self.pool.lookup(hashes, num_tokens)), limit):
                where = self.tiers.find(hashes[e]) if hashes[e] != 0 else None
                if where is None:
                    break
                promoted[e] = where
        taken = self.allocate(q, hashes, num_tokens)
        if taken is None:
            rec.add("overflow_blocks", nb)
            return
        n_hit = sum(1 for t in taken if t.kind in ("hit", "revived"))
        # a preemption for room may have released more of the chain into the HBM cache
        promoted = {e: w for e, w in promoted.items() if e >= n_hit}
        for e in sorted(promoted):  # promotions read their lower copies first
            tier, slot = promoted[e]
            self.tiers.t[tier].touch(slot, now)
        for t in taken[n_hit:]:
            if t.kind == "evicted":
                self.hbm_evicted(t)
        v = self.view
        for e, (t, x) in enumerate(zip(taken, recs)):
            b, bi, tok, size, h = t.block, e0 + e, x["tokens"], x["size"], x["hash"]
            if e < n_hit:  # an HBM prefix hit
                self.set_view(b, x, now)
                v.access_count[b] += 1
                self.hinfo[b]["uses"] += 1
                if mode == ADMIT:
                    q.hit_tok[0] += tok
                    q.credit_us += x["rcost"]
                if rec.life:
                    kind = "REVIVE" if t.kind == "revived" else "HIT"
                    self.log(kind, h, q.rid, bi, 0, 0, 0, 0.0, False, -1, kind.lower())
                self.write_through(b, q)
                continue
            self.set_view(b, x, now)
            v.insert_us[b] = now
            v.access_count[b] = 1
            v.content_hash[b] = h
            self.hinfo[b] = {"owner": q.rid, "bi": bi, "uses": 1 if h != 0 else 0}
            if rec.life:
                self.log("ALLOCATE", h, q.rid, bi, -1, 0, 0, 0.0, False, -1, "allocate")
            if e in promoted:  # found in a lower tier: transferred up
                tier = promoted[e][0]
                lat = 0.0 if tier in q.latency_paid else tg.up_lat_us[tier]
                q.latency_paid.add(tier)
                xfer = lat + size / tg.up_bytes_per_us[tier]
                hidden = 0.0
                if self.cfg.prefetch and x["pfok"] and mode == ADMIT:
                    hidden = min(xfer, q.budget_us)
                    q.budget_us -= hidden
                stall = xfer - hidden
                self.s["stall"] += stall
                rec.add("stall_us", stall)
                rec.add(f"bytes_up_{tier}", size)
                if hidden > 0.0:
                    rec.add("prefetches", 1)
                    rec.add("prefetches_useful", 1 if stall == 0.0 else 0)
                else:
                    rec.add("promotions", 1)
                if mode == ADMIT:
                    q.hit_tok[tier] += tok
                    q.credit_us += x["rcost"]
                if q.bound:
                    rec.add("decode_critical_misses", 1)
                why = "promote_rerun" if mode == RERUN else (
                    "prefetch" if hidden > 0 else "promote")
                self.log("PREFETCH" if hidden > 0 else "PROMOTE", h, q.rid, bi, tier, 0, size,
                         stall, q.bound, -1, why)
            elif mode == RERUN:
                if self.cfg.preemption == "swap":  # its swapped-out copy comes back
                    lat = 0.0 if 1 in q.latency_paid else tg.up_lat_us[1]
                    q.latency_paid.add(1)
                    cost = lat + size / tg.up_bytes_per_us[1]
                    self.s["extra"] += cost
                    rec.add("swap_in_bytes", size)
                    self.log("PROMOTE", h, q.rid, bi, 1, 0, size, cost, q.bound, -1, "swap_in")
                else:  # recompute preemption: its tokens are computed again
                    self.s["extra"] += x["rcost"]
                    rec.add("preempt_recompute_tokens", tok)
                    self.log("RECOMPUTE", h, q.rid, bi, -1, 0, 0, x["rcost"], q.bound, -1,
                             "recompute_rerun")
                if q.bound:
                    rec.add("decode_critical_misses", 1)
            elif mode == ADMIT and h != 0:
                if x["seen"]:  # computed before, resident nowhere now
                    rec.add("recompute_tokens", tok)
                    if q.bound:
                        rec.add("decode_critical_misses", 1)
                    self.log("RECOMPUTE", h, q.rid, bi, -1, 0, 0, x["rcost"], q.bound, -1,
                             "recompute")
                else:
                    rec.add("first_compute_tokens", tok)
            self.write_through(b, q)
        self.pool.admit(taken, now)
        if mode == ADMIT:
            q.lookup_tok += num_tokens

    # -- rows ----------------------------------------------------------------------------
    def run(self) -> Reference:
        for row in self.rows:
            p = self.pending
            if p is not None and not (row["kind"] == EV.ALLOCATE and row["request_id"] == p.rid):
                self.pending = None
                self.place(p, 0, ADMIT)
                p.phase = 1
            getattr(self, "on_" + EV(row["kind"]).name)(row)
        if self.pending is not None:
            p, self.pending = self.pending, None
            self.place(p, 0, ADMIT)
        if self.in_step:
            self.close_step()
        return self

    def on_STEP(self, row) -> None:
        if self.in_step:
            self.close_step()
        self.in_step = True
        self.step = row["step"]
        if self.snapshot is None and 0 <= self.warm_step <= self.step:
            self.snapshot = dict(self.rec.c)
            self.first_measured_step = len(self.steps)
        self.start_us = max(float(row["time_us"]), self.clock_us)
        self.s = {"duration": row["duration_us"], "saved": 0.0, "stall": 0.0, "extra": 0.0}

    def close_step(self) -> None:
        s = self.s
        lat = max(0.0, s["duration"] - s["saved"]) + s["stall"] + s["extra"]
        end = self.start_us + lat
        self.clock_us = end
        self.steps.append(lat)
        self.rec.add("saved_us", min(s["saved"], s["duration"]))
        for q, kind, dl in self.tokens_done:
            q.last_us = end
            q.nout += 1
            if kind == 1:
                q.first_us = end
                q.ft_pending = False
                q.ttft_miss = q.ttft_dl >= 0 and end > q.ttft_dl
            elif dl >= 0:
                self.rec.add("tpot_deadline_tokens", 1)
                q.tpot_missed += int(end > dl)
        self.tokens_done = []

    def on_ARRIVE(self, row) -> None:
        q = self.req(row["request_id"])
        q.state = "waiting"
        q.prompt, q.arrive_us, q.rprio = row["num_tokens"], row["time_us"], row["request_priority"]
        q.ttft_dl = row["deadline_us"]
        q.bound = q.bound or row["deadline_us"] >= 0 or \
            row["priority"] == Priority.DECODE_CRITICAL

    def _running(self, row) -> Req:
        """The row's request, resumed (whole table placed again) or admitted first."""
        q, now = self.req(row["request_id"]), self.start_us
        if q.state == "preempted":
            q.state = "running"
            self.running.append(q)
            q.latency_paid = set()
            self.place(q, 0, RERUN)
        elif q.state != "running":
            if q.state == "unseen":  # no ARRIVE row: arrival = admission
                q.arrive_us = int(now)
            q.state, q.recs, q.latency_paid = "running", [], set()
            q.phase = 2 if row["kind"] == EV.FORK else 0
            wait = now - q.arrive_us
            q.budget_us = wait if (self.cfg.prefetch and wait > 0) else 0.0
            self.running.append(q)
        return q

    def on_ALLOCATE(self, row) -> None:
        q = self._running(row)
        bi = row["block_index"]
        x = self.record(row)
        if x["priority"] == Priority.DECODE_CRITICAL:
            q.bound = True
        if q.phase == 0 and bi >= len(q.recs):  # a prompt block: gathered
            q.recs.append(x)
            self.pending = q
        elif bi < len(q.recs):  # a write into an existing block (copy-on-write)
            q.recs[bi] = x
            table = self.pool.tables.get(q.rid, [])
            if table and bi == len(table) - 1:
                self.cow(q, bi, x)
        else:  # appended after admission (decode): no lookup
            self.fill_last(q)
            q.recs.append(x)
            self.place(q, len(q.recs) - 1, APPEND)

    def fill_last(self, q: Req) -> None:
        """A block is appended: the one before it is full.  Allocated partial with the hash
        of its full content, it is cached now (vLLM cache_full_blocks; docs/simulate.md)."""
        table = self.pool.tables.get(q.rid, [])
        if not q.recs or len(table) != len(q.recs):
            return
        x = q.recs[-1]
        if x["hash"] != 0 or x["full_hash"] == 0:
            return
        x["hash"], x["tokens"] = x["full_hash"], self.bs
        b = self.pool.cache_block(q.rid, len(table) - 1, x["hash"], self.start_us)
        self.hinfo[b]["uses"] = 1
        self.write_through(b, q)

    def cow(self, q: Req, bi: int, x: dict) -> None:
        res = self.pool.write_last(q.rid, self.start_us)
        while res is None:
            v = self.pick_victim(q)
            if v is None:
                return
            self.preempt(v)
            res = self.pool.write_last(q.rid, self.start_us)
        if res == "none":
            return
        if res.kind == "evicted":
            self.hbm_evicted(res)
        b = res.block
        self.set_view(b, x, self.start_us)
        self.view.content_hash[b] = 0
        self.view.insert_us[b] = self.start_us
        self.hinfo[b] = {"owner": q.rid, "bi": bi, "uses": 0}
        self.rec.add("cow_copies", 1)
        self.rec.peak(0, self.pool.held)
        self.log("ALLOCATE", 0, q.rid, bi, 0, 0, x["size"], 0.0, False, -1, "cow")

    def on_FORK(self, row) -> None:
        q = self._running(row)
        p = self.reqs.get(row["parent_request_id"])
        if p is not None and p.state == "running" and not q.recs:
            self.pool.fork(p.rid, q.rid)
            q.recs = [dict(x) for x in p.recs]
            q.prompt, q.prefilled, q.bound, q.phase = p.prompt, p.prefilled, p.bound, 2

    def on_ACCESS(self, row) -> None:
        q = self._running(row)
        if q.phase < 2:  # savings credited at total saved / hit tokens per token
            q.phase = 2
            hit = sum(q.hit_tok)
            q.credit_rate = q.credit_us / hit if hit > 0 else 0.0
        kind = 0
        if row["phase"] == Phase.PREFILL:
            if q.credit_us > 0.0:
                s = min(q.credit_us, row["num_tokens"] * q.credit_rate)
                self.s["saved"] += s
                q.credit_us -= s
            q.prefilled += row["num_tokens"]
            if q.prefilled >= q.prompt and q.nout == 0 and not q.ft_pending:
                kind = 1
        elif row["phase"] in (Phase.DECODE, Phase.VERIFY):
            if row["deadline_us"] >= 0:
                q.bound = True
            if not q.ft_pending:
                kind = 1 if q.nout == 0 else 2
        if kind:
            self.tokens_done.append((q, kind, row["deadline_us"]))
            q.ft_pending = q.ft_pending or kind == 1

    def on_INTENT(self, row) -> None:
        q = self.req(row["request_id"])
        if q.state not in ("running", "preempted"):
            return
        bi = row["block_index"]
        table = self.pool.tables.get(q.rid, []) if q.state == "running" else []
        for e in (range(len(q.recs)) if bi < 0 else range(bi, min(bi + 1, len(q.recs)))):
            q.recs[e].update(intent(row))
            if e < len(table):
                b, v = table[e], self.view
                v.phase[b], v.priority[b] = row["phase"], row["priority"]
                v.request_priority[b] = row["request_priority"]
                v.deadline_us[b] = row["deadline_us"]
                v.slack_us[b], v.target_decode_step[b] = row["slack_us"], row["target_decode_step"]
                v.pinned[b] = q.recs[e]["pinned"]
        if row["priority"] == Priority.DECODE_CRITICAL:
            q.bound = True

    on_COMMIT = on_INTENT

    def on_FREE(self, row) -> None:
        q = self.req(row["request_id"])
        table = self.pool.tables.get(q.rid, [])
        if row["block_index"] < 0:  # the request is done: release tail first
            if q.state == "running":
                # computed tokens = prompt + outputs (this step's pending included) - 1:
                # a last block they fill exactly is cached first (vLLM caches it when
                # computed; docs/simulate.md, "Fidelity to vLLM")
                nout = q.nout + sum(1 for p, _, _ in self.tokens_done if p is q)
                if q.recs and q.prompt + nout - 1 >= len(q.recs) * self.bs:
                    self.fill_last(q)
                self.release(q, 0)
                self.running.remove(q)
            q.state = "done"
        elif q.state in ("running", "preempted") and row["block_index"] == len(q.recs) - 1:
            if q.state == "running" and len(table) == len(q.recs):  # one block (rollback)
                self.release(q, len(table) - 1)
            q.recs.pop()

    def release(self, q: Req, keep: int) -> None:
        """q frees its table from entry ``keep`` on, tail first; lifecycle rows for the
        blocks whose last holder it was (RELEASE: cached; FREE: no content identity)."""
        now, table = self.start_us, self.pool.tables.get(q.rid, [])
        for b in table[keep:]:  # per-request recency (DESIGN.md §1)
            self.view.last_access_us[b] = now
        blocks = list(table)
        self.pool.release(q.rid, keep, now)
        if self.rec.life:
            for e in range(len(blocks) - 1, keep - 1, -1):
                b = blocks[e]
                if self.pool.ref[b] == 0:
                    cached = b in self.pool.cands
                    self.log("RELEASE" if cached else "FREE",
                             int(self.view.content_hash[b]) if cached else 0, q.rid, e, 0,
                             0, 0, 0.0, False, -1, "release" if cached else "free")

    def summary(self) -> dict:
        from .metrics import summary

        return summary(self)


def intent(row: dict) -> dict:
    """The intent fields of an ALLOCATE / INTENT / COMMIT row."""
    return {"phase": row["phase"], "priority": row["priority"],
            "request_priority": row["request_priority"], "deadline_us": row["deadline_us"],
            "slack_us": row["slack_us"], "target_decode_step": row["target_decode_step"],
            "pinned": bool(row["pin_requested"]) or row["priority"] == Priority.DECODE_CRITICAL}
