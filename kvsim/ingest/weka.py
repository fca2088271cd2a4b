"""Reader for SemiAnalysis's Claude-Code traces on Weka (``semianalysisai/cc-traces-weka-*``
on Hugging Face, Apache-2.0; e.g. ``cc-traces-weka-042026``: 739 traces, 59,274 requests).

JSONL, ONE TRACE PER LINE (the agentic reader reads one conversation per JSON file)::

    {"id": "trace_0001", "models": ["claude-opus-4-5-20251101"], "block_size": 64,
     "hash_id_scope": "local", "tool_tokens": 12974, "system_tokens": 4243,
     "requests": [{"t": 0.0, "type": "n", "model": "...", "in": 71175, "out": 169,
                   "hash_ids": [1, 2, ...], "api_time": 5.3}, ...]}

Mapping rules (docs/importers.md, "SemiAnalysis Claude-Code traces (Weka)"):

* ``t`` is seconds from the trace's start; arrival = trace start + ``t``.  A request whose
  ``type`` is ``subagent`` holds ``requests`` of its own with ``t`` from the sub-agent's
  start (the agentic reader's rule); every other ``type`` (``n``, ``s``, ...) is one request.
* ``hash_ids`` name ``block_size``-token blocks of the prompt.  ``ceil(in / block_size)``
  ids: the last, partial block is identified too (``hashed_tokens = in``; the lowering
  hashes it with its token count, :func:`kvsim.ingest.hashing.partial_hash`, exactly as a
  Mooncake trace's last id); ``floor(in / block_size)`` ids: full blocks only
  (``hashed_tokens = block_size * len``).  Any other count is a bad row.
* ``hash_id_scope``: ``local`` (ids comparable only within one trace) namespaces the ids by
  the trace ``id`` (BLAKE2b of ``"weka:" + id``; sub-agents share their trace's namespace);
  ``global`` keeps one namespace for the file.  Anything else is refused.
* Sessions: each trace is one session, each sub-agent one more.  A request followed by a
  later request of its session has ``session_continues`` and ``next_turn_gap_us`` = the
  next request's ``t`` minus this one's ``t + api_time`` (at least 1 us; ``api_time`` 0
  when absent).
* ``tool_tokens + system_tokens`` (Anthropic's prompt order: tools, then system, then
  messages) become ``shared_prefix_tokens`` (capped at ``in``); absent = 0.
* ``tenant`` (an integer, or a name: names are numbered 1, 2, ... by first appearance), on
  the trace or on a request, is the tenant; absent = 0.  ``models`` and ``type`` are not
  used.
* Trace start times (the file has none): :func:`kvsim.ingest.agentic.conversation_starts_us`
  (``arrival_rate``: Poisson starts; else ``concurrency`` K in flight, default 8), traces in
  file order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.limits import get_limits
from kvsim.ingest.agentic import conversation_starts_us
from kvsim.ingest.hashing import name_hash, namespaced_ids
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import (
    BadRows,
    as_float,
    as_int,
    as_int_list,
    json_lines,
    parse_json,
)

#: Tokens per hash id (dataset card: "KV block size: 64 tokens"; ``"block_size": 64``).
WEKA_BLOCK_TOKENS = 64
#: Values of ``hash_id_scope`` (dataset card: ``local`` = comparable within one trace).
WEKA_SCOPES = ("local", "global")
#: Sub-agents nested deeper than this are refused (a guard against a malformed file).
_MAX_DEPTH = 100


def is_weka_record(rec: Any) -> bool:
    """Whether a JSONL record looks like one Weka trace (detection rule)."""
    return (isinstance(rec, dict) and isinstance(rec.get("requests"), list)
            and "hash_id_scope" in rec and "block_size" in rec)


class _Trace:
    """One trace line: rows with offsets from the trace start (seconds)."""

    def __init__(self, path, loc: str, rec: dict, block: int, tenants: dict, bad: BadRows):
        self.path, self.block, self.bad = path, block, bad
        self.rows: list[dict[str, Any]] = []
        self.end_s = 0.0
        self.num_sessions = 0
        lim = get_limits()
        self.max_s = lim.max_time_us / 1e6
        shared = 0
        for key in ("tool_tokens", "system_tokens"):
            if rec.get(key) is not None:
                shared += as_int(rec[key], path, loc, key, 0, lim.max_prompt_tokens)
        self.shared = shared
        self.tenant = _tenant(rec.get("tenant"), tenants, path, loc, 0)
        self.tenants = tenants
        self._walk(rec["requests"], 0.0, loc + ", requests", 0)

    def _walk(self, reqs: list, base_s: float, where: str, depth: int) -> None:
        lim = get_limits()
        session = self.num_sessions
        self.num_sessions += 1
        mine: list[dict[str, Any]] = []
        for i, r in enumerate(reqs):
            loc = f"{where}[{i}]"
            try:
                if not isinstance(r, dict):
                    raise KvsimInputError("expected an object", self.path, loc)
                t = as_float(r.get("t"), self.path, loc, "t", 0.0, self.max_s)
                if r.get("type") == "subagent":
                    if depth >= _MAX_DEPTH:
                        raise KvsimInputError(f"expected sub-agents nested at most "
                                              f"{_MAX_DEPTH} deep", self.path, loc, "requests")
                    sub = r.get("requests")
                    if not isinstance(sub, list):
                        raise bad_value(self.path, loc, "requests", "a list", sub)
                    self._walk(sub, base_s + t, loc + ".requests", depth + 1)
                    continue
                n_in = as_int(r.get("in"), self.path, loc, "in", 1, lim.max_prompt_tokens)
                n_out = as_int(r.get("out"), self.path, loc, "out", 0, lim.max_output_tokens)
                ids = as_int_list(r.get("hash_ids"), self.path, loc, "hash_ids")
                full, ceil_ = n_in // self.block, -(-n_in // self.block)
                if len(ids) not in (full, ceil_):
                    raise KvsimInputError(
                        f"expected ceil(in/{self.block}) = {ceil_} ids (or {full}, full "
                        f"blocks only), got {len(ids)}", self.path, loc, "hash_ids")
                api_s = as_float(r.get("api_time") or 0.0, self.path, loc, "api_time", 0.0,
                                 self.max_s)
                tenant = _tenant(r.get("tenant"), self.tenants, self.path, loc, self.tenant)
            except KvsimInputError as exc:
                self.bad.handle(exc)
                continue
            self.end_s = max(self.end_s, base_s + t + api_s)
            mine.append({
                "offset_s": base_s + t, "done_s": base_s + t + api_s, "in": n_in,
                "out": max(n_out, 1), "ids": ids, "session": session, "tenant": tenant,
                "hashed": n_in if len(ids) == ceil_ else len(ids) * self.block,
                "model": str(r.get("model") or "")})
        mine.sort(key=lambda row: row["offset_s"])  # stable: file order on ties
        for a, b in zip(mine, mine[1:]):
            a["gap_us"] = max(int(round((b["offset_s"] - a["done_s"]) * 1e6)), 1)
        self.rows.extend(mine)


def _tenant(value: Any, tenants: dict, path, loc: str, default: int) -> int:
    """The tenant id of ``value``: an integer as is, a string numbered by first appearance."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return as_int(value, path, loc, "tenant", 0, 2**31 - 1)
    if isinstance(value, str) and value:
        return tenants.setdefault(value, len(tenants) + 1)
    raise bad_value(path, loc, "tenant", "an integer >= 0 or a name", value)


