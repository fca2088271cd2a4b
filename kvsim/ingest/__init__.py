"""Ingest: trace readers -> canonical Request table -> MemoryIntent events (lowering).

Public API (the CLI ``kvsim import-request-trace`` is a thin shell over it):

* :func:`read_requests` - any supported trace -> :class:`RequestTable`
  (``kvsim.ingest.requests`` documents the table);
* :func:`lower_requests` - a Request table -> event file through the engine model
  (``kvsim.engine.engine_model``, ``kvsim.engine.scheduler``), returns :class:`ImportSummary`;
* :func:`import_request_trace` - both in one call (kvmi files are translated directly).

Readers: ``mooncake``, ``azure``, ``openai``, ``agentic``, ``kvmi`` (events), ``generic``
(column mapping), ``ragpulse``, ``bailian``, ``burstgpt``, ``vllm-kv-events`` (requests
reconstructed from a vLLM KV-event recording).  docs/importers.md describes every format and rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.ingest.detect import FORMATS, detect_format
from kvsim.engine.lowering import ImportSummary, lower_requests
from kvsim.ingest.requests import REQUEST_COLUMNS, RequestTable, build_request_table

__all__ = ["FORMATS", "ImportSummary", "REQUEST_COLUMNS", "RequestTable", "build_request_table",
           "detect_format", "import_request_trace", "lower_requests", "read_requests"]


def read_requests(path: str | Path, format: str | None = None,
                  mapping: str | dict[str, str] | None = None, skip_bad_rows: bool = False, *,
                  arrival_rate: float | None = None, concurrency: int | None = None,
                  seed: int = 0, trace_block_tokens: int = 16,
                  strict: bool = False) -> RequestTable:
    """Read a request trace into the canonical :class:`RequestTable`.

    ``format`` None = auto-detect (:func:`detect_format`; a ``mapping`` implies
    ``generic``).  ``arrival_rate`` / ``concurrency`` / ``seed`` lay out agentic
    conversations; ``trace_block_tokens`` is the block size of ``generic`` block ids.
    ``kvmi`` files are events, not requests: use :func:`import_request_trace`.
    ``strict``: refuse what is otherwise read with a warning (Mooncake ids that do not
    form a prefix tree).  Sizes are bounded by :func:`kvsim.core.limits.get_limits`.
    """
    fmt = format or ("generic" if mapping else detect_format(path))
    if fmt not in FORMATS:
        raise bad_value(None, None, "--format", "one of " + ", ".join(FORMATS), fmt)
    if fmt == "mooncake":
        from kvsim.ingest.mooncake import read_mooncake
        return read_mooncake(path, skip_bad_rows=skip_bad_rows, strict=strict)
    if fmt == "azure":
        from kvsim.ingest.azure import read_azure
        return read_azure(path, skip_bad_rows=skip_bad_rows)
    if fmt == "openai":
        from kvsim.ingest.openai import read_openai
        return read_openai(path, skip_bad_rows=skip_bad_rows)
    if fmt == "agentic":
        from kvsim.ingest.agentic import read_agentic
        return read_agentic(path, skip_bad_rows=skip_bad_rows, arrival_rate=arrival_rate,
                            concurrency=concurrency, seed=seed)
    if fmt == "ragpulse":
        from kvsim.ingest.ragpulse import read_ragpulse
        return read_ragpulse(path, skip_bad_rows=skip_bad_rows)
    if fmt == "bailian":
        from kvsim.ingest.bailian import read_bailian
        return read_bailian(path, skip_bad_rows=skip_bad_rows)
    if fmt == "burstgpt":
        from kvsim.ingest.burstgpt import read_burstgpt
        return read_burstgpt(path, skip_bad_rows=skip_bad_rows)
    if fmt == "vllm-kv-events":
        from kvsim.ingest.vllm_events import read_vllm_events_requests
        return read_vllm_events_requests(path)
    if fmt == "generic":
        from kvsim.ingest.generic import read_generic
        return read_generic(path, mapping, skip_bad_rows=skip_bad_rows,
                            trace_block_tokens=trace_block_tokens)
    raise KvsimInputError("kvmi files hold events, not requests: import them with "
                          "import_request_trace / kvsim import-request-trace", path, None,
                          "--format")


def import_request_trace(path: str | Path, out_path: str | Path, *, format: str | None = None,
                         mapping: str | dict[str, str] | None = None,
                         skip_bad_rows: bool = False, model: str = "llama-3-8b",
                         hardware: str = "h100-sxm", block_size_tokens: int = 16,
                         max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                         arrival_rate: float | None = None, concurrency: int | None = None,
                         seed: int = 0, trace_block_tokens: int = 16,
                         kvmi_step_us: int | None = None,
                         num_gpu_blocks: int | None = None,
                         gpu_memory_utilization: float | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         strict: bool = False, timing: str | None = "auto") -> ImportSummary:
    """Read ``path`` and write its MemoryIntent events to ``out_path`` (Parquet, or JSONL
    when the name ends in .jsonl).  Same inputs and arguments -> byte-identical output.
    ``num_gpu_blocks`` / ``gpu_memory_utilization``: the scheduler's KV block budget
    (:func:`lower_requests`); kvmi files are translated, not scheduled, and ignore them.
    ``timing``: the step-time model (``auto``, ``roofline``, ``measured`` or a timing
    profile path; :mod:`kvsim.engine.timing.select`)."""
    from kvsim.core.fsutil import check_output_path, check_output_suffix

    check_output_suffix(check_output_path(out_path, "--out"), "events", "--out")
    fmt = format or ("generic" if mapping else detect_format(path))
    if fmt == "kvmi":
        from kvsim.ingest.kvmi import KVMI_STEP_US, convert_kvmi
        return convert_kvmi(path, out_path, block_size_tokens=block_size_tokens,
                            step_us=kvmi_step_us or KVMI_STEP_US, skip_bad_rows=skip_bad_rows)
    table = read_requests(path, fmt, mapping, skip_bad_rows, arrival_rate=arrival_rate,
                          concurrency=concurrency, seed=seed,
                          trace_block_tokens=trace_block_tokens, strict=strict)
    return lower_requests(table, out_path, model=model, hardware=hardware,
                          block_size_tokens=block_size_tokens, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, seed=seed,
                          num_gpu_blocks=num_gpu_blocks,
                          gpu_memory_utilization=gpu_memory_utilization, progress=progress,
                          timing=timing)
