"""The real public traces in ../shared/traces (skipped when absent), sampled to stay fast.

The full-trace figures (12,031 Mooncake requests, reuse 0.366 / 0.640, time and memory)
are measured with the commands in docs/importers.md, not in the test suite.
"""

from __future__ import annotations

import json

import pytest

from kvsim.engine.lowering import import_request_trace
from kvsim.ingest import read_requests


def _head(src, dst, n):
    with open(src) as fin, open(dst, "w") as fout:
        for _, line in zip(range(n), fin):
            fout.write(line)


@pytest.mark.traces
@pytest.mark.parametrize("name", ["conversation_trace.jsonl", "synthetic_trace.jsonl"])
def test_mooncake_reuse_matches_raw_hash_ids(shared_traces, tmp_path, name):
    part = tmp_path / name
    _head(shared_traces / "mooncake" / name, part, 400)
    seen, reused, total = set(), 0, 0
    for line in part.read_text().splitlines():
        for h in json.loads(line)["hash_ids"]:
            total += 1
            reused += h in seen
            seen.add(h)
    s = import_request_trace(part, tmp_path / "ev.parquet", block_size_tokens=512)
    assert s.num_requests == 400
    assert s.prompt_blocks == total  # one ALLOCATE row per hash id at block size 512
    assert s.prefix_reuse_fraction == pytest.approx(reused / total, abs=1e-6)


@pytest.mark.traces
def test_azure_sample(shared_traces, tmp_path):
    part = tmp_path / "azure.csv"
    _head(shared_traces / "azure" / "AzureLLMInferenceTrace_code.csv", part, 301)
    s = import_request_trace(part, tmp_path / "ev.parquet")
    assert s.num_requests == 300 and s.prefix_reuse_fraction == 0.0


@pytest.mark.traces
def test_agentic_conversation(shared_traces, tmp_path):
    src = shared_traces / "claude-code-agentic" / "trace_0021.json"
    t = read_requests(src)
    assert len(t) == 14 and t.df["session_continues"].sum() == 12  # 12 tool_use stops
    s = import_request_trace(src, tmp_path / "ev.parquet", block_size_tokens=64)
    assert s.num_requests == 14 and s.prefix_reuse_fraction > 0.9


@pytest.mark.traces
def test_kvmi_sample(shared_formats, tmp_path):
    s = import_request_trace(shared_formats / "kvmi_events_sample.jsonl", tmp_path / "k.parquet")
    assert s.num_requests == 3 and s.prompt_blocks == 120 and s.num_steps == 120
    assert s.dropped_events == 0  # the sample holds only ALLOCATED events
