"""Convert kv_deadline_scheduler's MemoryIntentEvent JSONL ("kvmi") into a kvsim event file.

kvmi files are already block events, so they are translated, not lowered
(github.com/manishklach/kv_deadline_scheduler, MIT; sample in ../shared/formats/).  Each
line is ``{"step", "event_type", "intent": {...}, "latency_us", "reason"}``.  Mapping:

=========================== =============================================================
kvmi event_type             kvsim rows
=========================== =============================================================
(first sight of a request)  ``ARRIVE`` (num_tokens 0: kvmi does not record prompt length;
                            deadline_us and request_priority from the intent)
ALLOCATED                   ``ALLOCATE`` at the request's next block index (dense, in
                            allocation order); phase DRAFT when ``is_draft``
ACCESSED                    one ``ACCESS`` per request per step (num_tokens 1 in DECODE,
                            VERIFY or DRAFT, else 0: kvmi does not record tokens)
COMMITTED                   ``COMMIT`` of that block
MARKED_DECODE_CRITICAL,     block-level ``INTENT`` carrying the intent's phase, priority,
MARKED_COLD (any MARKED_*)  deadline, slack, target step, pin and ok-flags
FREED                       block-level ``FREE`` of that block
SPILLED, PREFETCHED, MISS,  dropped and counted (``ImportSummary.dropped_by_type``): they
EVICTED                     are the old tool's own placement decisions; kvsim decides
=========================== =============================================================

Clock: kvmi steps carry no time; ``time_us = step * step_us`` (``step_us`` default
:data:`KVMI_STEP_US`, an assumption).  kvmi's ``deadline_us`` is a *relative* budget from
the event (its generator writes 700, 900, 2,500, 10,000 us whatever the step; its
simulator compares it with a per-event latency), so kvsim's absolute deadline is
``time_us + deadline_us``; ``slack_us`` is copied (a difference already).  Content hashes
are ``NO_HASH`` (kvmi has no content identity), so nothing is
prefix-shared.  Rows of one step follow kvsim's order: STEP, ARRIVE, per request its
ALLOCATE/INTENT/COMMIT rows then its ACCESS, then FREE rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.schema import DEFAULTS, EventHeader, EventKind, Phase, Priority
from kvsim.ingest.tracefile import BadRows, as_float, as_int, json_lines, parse_json

#: Engine-step length given to kvmi steps (assumption: kvmi records no time; 1 ms is the
#: order of one decode step of a 7-8B model on one datacenter GPU).
KVMI_STEP_US = 1000
KVMI_EVENT_TYPES = ("ALLOCATED", "ACCESSED", "COMMITTED", "MARKED_DECODE_CRITICAL",
                    "MARKED_COLD", "SPILLED", "PREFETCHED", "MISS", "EVICTED", "FREED")
DROPPED_TYPES = ("SPILLED", "PREFETCHED", "MISS", "EVICTED")
_CHUNK_ROWS = 1 << 16


def looks_like_kvmi(record: Any) -> bool:
    return isinstance(record, dict) and "event_type" in record and "intent" in record


class _Rows:
    """Column lists of pending rows."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {name: [] for name in DEFAULTS}

    def add(self, **values: Any) -> None:
        for name, default in DEFAULTS.items():
            self.cols[name].append(values.get(name, default))

    def __len__(self) -> int:
        return len(self.cols["step"])

    def take(self) -> dict[str, np.ndarray]:
        out = {name: np.asarray(v) for name, v in self.cols.items()}
        self.cols = {name: [] for name in DEFAULTS}
        return out


def _enum(enum_cls, value: Any, path, loc: str, field: str) -> int:
    try:
        return int(enum_cls[str(value)])
    except KeyError:
        raise bad_value(path, loc, field, "one of " + ", ".join(m.name for m in enum_cls),
                        value) from None


def _or(value: Any, default: Any) -> Any:
    """``value``, or ``default`` when kvmi wrote null."""
    return default if value is None else value


