"""Reader for agentic coding traces (callanjfox/kv-cache-tester, Claude Code sessions).

One JSON object per conversation file (a directory is read in file-name order)::

    {"id", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"t": s, "type": "n"|"s", "model", "in", "out", "hash_ids": [...], "stop",
         "api_time": s, "think_time": s, ...},
        {"t": s, "type": "subagent", "requests": [...]}, ...]}

Mapping rules:

* ``t`` is seconds from the conversation start; a sub-agent's requests have ``t`` from the
  sub-agent's start, itself at the sub-agent entry's ``t``.  Arrival = conversation start
  + offsets.
* ``hash_ids`` name FULL 64-token blocks (``floor(in / 64)`` ids), local to the file:
  they are namespaced by the conversation ``id`` (BLAKE2b of ``"agentic:" + id``), and a
  sub-agent shares its parent's namespace.  ``hashed_tokens = 64 * len(hash_ids)``.
* Each conversation and each sub-agent is one session.  ``stop == "tool_use"`` means the
  agent loop continues (the client sends the tool result next): ``session_continues``.
  The expected gap to that next turn is what the serving layer last observed in this
  session (the request's own ``think_time``), or :data:`DEFAULT_AGENT_GAP_US` when it
  has none yet.
* Conversation start times (the trace has none), seeded and documented:
  ``arrival_rate`` = conversations per second, Poisson (exponential gaps from
  ``numpy.random.default_rng(seed)``), conversations in file-name order; otherwise
  ``concurrency`` K (default :data:`DEFAULT_CONCURRENCY`): K conversations in flight, the
  next starts when the earliest-ending one ends (end = max over its requests of
  ``t + api_time``).
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import open_text, strip_compression_suffix
from kvsim.core.limits import get_limits
from kvsim.ingest.hashing import name_hash, namespaced_ids
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_float, as_int, as_int_list

#: Largest offset / duration in seconds (kvsim.core.limits: max_time_us, 10 years).
_MAX_S = get_limits().max_time_us / 1e6

#: Tokens per hash id (kv-cache-tester traces: ``"block_size": 64``).
AGENTIC_BLOCK_TOKENS = 64
#: Expected tool-call gap when a session has no observed think time yet: the median
#: ``think_time`` after a ``tool_use`` stop over the 51 public traces (measured: 10.0 s).
DEFAULT_AGENT_GAP_US = 10_000_000
#: Conversations in flight when neither ``arrival_rate`` nor ``concurrency`` is given.
DEFAULT_CONCURRENCY = 8


def conversation_files(path: str | Path) -> list[Path]:
    """The conversation files of ``path`` (itself, or ``*.json[.gz|.zst]`` in a directory)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file()
                       and strip_compression_suffix(p).endswith(".json"))
        if not files:
            raise KvsimInputError("expected a directory holding *.json conversation files",
                                  path)
        return files
    return [path]


