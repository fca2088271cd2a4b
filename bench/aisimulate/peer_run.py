"""One AISimulate (``ai-dynamo-runtime``) trace replay, run by bench_vs_aisimulate.py in the
peer's own environment (never a kvsim dependency):

    /work/venvs/dynamo/bin/python bench/aisimulate/peer_run.py SPEC_JSON

SPEC_JSON: {"trace": path, "block_size": tokens, "trace_block_size": tokens, "gpu_blocks": n,
"host_blocks": n or 0, "kv_bytes_per_token": bytes, "replicas": n, "max_num_seqs": n,
"max_num_batched_tokens": n, "calls": N (optional, default 1)}.  Prints one JSON line: the CPU
seconds of the import and of the replay call (``time.process_time``, every thread of this
process), the call's wall seconds and the peer's summary; with ``calls`` > 1 the same replay
runs that many times in this process and ``calls_cpu_s`` holds each call's CPU seconds.  ``dynamo.replay.run_trace_replay`` (ai-dynamo) is a thin wrapper
of ``dynamo._core.run_mocker_trace_replay`` (ai-dynamo-runtime), called here directly.
"""

from __future__ import annotations

import json
import sys
import time

c0 = time.process_time()
from dynamo._core import KvRouterConfig, run_mocker_trace_replay  # noqa: E402

c1 = time.process_time()


def main() -> None:
    spec = json.loads(sys.argv[1])
    engine = {"block_size": spec["block_size"], "num_gpu_blocks": spec["gpu_blocks"],
              "max_num_seqs": spec["max_num_seqs"],
              "max_num_batched_tokens": spec["max_num_batched_tokens"],
              "enable_prefix_caching": True, "enable_chunked_prefill": True}
    if spec.get("host_blocks"):
        engine["kv_cache_bytes_per_token"] = spec["kv_bytes_per_token"]
        engine["native_host_offload"] = {"num_host_blocks": spec["host_blocks"]}
    n = spec["replicas"]
    kw = {}
    if n > 1:
        kw = {"router_mode": "kv_router", "router_config": KvRouterConfig()}
    per_call, wall, summary = [], 0.0, None
    for i in range(int(spec.get("calls", 1))):
        t0, p0 = time.perf_counter(), time.process_time()
        r = run_mocker_trace_replay([spec["trace"]], extra_engine_args={"engine": engine},
                                    num_workers=n, trace_block_size=spec["trace_block_size"],
                                    **kw)
        s = r.summary
        per_call.append(time.process_time() - p0)
        if not i:
            wall, summary = time.perf_counter() - t0, s
    out = {"import_cpu_s": c1 - c0, "call_cpu_s": per_call[0], "call_wall_s": wall,
           "calls_cpu_s": per_call,
           "summary": {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
