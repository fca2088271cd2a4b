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

Memory: the pending set (:class:`kvsim.results.log_pending.PendingEvictions`, ~100 bytes
per entry) holds one record per eviction not yet followed by a need of its block (bounded
by distinct evicted-and-not-reused blocks times the number of tiers a block can leave),
plus the per-block totals (:class:`kvsim.results.log_blocks.BlockTotals`, ~100 bytes per
distinct evicted block) and a step-distance histogram as long as the largest reuse
distance.  Batches are step-aligned
(:func:`kvsim.results.log_reader.step_aligned`) so a need is never split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from kvsim.results.log_blocks import BlockTotals
from kvsim.results.log_pending import (
    OUT_CAUSE,
    OUT_NEED,
    REC_ACTION,
    REC_FROM,
    REC_REASON,
    REC_REQ,
    REC_SEQ,
    REC_STEP,
    PendingEvictions,
)
from kvsim.results.log_reader import (
    BATCH_ROWS,
    EVICTING,
    NEEDING,
    DecisionLog,
    check_order,
    identity_columns,
    step_aligned,
)
from kvsim.results.log_schema import Action

#: Columns the ledger reads.
LEDGER_COLUMNS = ["seq", "step", "time_us", "action", "content_hash", "request_id",
                  "block_index", "from_tier", "cost_us", "decode_critical", "reason"]

