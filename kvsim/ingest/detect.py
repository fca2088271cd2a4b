"""Format detection: which reader a trace file or directory needs.

Rules, first match wins (``--format`` skips them):

1. a directory -> ``ragpulse`` when it holds ``0_trace.jsonl``, else ``agentic`` (a folder
   of conversation JSON files); ``*.msgpack`` / ``*.mpk`` -> ``vllm-kv-events``;
2. ``*.json`` -> ``agentic`` (one conversation object with ``requests``);
3. ``*.csv`` whose header names ``Timestamp``, ``Request tokens`` and ``Response tokens`` ->
   ``burstgpt``; whose header names ``TIMESTAMP``, ``NumImages``, ``ContextTokens`` and
   ``GeneratedTokens`` -> ``azure-mm``; ``TIMESTAMP``, ``ContextTokens`` and
   ``GeneratedTokens`` -> ``azure``;
   other CSV / TSV and ``*.parquet`` -> ``generic`` (needs ``--map`` unless the columns
   carry canonical names);
4. JSONL (any other name): the first non-blank line decides: ``"schema":
   "dynamo.request.trace.v1"`` -> ``dynamo``; a ``resourceSpans`` list (OTLP/JSON) ->
   ``otel``; a trace object with ``block_size``, ``hash_id_scope`` and a ``requests`` list
   -> ``weka``; ``request_id`` + ``input_length`` without ``timestamp``, with ``hash_ids``
   or ``duration`` -> ``servegen``; ``hash_ids`` as an object +
   ``input_length`` -> ``ragpulse``; ``chat_id`` + ``parent_chat_id`` + ``hash_ids`` ->
   ``bailian``; ``ts`` + ``events`` (or a ``[ts, [events...]]`` array) ->
   ``vllm-kv-events``; ``hash_ids`` + ``input_length`` -> ``mooncake``; ``event_type`` +
   ``intent`` -> ``kvmi``; ``usage`` (top
   level or under ``response``) -> ``openai``; otherwise ``generic``.

``.gz`` / ``.zst`` suffixes are looked through.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import open_text, strip_compression_suffix

FORMATS = ("mooncake", "azure", "openai", "agentic", "kvmi", "generic", "ragpulse", "bailian",
           "burstgpt", "vllm-kv-events", "weka", "servegen", "dynamo", "azure-mm", "otel")
#: File names (compression suffix stripped) of msgpack KV-event recordings.
MSGPACK_SUFFIXES = (".msgpack", ".mpk", ".msgpack.bin")


def detect_format(path: str | Path) -> str:
    """The reader name for ``path`` (one of :data:`FORMATS`)."""
    path = Path(path)
    if path.is_dir():
        from kvsim.ingest.ragpulse import is_ragpulse_folder
        return "ragpulse" if is_ragpulse_folder(path) else "agentic"
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    name = strip_compression_suffix(path).lower()
    if name.endswith(MSGPACK_SUFFIXES):
        return "vllm-kv-events"
    if name.endswith(".json"):
        return "agentic"
    if name.endswith(".parquet"):
        return "generic"
    if name.endswith(".csv") or name.endswith(".tsv"):
        with open_text(path) as fh:
            header = fh.readline().strip().split(",")
        from kvsim.ingest.burstgpt import is_burstgpt_header
        if is_burstgpt_header(header):
            return "burstgpt"
        from kvsim.ingest.azure import azure_layout
        return azure_layout(header) or "generic"
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
    from kvsim.ingest.agent_traces import is_dynamo_record, is_otel_record
    from kvsim.ingest.servegen import is_servegen_record
    from kvsim.ingest.weka import is_weka_record

    if is_dynamo_record(rec):
        return "dynamo"
    if is_otel_record(rec):
        return "otel"
    if is_weka_record(rec):
        return "weka"
    if is_servegen_record(rec) and not isinstance(rec.get("hash_ids"), dict):
        return "servegen"
    if isinstance(rec, dict):
        if isinstance(rec.get("hash_ids"), dict) and "input_length" in rec:
            return "ragpulse"
        if "chat_id" in rec and "parent_chat_id" in rec and "hash_ids" in rec:
            return "bailian"
        if "events" in rec and "ts" in rec:
            return "vllm-kv-events"
        if "hash_ids" in rec and "input_length" in rec:
            return "mooncake"
        if "event_type" in rec and "intent" in rec:
            return "kvmi"
        if "usage" in rec or isinstance(rec.get("response"), dict) and "usage" in rec["response"]:
            return "openai"
    if isinstance(rec, list) and len(rec) >= 2 and isinstance(rec[1], list) and isinstance(
            rec[0], (int, float)):
        return "vllm-kv-events"  # a KVEventBatch in msgspec's array_like form: [ts, events]
    return "generic"
