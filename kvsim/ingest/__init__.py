"""Ingest: trace readers -> the canonical Request table.

* :func:`read_requests` - any supported trace -> :class:`RequestTable`
  (``kvsim.ingest.requests`` documents the table).

The lowering of a Request table to MemoryIntent events is the engine's
(:func:`kvsim.engine.lowering.lower_requests`); reading and lowering in one call, the API of
``kvsim import-request-trace``, is :func:`kvsim.engine.lowering.import_request_trace`.

Readers: ``mooncake``, ``azure``, ``openai``, ``agentic``, ``kvmi`` (events), ``generic``
(column mapping), ``ragpulse``, ``bailian``, ``burstgpt``, ``vllm-kv-events`` (requests
reconstructed from a vLLM KV-event recording), ``weka`` (SemiAnalysis's Claude-Code traces),
``servegen`` (Alibaba ServeGen offline batch jobs), ``dynamo`` (Dynamo request traces),
``azure-mm`` (Azure's 2025 multimodal trace), ``otel`` (OpenTelemetry GenAI spans).
docs/importers.md describes every format and rule.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.heap import trim_heap
from kvsim.ingest.detect import FORMATS, detect_format
from kvsim.ingest.requests import REQUEST_COLUMNS, RequestTable, build_request_table

__all__ = ["FORMATS", "REQUEST_COLUMNS", "RequestTable", "build_request_table",
           "detect_format", "read_requests"]


def read_requests(path: str | Path, format: str | None = None,
                  mapping: str | dict[str, str] | None = None, skip_bad_rows: bool = False, *,
                  arrival_rate: float | None = None, concurrency: int | None = None,
                  seed: int = 0, trace_block_tokens: int = 16,
                  strict: bool = False, output_tokens: int | None = None,
                  submission_rate: float | None = None,
                  salt_by_tenant: bool = False) -> RequestTable:
    """Read a request trace into the canonical :class:`RequestTable`.

    ``format`` None = auto-detect (:func:`detect_format`; a ``mapping`` implies
    ``generic``).  ``arrival_rate`` / ``concurrency`` / ``seed`` lay out agentic
    conversations; ``trace_block_tokens`` is the block size of ``generic`` block ids.
    ``kvmi`` files are events, not requests: use :func:`import_request_trace`.
    ``strict``: refuse what is otherwise read with a warning (Mooncake ids that do not
    form a prefix tree).  Sizes are bounded by :func:`kvsim.core.limits.get_limits`.
    ``output_tokens`` / ``submission_rate``: a ServeGen batch job's assumed output length and
    submission rate (:mod:`kvsim.ingest.servegen`).  ``salt_by_tenant``: salt each request's
    prompt hashes with its tenant (:func:`kvsim.ingest.requests.salt_by_tenant`: tenants
    never share a block, as vLLM's ``cache_salt``).
    """
    table = _read(path, format, mapping, skip_bad_rows, arrival_rate=arrival_rate,
                  concurrency=concurrency, seed=seed, trace_block_tokens=trace_block_tokens,
                  strict=strict, output_tokens=output_tokens, submission_rate=submission_rate)
    if salt_by_tenant:
        from kvsim.ingest.requests import salt_by_tenant as _salt

        table = _salt(table)
    trim_heap()  # the parsed batches' freed heap, which nothing after the read reuses
    return table


def _read(path, format, mapping, skip_bad_rows, *, arrival_rate, concurrency, seed,
          trace_block_tokens, strict, output_tokens, submission_rate) -> RequestTable:
    fmt = format or ("generic" if mapping else detect_format(path))
    for option, value in (("--output-tokens", output_tokens),
                          ("--submission-rate", submission_rate)):
        if value is not None and fmt != "servegen":
            raise KvsimInputError(f"expected {option} only with a ServeGen batch job "
                                  f"(--format servegen), got a {fmt} trace", path, None, option)
    if fmt not in FORMATS:
        raise bad_value(None, None, "--format", "one of " + ", ".join(FORMATS), fmt)
    if fmt == "mooncake":
        from kvsim.ingest.mooncake import read_mooncake
        return read_mooncake(path, skip_bad_rows=skip_bad_rows, strict=strict)
    if fmt in ("azure", "azure-mm"):
        from kvsim.ingest.azure import read_azure
        return read_azure(path, skip_bad_rows=skip_bad_rows, layout=fmt)
    if fmt == "weka":
        from kvsim.ingest.weka import read_weka
        return read_weka(path, skip_bad_rows=skip_bad_rows, arrival_rate=arrival_rate,
                         concurrency=concurrency, seed=seed)
    if fmt == "servegen":
        from kvsim.ingest.servegen import read_servegen
        return read_servegen(path, skip_bad_rows=skip_bad_rows, output_tokens=output_tokens,
                             submission_rate=submission_rate)
    if fmt == "dynamo":
        from kvsim.ingest.agent_traces import read_dynamo
        return read_dynamo(path, skip_bad_rows=skip_bad_rows)
    if fmt == "otel":
        from kvsim.ingest.agent_traces import read_otel
        return read_otel(path, skip_bad_rows=skip_bad_rows)
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
