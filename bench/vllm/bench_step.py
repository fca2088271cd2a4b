"""Steps per second of kvsim's vLLM step function over a scheduler recording: the
plain-Python port (kvsim.engine.vllm_scheduler) and the compiled one (kvsim.engine.vllm_step),
each driven by the recording's arrivals; only the step calls are timed (a warm-up run
compiles first).  docs/benchmarks.md, "vLLM's scheduler, compiled".

    python bench/vllm/bench_step.py [tests/fixtures/vllm_sched/mooncake200.jsonl.gz]
"""

from __future__ import annotations

import sys
import time

from kvsim.analysis.sched_validate import build_requests
from kvsim.engine.vllm_compiled import CompiledVllmScheduler
from kvsim.engine.vllm_scheduler import EngineConfig, VllmScheduler
from kvsim.ingest.vllm_sched import load_sched_recording


def main(path: str) -> None:
    rec = load_sched_recording(path)
    cfg = EngineConfig.from_recording(rec.engine)
    warm = CompiledVllmScheduler(cfg, build_requests(rec))
    warm.add_request(0)
    warm.step_raw()
    for engine in ("python", "compiled"):
        reqs = build_requests(rec)
        if engine == "compiled":
            s = CompiledVllmScheduler(cfg, reqs)
        else:
            s = VllmScheduler(cfg, max_seqs=len(reqs) + 1)
        total = 0.0
        for st in rec.steps:
            for i in st.get("arrived", []):
                s.add_request(reqs[i])
            t = time.perf_counter()
            if engine == "compiled":
                s.step_raw()
                s.oc[:] = 0
            else:
                s.step()
            total += time.perf_counter() - t
        n = len(rec.steps)
        print(f"{engine}: {n} steps in {total:.3f} s = {n / total:,.0f} steps/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/vllm_sched/mooncake200.jsonl.gz")
