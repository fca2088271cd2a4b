"""Readers for agent request traces: NVIDIA Dynamo's request traces (``dynamo``) and
OpenTelemetry GenAI spans (``otel``, :func:`read_otel`, documented there).

**Dynamo** (``dynamo.request.trace.v1`` JSONL, what ``DYN_REQUEST_TRACE=1`` writes;
ai-dynamo/dynamo docs, "Request Replay Tracing").

One record per line; the ``request_end`` rows are requests::

    {"schema": "dynamo.request.trace.v1", "event_type": "request_end",
     "event_time_unix_ms": 1777312801000,
     "agent_context": {"session_id": "run-42:researcher", "parent_session_id": "..."},
     "request": {"request_id": "...", "model": "my-model", "input_tokens": 128,
                 "output_tokens": 16, "request_received_ms": 1777312800000,
                 "total_time_ms": 1000,
                 "replay": {"trace_block_size": 64, "input_length": 128,
                            "input_sequence_hashes": [14879255164371896291, ...]}}}

Mapping rules (docs/importers.md, "Dynamo request traces"):

* arrival = ``request.request_received_ms``, relative to the earliest request;
* prompt = ``replay.input_length``; output = ``request.output_tokens`` (0, a cancelled
  stream's, read as 1);
* ``replay.input_sequence_hashes``: Dynamo's sequence-aware rolling hashes of
  ``trace_block_size``-token blocks, exactly ``ceil(input_length / trace_block_size)``
  of them (Dynamo's replay requires it), so the partial last block is identified
  (``hashed_tokens = input_length``).  They are unsigned 64-bit: kvsim keeps their bits
  as int64 (two's complement), so equal hashes stay equal.  ``trace_block_size`` must be
  one value for the whole file.
* ``agent_context.session_id`` (a string) is the session (numbered by first appearance);
  a request followed by a later request of its session has ``session_continues`` and
  ``next_turn_gap_us`` = the next arrival minus this request's finish
  (``request_received_ms + total_time_ms``, else ``event_time_unix_ms``), at least 1 us.
  ``parent_session_id`` is not used (a sub-agent is its own session).
* ``request.model`` is the model.  Other event types (``tool_end``, ``tool_error``, ...) are
  skipped and counted (``source.skipped_events``); a record of another ``schema`` and a
  ``request_end`` row without ``replay`` metadata are bad rows (Dynamo records replay
  metadata for every replayable request).  Wrapped records and the agent dependency graph
  (tool waits, sub-agent joins) are not read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import (
    BadRows,
    as_float,
    as_int,
    as_time_us,
    json_lines,
    parse_json,
)

#: The schema tag of every record (Dynamo docs, "Record Shape").
DYNAMO_SCHEMA = "dynamo.request.trace.v1"
_U64 = 1 << 64


def is_dynamo_record(rec: Any) -> bool:
    """Whether a JSONL record is a Dynamo request-trace record (detection rule)."""
    return isinstance(rec, dict) and rec.get("schema") == DYNAMO_SCHEMA


def _u64_ids(value: Any, path, loc: str, field: str) -> list[int]:
    """Unsigned 64-bit hashes as int64 bit patterns (two's complement)."""
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise bad_value(path, loc, field, "a list of unsigned 64-bit integers",
                        value if not isinstance(value, list) else f"list with {value[:3]}...")
    out = []
    for i, v in enumerate(value):
        if not 0 <= v < _U64:
            raise bad_value(path, loc, f"{field}[{i}]", "an integer in 0 .. 2^64-1", v)
        out.append(v - _U64 if v >= 1 << 63 else v)
    return out


def read_dynamo(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read a Dynamo request trace (JSONL) into the canonical Request table."""
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    rows: list[dict[str, Any]] = []
    sessions: dict[str, int] = {}
    block: int | None = None
    block_line = 0
    skipped_events = 0
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            if rec.get("schema") != DYNAMO_SCHEMA:
                raise bad_value(path, loc, "schema", DYNAMO_SCHEMA, rec.get("schema"))
            if rec.get("event_type") != "request_end":
                skipped_events += 1
                continue
            req = rec.get("request")
            if not isinstance(req, dict):
                raise bad_value(path, loc, "request", "an object", req)
            rep = req.get("replay")
            if not isinstance(rep, dict):
                raise bad_value(path, loc, "request.replay", "replay metadata (an object "
                                "with trace_block_size, input_length, "
                                "input_sequence_hashes)", rep)
            t_us = as_time_us(req.get("request_received_ms"), 1000.0, path, loc,
                              "request.request_received_ms")
            bs = as_int(rep.get("trace_block_size"), path, loc,
                        "request.replay.trace_block_size", 1, 1 << 20)
            if block is not None and bs != block:
                raise KvsimInputError(f"expected trace_block_size {block} (as on line "
                                      f"{block_line}), got {bs}", path, loc,
                                      "request.replay.trace_block_size")
            n_in = as_int(rep.get("input_length"), path, loc, "request.replay.input_length",
                          1, lim.max_prompt_tokens)
            n_out = as_int(req.get("output_tokens"), path, loc, "request.output_tokens", 0,
                           lim.max_output_tokens)
            ids = _u64_ids(rep.get("input_sequence_hashes"), path, loc,
                           "request.replay.input_sequence_hashes")
            need = -(-n_in // bs)
            if len(ids) != need:
                raise KvsimInputError(f"expected ceil(input_length/{bs}) = {need} hashes, "
                                      f"got {len(ids)}", path, loc,
                                      "request.replay.input_sequence_hashes")
            if req.get("total_time_ms") is not None:
                done_us = t_us + int(round(as_float(req["total_time_ms"], path, loc,
                                                    "request.total_time_ms", 0.0) * 1000))
            elif rec.get("event_time_unix_ms") is not None:
                done_us = as_time_us(rec["event_time_unix_ms"], 1000.0, path, loc,
                                     "event_time_unix_ms")
            else:
                done_us = t_us
            ctx = rec.get("agent_context")
            sid = ctx.get("session_id") if isinstance(ctx, dict) else None
            if sid is not None and not isinstance(sid, str):
                raise bad_value(path, loc, "agent_context.session_id", "a string", sid)
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        if block is None:
            block, block_line = bs, lineno
        rows.append({"t": t_us, "done": done_us, "in": n_in, "out": max(n_out, 1),
                     "ids": ids, "model": str(req.get("model") or ""),
                     "session": -1 if sid is None else sessions.setdefault(sid, len(sessions))})
    t0 = min((r["t"] for r in rows), default=0)
    order = sorted(range(len(rows)), key=lambda i: rows[i]["t"])
    last: dict[int, dict] = {}
    for i in order:
        r = rows[i]
        if r["session"] >= 0:
            prev = last.get(r["session"])
            if prev is not None:
                prev["gap"] = max(r["t"] - prev["done"], 1)
            last[r["session"]] = r
    return build_request_table(
        {"arrival_us": [r["t"] - t0 for r in rows], "prompt_tokens": [r["in"] for r in rows],
         "output_tokens": [r["out"] for r in rows], "block_ids": [r["ids"] for r in rows],
         "hashed_tokens": [r["in"] for r in rows], "session": [r["session"] for r in rows],
         "session_continues": ["gap" in r for r in rows],
         "next_turn_gap_us": [r.get("gap", -1) for r in rows],
         "model": [r["model"] for r in rows]},
        block_size_tokens=block or 64, path=str(path), skipped=bad.count,
        source={"format": "dynamo", "file": Path(path).name, "skipped_events": skipped_events,
                "sessions": len(sessions)})


# ------------------------------------------------------------------ OpenTelemetry spans
#: Span attributes of the OpenTelemetry GenAI semantic conventions
#: (opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/) kvsim reads.
OTEL_INPUT = "gen_ai.usage.input_tokens"
OTEL_OUTPUT = "gen_ai.usage.output_tokens"
OTEL_MODEL = ("gen_ai.request.model", "gen_ai.response.model")
OTEL_SESSION = ("gen_ai.conversation.id", "session.id")
#: Tokens per synthesized content block of an OTel session (kvsim's block size).
OTEL_BLOCK_TOKENS = 16


def is_otel_record(rec: Any) -> bool:
    """Whether a JSONL record is an OTLP/JSON trace export (detection rule)."""
    return isinstance(rec, dict) and isinstance(rec.get("resourceSpans"), list)


def _attr_value(v: Any) -> Any:
    """An OTLP/JSON ``AnyValue`` as a Python value (``intValue`` is a string in OTLP/JSON)."""
    if not isinstance(v, dict):
        return None
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in v:
            return v[key]
    return None


def _spans(rec: dict, path, loc: str):
    """Every span of one OTLP/JSON export record, with its attributes as a dict."""
    for i, rs in enumerate(rec["resourceSpans"]):
        if not isinstance(rs, dict):
            raise bad_value(path, loc, f"resourceSpans[{i}]", "an object", rs)
        for j, ss in enumerate(rs.get("scopeSpans") or []):
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                raise bad_value(path, loc, f"resourceSpans[{i}].scopeSpans[{j}].spans",
                                "a list", spans)
            for k, sp in enumerate(spans):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                if not isinstance(sp, dict):
                    raise bad_value(path, loc, where, "an object", sp)
                attrs = {}
                for a in sp.get("attributes") or []:
                    if isinstance(a, dict) and isinstance(a.get("key"), str):
                        attrs[a["key"]] = _attr_value(a.get("value"))
                yield where, sp, attrs


def read_otel(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read OpenTelemetry GenAI spans (OTLP/JSON, one export request per line, as the
    OpenTelemetry Collector's file exporter writes them) into a Request table.

    * a request is a span carrying ``gen_ai.usage.input_tokens`` (other spans: agent,
      tool, HTTP, ... are skipped and counted in ``source.skipped_spans``);
    * arrival = ``startTimeUnixNano`` (relative to the earliest); prompt =
      ``gen_ai.usage.input_tokens``; output = ``gen_ai.usage.output_tokens`` (absent or 0:
      1); model = ``gen_ai.request.model`` (else ``gen_ai.response.model``);
    * session = ``gen_ai.conversation.id`` (else ``session.id``, else the span's
      ``traceId``: one agent run); a request followed by a later one of its session has
      ``session_continues`` and ``next_turn_gap_us`` = the next start minus this span's
      ``endTimeUnixNano`` (else its start), at least 1 us;
    * content: spans carry no tokens or hashes.  kvsim ASSUMES an append-only context per
      session (an agent loop resends its whole history): in start order, a request whose
      prompt is at least the previous request's prompt + output tokens starts with that
      previous prompt and output (same 16-token content ids); a shorter prompt (a context
      compaction, a new task) starts a fresh stream.  Only full 16-token blocks are
      identified (``hashed_tokens = 16 * floor(prompt / 16)``).
    """
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    rows: list[dict[str, Any]] = []
    sessions: dict[str, int] = {}
    skipped = 0
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not is_otel_record(rec):
                raise bad_value(path, loc, "resourceSpans", "an OTLP/JSON trace export "
                                "(an object with a resourceSpans list)", text[:40])
            found = []
            for where, sp, attrs in _spans(rec, path, loc):
                if attrs.get(OTEL_INPUT) is None:
                    skipped += 1
                    continue
                t_us = as_time_us(sp.get("startTimeUnixNano"), 1e-3, path, loc,
                                  where + ".startTimeUnixNano")
                n_in = as_int(attrs[OTEL_INPUT], path, loc, OTEL_INPUT, 1,
                              lim.max_prompt_tokens)
                n_out = as_int(attrs.get(OTEL_OUTPUT) or 0, path, loc, OTEL_OUTPUT, 0,
                               lim.max_output_tokens)
                sid = next((attrs[k] for k in OTEL_SESSION if attrs.get(k)), None)
                sid = str(sid) if sid is not None else "trace:" + str(sp.get("traceId"))
                model = next((attrs[k] for k in OTEL_MODEL if attrs.get(k)), "")
                done_us = t_us
                if sp.get("endTimeUnixNano") is not None:
                    done_us = as_time_us(sp["endTimeUnixNano"], 1e-3, path, loc,
                                         where + ".endTimeUnixNano")
                found.append({"t": t_us, "done": done_us, "in": n_in, "out": max(n_out, 1),
                              "sid": sid, "model": str(model)})
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        for r in found:
            r["session"] = sessions.setdefault(r["sid"], len(sessions))
        rows.extend(found)
    rows.sort(key=lambda r: r["t"])  # stable: file order on ties
    B = OTEL_BLOCK_TOKENS
    next_id = 0
    state: dict[int, tuple[list[int], int]] = {}  # session -> (stream ids, known tokens)
    for r in rows:
        stream, known = state.get(r["session"], ([], 0))
        if r["in"] < known:
            stream, known = [], 0  # shorter than the history: a fresh context
        keep = known // B  # full blocks of the known history
        stream = stream[:keep]
        need = -(-(r["in"] + r["out"]) // B)
        while len(stream) < need:
            stream.append(next_id)
            next_id += 1
        r["ids"] = stream[:r["in"] // B]
        state[r["session"]] = (stream, r["in"] + r["out"])
    t0 = rows[0]["t"] if rows else 0
    last: dict[int, dict] = {}
    for r in rows:
        prev = last.get(r["session"])
        if prev is not None:
            prev["gap"] = max(r["t"] - prev["done"], 1)
        last[r["session"]] = r
    return build_request_table(
        {"arrival_us": [r["t"] - t0 for r in rows], "prompt_tokens": [r["in"] for r in rows],
         "output_tokens": [r["out"] for r in rows], "block_ids": [r["ids"] for r in rows],
         "hashed_tokens": [len(r["ids"]) * B for r in rows],
         "session": [r["session"] for r in rows],
         "session_continues": ["gap" in r for r in rows],
         "next_turn_gap_us": [r.get("gap", -1) for r in rows],
         "model": [r["model"] for r in rows]},
        block_size_tokens=B, path=str(path), skipped=bad.count,
        source={"format": "otel", "file": Path(path).name, "skipped_spans": skipped,
                "sessions": len(sessions), "content": "append-only sessions (assumed)"})
