"""Reader for Mooncake traces (kvcache-ai/Mooncake, FAST'25 release).

JSONL, one request per line: ``{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [...]}``.  ``hash_ids`` holds one id per 512-token block of the prompt
(``ceil(input_length / 512)`` ids, the last block possibly partial); ids are remapped
prefix hashes, so equal ids mean equal prefixes.  The last id identifies the partial
block's content too, hence ``hashed_tokens = input_length``.  No sessions, priorities or
SLOs are recorded: those columns keep their defaults.

All three traces of the FAST'25 release (conversation, synthetic, tool&agent) use this
format, and the reader assumes nothing about which one it reads: arrivals are made
relative to the earliest timestamp (a trace need not start at 0 nor be sorted) and extra
keys are ignored.

Prefix tree.  Because ids are prefix hashes, an id must always follow the same id (or
always start the list).  A trace that breaks this (ids re-used after a different prefix)
is read, with ONE warning line saying how many requests do it: the lowering chains ids by
prefix, so those blocks are not shared where the trace's ids alone would say they are.
``strict=True`` (``--strict``) refuses such a trace, naming the first offending line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from kvsim.core.errors import KvsimInputError, KvsimWarning
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_int, as_int_list, as_time_us, json_lines, parse_json

#: Tokens per hash id (Mooncake README / FAST'25 artifact: "block size 512").
MOONCAKE_BLOCK_TOKENS = 512


def read_mooncake(path: str | Path, *, skip_bad_rows: bool = False,
                  strict: bool = False) -> RequestTable:
    """Read a Mooncake JSONL trace into the canonical Request table.  Ids that do not form
    a prefix tree: a :class:`~kvsim.core.errors.KvsimWarning` (``strict``: an error)."""
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    arrival, prompt, output, ids = [], [], [], []
    parent: dict[int, int] = {}  # id -> the id before it (-1: first of its list)
    off_tree = 0
    first_off: str | None = None
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in rec:
                    raise KvsimInputError("missing required field", path, loc, key)
            t_us = as_time_us(rec["timestamp"], 1000.0, path, loc, "timestamp",
                              limits=lim)
            n_in = as_int(rec["input_length"], path, loc, "input_length", 1,
                          lim.max_prompt_tokens)
            n_out = as_int(rec["output_length"], path, loc, "output_length", 1,
                           lim.max_output_tokens)
            h = as_int_list(rec["hash_ids"], path, loc, "hash_ids")
            need = -(-n_in // MOONCAKE_BLOCK_TOKENS)
            if len(h) != need:
                raise KvsimInputError(
                    f"expected ceil(input_length/512) = {need} ids, got {len(h)}",
                    path, loc, "hash_ids")
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        prev = -1
        broken = False
        for j, hid in enumerate(h):
            seen = parent.setdefault(hid, prev)
            if seen != prev and not broken:
                broken = True
                if first_off is None:
                    first_off = (f"{loc}: id {hid} at position {j} follows "
                                 f"{'nothing' if prev == -1 else prev}, elsewhere "
                                 f"{'nothing' if seen == -1 else seen}")
            prev = hid
        if broken:
            if strict:
                raise KvsimInputError(
                    f"expected prefix-hash ids (each id always after the same id); id "
                    f"reused after a different prefix ({first_off.split(': ', 1)[1]})",
                    path, loc, "hash_ids")
            off_tree += 1
        arrival.append(t_us)
        prompt.append(n_in)
        output.append(n_out)
        ids.append(h)
    t0 = min(arrival) if arrival else 0
    arrival = [t - t0 for t in arrival]
    if off_tree:
        warnings.warn(KvsimWarning(
            f"{path}: {off_tree:,} of {len(arrival):,} requests have hash_ids that do not form "
            f"a prefix tree (first: {first_off}); kvsim chains ids by prefix, so those blocks "
            "are shared only after an identical prefix (less sharing than the raw ids "
            "suggest); --strict refuses such a trace"), stacklevel=2)
    return build_request_table(
        {"arrival_us": arrival, "prompt_tokens": prompt, "output_tokens": output,
         "block_ids": ids, "hashed_tokens": prompt},
        block_size_tokens=MOONCAKE_BLOCK_TOKENS, path=str(path), skipped=bad.count,
        source={"format": "mooncake", "file": Path(path).name})
