#!/usr/bin/env python3
"""The hybrid pool against "every layer alike" in the same KV memory, through vLLM's
scheduler (kvsim.engine.vllm_hybrid.serve_hybrid): docs/benchmarks.md, "Hybrid pool".

One synthetic batch (all arrived at once): 6 system prompts of 1,024 tokens, each shared
by 8 requests with their own 1,000-token suffix and 200 output tokens (48 requests).  The
KV memory is fixed; the hybrid pool splits it into block ids of one page of
``layers_per_group`` layers (vLLM's grouping, kvsim.memory.hybrid.model_groups), the
"alike" pool into block ids of every layer (what kvsim's compiled replay does today).

    python bench/hybrid_pool.py --model gpt-oss-20b --kv-gb 1
    python bench/hybrid_pool.py --model qwen3-next-80b-a3b --kv-gb 4

Prints one JSON line per pool: block ids, steps to drain the batch, prefix hit rate over
prompt tokens, preemptions, blocks the windows / Mamba states freed.
"""

from __future__ import annotations

import argparse
import json
import time

from kvsim.engine.vllm_hybrid import serve_hybrid
from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest
from kvsim.memory.hybrid import FULL, GroupSpec, model_groups
from kvsim.spec.kvsize import kv_bytes_per_layer_token
from kvsim.spec.models.catalog import load_model


def workload(n_prefix=6, per_prefix=8, prefix_len=1024, suffix_len=1000, out_len=200):
    reqs = []
    for p in range(n_prefix):
        for k in range(per_prefix):
            i = len(reqs)
            prompt = [1_000_000 * (p + 1) + t for t in range(prefix_len)]
            prompt += [50_000_000 + 10_000 * i + t for t in range(suffix_len)]
            out = [90_000_000 + 10_000 * i + t for t in range(out_len)]
            reqs.append(SimRequest(idx=i, request_id=str(i), all_tokens=prompt + out,
                                   prompt_len=len(prompt), output_len=out_len))
    return reqs


def run(model_name: str, kv_gb: float, block: int) -> list[dict]:
    model = load_model(model_name)
    budget = int(kv_gb * 1e9)
    groups, per_group, id_bytes = model_groups(model, block)
    alike_bytes = block * model.num_layers * kv_bytes_per_layer_token(model, "auto")
    out = []
    for name, gs, nbytes in (("hybrid", groups, id_bytes),
                             ("alike", [GroupSpec(FULL, block)], alike_bytes)):
        blocks = budget // nbytes
        bs = gs[0].block_size
        cfg = EngineConfig(block_size=bs, num_gpu_blocks=blocks + 1, max_num_seqs=64,
                           max_num_batched_tokens=max(2048, bs), max_model_len=1 << 20)
        t0 = time.perf_counter()
        res = serve_hybrid(cfg, gs, workload())
        out.append({"model": model_name, "pool": name, "kv_gb": kv_gb,
                    "groups": len(gs), "block_tokens": bs, "block_id_bytes": nbytes,
                    "block_ids": blocks, "steps": res.steps,
                    "hit_rate": round(res.hit_rate, 4), "preemptions": res.preemptions,
                    "freed_by_window": res.freed_by_window,
                    "wall_s": round(time.perf_counter() - t0, 1)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-oss-20b")
    ap.add_argument("--kv-gb", type=float, default=1.0)
    ap.add_argument("--block", type=int, default=16)
    args = ap.parse_args(argv)
    for row in run(args.model, args.kv_gb, args.block):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
