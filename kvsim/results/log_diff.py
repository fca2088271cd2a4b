"""``kvsim log diff``: two policies' logs of the same trace, side by side.

- **First divergence.**  Two replays of one trace write identical rows until the policies
  first choose differently, so the logs are compared position by position (same ``seq``)
  on (step, action, block identity, request, tiers), streamed in lockstep; the first
  mismatch is the first divergent row (normally a decision: a different victim).  For each
  side the divergent row's block and its next need in that log are reported (what that
  choice cost afterwards: :func:`kvsim.results.log_explain.next_uses`).
- **Blocks one evicted while the other kept.**  From each log's eviction ledger
  (:mod:`kvsim.results.log_ledger`): blocks evicted in A and never in B, and vice versa,
  with the regret cost each paid in its own log (sum of the ``cost_us`` of the needs those
  evictions caused); plus the blocks whose eviction count or regret cost differs.

Memory: two batches in flight for the lockstep pass; two ledgers (one row per distinct
evicted block each) for the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from kvsim.core.errors import KvsimInputError
from kvsim.results.log_explain import key_of, next_uses
from kvsim.results.log_ledger import build_ledger
from kvsim.results.log_query import rows_frame
from kvsim.results.log_reader import EVICTING, DecisionLog, format_block
from kvsim.results.log_schema import DECISIONS

_CMP = ["seq", "step", "action", "content_hash", "request_id", "block_index", "from_tier",
        "to_tier"]


@dataclass
class LogDiff:
    """Result of :func:`diff` (JSON keys documented in docs/decision-log.md)."""

    path_a: str
    path_b: str
    policy_a: str
    policy_b: str
    trace: object
    rows_a: int
    rows_b: int
    first_divergence: dict | None
    evicted_only_a: int = 0
    evicted_only_b: int = 0
    cost_only_a_us: float = 0.0
    cost_only_b_us: float = 0.0
    regret_cost_a_us: float = 0.0
    regret_cost_b_us: float = 0.0
    top_only_a: list[dict] = field(default_factory=list)
    top_only_b: list[dict] = field(default_factory=list)
    differing_blocks: list[dict] = field(default_factory=list)


def _arrays(log: DecisionLog) -> Iterator[dict[str, np.ndarray]]:
    for batch in log.scan(_CMP):
        yield {n: batch.column(n).to_numpy(zero_copy_only=False) for n in _CMP}


def _first_mismatch(log_a: DecisionLog, log_b: DecisionLog) -> int | None:
    """Position (seq) of the first row where the logs differ; None if identical."""
    it_a, it_b = _arrays(log_a), _arrays(log_b)
    buf_a: dict | None = None
    buf_b: dict | None = None
    pos = 0
    while True:
        if buf_a is None or buf_a["seq"].size == 0:
            buf_a = next(it_a, None)
        if buf_b is None or buf_b["seq"].size == 0:
            buf_b = next(it_b, None)
        if buf_a is None and buf_b is None:
            return None
        if buf_a is None or buf_b is None:
            return pos  # one log ends: the other's next row diverges
        n = min(buf_a["seq"].size, buf_b["seq"].size)
        differ = np.zeros(n, bool)
        for name in _CMP[1:]:
            differ |= buf_a[name][:n] != buf_b[name][:n]
        hit = np.flatnonzero(differ)
        if hit.size:
            return pos + int(hit[0])
        pos += n
        buf_a = {k: v[n:] for k, v in buf_a.items()}
        buf_b = {k: v[n:] for k, v in buf_b.items()}


def _side(log: DecisionLog, position: int) -> dict | None:
    table = log.table(ds.field("seq") == int(position))
    if table.num_rows == 0:
        return None
    row = rows_frame(table).iloc[0].to_dict()
    raw = table.to_pylist()[0]
    out = {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
    out["is_decision"] = raw["action"] in {int(a) for a in DECISIONS}
    out["next_need"] = None
    if raw["action"] in EVICTING:
        key = key_of(raw["content_hash"], raw["request_id"], raw["block_index"])
        need = next_uses(log, raw["seq"], [key], {key})[key].get("need")
        if need is not None:
            need = dict(need, steps_later=need["step"] - raw["step"])
        out["next_need"] = need
    return out


def _ledger_facts(log: DecisionLog) -> tuple[pd.DataFrame, float]:
    ledger = build_ledger(log)
    return ledger.per_block(), ledger.regret_cost_us


def diff(log_a: DecisionLog, log_b: DecisionLog, top: int = 10) -> LogDiff:
    """Compare two logs of the same trace (KvsimInputError if their traces differ)."""
    sha_a, sha_b = getattr(log_a, "trace_sha256", None), getattr(log_b, "trace_sha256", None)
    if sha_a and sha_b:  # by content: two files that share a name are two traces
        if sha_a != sha_b:
            raise KvsimInputError(
                f"expected two logs of the same trace, got two different traces (by content: "
                f"{log_a.trace!r} sha256 {sha_a[:12]}..., {log_b.trace!r} sha256 "
                f"{sha_b[:12]}...)", log_b.path, None, "trace")
    elif log_a.trace and log_b.trace and log_a.trace != log_b.trace:
        raise KvsimInputError(f"expected two logs of the same trace, got {log_a.trace!r} and "
                              f"{log_b.trace!r}", log_b.path, None, "trace")
    position = _first_mismatch(log_a, log_b)
    first = None
    if position is not None:
        first = {"seq": position, "a": _side(log_a, position), "b": _side(log_b, position)}
        first["step"] = (first["a"] or first["b"])["step"]
    blocks_a, regret_a = _ledger_facts(log_a)  # one ledger in memory at a time
    blocks_b, regret_b = _ledger_facts(log_b)
    blocks = pd.concat([blocks_a.add_suffix("_a"), blocks_b.add_suffix("_b")],
                       axis=1).fillna(0)
    blocks = blocks.reset_index()
    only_a = blocks[(blocks["evictions_a"] > 0) & (blocks["evictions_b"] == 0)]
    only_b = blocks[(blocks["evictions_b"] > 0) & (blocks["evictions_a"] == 0)]
    out = LogDiff(path_a=str(log_a.path), path_b=str(log_b.path), policy_a=log_a.policy,
                  policy_b=log_b.policy, trace=log_a.trace or log_b.trace,
                  rows_a=log_a.num_rows, rows_b=log_b.num_rows, first_divergence=first,
                  evicted_only_a=len(only_a), evicted_only_b=len(only_b),
                  cost_only_a_us=float(only_a["cost_us_a"].sum()),
                  cost_only_b_us=float(only_b["cost_us_b"].sum()),
                  regret_cost_a_us=regret_a, regret_cost_b_us=regret_b)

    def listing(frame: pd.DataFrame, side: str) -> list[dict]:
        frame = frame.sort_values([f"cost_us_{side}", f"evictions_{side}", "k_hash", "k_req",
                                   "k_idx"], ascending=[False, False, True, True, True])
        return [{"block": format_block(r.k_hash, r.k_req, r.k_idx),
                 "evictions": int(getattr(r, f"evictions_{side}")),
                 "regretted": int(getattr(r, f"regretted_{side}")),
                 "cost_us": float(getattr(r, f"cost_us_{side}"))}
                for r in frame.head(top).itertuples()]

    out.top_only_a = listing(only_a, "a")
    out.top_only_b = listing(only_b, "b")
    changed = blocks[(blocks["evictions_a"] != blocks["evictions_b"])
                     | (blocks["cost_us_a"] != blocks["cost_us_b"])].copy()
    changed["gap"] = (changed["cost_us_a"] - changed["cost_us_b"]).abs()
    changed = changed.sort_values(["gap", "k_hash", "k_req", "k_idx"],
                                  ascending=[False, True, True, True]).head(top)
    out.differing_blocks = [
        {"block": format_block(r.k_hash, r.k_req, r.k_idx), "evictions_a": int(r.evictions_a),
         "cost_a_us": float(r.cost_us_a), "evictions_b": int(r.evictions_b),
         "cost_b_us": float(r.cost_us_b)} for r in changed.itertuples()]
    return out

