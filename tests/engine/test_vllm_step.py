"""The compiled vLLM step function (kvsim.engine.vllm_step, through
kvsim.engine.vllm_compiled) against its witness, the plain-Python port
(kvsim.engine.vllm_scheduler): identical StepResults, every step, on every recording of
vLLM's scheduler and on random small workloads (preemption, priority, chunked prefill,
the long-prefill threshold, watermark, reserve-full-ISL, salts, resets, caching off,
speculative drafts with and without lookahead slots)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as stg

from kvsim.analysis.sched_validate import build_requests
from kvsim.engine.vllm_compiled import CompiledVllmScheduler
from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest, VllmScheduler
from kvsim.ingest.vllm_sched import load_sched_recording

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_sched"
NAMES = ["agentic_0505", "overload", "chunked_prefill", "priority", "salted_tenants", "reset",
         "multiturn_output_reuse", "preempt_heavy", "overload_noreserve", "overload_watermark",
         "mooncake200", "spec_decode"]


def _twins(cfg: EngineConfig, make_requests, pool: str = "fast"):
    py = VllmScheduler(cfg, pool=pool, max_seqs=64)
    reqs_py = make_requests()
    comp = CompiledVllmScheduler(cfg, make_requests())
    return py, reqs_py, comp


def _drive(py, reqs, comp, arrivals: dict[int, list[int]], resets: dict[int, list[bool]],
           max_steps: int) -> int:
    """Both schedulers, same arrivals and resets per step; every StepResult equal."""
    k = 0
    last = max([*arrivals, *resets, -1])
    while k < max_steps and (k <= last or py.has_requests()):
        for i in arrivals.get(k, []):
            py.add_request(reqs[i])
            comp.add_request(i)
        for running in resets.get(k, []):
            assert py.reset_prefix_cache(running) == comp.reset_prefix_cache(running)
        a, b = py.step(), comp.step()
        assert a == b, f"step {k}"
        assert py.has_requests() == comp.has_requests()
        assert py.num_free_blocks() == comp.num_free_blocks()
        k += 1
    return k


@pytest.mark.parametrize("name", NAMES)
def test_compiled_equals_python_on_recordings(name):
    rec = load_sched_recording(FIXTURES / f"{name}.jsonl.gz")
    if name == "mooncake200":  # the Python step function takes ~15 s over all 8,326
        rec.steps = rec.steps[:2500]
    cfg = EngineConfig.from_recording(rec.engine)
    py, reqs, comp = _twins(cfg, lambda: build_requests(rec))
    py.pool  # noqa: B018 - built
    arrivals = {k: list(s.get("arrived", [])) for k, s in enumerate(rec.steps)}
    resets: dict[int, list[bool]] = {}
    before = {}
    for a in rec.header.get("actions") or []:
        if "at_step" in a:
            resets.setdefault(int(a["at_step"]), []).append(bool(a.get("reset_running_requests")))
        elif "before_arrival_of" in a:
            before[int(a["before_arrival_of"])] = bool(a.get("reset_running_requests"))
    for k, ids in arrivals.items():  # a reset before an arrival: the same step, first
        for i in ids:
            if i in before:
                resets.setdefault(k, []).insert(0, before.pop(i))
    steps = _drive(py, reqs, comp, arrivals, resets, len(rec.steps))
    assert steps == len(rec.steps)


@stg.composite
def _workload(draw):
    bs = draw(stg.sampled_from([2, 4]))
    cfg = EngineConfig(
        block_size=bs, num_gpu_blocks=draw(stg.integers(6, 30)),
        max_num_seqs=draw(stg.integers(1, 4)),
        max_num_batched_tokens=draw(stg.integers(4, 24)),
        enable_chunked_prefill=draw(stg.booleans()),
        long_prefill_token_threshold=draw(stg.sampled_from([0, 0, 3, 6])),
        policy=draw(stg.sampled_from(["fcfs", "priority"])),
        enable_prefix_caching=draw(stg.booleans() | stg.just(True)),
        scheduler_reserve_full_isl=draw(stg.booleans()),
        watermark=draw(stg.sampled_from([0.0, 0.0, 0.1])),
        max_model_len=draw(stg.sampled_from([1 << 30, 20])),
        num_speculative_tokens=draw(stg.sampled_from([0, 0, 1, 3])),
        spec_acceptance_rate=draw(stg.sampled_from([0.0, 0.5, 1.0])),
        spec_lookahead=draw(stg.booleans()), spec_seed=draw(stg.integers(0, 3)))
    n = draw(stg.integers(1, 7))
    reqs = []
    for i in range(n):
        plen = draw(stg.integers(1, 18))
        olen = draw(stg.integers(1, 6))
        toks = draw(stg.lists(stg.integers(0, 2), min_size=plen + olen, max_size=plen + olen))
        reqs.append(dict(idx=i, request_id=f"r{draw(stg.integers(0, 3))}-{i}",
                         all_tokens=toks, prompt_len=plen, output_len=olen,
                         priority=draw(stg.integers(0, 2)),
                         arrival_time=float(draw(stg.integers(0, 3))),
                         cache_salt=draw(stg.sampled_from([None, None, "a", "b"]))))
    arrivals: dict[int, list[int]] = {}
    for i in range(n):
        arrivals.setdefault(draw(stg.integers(0, 12)), []).append(i)
    resets: dict[int, list[bool]] = {}
    for _ in range(draw(stg.integers(0, 2))):
        resets.setdefault(draw(stg.integers(0, 30)), []).append(draw(stg.booleans()))
    return cfg, reqs, arrivals, resets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workload())
def test_compiled_equals_python_on_random_workloads(w):
    cfg, reqs, arrivals, resets = w
    py, rs, comp = _twins(cfg, lambda: [SimRequest(**r) for r in reqs], pool="reference")
    _drive(py, rs, comp, arrivals, resets, 200)
    assert comp.num_preemptions() == sum(r.num_preemptions for r in rs)
