"""``kvsim log show`` and ``kvsim log timeline``: filtered rows and block biographies.

Both build one pyarrow filter expression (request, block, actions, tiers, step range) that
the scan pushes down to row groups, so a selective query reads only the groups whose
statistics can match; ``--reason`` (a case-insensitive substring of the reason sentence)
is applied per batch on the column's dictionary, never row by row in Python.  ``show``
stops reading as soon as ``limit`` rows are found.

Output frames have one row per log row, in ``seq`` order, with enums as names (tiers
``HBM``/``DRAM``/``CXL``/``NVME``, ``-`` for none) and the block identity as text (the content
hash, or ``<request>:<block_index>`` for a block without one).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from kvsim.core.errors import KvsimInputError
from kvsim.results.log_reader import (
    BlockKey,
    DecisionLog,
    action_name,
    block_filter,
    format_block,
    tier_name,
)
from kvsim.results.log_schema import Action

#: Columns of :func:`show` and :func:`timeline` frames, in order.
SHOW_COLUMNS = ["seq", "step", "time_us", "action", "block", "request_id", "block_index",
                "from_tier", "to_tier", "bytes", "cost_us", "decode_critical", "reason",
                "n_candidates"]

_READ = ["seq", "step", "time_us", "action", "content_hash", "request_id", "block_index",
         "from_tier", "to_tier", "bytes", "cost_us", "decode_critical", "reason", "candidates"]


def parse_step_range(text: str) -> tuple[int | None, int | None]:
    """``"A:B"`` (both inclusive), ``"A:"``, ``":B"`` or ``"A"`` -> (low, high)."""
    raw = text.strip()
    try:
        if ":" not in raw:
            value = int(raw)
            return (value, value)
        lo, hi = raw.split(":", 1)
        bounds = (int(lo) if lo.strip() else None, int(hi) if hi.strip() else None)
    except ValueError:
        raise KvsimInputError(f"expected A:B (steps, inclusive; either side may be empty), "
                              f"got {raw!r}", field="step") from None
    if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
        raise KvsimInputError(f"expected A <= B, got {raw!r}", field="step")
    return bounds


def row_filter(request: int | None = None, block: BlockKey | None = None,
               actions: list[int] | None = None, tiers: list[int] | None = None,
               steps: tuple[int | None, int | None] | None = None) -> ds.Expression | None:
    """The conjunction of the given conditions (None when there is none)."""
    parts: list[ds.Expression] = []
    if request is not None:
        parts.append(ds.field("request_id") == int(request))
    if block is not None:
        parts.append(block_filter(block))
    if actions:
        parts.append(ds.field("action").isin(pa.array(sorted(set(actions)), pa.int8())))
    if tiers:
        codes = pa.array(sorted(set(tiers)), pa.int8())
        parts.append(ds.field("from_tier").isin(codes) | ds.field("to_tier").isin(codes))
    if steps is not None:
        lo, hi = steps
        if lo is not None:
            parts.append(ds.field("step") >= int(lo))
        if hi is not None:
            parts.append(ds.field("step") <= int(hi))
    expr = None
    for part in parts:
        expr = part if expr is None else expr & part
    return expr


def _reason_mask(column: pa.Array | pa.ChunkedArray, needle: str) -> pa.Array:
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    masks = []
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        hit = pc.match_substring(chunk.dictionary, needle, ignore_case=True)
        masks.append(pc.fill_null(pc.take(hit, chunk.indices), False))
    return pa.concat_arrays(masks) if masks else pa.array([], pa.bool_())


def rows_frame(table: pa.Table) -> pd.DataFrame:
    """Log rows -> the documented display frame (enums and identities as text)."""
    n = table.num_rows
    get = lambda name: table.column(name).to_numpy(zero_copy_only=False)  # noqa: E731
    hashes, reqs, idxs = get("content_hash"), get("request_id"), get("block_index")
    cand = table.column("candidates")
    lengths = pc.fill_null(pc.list_value_length(cand), 0).to_numpy(zero_copy_only=False) \
        if n else np.zeros(0, np.int64)
    frame = pd.DataFrame({
        "seq": get("seq").astype(np.int64),
        "step": get("step").astype(np.int64),
        "time_us": get("time_us").astype(np.float64),
        "action": [action_name(a) for a in get("action")],
        "block": [format_block(h, r, i) for h, r, i in zip(hashes, reqs, idxs)],
        "request_id": reqs.astype(np.int64),
        "block_index": idxs.astype(np.int64),
        "from_tier": [tier_name(t) for t in get("from_tier")],
        "to_tier": [tier_name(t) for t in get("to_tier")],
        "bytes": get("bytes").astype(np.int64),
        "cost_us": get("cost_us").astype(np.float64),
        "decode_critical": get("decode_critical").astype(bool),
        "reason": [str(s) for s in table.column("reason").cast(pa.string()).to_pylist()]
        if n else [],
        "n_candidates": np.asarray(lengths, dtype=np.int64),
    }, columns=SHOW_COLUMNS)
    return frame


def _rows(log: DecisionLog, expr: ds.Expression | None, reason: str | None,
          limit: int | None) -> pa.Table:
    parts: list[pa.Table] = []
    taken = 0
    for batch in log.scan(_READ, expr):
        table = pa.Table.from_batches([batch])
        if reason:
            table = table.filter(_reason_mask(table.column("reason"), reason))
            if table.num_rows == 0:
                continue
        if limit and taken + table.num_rows >= limit:
            parts.append(table.slice(0, limit - taken))
            break
        parts.append(table)
        taken += table.num_rows
    if not parts:
        return log.schema.empty_table().select(_READ)
    # reason dictionaries differ between row groups: unify before concatenating
    return pa.concat_tables([p.unify_dictionaries() for p in parts]).unify_dictionaries()


def show(log: DecisionLog, request: int | None = None, block: BlockKey | None = None,
         actions: list[int] | None = None, tiers: list[int] | None = None,
         steps: tuple[int | None, int | None] | None = None, reason: str | None = None,
         limit: int | None = 50) -> pd.DataFrame:
    """The log rows matching every given filter, first ``limit`` in ``seq`` order
    (``limit`` None or 0: all).  Columns: :data:`SHOW_COLUMNS`."""
    expr = row_filter(request, block, actions, tiers, steps)
    return rows_frame(_rows(log, expr, reason, limit or None))


#: What each action means for a block, as a phrase of its biography.
_PHRASES = {
    Action.ALLOCATE: "allocated in {to} for request {r}",
    Action.HIT: "shared by request {r} (prefix-cache hit)",
    Action.RELEASE: "released by its last holder; cached while free",
    Action.REVIVE: "revived from the free cache by request {r}",
    Action.FREE: "freed (no content identity): slot empty again",
    Action.EVICT: "evicted from {frm} (no copy kept below)",
    Action.DEMOTE: "demoted {frm} -> {to}",
    Action.PROMOTE: "promoted {frm} -> {to} on demand for request {r} ({cost:g} us)",
    Action.PREFETCH: "prefetched {frm} -> {to} ahead of use ({cost:g} us)",
    Action.RECOMPUTE: "recomputed into {to} for request {r} ({cost:g} us)",
    Action.WRITE_THROUGH: "copied {frm} -> {to} (write-through), stays in {frm}",
    Action.PREEMPT: "request {r} preempted",
}


def _resident_after(action: int, frm: int, to: int, tiers: set[int]) -> set[int]:
    """Tiers holding the block after the action.  A fetched-up block keeps its lower copy
    until the log evicts it (what vLLM offloading and SGLang HiCache do)."""
    tiers = set(tiers)
    if action in (Action.ALLOCATE, Action.RECOMPUTE, Action.PROMOTE, Action.PREFETCH,
                  Action.WRITE_THROUGH, Action.REVIVE, Action.HIT):
        tiers.add(to if to >= 0 else 0)  # no tier logged: the action happens in HBM
    elif action in (Action.EVICT, Action.FREE):
        tiers.discard(frm if frm >= 0 else 0)
    elif action in (Action.DEMOTE, Action.PREEMPT):
        if frm >= 0:
            tiers.discard(frm)
        if to >= 0:
            tiers.add(to)
    return tiers


def timeline(log: DecisionLog, block: BlockKey | None = None,
             request: int | None = None) -> pd.DataFrame:
    """A block's biography (every row of that identity) or a request's events, in ``seq``
    order: :data:`SHOW_COLUMNS` plus ``what`` (a phrase) and, for a block, ``resident``
    (the tiers holding it after the row, e.g. ``HBM+DRAM``, ``-`` for nowhere)."""
    if (block is None) == (request is None):
        raise KvsimInputError("expected exactly one of --block or --request", field="timeline")
    expr = row_filter(request=request, block=block)
    frame = rows_frame(_rows(log, expr, None, None))
    codes = {a.name: a for a in Action}
    whats, resident, tiers = [], [], set()
    for row in frame.itertuples(index=False):
        action = codes.get(row.action)
        frm = -1 if row.from_tier == "-" else int(_TIER_CODES[row.from_tier])
        to = -1 if row.to_tier == "-" else int(_TIER_CODES[row.to_tier])
        phrase = _PHRASES.get(action, row.action.lower()) if action is not None else row.action
        whats.append(phrase.format(to=row.to_tier, frm=row.from_tier, r=row.request_id,
                                   cost=row.cost_us))
        if block is not None and action is not None:
            tiers = _resident_after(int(action), frm, to, tiers)
            resident.append("+".join(tier_name(t) for t in sorted(tiers)) or "-")
    frame["what"] = whats
    if block is not None:
        frame["resident"] = resident
    return frame


def tiers_visited(frame: pd.DataFrame) -> list[str]:
    """The tiers a block entered, in order, repeats kept (``HBM, DRAM, HBM`` for a block
    demoted then promoted back), from a :func:`timeline` frame."""
    path: list[str] = []
    for name in frame["to_tier"]:
        if name != "-" and (not path or path[-1] != name):
            path.append(name)
    return path


_TIER_CODES = {tier_name(c): c for c in range(4)}
