"""Cache-mode hit rates of kvsim vs kvcache-simulator 0.1.3 on the Mooncake conversation trace
(512-token blocks, 50 % warm-up by requests, token hit rate); docs/benchmarks.md.

    python bench/vs_kvcache_simulator.py 1000,5859,10000,20000 lru,fifo,optimal
"""
import sys
import time

from kvcache_sim.plan import build_execution_plan
from kvcache_sim.policies import simulate_policy
from kvcache_sim.trace import parse_trace_file

from kvsim.bounds.optimal import optimum_summary
from kvsim.engine.serial_lowering import stream_from_requests
from kvsim.ingest import read_requests
from kvsim.modes.cache import simulate_cache
from kvsim.spec.sim_config import SimConfig

P = str(__import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/conversation_trace.jsonl")
caps=[int(x) for x in sys.argv[1].split(",")]
pols=sys.argv[2].split(",")
plan=build_execution_plan(parse_trace_file(P, block_size=512), warmup_fraction=0.5)
stream=stream_from_requests(read_requests(P, "mooncake"), block_size_tokens=512, kv_bytes_per_token=1)
W=stream.num_requests//2
for cap in caps:
    for pol in pols:
        ref=simulate_policy(plan, pol, cap)
        t=time.process_time()
        if pol=="optimal":
            ours=optimum_summary(stream, cap, W)["hbm_hit_rate"]
        else:
            ours=simulate_cache(stream, pol, SimConfig(hbm_blocks=cap, dram_gb=0, cxl_gb=0, nvme_gb=0, warmup_fraction=0.5, mode="cache", hardware="h100-sxm")).summary["hbm_hit_rate"]
        print(cap, pol, f"kvsim={ours:.4f} kvcache-simulator={ref.hitRate:.4f} diff={ours-ref.hitRate:+.4f} mode={ref.measurementMode} cpu={time.process_time()-t:.1f}s", flush=True)