_KEYS = ["k_hash", "k_req", "k_idx"]


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
    _pending: PendingEvictions = field(default_factory=PendingEvictions)
    _blocks: BlockTotals = field(default_factory=BlockTotals)
    _never: int = 0
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
                              "step": cols["step"], "action": action[sel],
                              "from_tier": cols["from_tier"].astype(np.int64),
                              "reason": reason, "request_id": cols["request_id"],
                              "cost_us": cols["cost_us"],
                              "critical": cols["decode_critical"].astype(bool),
                              "is_need": is_need[sel] & ~is_ev[sel]})
        ev = frame[~frame["is_need"]]
        self.evictions += len(ev)
        self._add_causes(ev["action"].to_numpy(), ev["from_tier"].to_numpy(),
                         ev["reason"].to_numpy(), 0, None)
        # one need per (block, step): its cost is the sum of the step's need rows
        needs = (frame[frame["is_need"]]
                 .groupby(_KEYS + ["step"], sort=False)
                 .agg(seq=("seq", "min"), request_id=("request_id", "first"),
                      cost_us=("cost_us", "sum"), critical=("critical", "max"))
                 .reset_index())
        needs["is_need"] = True
        events = pd.concat([ev.drop(columns=["cost_us", "critical"]), needs],
                           ignore_index=True).sort_values("seq", kind="stable",
                                                          ignore_index=True)
        arr = {c: events[c].to_numpy(dtype=np.int64, na_value=0) for c in
               _KEYS + ["seq", "step", "action", "from_tier", "reason", "request_id"]}
        need = events["is_need"].to_numpy(dtype=bool)
        cost = events["cost_us"].to_numpy(dtype=np.float64, na_value=0.0)
        crit = events["critical"].to_numpy(dtype=bool, na_value=False)
        out, orphan = self._pending.match(
            need, arr["k_hash"], arr["k_req"], arr["k_idx"], arr["seq"], arr["step"],
            arr["action"], arr["from_tier"], arr["reason"], arr["request_id"])
        self.unattributed_needs += int(np.count_nonzero(orphan & (cost > 0)))
        self.unattributed_cost_us += float(cost[orphan].sum())
        ones = np.ones(len(ev), np.int64)
        self._blocks.add(ev["k_hash"].to_numpy(), ev["k_req"].to_numpy(), ev["k_idx"].to_numpy(),
                         ones, ones * 0, np.zeros(len(ev)))
        if not len(out):
            return
        nj = out[:, OUT_NEED]
        is_cause = out[:, OUT_CAUSE] == 1
        dist = arr["step"][nj] - out[:, REC_STEP]
        hist = np.bincount(dist)
        if hist.size > self.distance_steps.size:
            hist[: self.distance_steps.size] += self.distance_steps
            self.distance_steps = hist
        else:
            self.distance_steps[: hist.size] += hist
        paid = np.where(is_cause, cost[nj], 0.0)
        self.regretted += len(out)
        self.regret_cost_us += float(paid.sum())
        self.regret_critical_cost_us += float(paid[crit[nj]].sum())
        done = pd.DataFrame({"k_hash": arr["k_hash"][nj], "k_req": arr["k_req"][nj],
                             "k_idx": arr["k_idx"][nj], "seq": out[:, REC_SEQ],
                             "step": out[:, REC_STEP], "action": out[:, REC_ACTION],
                             "from_tier": out[:, REC_FROM], "reason": out[:, REC_REASON],
                             "request_id": out[:, REC_REQ], "cost_us": paid,
                             "need_step": arr["step"][nj], "need_seq": arr["seq"][nj],
                             "need_request_id": arr["request_id"][nj],
                             "need_critical": crit[nj]})
        self._add_causes(out[:, REC_ACTION], out[:, REC_FROM], out[:, REC_REASON], 1, paid)
        ones = np.ones(len(done), np.int64)
        self._blocks.add(done["k_hash"].to_numpy(), done["k_req"].to_numpy(),
                         done["k_idx"].to_numpy(), ones * 0, ones, paid)
        top = done[done["cost_us"] > 0]
        if len(top):
            merged = top if self._top is None else pd.concat([self._top, top])
            self._top = merged.sort_values(["cost_us", "seq"], ascending=[False, True],
                                           kind="stable").head(self.top_n)

    def _add_causes(self, action, from_tier, reason, column: int, cost) -> None:
        """Add counts (to ``by_cause[...][column]``) and costs per (action, tier, reason)."""
        if not len(action):
            return
        code = (np.asarray(action, np.int64) << 40) | ((np.asarray(from_tier, np.int64) + 1)
                                                      << 32) | np.asarray(reason, np.int64)
        uniq, inverse, counts = np.unique(code, return_inverse=True, return_counts=True)
        costs = np.bincount(inverse, weights=cost, minlength=uniq.size) if cost is not None \
            else None
        for i, c in enumerate(uniq.tolist()):
            key = (c >> 40, ((c >> 32) & 0xFF) - 1, c & 0xFFFFFFFF)
            entry = self.by_cause.setdefault(key, [0, 0, 0.0])
            entry[column] += int(counts[i])
            if costs is not None:
                entry[2] += float(costs[i])

    def per_block(self) -> pd.DataFrame:
        """Per evicted block: ``evictions``, ``regretted``, ``cost_us`` (index: identity)."""
        return self._blocks.frame().set_index(_KEYS).sort_index()

    def top_causes(self) -> pd.DataFrame:
        """The ``top_n`` evictions whose later need cost the most (cost desc, seq asc)."""
        if self._top is None:
            return pd.DataFrame(columns=_KEYS + ["seq", "step", "action", "from_tier",
                                                 "reason", "request_id", "cost_us",
                                                 "need_step", "need_seq", "need_request_id",
                                                 "need_critical"])
        return self._top.reset_index(drop=True)

    def never_needed(self) -> int:
        """Evictions still pending (never followed by a need of their block)."""
        return self._never if self._pending is None else self._pending.pending

    def finish(self) -> None:
        """End of the log: keep the pending count, free the pending table."""
        self._never = self._pending.pending
        self._pending = None

    def top_blocks(self, n: int) -> pd.DataFrame:
        """The ``n`` blocks evicted most (evictions desc, regret cost desc, identity asc)."""
        return self._blocks.top(n)


def build_ledger(log: DecisionLog, top_n: int = 10, extra=None,
                 columns: list[str] | None = None, batch_rows: int = BATCH_ROWS
                 ) -> EvictionLedger:
    """Run the ledger over the whole log (streamed).  ``extra(table)`` sees each table,
    which holds ``LEDGER_COLUMNS`` plus any further ``columns``."""
    ledger = EvictionLedger(top_n=top_n)
    names = LEDGER_COLUMNS + [c for c in (columns or []) if c not in LEDGER_COLUMNS]
    prev_seq, prev_step = -1, -1
    for table in step_aligned(log.scan(names, batch_rows=batch_rows)):
        seq = table.column("seq").to_numpy()
        step = table.column("step").to_numpy()
        check_order(seq, step, prev_seq, prev_step, log.path)
        prev_seq, prev_step = int(seq[-1]), int(step[-1])
        ledger.feed(table)
        if extra is not None:
            extra(table)
    ledger.finish()
    return ledger