def read_weka(path: str | Path, *, skip_bad_rows: bool = False,
              arrival_rate: float | None = None, concurrency: int | None = None,
              seed: int = 0) -> RequestTable:
    """Read a Weka Claude-Code trace file (JSONL, one trace per line) into a Request table."""
    bad = BadRows(skip_bad_rows)
    traces: list[tuple[_Trace, int]] = []
    block: int | None = None
    block_line = 0
    tenants: dict[str, int] = {}
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not is_weka_record(rec):
                raise KvsimInputError("expected a trace object with block_size, "
                                      "hash_id_scope and a 'requests' list", path, loc,
                                      "requests")
            bs = as_int(rec["block_size"], path, loc, "block_size", 1, 1 << 20)
            if block is not None and bs != block:
                raise KvsimInputError(f"expected block_size {block} (as on line "
                                      f"{block_line}), got {bs}", path, loc, "block_size")
            scope = rec["hash_id_scope"]
            if scope not in WEKA_SCOPES:
                raise bad_value(path, loc, "hash_id_scope", "local or global", scope)
            tid = rec.get("id")
            if scope == "local" and not isinstance(tid, (str, int)):
                raise bad_value(path, loc, "id", "a trace id (string or integer) naming "
                                "the hash namespace", tid)
            trace = _Trace(path, loc, rec, bs, tenants, bad)
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        if block is None:
            block, block_line = bs, lineno
        ns = name_hash("weka:" + str(tid)) if scope == "local" else name_hash("weka:global")
        traces.append((trace, ns))
    starts = conversation_starts_us([t.end_s for t, _ in traces], arrival_rate=arrival_rate,
                                    concurrency=concurrency, seed=seed)
    cols: dict[str, list] = {k: [] for k in (
        "arrival_us", "prompt_tokens", "output_tokens", "block_ids", "hashed_tokens",
        "session", "tenant", "session_continues", "next_turn_gap_us", "model",
        "shared_prefix_tokens")}
    session_base = 0
    for (trace, ns), start in zip(traces, starts):
        for r in trace.rows:
            cols["arrival_us"].append(start + int(round(r["offset_s"] * 1e6)))
            cols["prompt_tokens"].append(r["in"])
            cols["output_tokens"].append(r["out"])
            cols["block_ids"].append(namespaced_ids(ns, np.asarray(r["ids"], dtype=np.int64)))
            cols["hashed_tokens"].append(r["hashed"])
            cols["session"].append(session_base + r["session"])
            cols["tenant"].append(r["tenant"])
            cols["session_continues"].append("gap_us" in r)
            cols["next_turn_gap_us"].append(r.get("gap_us", -1))
            cols["model"].append(r["model"])
            cols["shared_prefix_tokens"].append(min(trace.shared, r["in"]))
        session_base += trace.num_sessions
    return build_request_table(
        cols, block_size_tokens=block or WEKA_BLOCK_TOKENS, path=str(path), skipped=bad.count,
        source={"format": "weka", "file": Path(path).name, "traces": len(traces),
                "arrival_rate": arrival_rate, "concurrency": concurrency, "seed": seed})