class _Converter:
    def __init__(self, path, block_size_tokens: int, step_us: int, bad: BadRows) -> None:
        self.path = path
        self.B = block_size_tokens
        self.step_us = step_us
        self.bad = bad
        self.rids: dict[str, int] = {}
        self.blocks: dict[tuple[int, Any], int] = {}  # (rid, kvmi block_id) -> index
        self.nblocks: dict[int, int] = {}
        self.rows = _Rows()
        self.step = -1
        self.pending: list[tuple[str, dict, str]] = []
        self.dropped: dict[str, int] = {}
        self.kv_bytes_per_token = 0
        self.num_steps = 0

    def feed(self, lineno: int, rec: Any) -> None:
        loc = f"line {lineno}"
        if not looks_like_kvmi(rec):
            raise KvsimInputError("expected a kvmi event {step, event_type, intent}",
                                  self.path, loc)
        et = rec["event_type"]
        if et not in KVMI_EVENT_TYPES:
            raise bad_value(self.path, loc, "event_type", "a kvmi event type", et)
        from kvsim.core.limits import get_limits

        # step x step_us is the event time: bounded like any trace time (kvsim.core.limits)
        step = as_int(rec.get("step"), self.path, loc, "step", 0,
                      get_limits().max_time_us // max(int(self.step_us), 1))
        if not isinstance(rec["intent"], dict) or "request_id" not in rec["intent"]:
            raise KvsimInputError("expected an object with request_id", self.path, loc,
                                  "intent")
        if step < self.step:
            raise KvsimInputError(f"expected steps never decreasing, got {step} after "
                                  f"{self.step}", self.path, loc, "step")
        if et in DROPPED_TYPES:
            self.dropped[et] = self.dropped.get(et, 0) + 1
            return
        # validate the intent now so errors name this line
        it = rec["intent"]
        _enum(Phase, it.get("phase", "PREFILL"), self.path, loc, "intent.phase")
        _enum(Priority, it.get("priority", "WARM"), self.path, loc, "intent.priority")
        if et != "ACCESSED" and "block_id" not in it:
            raise KvsimInputError("missing required field", self.path, loc, "intent.block_id")
        bid = it.get("block_id")
        if bid is not None and (isinstance(bid, bool) or not isinstance(bid, (int, str))):
            raise bad_value(self.path, loc, "intent.block_id", "an integer or a string", bid)
        self._intent_fields(it, loc)  # every intent field checked on its own line
        if step != self.step:
            self.flush_step()
            self.step = step
        self.pending.append((et, it, loc))

    def _intent_fields(self, it: dict, loc: str) -> dict[str, Any]:
        """kvsim intent columns from one kvmi ``intent`` object (null = unset)."""
        p = self.path
        phase = _enum(Phase, it.get("phase", "PREFILL"), p, loc, "intent.phase")
        if it.get("is_draft") and not it.get("is_committed"):
            phase = int(Phase.DRAFT)
        return {
            "phase": phase,
            "priority": _enum(Priority, it.get("priority", "WARM"), p, loc, "intent.priority"),
            "request_priority": as_int(it.get("request_priority", 50), p, loc,
                                       "intent.request_priority", 0, 100),
            # kvmi writes null for an unset optional integer (its fields are `int | None`)
            "deadline_us": max(as_int(_or(it.get("deadline_us"), -1), p, loc,
                                      "intent.deadline_us"), -1),
            "slack_us": as_int(_or(it.get("slack_us"), 0), p, loc, "intent.slack_us"),
            "target_decode_step": max(as_int(_or(it.get("target_decode_step"), -1), p, loc,
                                             "intent.target_decode_step"), -1),
            "recompute_cost_us": max(as_float(_or(it.get("recompute_cost_us"), 0.0), p, loc,
                                              "intent.recompute_cost_us"), 0.0),
            "pin_requested": bool(it.get("pin_requested", False)),
            "compression_ok": bool(it.get("compression_ok", True)),
            "recompute_ok": bool(it.get("recompute_ok", True)),
            "prefetch_ok": bool(it.get("prefetch_ok", True)),
            "size_bytes": as_int(it.get("size_bytes", 0), p, loc, "intent.size_bytes", 0),
        }

    def flush_step(self) -> None:
        if not self.pending:
            return
        step, t = self.step, self.step * self.step_us
        self.num_steps += 1
        base = {"step": step, "time_us": t}
        self.rows.add(**base, kind=int(EventKind.STEP), duration_us=float(self.step_us))
        order: list[int] = []
        per_req: dict[int, list] = {}
        frees: list[dict] = []
        for et, it, loc in self.pending:
            name = str(it["request_id"])
            fields = self._intent_fields(it, loc)
            if fields["deadline_us"] >= 0:  # kvmi's deadline is a budget from the event
                fields["deadline_us"] += t
            if name not in self.rids:
                rid = self.rids[name] = len(self.rids)
                self.nblocks[rid] = 0
                self.rows.add(**base, kind=int(EventKind.ARRIVE), request_id=rid,
                              phase=fields["phase"], request_priority=fields["request_priority"],
                              deadline_us=fields["deadline_us"], slack_us=fields["slack_us"])
            rid = self.rids[name]
            if rid not in per_req:
                per_req[rid] = []
                order.append(rid)
            row = {**base, **fields, "request_id": rid}
            if et == "ALLOCATED":
                key = (rid, it["block_id"])
                idx = self.nblocks[rid]
                self.blocks[key] = idx
                self.nblocks[rid] = idx + 1
                if not self.kv_bytes_per_token and fields["size_bytes"]:
                    self.kv_bytes_per_token = fields["size_bytes"] // self.B
                per_req[rid].append({**row, "kind": int(EventKind.ALLOCATE), "block_index": idx,
                                     "num_tokens": self.B})
            elif et == "ACCESSED":
                if not any(r["kind"] == EventKind.ACCESS for r in per_req[rid]):
                    ntok = 1 if fields["phase"] in (Phase.DECODE, Phase.VERIFY, Phase.DRAFT) else 0
                    per_req[rid].append({**row, "kind": int(EventKind.ACCESS), "num_tokens": ntok,
                                         "size_bytes": 0})
            else:
                key = (rid, it["block_id"])
                if key not in self.blocks:
                    self.bad.handle(KvsimInputError(
                        f"block {it['block_id']!r} of {name} was never ALLOCATED", self.path,
                        loc, "intent.block_id"))
                    continue
                row["block_index"] = self.blocks[key]
                if et == "FREED":
                    frees.append({**row, "kind": int(EventKind.FREE)})
                elif et == "COMMITTED":
                    per_req[rid].append({**row, "kind": int(EventKind.COMMIT)})
                else:  # MARKED_*
                    per_req[rid].append({**row, "kind": int(EventKind.INTENT)})
        for rid in order:
            rows = per_req[rid]
            rows.sort(key=lambda r: r["kind"] == EventKind.ACCESS)  # stable: ACCESS last
            for r in rows:
                self.rows.add(**r)
        for r in frees:
            self.rows.add(**r)
        self.pending = []


def convert_kvmi(path: str | Path, out_path: str | Path, *, block_size_tokens: int = 16,
                 step_us: int = KVMI_STEP_US, skip_bad_rows: bool = False):
    """Translate a kvmi JSONL file into a kvsim event file; returns an ImportSummary."""
    from kvsim.events import EventWriter
    from kvsim.events.import_summary import ImportSummary

    if block_size_tokens < 1:
        raise bad_value(None, None, "--block-size", "an integer >= 1", block_size_tokens)
    bad = BadRows(skip_bad_rows)
    conv = _Converter(path, block_size_tokens, step_us, bad)
    # first pass only to learn kv bytes per token for the header (kvmi files are small
    # event logs; a second streaming pass writes)
    for lineno, text in json_lines(path):
        try:
            conv.feed(lineno, parse_json(path, lineno, text))
        except KvsimInputError as exc:
            bad.handle(exc)
    conv.flush_step()
    kvbpt = conv.kv_bytes_per_token
    bad = BadRows(skip_bad_rows)
    conv = _Converter(path, block_size_tokens, step_us, bad)
    header = EventHeader(block_size_tokens=block_size_tokens, kv_bytes_per_token=kvbpt,
                         model="", hardware="",
                         source={"format": "kvmi", "file": Path(path).name, "step_us": step_us})
    num_events = 0
    with EventWriter(out_path, header) as writer:
        for lineno, text in json_lines(path):
            try:
                conv.feed(lineno, parse_json(path, lineno, text))
            except KvsimInputError as exc:
                bad.handle(exc)
            if len(conv.rows) >= _CHUNK_ROWS:
                num_events += len(conv.rows)
                writer.write(conv.rows.take())
        conv.flush_step()
        if len(conv.rows):
            num_events += len(conv.rows)
            writer.write(conv.rows.take())
    dropped = sum(conv.dropped.values())
    return ImportSummary(
        out_path=str(out_path), format="kvmi", num_requests=len(conv.rids),
        skipped_rows=bad.count, num_events=num_events, num_steps=conv.num_steps, num_forks=0,
        block_size_tokens=block_size_tokens, model="", hardware="",
        kv_bytes_per_token=kvbpt, block_bytes=kvbpt * block_size_tokens,
        total_prompt_tokens=0, total_output_tokens=0,
        prompt_blocks=sum(conv.nblocks.values()), hashed_prompt_blocks=0,
        prefix_reuse_fraction=0.0, makespan_us=max(conv.step, 0) * step_us + step_us,
        dropped_events=dropped, dropped_by_type=dict(sorted(conv.dropped.items())))
