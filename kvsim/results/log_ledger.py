"""The eviction ledger: which evictions were regretted, how soon, and what they cost.

One streaming pass over a decision log matches every eviction (an ``EVICT`` or ``DEMOTE``
row) of a block with the block's next **need**: the first later step in which the same
block identity was fetched back (``PROMOTE`` / ``PREFETCH``), recomputed (``RECOMPUTE``) or
allocated afresh with the same content (``ALLOCATE`` of a hashed block).  The rows of one
block in one step form one need; its cost is the sum of their ``cost_us``.

- Every eviction still pending when the need comes is *regretted* ("needed again"), with a
  reuse distance of ``need.step - eviction.step`` steps.  The need's cost is attributed to
  the **latest** of them (a DEMOTE then an EVICT of the same block: the EVICT caused the
  recompute), so attributed costs sum to the total stall of needs.
- A need with no pending eviction (e.g. the cold first allocation of a block, or a
  recompute after a preemption) is *unattributed*; only its cost is kept.
- Evictions still pending at the end of the log were never needed again.

Memory: the pending set holds one row per eviction not yet followed by a need of its block
(bounded by distinct evicted-and-not-reused blocks times the number of tiers a block can
leave), plus the per-block totals (one row per distinct evicted block) and a step-distance
histogram as long as the largest reuse distance.  Batches are step-aligned
(:func:`kvsim.results.log_reader.step_aligned`) so a need is never split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from kvsim.results.log_reader import (EVICTING, NEEDING, DecisionLog, check_order,
                                      identity_columns, step_aligned)
from kvsim.results.log_schema import Action

#: Columns the ledger reads.
LEDGER_COLUMNS = ["seq", "step", "time_us", "action", "content_hash", "request_id",
                  "block_index", "from_tier", "cost_us", "decode_critical", "reason"]

_KEYS = ["k_hash", "k_req", "k_idx"]
#: Compact the per-block partial totals once they hold this many rows.
_COMPACT_ROWS = 1_000_000


def reasons_of(column: pa.ChunkedArray | pa.Array, intern: dict[str, int]) -> np.ndarray:
    """Global reason ids for a ``reason`` column (dictionary or plain strings).

    ``intern`` maps reason text -> id and grows as new sentences appear; only each
    chunk's dictionary is touched in Python, never every row.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = []
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        ids = np.array([intern.setdefault(str(s), len(intern))
                        for s in chunk.dictionary.to_pylist()], dtype=np.int64)
        idx = chunk.indices.to_numpy(zero_copy_only=False)
        out.append(ids[idx] if ids.size else np.zeros(len(chunk), np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@dataclass
class EvictionLedger:
    """Accumulates the matching of evictions to later needs over step-aligned tables.

    Feed tables with :meth:`feed` in ``seq`` order, then call :meth:`finish`.  Results:
    ``evictions``, ``regretted``, ``regret_cost_us``, ``regret_critical_cost_us`` (needs
    that were decode-critical), ``unattributed_needs`` / ``unattributed_cost_us``,
    ``distance_steps`` (histogram: index = steps between eviction and need),
    ``by_cause`` ((action, from_tier, reason id) -> [evictions, regretted, cost_us]),
    ``reasons`` (id -> text), :meth:`per_block` and ``top_causes``.
    """

    top_n: int = 10
    evictions: int = 0
    regretted: int = 0
    regret_cost_us: float = 0.0
    regret_critical_cost_us: float = 0.0
    unattributed_needs: int = 0
    unattributed_cost_us: float = 0.0
    distance_steps: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    by_cause: dict = field(default_factory=dict)
    intern: dict = field(default_factory=dict)
    _pending: pd.DataFrame | None = None
    _blocks: list = field(default_factory=list)
    _block_rows: int = 0
    _top: pd.DataFrame | None = None

    @property
    def reasons(self) -> dict[int, str]:
        return {v: k for k, v in self.intern.items()}

    def feed(self, t: pa.Table) -> None:
        action = t.column("action").to_numpy().astype(np.int64)
        hashes = t.column("content_hash").to_numpy()
        is_ev = np.isin(action, EVICTING)
        is_need = np.isin(action, NEEDING) | ((action == int(Action.ALLOCATE)) & (hashes != 0))
        if not (is_ev.any() or is_need.any()):
            return
        sel = is_ev | is_need
        cols = {n: t.column(n).to_numpy()[sel] for n in
                ("seq", "step", "time_us", "content_hash", "request_id", "block_index",
                 "from_tier", "cost_us", "decode_critical")}
        reason = reasons_of(t.column("reason").filter(pa.array(sel)), self.intern)
        kh, kr, ki = identity_columns(cols["content_hash"], cols["request_id"],
                                      cols["block_index"])
        frame = pd.DataFrame({"k_hash": kh, "k_req": kr, "k_idx": ki, "seq": cols["seq"],
                              "step": cols["step"], "time_us": cols["time_us"],
                              "action": action[sel], "from_tier": cols["from_tier"],
                              "reason": reason, "request_id": cols["request_id"],
                              "cost_us": cols["cost_us"],
                              "critical": cols["decode_critical"].astype(bool),
                              "is_ev": is_ev[sel]})
        ev = frame[frame["is_ev"]]
        self.evictions += len(ev)
        for (a, ft, r), n in ev.groupby(["action", "from_tier", "reason"]).size().items():
            self.by_cause.setdefault((int(a), int(ft), int(r)), [0, 0, 0.0])[0] += int(n)
        needs = (frame[~frame["is_ev"]]
                 .groupby(_KEYS + ["step"], sort=False)
                 .agg(seq=("seq", "min"), time_us=("time_us", "min"),
                      request_id=("request_id", "first"), cost_us=("cost_us", "sum"),
                      critical=("critical", "max"))
                 .reset_index())
        needs["is_ev"] = False
        ev = ev.drop(columns=["cost_us", "critical"])
        parts = [p for p in (self._pending, ev) if p is not None and len(p)]
        events = pd.concat(parts + [needs], ignore_index=True) if parts else needs
        self._match(events)
        counts = ev.groupby(_KEYS).size().rename("evictions")
        self._add_blocks(counts.to_frame().assign(regretted=0, cost_us=0.0))

    def _match(self, events: pd.DataFrame) -> None:
        events = events.sort_values(_KEYS + ["seq"], kind="stable", ignore_index=True)
        n = len(events)
        kh, kr, ki = (events[k].to_numpy() for k in _KEYS)
        need = ~events["is_ev"].to_numpy(bool)
        pos = np.where(need, np.arange(n), n)
        nxt = np.minimum.accumulate(pos[::-1])[::-1]
        j = np.minimum(nxt, n - 1)
        same = (nxt < n) & (kh[j] == kh) & (kr[j] == kr) & (ki[j] == ki)
        ev_idx = np.flatnonzero(~need & same)
        nj = nxt[ev_idx]
        is_cause = (ev_idx + 1) == nj
        step = events["step"].to_numpy()
        cost = events["cost_us"].to_numpy(dtype=np.float64, na_value=0.0)
        crit = events["critical"].to_numpy(dtype=bool, na_value=False)
        dist = (step[nj] - step[ev_idx]).astype(np.int64)
        if dist.size:
            hist = np.bincount(dist)
            if hist.size > self.distance_steps.size:
                hist[: self.distance_steps.size] += self.distance_steps
                self.distance_steps = hist
            else:
                self.distance_steps[: hist.size] += hist
        paid = np.where(is_cause, cost[nj], 0.0)
        self.regretted += int(ev_idx.size)
        self.regret_cost_us += float(paid.sum())
        self.regret_critical_cost_us += float(paid[crit[nj]].sum())
        # needs with no eviction right before them in the same block: unattributed
        need_idx = np.flatnonzero(need)
        prev = need_idx - 1
        has_prev_ev = (prev >= 0)
        p = np.maximum(prev, 0)
        has_prev_ev &= ~need[p] & (kh[p] == kh[need_idx]) & (kr[p] == kr[need_idx]) \
            & (ki[p] == ki[need_idx])
        orphan = need_idx[~has_prev_ev]
        self.unattributed_needs += int(np.count_nonzero(cost[orphan] > 0))
        self.unattributed_cost_us += float(cost[orphan].sum())
        if ev_idx.size:
            done = events.iloc[ev_idx][_KEYS + ["seq", "step", "action", "from_tier",
                                                "reason", "request_id"]].copy()
            done["cost_us"] = paid
            done["need_step"] = step[nj]
            done["need_seq"] = events["seq"].to_numpy()[nj]
            done["need_request_id"] = events["request_id"].to_numpy()[nj]
            done["need_critical"] = crit[nj]
            for (a, ft, r), sub in done.groupby(["action", "from_tier", "reason"]):
                entry = self.by_cause.setdefault((int(a), int(ft), int(r)), [0, 0, 0.0])
                entry[1] += len(sub)
                entry[2] += float(sub["cost_us"].sum())
            agg = done.groupby(_KEYS).agg(regretted=("seq", "size"), cost_us=("cost_us", "sum"))
            self._add_blocks(agg.assign(evictions=0))
            top = done[done["cost_us"] > 0]
            if len(top):
                merged = top if self._top is None else pd.concat([self._top, top])
                self._top = merged.sort_values(["cost_us", "seq"], ascending=[False, True],
                                               kind="stable").head(self.top_n)
        pending = np.flatnonzero(~need & ~same)
        self._pending = events.iloc[pending].reset_index(drop=True)

    def _add_blocks(self, frame: pd.DataFrame) -> None:
        if not len(frame):
            return
        self._blocks.append(frame[["evictions", "regretted", "cost_us"]])
        self._block_rows += len(frame)
        if self._block_rows > _COMPACT_ROWS and len(self._blocks) > 1:
            self._blocks = [pd.concat(self._blocks).groupby(level=_KEYS).sum()]
            self._block_rows = len(self._blocks[0])

    def per_block(self) -> pd.DataFrame:
        """Per evicted block: ``evictions``, ``regretted``, ``cost_us`` (index: identity)."""
        if not self._blocks:
            idx = pd.MultiIndex.from_arrays([[], [], []], names=_KEYS)
            return pd.DataFrame({"evictions": [], "regretted": [], "cost_us": []}, index=idx)
        merged = pd.concat(self._blocks).groupby(level=_KEYS).sum()
        self._blocks = [merged]
        self._block_rows = len(merged)
        return merged

    def top_causes(self) -> pd.DataFrame:
        """The ``top_n`` evictions whose later need cost the most (cost desc, seq asc)."""
        if self._top is None:
            return pd.DataFrame(columns=_KEYS + ["seq", "step", "action", "from_tier",
                                                 "reason", "request_id", "cost_us",
                                                 "need_step", "need_seq", "need_request_id",
                                                 "need_critical"])
        return self._top.reset_index(drop=True)

    def never_needed(self) -> int:
        return 0 if self._pending is None else int(len(self._pending))


def build_ledger(log: DecisionLog, top_n: int = 10, extra=None,
                 columns: list[str] | None = None) -> EvictionLedger:
    """Run the ledger over the whole log (streamed).  ``extra(table)`` sees each table,
    which holds ``LEDGER_COLUMNS`` plus any further ``columns``."""
    ledger = EvictionLedger(top_n=top_n)
    names = LEDGER_COLUMNS + [c for c in (columns or []) if c not in LEDGER_COLUMNS]
    prev_seq, prev_step = -1, -1
    for table in step_aligned(log.scan(names)):
        seq = table.column("seq").to_numpy()
        step = table.column("step").to_numpy()
        check_order(seq, step, prev_seq, prev_step, log.path)
        prev_seq, prev_step = int(seq[-1]), int(step[-1])
        ledger.feed(table)
        if extra is not None:
            extra(table)
    return ledger
