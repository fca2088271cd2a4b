"""Reader for the Azure LLM inference traces (Azure/AzurePublicDataset, Splitwise ISCA'24).

CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``; TIMESTAMP is a wall-clock
datetime with up to 7 sub-second digits (``2023-11-16 18:17:03.9799600``).  Arrivals are
made relative to the first row's timestamp.  The trace carries no content, so every
prompt is unique (``block_ids`` empty, no prefix sharing).
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import open_text
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_int, csv_rows

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _parse_time_us(text: str, path, loc: str) -> int:
    """Microseconds since the epoch of ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (UTC assumed)."""
    text = text.strip()
    base, _, frac = text.partition(".")
    try:
        if not base.isascii():
            raise ValueError
        dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
        if frac and not (frac.isascii() and frac.isdigit()):
            raise ValueError
    except ValueError:
        raise bad_value(path, loc, "TIMESTAMP", "a datetime like 2023-11-16 18:17:03.97996",
                        text) from None
    seconds = (dt - datetime(1970, 1, 1)).total_seconds()
    frac_us = int((frac + "000000")[:6]) if frac else 0
    return int(seconds) * 1_000_000 + frac_us


def read_azure(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read an Azure LLM inference CSV trace into the canonical Request table."""
    bad = BadRows(skip_bad_rows)
    times, prompt, output = [], [], []
    with open_text(path) as fh:
        reader = csv.reader(fh)
        rows = csv_rows(reader, path)
        header = next(rows, None)
        if header is None or [h.strip() for h in header[:3]] != list(AZURE_COLUMNS):
            raise KvsimInputError(f"expected header {','.join(AZURE_COLUMNS)}, got "
                                  f"{','.join(header or [])!r}", path, "line 1")
        lim = get_limits()
        for lineno, row in enumerate(rows, start=2):
            if not row or not "".join(row).strip():
                continue
            loc = f"line {lineno}"
            try:
                if len(row) < 3:
                    raise KvsimInputError(f"expected 3 fields, got {len(row)}", path, loc)
                t = _parse_time_us(row[0], path, loc)
                n_in = as_int(row[1], path, loc, "ContextTokens", 1, lim.max_prompt_tokens)
                n_out = as_int(row[2], path, loc, "GeneratedTokens", 1,
                               lim.max_output_tokens)
            except KvsimInputError as exc:
                bad.handle(exc)
                continue
            times.append(t)
            prompt.append(n_in)
            output.append(n_out)
    t0 = min(times) if times else 0
    return build_request_table(
        {"arrival_us": [t - t0 for t in times], "prompt_tokens": prompt,
         "output_tokens": output},
        block_size_tokens=16, path=str(path), skipped=bad.count,
        source={"format": "azure", "file": Path(path).name})
