"""Reader for BurstGPT (HPMLL/BurstGPT: ChatGPT and GPT-4 traffic of an Azure OpenAI
service, arXiv 2401.17644).

CSV with header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
(the released ``BurstGPT_*.csv``); ``Timestamp`` is seconds from the trace start,
``Log Type`` is ``Conversation log`` or ``API log``.  A later release adds ``Session ID``
and ``Elapsed time`` columns; columns are found by name, so both layouts read.

The trace records **no content**: no prefix identity, every prompt unique (``block_ids``
empty; the import summary says so).  ``Response tokens`` is 0 for failed requests in the
files with failures: lowered as 1 (the prefill samples one token).  ``Request tokens`` of 0
is a bad row (a request has at least one prompt token).  ``Model`` fills the ``model``
column; ``Session ID``, when present, the ``session`` column.
"""

from __future__ import annotations

import csv
from pathlib import Path

from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import open_text
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_int, as_time_us, csv_rows

#: The columns every BurstGPT release has (README of HPMLL/BurstGPT).
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens",
                    "Total tokens", "Log Type")


def is_burstgpt_header(header: list[str]) -> bool:
    names = {h.strip() for h in header}
    return all(c in names for c in ("Timestamp", "Request tokens", "Response tokens"))


def read_burstgpt(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read a BurstGPT CSV into the canonical Request table (no content identity)."""
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    cols: dict[str, list] = {k: [] for k in ("arrival_us", "prompt_tokens", "output_tokens",
                                             "model", "session")}
    sessions: dict[str, int] = {}
    with open_text(path) as fh:
        reader = csv_rows(csv.reader(fh), path)
        header = next(reader, None)
        if header is None or not is_burstgpt_header(header):
            raise KvsimInputError(f"expected header {','.join(BURSTGPT_COLUMNS)}, got "
                                  f"{','.join(header or [])!r}", path, "line 1")
        idx = {h.strip(): i for i, h in enumerate(header)}
        t_i, in_i, out_i = idx["Timestamp"], idx["Request tokens"], idx["Response tokens"]
        model_i, sess_i = idx.get("Model"), idx.get("Session ID")
        for lineno, row in enumerate(reader, start=2):
            if not row or not "".join(row).strip():
                continue
            loc = f"line {lineno}"
            try:
                if len(row) != len(header):
                    raise KvsimInputError(f"expected {len(header)} fields, got {len(row)}",
                                          path, loc)
                t_us = as_time_us(row[t_i], 1e6, path, loc, "Timestamp")
                n_in = as_int(row[in_i], path, loc, "Request tokens", 1,
                              lim.max_prompt_tokens)
                n_out = as_int(row[out_i], path, loc, "Response tokens", 0,
                               lim.max_output_tokens)
            except KvsimInputError as exc:
                bad.handle(exc)
                continue
            cols["arrival_us"].append(t_us)
            cols["prompt_tokens"].append(n_in)
            cols["output_tokens"].append(max(n_out, 1))
            cols["model"].append(row[model_i].strip() if model_i is not None else "")
            sid = row[sess_i].strip() if sess_i is not None else ""
            cols["session"].append(sessions.setdefault(sid, len(sessions)) if sid else -1)
    t0 = min(cols["arrival_us"]) if cols["arrival_us"] else 0
    cols["arrival_us"] = [t - t0 for t in cols["arrival_us"]]
    return build_request_table(
        cols, block_size_tokens=16, path=str(path), skipped=bad.count,
        source={"format": "burstgpt", "file": Path(path).name, "prefix_identity": False})
