"""kvsim's measured step clock against step times measured on a real H200 with PyTorch
(bench/gpu/torch_step_time.py, committed in bench/results/gpu/; docs/benchmarks.md "On a
real GPU").  PyTorch is not vLLM (no fused QKV/rotary, FlashAttention-2 rather than vLLM's
kernels), so kvsim's clock, built from kernels measured under vLLM, must be at most as slow
as the PyTorch model and not much faster: decode steps within 10 %; prefill chunks (without
cached context, or with it on FlashAttention's mask-free path) and mixed steps (a chunk beside
a decode batch) at most 2 % slower and at most 20 % faster.  A change of the bundled H200
profile that breaks this fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.engine.timing.measured import MeasuredStepTime

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "gpu" / "h200_torch_step_times.json"
#: ``torch_step_time.py --shapes long`` (2026-11-30): decode over 16k-32k cached tokens, a
#: 512-sequence decode batch, a 16k-token chunk, a 4k chunk after 28k cached tokens
RESULT_LONG = ROOT / "bench" / "results" / "gpu" / "h200_torch_step_times_long.json"


def _rows(path=RESULT):
    doc = json.loads(path.read_text())
    assert doc["device"] == "NVIDIA H200"
    return [r for r in doc["rows"] if "ms" in r]


def _all_rows():
    return _rows() + _rows(RESULT_LONG)


@pytest.fixture(scope="module")
def clock():
    return MeasuredStepTime.bundled("h200", "llama-3.1-8b", 1)


def test_the_recording_covers_prefill_and_decode():
    rows = _rows()
    assert {r["kind"] for r in rows} == {"prefill", "prefill_nomask", "decode", "mixed"}
    assert len(rows) == 30
    long = _rows(RESULT_LONG)
    assert len(long) == 10 and max(r["decode_context"] for r in long) == 32768


def _kvsim_ms(clock, row) -> float:
    chunks = [(row["chunk"], row["context"])] if row["chunk"] else []
    return clock.step_ms(prefill_chunks=chunks, decode_contexts=[row["decode_context"]] * row["batch"])


def _name(r) -> str:
    return f"{r['kind']}-c{r['chunk']}-ctx{r['context']}-b{r['batch']}-d{r['decode_context']}"


@pytest.mark.parametrize("row", [r for r in _all_rows() if r["kind"] == "decode"], ids=_name)
def test_decode_steps_within_10_percent_of_the_gpu(clock, row):
    assert abs(_kvsim_ms(clock, row) / row["ms"] - 1.0) <= 0.10, row


COMPUTE_BOUND = [r for r in _all_rows() if r["kind"] in ("prefill_nomask", "mixed")
                 or (r["kind"] == "prefill" and r["context"] == 0)]


@pytest.mark.parametrize("row", COMPUTE_BOUND, ids=_name)
def test_prefill_and_mixed_steps_at_most_20_percent_faster_never_slower(clock, row):
    assert -0.20 <= _kvsim_ms(clock, row) / row["ms"] - 1.0 <= 0.02, row
