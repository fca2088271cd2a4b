"""``kvsim log explain``: why this victim, how the alternatives scored, what happened next.

For one decision row (found with the ``step`` filter pushed down to row groups) the
explanation holds:

- the decision itself (action, block, the request on whose behalf, tiers, reason);
- every candidate the policy logged (victim first), each with its logged intent snapshot,
  its logged score and its **score terms**: the policy's ``explain(row, now_us)`` (via
  :func:`kvsim.policy.registry.get_policy`) applied to the candidate's snapshot when the
  policy provides it, else the single term ``score`` as logged;
- what happened next (one forward scan from the decision, filtered to the candidates'
  identities): each candidate's next use (any ``USING`` row) and the victim's next *need*
  (the first step in which it was fetched back, recomputed or re-allocated), with the need's
  total ``cost_us`` (all need rows of the block in that step), whether it was
  decode-critical, and whether it missed the victim's logged deadline
  (``need time_us + cost_us > deadline_us``; unknown when no deadline was logged).

The forward scan stops as soon as every candidate's next use and the victim's need are
complete; a block never used again costs a scan to the end of the log (column-projected).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from kvsim.core.errors import KvsimInputError
from kvsim.results.log_reader import (
    EVICTING,
    NEEDING,
    USING,
    BlockKey,
    DecisionLog,
    action_name,
    blocks_filter,
    format_block,
    identity_columns,
    tier_name,
)
from kvsim.results.log_schema import CANDIDATE_TYPE, DECISIONS, Action

#: ``next_use`` of a block never used again (kvsim.policy.api.NEVER, int64 max): shown as
#: null in JSON, never as 9223372036854775807.  A score at or beyond +-2**62 is that
#: sentinel turned into a score (belady's ``-next_use``): null too.
_NEVER = (1 << 63) - 1
_SENTINEL_SCORE = float(1 << 62)


def _no_sentinel(value: Any) -> Any:
    """None for the "never" sentinels (see :data:`_NEVER`), else ``value``."""
    if isinstance(value, (int, float)) and (value == _NEVER or abs(value) >= _SENTINEL_SCORE):
        return None
    return value


_NEXT_COLUMNS = ["seq", "step", "time_us", "action", "content_hash", "request_id",
                 "block_index", "cost_us", "decode_critical"]
_INTENT_FIELDS = [f.name for f in CANDIDATE_TYPE
                  if f.name not in ("content_hash", "request_id", "block_index", "score")]


def policy_explainer(name: str) -> Callable[[dict, float], dict[str, float]] | None:
    """The ``explain`` of the registered policy ``name``, or None (unknown policy, no
    registry, or a policy without ``explain``): callers then fall back to logged scores."""
    try:
        from kvsim.policy.registry import get_policy

        return getattr(get_policy(name), "explain", None)
    except Exception:  # noqa: BLE001 - any failure means "no explain available"
        return None


def key_of(content_hash: int, request_id: int, block_index: int) -> BlockKey:
    if int(content_hash) != 0:
        return (int(content_hash), -1, -1)
    return (0, int(request_id), int(block_index))


def _is_need(action: int, content_hash: int) -> bool:
    return action in NEEDING or (action == int(Action.ALLOCATE) and content_hash != 0)


def next_uses(log: DecisionLog, after_seq: int, keys: list[BlockKey],
              need_for: set[BlockKey] | None = None) -> dict[BlockKey, dict[str, Any]]:
    """For each key, its first ``USING`` row after ``after_seq`` (``"use"``) and, for keys in
    ``need_for``, its first need with the summed cost of that step's need rows
    (``"need"``).  Missing entries mean "never again in this log"."""
    keys = sorted(set(keys))
    need_for = set(need_for or ())
    found: dict[BlockKey, dict[str, Any]] = {k: {} for k in keys}
    if not keys:
        return found
    expr = ((ds.field("seq") > int(after_seq))
            & ds.field("action").isin(pa.array(sorted(USING), pa.int8()))
            & blocks_filter(keys))
    open_need: dict[BlockKey, dict] = {}
    for batch in log.scan(_NEXT_COLUMNS, expr):
        cols = {n: batch.column(n).to_numpy(zero_copy_only=False) for n in _NEXT_COLUMNS}
        kh, kr, ki = identity_columns(cols["content_hash"], cols["request_id"],
                                      cols["block_index"])
        for i in range(batch.num_rows):
            key = (int(kh[i]), int(kr[i]), int(ki[i]))
            if key not in found:
                continue
            row = {"seq": int(cols["seq"][i]), "step": int(cols["step"][i]),
                   "time_us": float(cols["time_us"][i]), "action": action_name(cols["action"][i]),
                   "request_id": int(cols["request_id"][i]),
                   "cost_us": float(cols["cost_us"][i]),
                   "decode_critical": bool(cols["decode_critical"][i])}
            slot = found[key]
            slot.setdefault("use", row)
            if key in need_for and _is_need(int(cols["action"][i]), key[0]):
                need = slot.get("need")
                if need is None:
                    slot["need"] = dict(row)
                    open_need[key] = slot["need"]
                elif key in open_need and row["step"] == need["step"]:
                    need["cost_us"] += row["cost_us"]
                    need["decode_critical"] = need["decode_critical"] or row["decode_critical"]
        last_step = int(cols["step"][-1])
        for key in [k for k, n in open_need.items() if n["step"] < last_step]:
            del open_need[key]  # its step is complete
        if not open_need and all("use" in found[k] and (k not in need_for or "need" in found[k])
                                 for k in keys):
            break
    return found


@dataclass
class Explanation:
    """Result of :func:`explain` (JSON keys documented in docs/decision-log.md)."""

    path: str
    policy: str
    seq: int
    step: int
    time_us: float
    action: str
    block: str
    request_id: int
    from_tier: str
    to_tier: str
    cost_us: float
    decode_critical: bool
    reason: str
    terms_source: str
    candidates: list[dict] = field(default_factory=list)
    next_need: dict | None = None
    other_decisions: list[dict] = field(default_factory=list)


def _decision_rows(log: DecisionLog, step: int) -> pa.Table:
    expr = (ds.field("step") == int(step)) & ds.field("action").isin(
        pa.array(sorted(int(a) for a in DECISIONS), pa.int8()))
    return log.table(expr)


def nearest_decision_steps(log: DecisionLog, step: int, n: int = 2) -> list[int]:
    """Up to ``n`` steps before and ``n`` after ``step`` that hold a decision (sorted)."""
    expr = ds.field("action").isin(pa.array(sorted(int(a) for a in DECISIONS), pa.int8()))
    steps = sorted(set(log.table(expr, columns=["step"]).column("step").to_pylist()))
    import bisect

    i = bisect.bisect_left(steps, int(step))
    return steps[max(0, i - n):i] + steps[i:i + n]


def explain(log: DecisionLog, step: int, block: BlockKey | None = None,
            explainer: Callable[[dict, float], dict[str, float]] | None | bool = True
            ) -> Explanation:
    """Explain the decision at ``step``: the one about ``block`` if given, else the step's
    first eviction (EVICT/DEMOTE), else its first decision.  ``explainer``: True = look the
    policy up in the registry; a callable = use it; None/False = logged scores only."""
    rows = _decision_rows(log, step).to_pylist()
    if not rows:
        near = nearest_decision_steps(log, step)
        hint = (f"; nearest steps with one: {', '.join(str(n) for n in near)}" if near
                else "; this log has no decisions (the replay never evicted: try a smaller "
                     "--hbm-gb)")
        raise KvsimInputError(f"expected a decision at step {step}, found none{hint}",
                              log.path, f"step {step}", "step")
    keys = [key_of(r["content_hash"], r["request_id"], r["block_index"]) for r in rows]
    if block is not None:
        picks = [i for i, k in enumerate(keys) if k == block]
        if not picks:
            raise KvsimInputError(f"expected a decision about block "
                                  f"{format_block(*block)} at step {step}, found none",
                                  log.path, f"step {step}", "block")
    else:
        picks = [i for i, r in enumerate(rows) if r["action"] in EVICTING] or [0]
    row = rows[picks[0]]
    victim = keys[picks[0]]
    if explainer is True:
        explainer = policy_explainer(log.policy)
    explainer = explainer or None
    cands = row["candidates"] or []
    cand_keys = [key_of(c["content_hash"], c["request_id"], c["block_index"]) for c in cands]
    evicting = row["action"] in EVICTING
    later = next_uses(log, row["seq"], cand_keys + [victim], {victim} if evicting else set())
    out = Explanation(
        path=str(log.path), policy=log.policy, seq=row["seq"], step=row["step"],
        time_us=row["time_us"], action=action_name(row["action"]),
        block=format_block(*victim), request_id=row["request_id"],
        from_tier=tier_name(row["from_tier"]), to_tier=tier_name(row["to_tier"]),
        cost_us=row["cost_us"], decode_critical=row["decode_critical"],
        reason=str(row["reason"]),
        terms_source="policy explain()" if explainer is not None else "logged score")
    for rank, (c, key) in enumerate(zip(cands, cand_keys)):
        terms = {"score": _no_sentinel(float(c["score"]))}
        if explainer is not None:
            got = explainer(dict(c), float(row["time_us"]))
            terms = {str(k): _no_sentinel(float(v)) for k, v in got.items()}
        use = later[key].get("use")
        out.candidates.append({
            "rank": rank, "block": format_block(*key), "request_id": c["request_id"],
            "block_index": c["block_index"], "score": _no_sentinel(float(c["score"])),
            "terms": terms,
            **{f: (_no_sentinel(c.get(f)) if f == "next_use" else c.get(f))
               for f in _INTENT_FIELDS},
            "next_use_step": use["step"] if use else None,
            "next_use_action": use["action"] if use else None,
            "next_use_request_id": use["request_id"] if use else None,
        })
    need = later[victim].get("need") if evicting else None
    if need is not None:
        deadline = int(cands[0]["deadline_us"]) if cands and cand_keys[0] == victim else -1
        need = dict(need)
        need["steps_later"] = need["step"] - row["step"]
        need["deadline_us"] = deadline if deadline >= 0 else None
        need["deadline_missed"] = (need["time_us"] + need["cost_us"] > deadline) \
            if deadline >= 0 else None
    out.next_need = need
    out.other_decisions = [
        {"seq": r["seq"], "action": action_name(r["action"]), "block": format_block(*k)}
        for i, (r, k) in enumerate(zip(rows, keys)) if i != picks[0]]
    return out
