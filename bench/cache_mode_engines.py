"""What each engine costs a cache-mode replay of a policy whose hooks are not compiled yet
(the measurement behind ``kvsim.spec.sim_config.AUTO_HOOKS_MIN_ROWS``):

    python bench/cache_mode_engines.py --policies fifo,sieve,s3fifo,arc,lfu \
        [--blocks 5859] [--out R.json]

Run it on a numba cache where the compiled core is warm and these policies' hooks are not
(a fresh ``KVSIM_CACHE_DIR`` after one ``kvsim simulate`` of lru, say).  For each policy, in
this process: the interpreted engine's CPU seconds, then the compiled engine's first run
(its hooks compiled, or loaded when already cached) and a second run (``time.process_time``),
with the hit rate of each (they must agree).  The trace: the Mooncake conversation trace
lowered for cache mode at 512-token blocks (the lowering's row count is printed), HBM only,
the first half of the requests as warm-up.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

TRACE = Path(__file__).resolve().parents[2] / "shared/traces/mooncake/conversation_trace.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="fifo,sieve,s3fifo,arc,lfu")
    ap.add_argument("--blocks", type=int, default=5859)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import pyarrow.parquet as pq

    from kvsim.engine.serial_lowering import stream_from_requests
    from kvsim.ingest import read_requests
    from kvsim.modes.cache import lower_for_cache, simulate_cache
    from kvsim.spec.sim_config import SimConfig

    stream = stream_from_requests(read_requests(args.trace, "mooncake"), block_size_tokens=512,
                                  kv_bytes_per_token=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        low = lower_for_cache(stream, "prefix", tmp)
        n = pq.ParquetFile(low.path).metadata.num_rows
        print(f"{n:,} events, {args.blocks:,} HBM blocks, /proc/loadavg "
              f"{Path('/proc/loadavg').read_text().split()[:3]}")
        for pol in args.policies.split(","):
            row = {"policy": pol, "events": n}
            for key, engine in (("interpreted", "interpreted"), ("compiled_first", "compiled"),
                                ("compiled_again", "compiled")):
                cfg = SimConfig(hbm_blocks=args.blocks, dram_gb=0, cxl_gb=0, nvme_gb=0,
                                warmup_fraction=0.5, mode="cache", hardware="h100-sxm",
                                engine=engine)
                t = time.process_time()
                hit = simulate_cache(stream, pol, cfg, lowering=low).summary["hbm_hit_rate"]
                row[key + "_cpu_s"] = round(time.process_time() - t, 3)
                row.setdefault("hbm_hit_rate", hit)
                if hit != row["hbm_hit_rate"]:
                    raise SystemExit(f"{pol}: {engine} hit rate {hit} != {row['hbm_hit_rate']}")
            row["interpreted_events_per_cpu_s"] = round(n / row["interpreted_cpu_s"])
            row["hooks_compile_cpu_s"] = round(row["compiled_first_cpu_s"]
                                               - row["compiled_again_cpu_s"], 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out is not None:
        args.out.write_text(json.dumps({"load_end": Path("/proc/loadavg").read_text().split()[:3],
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
