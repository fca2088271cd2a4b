#!/usr/bin/env python3
"""vLLM's own prefix-cache hit tokens over a Mooncake trace, one request at a time.

The witness for kvsim's ``--mode cache --cache-variant vllm`` (docs/simulate.md, "Fidelity
to vLLM"): vLLM 0.33.0's real ``KVCacheManager`` (one full-attention group, ``num_blocks``
usable blocks + vLLM's null block), fed the trace's requests in order, each one alone:
``get_computed_blocks`` (the hit: the longest cached prefix of whole blocks, at most
``prompt - 1`` tokens), ``allocate_slots`` for the rest of the prompt (which caches every
full block of it), then ``free`` (tail first, so tails are evicted first).  A request whose
prompt needs more blocks than the pool holds is skipped (counted; kvsim refuses or skips
those too).  Tokens come from the recorder's mapping (bench/vllm/record_scheduler.py,
docs/vllm-recordings.md): Mooncake hash id ``h`` -> 512 tokens ``1 + 512 h ...``, the last
block its first ``input_length - 512 (k - 1)`` tokens.

Imports only vLLM and the standard library; runs in vLLM's own environment::

    HF_HUB_OFFLINE=1 /work/venvs/vllm033/bin/python bench/vllm/cache_hits.py \\
        ../shared/traces/mooncake/conversation_trace.jsonl --block-size 512 --blocks 1000

Prints one JSON line: ``{"block_size", "blocks", "requests", "skipped", "hit_tokens",
"prompt_tokens", "vllm"}``.  Never a CI dependency: tests read the figures committed in
tests/fixtures/vllm_cache_hits.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def prompts_from_mooncake(path: str, limit: int | None):
    """The trace's prompts as token lists, one at a time (the whole trace is 145 M tokens)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from record_scheduler import expand_prompt, mooncake_requests

    reqs, _ = mooncake_requests(path, limit if limit else 1 << 62)
    return len(reqs), (expand_prompt(r["prompt"], reqs) for r in reqs)


def run(num_requests: int, prompts, block_size: int, blocks: int) -> dict:
    import torch
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    bs = block_size
    max_len = 1 << 22  # longer than any prompt (the manager only caps hits by it)
    config = KVCacheConfig(
        num_blocks=blocks + 1,  # vLLM's null block is one of num_blocks
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    mgr = KVCacheManager(config, max_model_len=max_len, scheduler_block_size=bs,
                         hash_block_size=bs, enable_caching=True)
    hash_fn = get_hash_fn_by_name("sha256")  # CacheConfig.prefix_caching_hash_algo's default
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(bs, hash_fn)
    hit = skipped = prompt_tokens = 0
    for i, p in enumerate(prompts):
        req = Request(request_id=str(i), prompt_token_ids=list(p),
                      sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                      arrival_time=float(i), block_hasher=hasher)
        if -(-len(p) // bs) > blocks:
            skipped += 1
            continue
        computed, n_hit, _ = mgr.get_computed_blocks(req)
        got = mgr.allocate_slots(req, len(p) - n_hit, n_hit, computed)
        if got is None:
            skipped += 1
            continue
        hit += n_hit
        prompt_tokens += len(p)
        mgr.free(req)
    return {"block_size": bs, "blocks": blocks, "requests": num_requests, "skipped": skipped,
            "hit_tokens": hit, "prompt_tokens": prompt_tokens, "vllm": vllm.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--block-size", type=int, required=True)
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--first", type=int, default=None, help="only the first N requests")
    args = ap.parse_args(argv)
    t0 = time.time()
    res = run(*prompts_from_mooncake(args.trace, args.first), args.block_size, args.blocks)
    res["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
