#!/usr/bin/env python3
"""vLLM's own hybrid KV-cache manager on a small request sequence: the witness for
:mod:`kvsim.memory.hybrid` (docs/memory-model.md, "Hybrid models").

Drives vLLM 0.33.0's real ``KVCacheManager`` (``HybridKVCacheCoordinator`` over one shared
``BlockPool``) built on a hand-made ``KVCacheConfig`` -- no model weights, no model config:
the managers only read the groups' specs -- through a fixed script of operations:

* ``admit``: ``get_computed_blocks`` (the prefix hit, at most ``prompt - 1`` tokens), then
  ``allocate_slots`` for ``chunk`` tokens (default: the rest of the prompt); the request's
  ``num_computed_tokens`` then advances as vLLM's scheduler advances it;
* ``prefill``: ``allocate_slots`` for the next ``n`` prompt tokens;
* ``decode``: ``k`` times: append one output token, ``allocate_slots(req, 1)``;
* ``finish``: ``free`` (tail first).

After every operation it records the pool's free-block count, the request's block ids per
group (0 = vLLM's null block: a sliding-window block freed outside the window, a Mamba
state no longer needed) and, for ``admit``, the hit tokens.  Configurations:

* ``swa``: a full-attention group + a sliding-window group (window 32), block size 16 for
  both (gpt-oss's layout: vLLM puts the alternating layers in one group per type);
* ``mamba``: a full-attention group + a Mamba group in ``mamba_cache_mode="align"``, block
  size 16 for both (vLLM aligns the attention block size to the Mamba one);
* ``lcm``: full attention with block size 32 + sliding window 48 with block size 16: the
  scheduler block size is their lcm (32), the hash block size their gcd (16).

Imports only vLLM and the standard library; runs in vLLM's own environment::

    HF_HUB_OFFLINE=1 /work/venvs/vllm033/bin/python bench/vllm/record_hybrid.py \\
        > tests/fixtures/vllm_hybrid.json

Never a CI dependency: tests/memory/test_hybrid_vllm.py replays the committed JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BLOCKS = 24  # usable blocks (vLLM's null block is one more)


def _prompt(base: int, n: int) -> list[int]:
    return [base + k for k in range(n)]


SHARED = _prompt(1000, 64)  # a 64-token prefix (4 blocks of 16) several requests share

# (op, request, arg): the same script for every configuration
SCRIPT = [
    ("admit", "a", {"prompt": SHARED + _prompt(2000, 20)}),       # 84 tokens, one chunk
    ("decode", "a", {"k": 14}),                                   # 98 tokens
    ("admit", "b", {"prompt": SHARED + _prompt(3000, 8)}),        # shares 64 tokens
    ("decode", "b", {"k": 3}),
    ("finish", "a", {}),
    ("admit", "c", {"prompt": SHARED + _prompt(2000, 20) + _prompt(4000, 30)}),  # a's prompt +
    ("decode", "c", {"k": 2}),
    ("finish", "b", {}),
    ("admit", "d", {"prompt": _prompt(5000, 100), "chunk": 48}),  # chunked prefill
    ("prefill", "d", {"n": 32}),
    ("prefill", "d", {"n": 20}),
    ("decode", "d", {"k": 5}),
    ("finish", "c", {}),
    ("admit", "e", {"prompt": SHARED + _prompt(6000, 4)}),
    ("finish", "d", {}),
    ("finish", "e", {}),
    ("admit", "f", {"prompt": _prompt(5000, 100) + _prompt(7000, 9)}),  # d's prompt +
    ("admit", "g", {"prompt": SHARED[:32]}),                          # exactly 2 blocks
    ("admit", "h", {"prompt": SHARED[:40]}),                          # 2.5 blocks
    ("finish", "f", {}),
    ("finish", "g", {}),
    ("finish", "h", {}),
]

CONFIGS = {
    "swa": [("full", 16, {}), ("sliding_window", 16, {"sliding_window": 32})],
    "mamba": [("full", 16, {}), ("mamba", 16, {"mamba_cache_mode": "align"})],
    "lcm": [("full", 32, {}), ("sliding_window", 16, {"sliding_window": 48})],
}


def build(groups):
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    specs = []
    for i, (kind, bs, extra) in enumerate(groups):
        if kind == "full":
            spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                     dtype=torch.float32)
        elif kind == "sliding_window":
            spec = SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                     dtype=torch.float32, sliding_window=extra["sliding_window"])
        else:
            spec = MambaSpec(block_size=bs, shapes=((1,),), dtypes=(torch.float32,),
                             mamba_cache_mode=extra["mamba_cache_mode"])
        specs.append(KVCacheGroupSpec([f"layer{i}"], spec))
    sizes = [bs for _, bs, _ in groups]
    sched_bs = math.lcm(*sizes)
    hash_bs = math.gcd(*sizes)
    config = KVCacheConfig(num_blocks=BLOCKS + 1, kv_cache_tensors=[], kv_cache_groups=specs)
    mgr = KVCacheManager(config, max_model_len=4096, scheduler_block_size=sched_bs,
                         hash_block_size=hash_bs, enable_caching=True)
    return mgr, hash_bs, sched_bs


def run(name: str, groups) -> dict:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    mgr, hash_bs, sched_bs = build(groups)
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_bs, hash_fn)
    reqs: dict[str, Request] = {}
    rows = []
    out_tok = 90000
    for op, rid, arg in SCRIPT:
        row = {"op": op, "req": rid, **arg}
        if op == "admit":
            p = arg["prompt"]
            req = Request(request_id=rid, prompt_token_ids=list(p),
                          sampling_params=SamplingParams(max_tokens=64), pooling_params=None,
                          arrival_time=float(len(reqs)), block_hasher=hasher)
            reqs[rid] = req
            mgr.new_step_starts()
            computed, n_hit, _ = mgr.get_computed_blocks(req)
            n = arg.get("chunk", len(p) - n_hit)
            if "chunk" in arg:
                n = arg["chunk"] - n_hit
            got = mgr.allocate_slots(req, n, n_hit, computed)
            row["hit_tokens"] = n_hit
            row["ok"] = got is not None
            if got is not None:
                req.num_computed_tokens = n_hit + n
        elif op == "prefill":
            req = reqs[rid]
            mgr.new_step_starts()
            got = mgr.allocate_slots(req, arg["n"])
            row["ok"] = got is not None
            if got is not None:
                req.num_computed_tokens += arg["n"]
        elif op == "decode":
            req = reqs[rid]
            row["ok"] = True
            for _ in range(arg["k"]):
                out_tok += 1
                req.append_output_token_ids(out_tok)
                mgr.new_step_starts()
                got = mgr.allocate_slots(req, 1)
                if got is None:
                    row["ok"] = False
                    break
                req.num_computed_tokens += 1
            row["out_tokens"] = list(req.output_token_ids)
        else:
            mgr.free(reqs[rid])
        row["free_blocks"] = mgr.block_pool.get_num_free_blocks()
        ids = mgr.get_block_ids(rid) if op != "finish" else tuple([] for _ in groups)
        row["block_ids"] = [list(g) for g in ids]
        rows.append(row)
    return {"groups": [{"kind": k, "block_size": bs, **e} for k, bs, e in groups],
            "blocks": BLOCKS, "scheduler_block_size": sched_bs,
            "hash_block_size": hash_bs, "rows": rows}


def main() -> int:
    import vllm

    out = {"vllm": vllm.__version__, "recorder": "bench/vllm/record_hybrid.py",
           "configs": {name: run(name, g) for name, g in CONFIGS.items()}}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
