"""Cache mode's ``vllm`` variant against vLLM's own KVCacheManager (vLLM 0.33.0, run by
bench/vllm/cache_hits.py in its own environment; figures in
tests/fixtures/vllm_cache_hits.json): the Mooncake conversation trace, one request at a
time, LRU over 1,000 and 5,000 blocks of 16 and 512 tokens.  kvsim's hit tokens must equal
vLLM's to the token (docs/simulate.md, "Fidelity to vLLM")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_cache_hits.json"
CASES = json.loads(FIXTURE.read_text())["runs"]


@pytest.fixture(scope="module")
def mooncake_table(shared_traces):
    from kvsim.ingest import read_requests

    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return read_requests(path)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['block_size']}tok-{c['blocks']}blocks")
def test_cache_variant_vllm_hits_equal_vllm(mooncake_table, case):
    from kvsim.engine.serial_lowering import stream_from_requests
    from kvsim.modes.cache import simulate_cache
    from kvsim.spec.sim_config import SimConfig

    stream = stream_from_requests(mooncake_table, block_size_tokens=case["block_size"])
    assert stream.num_requests == case["requests"]
    res = simulate_cache(stream, "lru", SimConfig(mode="cache", cache_variant="vllm",
                                                  hbm_blocks=case["blocks"], dram_gb=0,
                                                  cxl_gb=0, nvme_gb=0))
    assert res.summary["hit_tokens"] == case["hit_tokens"]


def test_the_fixture_covers_the_issue_grid():
    assert sorted((c["block_size"], c["blocks"]) for c in CASES) == [
        (16, 1000), (16, 5000), (512, 1000), (512, 5000)]
    assert {c["vllm"] for c in CASES} == {"0.33.0"}
