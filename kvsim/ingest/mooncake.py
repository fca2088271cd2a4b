"""Reader for Mooncake traces (kvcache-ai/Mooncake, FAST'25 release).

JSONL, one request per line: ``{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [...]}``.  ``hash_ids`` holds one id per 512-token block of the prompt
(``ceil(input_length / 512)`` ids, the last block possibly partial); ids are remapped
prefix hashes, so equal ids mean equal prefixes.  The last id identifies the partial
block's content too, hence ``hashed_tokens = input_length``.  No sessions, priorities or
SLOs are recorded: those columns keep their defaults.

All three traces of the FAST'25 release (conversation, synthetic, tool&agent) use this
format, and the reader assumes nothing about which one it reads: arrivals are made
relative to the earliest timestamp (a trace need not start at 0 nor be sorted), extra keys
are ignored, and an ``output_length`` of 0 (a call that generated nothing) is lowered as
1 token (the prefill samples one), as the other readers do.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import KvsimInputError
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import (BadRows, as_float, as_int, as_int_list, json_lines,
                                    parse_json)

#: Tokens per hash id (Mooncake README / FAST'25 artifact: "block size 512").
MOONCAKE_BLOCK_TOKENS = 512


def read_mooncake(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read a Mooncake JSONL trace into the canonical Request table."""
    bad = BadRows(skip_bad_rows)
    arrival, prompt, output, ids = [], [], [], []
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in rec:
                    raise KvsimInputError("missing required field", path, loc, key)
            t_ms = as_float(rec["timestamp"], path, loc, "timestamp", 0.0)
            n_in = as_int(rec["input_length"], path, loc, "input_length", 1)
            n_out = as_int(rec["output_length"], path, loc, "output_length", 0)
            h = as_int_list(rec["hash_ids"], path, loc, "hash_ids")
            need = -(-n_in // MOONCAKE_BLOCK_TOKENS)
            if len(h) != need:
                raise KvsimInputError(
                    f"expected ceil(input_length/512) = {need} ids, got {len(h)}",
                    path, loc, "hash_ids")
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        arrival.append(int(round(t_ms * 1000.0)))
        prompt.append(n_in)
        output.append(max(n_out, 1))
        ids.append(h)
    t0 = min(arrival) if arrival else 0
    arrival = [t - t0 for t in arrival]
    return build_request_table(
        {"arrival_us": arrival, "prompt_tokens": prompt, "output_tokens": output,
         "block_ids": ids, "hashed_tokens": prompt},
        block_size_tokens=MOONCAKE_BLOCK_TOKENS, path=str(path), skipped=bad.count,
        source={"format": "mooncake", "file": Path(path).name})
