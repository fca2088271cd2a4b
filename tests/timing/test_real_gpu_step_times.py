"""kvsim's measured step clock against step times measured on a real H200 with PyTorch
(bench/gpu/torch_step_time.py, committed in bench/results/gpu/; docs/benchmarks.md "On a
real GPU").  PyTorch is not vLLM (no fused QKV/rotary, FlashAttention-2 rather than vLLM's
kernels), so kvsim's clock, built from kernels measured under vLLM, must be at most as slow
as the PyTorch model and not much faster: decode steps within 10 %, prefill chunks without
cached context within 20 %.  A change of the bundled H200 profile that breaks this fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.engine.timing.measured import MeasuredStepTime

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "gpu" / "h200_torch_step_times.json"


def _rows():
    doc = json.loads(RESULT.read_text())
    assert doc["device"] == "NVIDIA H200"
    return [r for r in doc["rows"] if "ms" in r]


@pytest.fixture(scope="module")
def clock():
    return MeasuredStepTime.bundled("h200", "llama-3.1-8b", 1)


def test_the_recording_covers_prefill_and_decode():
    rows = _rows()
    assert {r["kind"] for r in rows} == {"prefill", "decode"}
    assert len(rows) == 21


@pytest.mark.parametrize("row", [r for r in _rows() if r["kind"] == "decode"],
                         ids=lambda r: f"decode-b{r['batch']}-ctx{r['context']}")
def test_decode_steps_within_10_percent_of_the_gpu(clock, row):
    kvsim_ms = clock.decode_ms(row["batch"], row["context"])
    assert abs(kvsim_ms / row["ms"] - 1.0) <= 0.10, (kvsim_ms, row)


@pytest.mark.parametrize("row", [r for r in _rows() if r["kind"] == "prefill" and r["context"] == 0],
                         ids=lambda r: f"prefill-{r['chunk']}")
def test_prefill_without_context_within_20_percent_and_not_slower(clock, row):
    kvsim_ms = clock.step_ms(prefill_chunks=[(row["chunk"], 0)])
    assert -0.20 <= kvsim_ms / row["ms"] - 1.0 <= 0.02, (kvsim_ms, row)
