"""Readers for the Azure LLM inference traces (Azure/AzurePublicDataset).

* ``azure``: the 2023 / 2024 LLM traces (Splitwise ISCA'24, DynamoLLM), CSV with header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``.
* ``azure-mm``: the 2025 multimodal (LMM) trace (ModServe, SoCC'25;
  ``AzureLMMInferenceTrace_multimodal.csv.gz``), header
  ``TIMESTAMP,NumImages,ContextTokens,GeneratedTokens`` (AzureLMMInferenceDataset2025.md,
  "Schema").  ``ContextTokens`` is read as the whole prompt (the dataset's description
  sends "the input prompt with the required number of tokens and images"; whether image
  tokens are inside ``ContextTokens`` is not stated); ``NumImages`` (an integer >= 0) is
  checked and totalled in the summary source, not modelled.

TIMESTAMP is a wall-clock datetime, ``YYYY-MM-DD HH:MM:SS`` (or ``T`` between date and
time) with up to 7 sub-second digits (``2023-11-16 18:17:03.9799600``) and an optional
UTC offset (``Z``, ``+00:00``); without one UTC is assumed.  Arrivals are made relative to
the earliest row.  Columns are found by name in the header.  The traces carry no content,
so every prompt is unique (``block_ids`` empty, no prefix sharing).
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
#: Header of the 2025 multimodal trace (AzureLMMInferenceDataset2025.md, "Schema").
AZURE_MM_COLUMNS = ("TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens")


def azure_layout(header: list[str]) -> str | None:
    """``azure`` / ``azure-mm`` for a CSV header naming these columns, else None."""
    names = {h.strip() for h in header}
    if set(AZURE_MM_COLUMNS) <= names:
        return "azure-mm"
    if set(AZURE_COLUMNS) <= names:
        return "azure"
    return None


def _parse_time_us(text: str, path, loc: str) -> int:
    """Microseconds since the epoch of ``YYYY-MM-DD HH:MM:SS[.fffffff][Z|+HH:MM]`` (UTC
    when no offset is given)."""
    text = text.strip()
    body, offset_s = text, 0
    try:
        if not text.isascii():
            raise ValueError
        if body.endswith("Z"):
            body = body[:-1]
        elif len(body) > 19 and body[-6] in "+-" and body[-3] == ":":
            hh, mm = int(body[-5:-3]), int(body[-2:])
            offset_s = (1 if body[-6] == "+" else -1) * (hh * 3600 + mm * 60)
            body = body[:-6]
        base, _, frac = body.replace("T", " ", 1).partition(".")
        dt = datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
        if frac and not frac.isdigit():
            raise ValueError
    except ValueError:
        raise bad_value(path, loc, "TIMESTAMP", "a datetime like 2023-11-16 18:17:03.97996",
                        text) from None
    seconds = int((dt - datetime(1970, 1, 1)).total_seconds()) - offset_s
    frac_us = int((frac + "000000")[:6]) if frac else 0
    return seconds * 1_000_000 + frac_us


def read_azure(path: str | Path, *, skip_bad_rows: bool = False,
               layout: str | None = None) -> RequestTable:
    """Read an Azure LLM (``azure``) or multimodal (``azure-mm``) inference CSV trace into
    the canonical Request table; ``layout`` None = from the header."""
    bad = BadRows(skip_bad_rows)
    times, prompt, output = [], [], []
    images = 0
    with open_text(path) as fh:
        reader = csv.reader(fh)
        rows = csv_rows(reader, path)
        header = [h.strip() for h in (next(rows, None) or [])]
        found = azure_layout(header)
        want = layout or found or "azure"
        cols = AZURE_MM_COLUMNS if want == "azure-mm" else AZURE_COLUMNS
        if not set(cols) <= set(header):
            raise KvsimInputError(f"expected header {','.join(cols)}, got "
                                  f"{','.join(header)!r}", path, "line 1")
        at = {name: header.index(name) for name in cols}
        width = max(at.values()) + 1
        lim = get_limits()
        for lineno, row in enumerate(rows, start=2):
            if not row or not "".join(row).strip():
                continue
            loc = f"line {lineno}"
            try:
                if len(row) < width:
                    raise KvsimInputError(f"expected {len(header)} fields, got {len(row)}",
                                          path, loc)
                t = _parse_time_us(row[at["TIMESTAMP"]], path, loc)
                n_in = as_int(row[at["ContextTokens"]], path, loc, "ContextTokens", 1,
                              lim.max_prompt_tokens)
                n_out = as_int(row[at["GeneratedTokens"]], path, loc, "GeneratedTokens", 1,
                               lim.max_output_tokens)
                if want == "azure-mm":
                    images += as_int(row[at["NumImages"]], path, loc, "NumImages", 0,
                                     lim.max_prompt_tokens)
            except KvsimInputError as exc:
                bad.handle(exc)
                continue
            times.append(t)
            prompt.append(n_in)
            output.append(n_out)
    t0 = min(times) if times else 0
    source = {"format": want, "file": Path(path).name}
    if want == "azure-mm":
        source["images"] = images
    return build_request_table(
        {"arrival_us": [t - t0 for t in times], "prompt_tokens": prompt,
         "output_tokens": output},
        block_size_tokens=16, path=str(path), skipped=bad.count, source=source)
