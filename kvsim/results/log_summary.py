"""``kvsim log summary``: what a policy decided, what it cost, and what it regretted.

One streamed pass (:func:`kvsim.results.log_ledger.build_ledger`) over the log computes:

- rows by action (count, bytes, charged ``cost_us``), decisions (actions in
  ``log_schema.DECISIONS``) by (action, reason) and
  rows by (action, from tier, to tier);
- the blocks evicted most (with how often each was needed again and what that cost) and
  the requests whose blocks were evicted most (the victim's owner: the request id of the
  first candidate snapshot, or the row's request for a block without a content hash);
- stall (charged time) by the request that paid it, and by the eviction that caused it
  (ledger attribution: the latest eviction before the block's next need);
- regret: evictions needed again, how soon (reuse distance in steps: quantiles and
  buckets), and at what cost.

Memory: one batch in flight plus the ledger's state (see log_ledger) and per-request
totals (one row per request that paid or lost a block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from kvsim.results.log_ledger import LEDGER_COLUMNS, build_ledger, reasons_of
from kvsim.results.log_reader import EVICTING, DecisionLog, action_name, format_block, tier_name
from kvsim.results.log_schema import DECISIONS

_DECISION_CODES = np.array(sorted(int(a) for a in DECISIONS), np.int64)

#: Reuse-distance buckets reported (steps between an eviction and the block's next need).
DISTANCE_BUCKETS_STEPS = (1, 10, 100, 1000)


@dataclass
class LogSummary:
    """Result of :func:`summary`.  Every list is sorted deterministically (by the value
    reported, descending, then by key); JSON keys are documented in docs/decision-log.md."""

    path: str
    policy: str
    trace: Any
    rows: int
    decisions: int
    first_step: int
    last_step: int
    total_cost_us: float
    critical_cost_us: float
    by_action: list[dict] = field(default_factory=list)
    by_reason: list[dict] = field(default_factory=list)
    by_tier: list[dict] = field(default_factory=list)
    top_evicted_blocks: list[dict] = field(default_factory=list)
    top_evicted_requests: list[dict] = field(default_factory=list)
    top_paying_requests: list[dict] = field(default_factory=list)
    stall_by_cause: list[dict] = field(default_factory=list)
    top_causes: list[dict] = field(default_factory=list)
    unattributed_needs: int = 0
    unattributed_cost_us: float = 0.0
    regret: dict = field(default_factory=dict)


def _quantile(hist: np.ndarray, q: float) -> int | None:
    total = int(hist.sum())
    if total == 0:
        return None
    rank = int(np.ceil(q * total))  # nearest-rank definition
    return int(np.searchsorted(np.cumsum(hist), max(rank, 1)))


class _Totals:
    """Streaming counters merged batch by batch (small: bounded by distinct keys)."""

    def __init__(self, intern: dict[str, int]) -> None:
        self.intern = intern
        self.rows = 0
        self.decisions = 0
        self.first_step: int | None = None
        self.last_step = -1
        self.action = np.zeros((3, 256), np.float64)  # rows, bytes, cost by action code
        self.reason: dict[tuple[int, int], list] = {}
        self.tier: dict[tuple[int, int, int], list] = {}
        self.critical_cost_us = 0.0
        self.paid = _PerRequest(("cost_us", "critical_cost_us", "rows"))
        self.owners = _PerRequest(("evictions",))

    def __call__(self, t: pa.Table) -> None:
        action = t.column("action").to_numpy().astype(np.int64)
        step = t.column("step").to_numpy()
        nbytes = t.column("bytes").to_numpy().astype(np.float64)
        cost = t.column("cost_us").to_numpy().astype(np.float64)
        self.rows += len(action)
        if self.first_step is None:
            self.first_step = int(step[0])
        self.last_step = int(step[-1])
        a = action & 0xFF
        self.action[0] += np.bincount(a, minlength=256)
        self.action[1] += np.bincount(a, weights=nbytes, minlength=256)
        self.action[2] += np.bincount(a, weights=cost, minlength=256)
        dec = np.isin(action, _DECISION_CODES)
        self.decisions += int(dec.sum())
        if dec.any():
            rid = reasons_of(t.column("reason").filter(pa.array(dec)), self.intern)
            code = (action[dec] << 32) | rid
            for c, n, w in _group(code, cost[dec]):
                entry = self.reason.setdefault((c >> 32, c & 0xFFFFFFFF), [0, 0.0])
                entry[0] += n
                entry[1] += w
        ft = t.column("from_tier").to_numpy().astype(np.int64)
        tt = t.column("to_tier").to_numpy().astype(np.int64)
        moved = (ft >= 0) | (tt >= 0)
        if moved.any():
            code = (action[moved] << 16) | ((ft[moved] + 1) << 8) | (tt[moved] + 1)
            for c, n, w in _group(code, nbytes[moved]):
                entry = self.tier.setdefault((c >> 16, ((c >> 8) & 0xFF) - 1, (c & 0xFF) - 1),
                                             [0, 0.0])
                entry[0] += n
                entry[1] += w
        req = t.column("request_id").to_numpy()
        crit = t.column("decode_critical").to_numpy(zero_copy_only=False).astype(bool)
        charged = cost > 0
        if charged.any():
            paid_crit = np.where(crit[charged], cost[charged], 0.0)
            self.critical_cost_us += float(paid_crit.sum())
            self.paid.add(req[charged], cost_us=cost[charged], critical_cost_us=paid_crit,
                          rows=np.ones(int(charged.sum())))
        ev = np.isin(action, EVICTING)
        if ev.any():
            owner = req.copy()
            hashed = t.column("content_hash").to_numpy() != 0
            first = pc.list_slice(t.column("candidates"), 0, 1)
            if isinstance(first, pa.ChunkedArray):
                first = first.combine_chunks()
            parents = pc.list_parent_indices(first).to_numpy()
            vreq = pc.struct_field(pc.list_flatten(first), "request_id").to_numpy(
                zero_copy_only=False)
            snap = np.full(len(action), -1, np.int64)
            snap[parents] = vreq
            owner = np.where(hashed, snap, owner)
            self.owners.add(owner[ev], evictions=np.ones(int(ev.sum())))


def _group(code: np.ndarray, weights: np.ndarray):
    """(code, count, weight sum) per distinct code, as Python ints/floats."""
    uniq, inverse, counts = np.unique(code, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=weights, minlength=uniq.size)
    return zip(uniq.tolist(), counts.tolist(), sums.tolist())


class _PerRequest:
    """Per-request sums.  Request ids are dense (>= 0, the event-file contract), so sums
    live in numpy arrays indexed by id (8 bytes per id and column, no per-batch groupby);
    ids above :data:`DENSE_REQUEST_IDS` switch to merged pandas partials.  Rows with id -1
    (no request) are left out."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.arrays = {c: np.zeros(0) for c in columns}
        self.sparse: _Partials | None = None

    def add(self, ids: np.ndarray, **values: np.ndarray) -> None:
        keep = ids >= 0
        ids = ids[keep].astype(np.int64)
        if not ids.size:
            return
        top = int(ids.max())
        if self.sparse is None and top >= DENSE_REQUEST_IDS:
            dense = self.frame()
            self.sparse = _Partials()
            if dense is not None:
                self.sparse.add(dense)
        if self.sparse is not None:
            frame = pd.DataFrame({c: values[c][keep] for c in self.columns}, index=ids)
            self.sparse.add(frame.groupby(level=0).sum())
            return
        size = self.arrays[self.columns[0]].size
        if top >= size:
            grown = max(top + 1, size * 3 // 2)
            for c in self.columns:
                arr = np.zeros(grown)
                arr[:size] = self.arrays[c]
                self.arrays[c] = arr
        for c in self.columns:
            sums = np.bincount(ids, weights=values[c][keep], minlength=top + 1)
            self.arrays[c][: top + 1] += sums

    def frame(self) -> pd.DataFrame | None:
        """Index ``request_id``; only requests with a non-zero first column."""
        if self.sparse is not None:
            return self.sparse.merged()
        first = self.arrays[self.columns[0]]
        ids = np.flatnonzero(first)
        if not ids.size:
            return None
        return pd.DataFrame({c: self.arrays[c][ids] for c in self.columns},
                            index=pd.Index(ids, name="request_id"))


#: Largest request id kept in dense per-request arrays (beyond: pandas partials).
DENSE_REQUEST_IDS = 50_000_000


class _Partials:
    """Per-key partial sums (frames indexed by key) merged lazily: memory is bounded by
    the distinct keys plus ``limit`` unmerged rows."""

    def __init__(self, limit: int = 2_000_000) -> None:
        self.parts: list[pd.DataFrame] = []
        self.rows = 0
        self.limit = limit

    def add(self, frame: pd.DataFrame) -> None:
        self.parts.append(frame)
        self.rows += len(frame)
        if self.rows > self.limit and len(self.parts) > 1:
            self.merged()

    def merged(self) -> pd.DataFrame | None:
        if not self.parts:
            return None
        merged = pd.concat(self.parts).groupby(level=0).sum()
        self.parts, self.rows = [merged], len(merged)
        return merged


def summary(log: DecisionLog, top: int = 10) -> LogSummary:
    """Summarise ``log`` in one streamed pass; ``top`` bounds every "most" list."""
    intern: dict[str, int] = {}
    totals = _Totals(intern)
    ledger = build_ledger(log, top_n=top, extra=totals,
                          columns=SUMMARY_COLUMNS + [log.candidate_leaf("request_id")])
    # the ledger and the totals intern reasons separately; map both back to text
    ledger_reasons = ledger.reasons
    reasons = {v: k for k, v in intern.items()}
    out = LogSummary(path=str(log.path), policy=log.policy, trace=log.trace, rows=totals.rows,
                     decisions=totals.decisions,
                     first_step=int(totals.first_step if totals.first_step is not None else -1),
                     last_step=totals.last_step,
                     total_cost_us=float(totals.action[2].sum()), critical_cost_us=0.0)
    for code in np.flatnonzero(totals.action[0]):
        out.by_action.append({"action": action_name(code), "rows": int(totals.action[0][code]),
                              "bytes": int(totals.action[1][code]),
                              "cost_us": float(totals.action[2][code])})
    out.by_action.sort(key=lambda d: (-d["rows"], d["action"]))
    out.by_reason = sorted(({"action": action_name(a), "reason": reasons[r], "rows": n,
                             "cost_us": c} for (a, r), (n, c) in totals.reason.items()),
                           key=lambda d: (-d["rows"], d["action"], d["reason"]))
    out.by_tier = sorted(({"action": action_name(a), "from_tier": tier_name(f),
                           "to_tier": tier_name(t), "rows": n, "bytes": int(b)}
                          for (a, f, t), (n, b) in totals.tier.items()),
                         key=lambda d: (-d["rows"], d["action"], d["from_tier"], d["to_tier"]))
    out.top_evicted_blocks = [
        {"block": format_block(r.k_hash, r.k_req, r.k_idx), "evictions": int(r.evictions),
         "regretted": int(r.regretted), "cost_us": float(r.cost_us)}
        for r in ledger.top_blocks(top).itertuples()]
    owners = totals.owners.frame()
    if owners is not None:
        owners = owners.rename_axis("request_id").reset_index()
        owners = owners.sort_values(["evictions", "request_id"], ascending=[False, True])
        out.top_evicted_requests = [{"request_id": int(r.request_id), "evictions": int(r.evictions)}
                                    for r in owners.head(top).itertuples()]
    out.critical_cost_us = totals.critical_cost_us
    paid = totals.paid.frame()
    if paid is not None:
        paid = paid.rename_axis("request_id").reset_index()
        paid = paid.sort_values(["cost_us", "request_id"], ascending=[False, True]).head(top)
        out.top_paying_requests = [{"request_id": int(r.request_id), "cost_us": float(r.cost_us),
                                    "critical_cost_us": float(r.critical_cost_us),
                                    "rows": int(r.rows)} for r in paid.itertuples()]
    out.stall_by_cause = sorted(
        ({"action": action_name(a), "from_tier": tier_name(f), "reason": ledger_reasons[r],
          "evictions": n, "regretted": k, "cost_us": c}
         for (a, f, r), (n, k, c) in ledger.by_cause.items()),
        key=lambda d: (-d["cost_us"], -d["evictions"], d["action"], d["from_tier"], d["reason"]))
    out.top_causes = [
        {"seq": int(r.seq), "step": int(r.step), "block": format_block(r.k_hash, r.k_req, r.k_idx),
         "action": action_name(r.action), "from_tier": tier_name(r.from_tier),
         "reason": ledger_reasons[int(r.reason)], "cost_us": float(r.cost_us),
         "need_step": int(r.need_step), "need_request_id": int(r.need_request_id),
         "need_decode_critical": bool(r.need_critical)}
        for r in ledger.top_causes().itertuples()]
    out.unattributed_needs = ledger.unattributed_needs
    out.unattributed_cost_us = ledger.unattributed_cost_us
    hist = ledger.distance_steps
    out.regret = {
        "evictions": ledger.evictions,
        "needed_again": ledger.regretted,
        "never_needed_again": ledger.never_needed(),
        "needed_again_fraction": (ledger.regretted / ledger.evictions) if ledger.evictions else 0.0,
        "distance_steps_p50": _quantile(hist, 0.5),
        "distance_steps_p90": _quantile(hist, 0.9),
        "distance_steps_max": (int(np.flatnonzero(hist)[-1]) if hist.any() else None),
        "within_steps": {str(b): int(hist[: b + 1].sum()) for b in DISTANCE_BUCKETS_STEPS},
        "cost_us": ledger.regret_cost_us,
        "decode_critical_cost_us": ledger.regret_critical_cost_us,
    }
    return out


#: Extra columns the summary reads besides the ledger's.
#: (Of the candidates only the victim's ``request_id`` leaf is read.)
SUMMARY_COLUMNS = LEDGER_COLUMNS + ["bytes", "to_tier"]