def _load(path: Path) -> dict[str, Any]:
    try:
        with open_text(path) as fh:
            doc = json.load(fh)
    except json.JSONDecodeError as exc:
        raise KvsimInputError(f"invalid JSON ({exc.msg})", path, f"line {exc.lineno}") from None
    except RecursionError:
        raise KvsimInputError("invalid JSON (nested too deeply)", path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise KvsimInputError("expected an object with a 'requests' list", path, None,
                              "requests")
    bs = doc.get("block_size", AGENTIC_BLOCK_TOKENS)
    if bs != AGENTIC_BLOCK_TOKENS:
        raise KvsimInputError(f"expected block_size {AGENTIC_BLOCK_TOKENS}, got {bs!r}", path,
                              None, "block_size")
    return doc


class _Conversation:
    """Requests of one conversation with offsets from its start (seconds)."""

    def __init__(self, path: Path, doc: dict[str, Any], bad: BadRows) -> None:
        self.path = path
        self.namespace = name_hash("agentic:" + str(doc.get("id", path.stem)))
        self.rows: list[dict[str, Any]] = []  # offset_s, in, out, ids, session_local, ...
        self.end_s = 0.0
        self.num_sessions = 0
        self._walk(doc["requests"], 0.0, "requests", bad)

    def _walk(self, reqs: list, base_s: float, where: str, bad: BadRows) -> None:
        lim = get_limits()
        session = self.num_sessions
        self.num_sessions += 1
        for i, r in enumerate(reqs):
            loc = f"{where}[{i}]"
            try:
                if not isinstance(r, dict):
                    raise KvsimInputError("expected an object", self.path, loc)
                if where.count(".requests") > 100:
                    raise KvsimInputError("expected sub-agents nested at most 100 deep",
                                          self.path, loc, "requests")
                t = as_float(r.get("t"), self.path, loc, "t", 0.0, _MAX_S)
                if r.get("type") == "subagent":
                    sub = r.get("requests")
                    if not isinstance(sub, list):
                        raise KvsimInputError("expected a list", self.path, loc, "requests")
                    self._walk(sub, base_s + t, loc + ".requests", bad)
                    continue
                n_in = as_int(r.get("in"), self.path, loc, "in", 1, lim.max_prompt_tokens)
                n_out = as_int(r.get("out"), self.path, loc, "out", 0, lim.max_output_tokens)
                ids = as_int_list(r.get("hash_ids"), self.path, loc, "hash_ids")
                if len(ids) * AGENTIC_BLOCK_TOKENS > n_in:
                    raise KvsimInputError(
                        f"expected at most floor(in/64) = {n_in // 64} ids, got {len(ids)}",
                        self.path, loc, "hash_ids")
                api_s = as_float(r.get("api_time") or 0.0, self.path, loc, "api_time", 0.0,
                                 _MAX_S)
                think_s = as_float(r.get("think_time") or 0.0, self.path, loc, "think_time",
                                   0.0, _MAX_S)
            except KvsimInputError as exc:
                bad.handle(exc)
                continue
            self.end_s = max(self.end_s, base_s + t + api_s)
            self.rows.append({
                "offset_s": base_s + t, "in": n_in, "out": max(n_out, 1), "ids": ids,
                "session": session, "continues": r.get("stop") == "tool_use",
                "gap_us": int(round(think_s * 1e6)) if think_s > 0 else DEFAULT_AGENT_GAP_US,
                "model": str(r.get("model") or ""),
            })


def conversation_starts_us(durations_s: list[float], *, arrival_rate: float | None,
                           concurrency: int | None, seed: int) -> list[int]:
    """Start time (us) of each conversation by the documented rule (module docstring)."""
    if arrival_rate is not None:
        if arrival_rate <= 0:
            raise KvsimInputError(f"expected a rate > 0, got {arrival_rate}", None, None,
                                  "--arrival-rate")
        gaps = np.random.default_rng(seed).exponential(1.0 / arrival_rate, len(durations_s))
        gaps[0] = 0.0
        return [int(round(x * 1e6)) for x in np.cumsum(gaps)]
    k = DEFAULT_CONCURRENCY if concurrency is None else concurrency
    if k < 1:
        raise KvsimInputError(f"expected an integer >= 1, got {k}", None, None, "--concurrency")
    slots = [0.0] * min(k, max(len(durations_s), 1))
    heapq.heapify(slots)
    starts = []
    for d in durations_s:
        s = heapq.heappop(slots)
        starts.append(int(round(s * 1e6)))
        heapq.heappush(slots, s + d)
    return starts


def read_agentic(path: str | Path, *, skip_bad_rows: bool = False,
                 arrival_rate: float | None = None, concurrency: int | None = None,
                 seed: int = 0) -> RequestTable:
    """Read one agentic conversation file, or a directory of them, into a Request table."""
    bad = BadRows(skip_bad_rows)
    convs: list[_Conversation] = []
    for f in conversation_files(path):
        try:
            convs.append(_Conversation(f, _load(f), bad))
        except KvsimInputError as exc:
            bad.handle(exc)
    starts = conversation_starts_us([c.end_s for c in convs], arrival_rate=arrival_rate,
                                    concurrency=concurrency, seed=seed)
    cols: dict[str, list] = {k: [] for k in (
        "arrival_us", "prompt_tokens", "output_tokens", "block_ids", "hashed_tokens",
        "session", "session_continues", "next_turn_gap_us", "model")}
    session_base = 0
    for conv, start in zip(convs, starts):
        for r in conv.rows:
            cols["arrival_us"].append(start + int(round(r["offset_s"] * 1e6)))
            cols["prompt_tokens"].append(r["in"])
            cols["output_tokens"].append(r["out"])
            cols["block_ids"].append(namespaced_ids(conv.namespace,
                                                    np.asarray(r["ids"], dtype=np.int64)))
            cols["hashed_tokens"].append(len(r["ids"]) * AGENTIC_BLOCK_TOKENS)
            cols["session"].append(session_base + r["session"])
            cols["session_continues"].append(r["continues"])
            cols["next_turn_gap_us"].append(r["gap_us"] if r["continues"] else -1)
            cols["model"].append(r["model"])
        session_base += conv.num_sessions
    return build_request_table(
        cols, block_size_tokens=AGENTIC_BLOCK_TOKENS, path=str(path), skipped=bad.count,
        source={"format": "agentic", "file": Path(path).name, "conversations": len(convs),
                "arrival_rate": arrival_rate, "concurrency": concurrency, "seed": seed})
