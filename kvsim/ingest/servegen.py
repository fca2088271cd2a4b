"""Reader for Alibaba ServeGen's offline batch traces (``alibaba/ServeGen``,
``data/offline/``, Apache-2.0; SOSP'26 "Batched in Back: Characterizing and Optimizing
Offline LLM Inference in Production with ACDC").

JSONL, one request per line.  Each file is ONE batch job: all its requests were submitted
together, so there is no arrival time; ``request_id`` is the order of the submitted input
file.  Two kinds of file (``data/offline/README.md``):

* content-hash traces (trace_a/b/c)::

      {"request_id": 0, "type": "text", "input_length": 271, "hash_ids": [0, 1, ...],
       "img_ids": []}

  ``hash_ids``: remapped hashes of the prompt's 16-token blocks, ONE GLOBAL NAMESPACE for
  every content-hash trace (same id = same block content after the same prefix).  The
  README's example (446 tokens, 28 ids) has ``ceil(input_length / 16)`` ids: the last,
  partial block is identified (``hashed_tokens = input_length``, hashed with its token
  count by the lowering, as Mooncake's last id); ``floor`` ids (full blocks only) are
  read too.  These traces record NO output length: every request gets ``output_tokens``
  (default :data:`DEFAULT_OUTPUT_TOKENS`, an assumption, stated in the summary source).
* stat traces (trace_d/e/f)::

      {"request_id": 0, "type": "text", "input_length": 61, "output_length": 2370,
       "duration": 14000}

  no content ids (every prompt unique); ``duration`` (ms, end-to-end in production) is
  checked (a number >= 0) but not used.

Batch submission: all requests arrive at t = 0 in ``request_id`` order (the closed loop
queues them FCFS), or, with ``submission_rate`` R, request k (k-th in ``request_id``
order) arrives at ``k / R`` seconds.  ``type`` (text / multimodal) and ``img_ids`` are
not used (the hash ids already name the prompt's content).  No sessions or tenants.
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
    as_int_list,
    json_lines,
    parse_json,
)

#: Tokens per hash id (data/offline/README.md: "with a block size of 16 tokens").
SERVEGEN_BLOCK_TOKENS = 16
#: Output tokens of a content-hash trace's request (the trace records none): an assumption
#: of kvsim's, overridden by ``--output-tokens``.  128 is the order of a dictionary entry's
#: translation (trace_a's task) and keeps the study prefill-dominated, where prefix reuse
#: matters.
DEFAULT_OUTPUT_TOKENS = 128
#: Request types the README lists.
SERVEGEN_TYPES = ("text", "multimodal")


def is_servegen_record(rec: Any) -> bool:
    """Whether a JSONL record looks like a ServeGen offline request (detection rule):
    ``request_id`` and ``input_length``, no ``timestamp``, and either ``hash_ids`` or
    ``duration``."""
    return (isinstance(rec, dict) and "request_id" in rec and "input_length" in rec
            and "timestamp" not in rec and ("hash_ids" in rec or "duration" in rec))


def read_servegen(path: str | Path, *, skip_bad_rows: bool = False,
                  output_tokens: int | None = None,
                  submission_rate: float | None = None) -> RequestTable:
    """Read one ServeGen offline batch job (JSONL) into the canonical Request table."""
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    default_out = DEFAULT_OUTPUT_TOKENS if output_tokens is None else output_tokens
    if not 1 <= default_out <= lim.max_output_tokens:
        raise bad_value(None, None, "--output-tokens", f"1 .. {lim.max_output_tokens:,}",
                        output_tokens)
    if submission_rate is not None and not submission_rate > 0:
        raise bad_value(None, None, "--submission-rate", "a rate > 0 (requests per second)",
                        submission_rate)
    rows: list[tuple[int, int, int, list[int], int]] = []
    seen: dict[int, int] = {}
    kind: str | None = None
    kind_line = 0
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            for key in ("request_id", "input_length"):
                if key not in rec:
                    raise KvsimInputError("missing required field", path, loc, key)
            this = "hash" if "hash_ids" in rec else "stat"
            if kind is not None and this != kind:
                raise KvsimInputError(
                    f"expected a {'content-hash' if kind == 'hash' else 'stat'} record as "
                    f"on line {kind_line} (one kind per batch job), got "
                    f"{'hash_ids' if this == 'hash' else 'no hash_ids'}", path, loc,
                    "hash_ids")
            rid = as_int(rec["request_id"], path, loc, "request_id", 0)
            if rid in seen:
                raise KvsimInputError(f"request_id {rid} already used on line {seen[rid]}",
                                      path, loc, "request_id")
            n_in = as_int(rec["input_length"], path, loc, "input_length", 1,
                          lim.max_prompt_tokens)
            if "type" in rec and rec["type"] not in SERVEGEN_TYPES:
                raise bad_value(path, loc, "type", "text or multimodal", rec["type"])
            if this == "hash":
                ids = as_int_list(rec["hash_ids"], path, loc, "hash_ids")
                full = n_in // SERVEGEN_BLOCK_TOKENS
                ceil_ = -(-n_in // SERVEGEN_BLOCK_TOKENS)
                if len(ids) not in (full, ceil_):
                    raise KvsimInputError(
                        f"expected ceil(input_length/16) = {ceil_} ids (or {full}, full "
                        f"blocks only), got {len(ids)}", path, loc, "hash_ids")
                hashed = n_in if len(ids) == ceil_ else full * SERVEGEN_BLOCK_TOKENS
                n_out = default_out
            else:
                if "output_length" not in rec:
                    raise KvsimInputError("missing required field (a stat record)", path,
                                          loc, "output_length")
                n_out = max(as_int(rec["output_length"], path, loc, "output_length", 0,
                                   lim.max_output_tokens), 1)
                if "duration" in rec:
                    as_float(rec["duration"], path, loc, "duration", 0.0)
                ids, hashed = [], 0
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        if kind is None:
            kind, kind_line = this, lineno
        seen[rid] = lineno
        rows.append((rid, n_in, n_out, ids, hashed))
    rows.sort(key=lambda r: r[0])  # submission order (a file out of order is re-sorted)
    if submission_rate is None:
        arrival = [0] * len(rows)
    else:
        arrival = [int(round(k / submission_rate * 1e6)) for k in range(len(rows))]
    return build_request_table(
        {"arrival_us": arrival, "prompt_tokens": [r[1] for r in rows],
         "output_tokens": [r[2] for r in rows], "block_ids": [r[3] for r in rows],
         "hashed_tokens": [r[4] for r in rows]},
        block_size_tokens=SERVEGEN_BLOCK_TOKENS, path=str(path), skipped=bad.count,
        source={"format": "servegen", "file": Path(path).name,
                "kind": "content-hash" if kind == "hash" else "stat",
                "batch": True, "submission_rate": submission_rate,
                "assumed_output_tokens": default_out if kind == "hash" else None})
