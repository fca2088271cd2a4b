"""Format detection: which reader a trace file or directory needs.

Rules, first match wins (``--format`` skips them):

1. a directory -> ``agentic`` (a folder of conversation JSON files);
2. ``*.json`` -> ``agentic`` (one conversation object with ``requests``);
3. ``*.csv`` whose header is ``TIMESTAMP,ContextTokens,GeneratedTokens`` -> ``azure``;
   other CSV / TSV and ``*.parquet`` -> ``generic`` (needs ``--map`` unless the columns
   carry canonical names);
4. JSONL (any other name): the first non-blank line decides: ``hash_ids`` +
   ``input_length`` -> ``mooncake``; ``event_type`` + ``intent`` -> ``kvmi``; ``usage`` (top
   level or under ``response``) -> ``openai``; otherwise ``generic``.

``.gz`` / ``.zst`` suffixes are looked through.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.errors import KvsimInputError
from kvsim.fsutil import open_text, strip_compression_suffix

FORMATS = ("mooncake", "azure", "openai", "agentic", "kvmi", "generic")


def detect_format(path: str | Path) -> str:
    """The reader name for ``path`` (one of :data:`FORMATS`)."""
    path = Path(path)
    if path.is_dir():
        return "agentic"
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    name = strip_compression_suffix(path).lower()
    if name.endswith(".json"):
        return "agentic"
    if name.endswith(".parquet"):
        return "generic"
    if name.endswith(".csv") or name.endswith(".tsv"):
        with open_text(path) as fh:
            header = fh.readline().strip().split(",")
        return "azure" if [h.strip() for h in header[:3]] == [
            "TIMESTAMP", "ContextTokens", "GeneratedTokens"] else "generic"
    with open_text(path) as fh:
        first = ""
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                first = line.strip()
                break
    if not first:
        raise KvsimInputError("empty file: cannot detect its format (give --format)", path)
    try:
        rec = json.loads(first)
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise KvsimInputError("not JSONL, CSV, Parquet or JSON: cannot detect the format "
                              "(give --format)", path, f"line {lineno}") from None
    if isinstance(rec, dict):
        if "hash_ids" in rec and "input_length" in rec:
            return "mooncake"
        if "event_type" in rec and "intent" in rec:
            return "kvmi"
        if "usage" in rec or isinstance(rec.get("response"), dict) and "usage" in rec["response"]:
            return "openai"
    return "generic"
