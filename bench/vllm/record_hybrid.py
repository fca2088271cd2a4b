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

Never a CI dependency: tests/memory/test_hybrid_vllm.py replays the committed JSON;
``staggered`` / ``staggered_mamba`` (requests added between steps, ARRIVE_STEPS) are what
tests/engine/test_hybrid_closed.py serves through kvsim's closed loop
(kvsim.modes.closed.hybrid_serve, one step = 1 ms, arrival i at ARRIVE_STEPS[i] ms).
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


def group_specs(groups) -> list:
    """One ``KVCacheGroupSpec`` per ``(kind, block_size, extra)`` of ``groups`` (one layer
    each, ``layer<i>``): the hand-made groups of both the manager script and the closed loop."""
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
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
    return specs


def build(groups):
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import KVCacheConfig

    specs = group_specs(groups)
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


# the closed loop: vLLM's Scheduler over the full + sliding-window and the full + Mamba
# ("align") KVCacheConfigs
CLOSED = {
    "engine": {"num_gpu_blocks": 31, "max_num_seqs": 8, "max_num_batched_tokens": 64,
               "max_model_len": 4096, "scheduler_reserve_full_isl": True},
    # (prompt, output_len): shared prefixes, long decodes that outgrow the window, pressure
    "requests": [
        (SHARED + _prompt(2000, 20), 30),
        (SHARED + _prompt(3000, 8), 12),
        (_prompt(5000, 100), 40),
        (SHARED + _prompt(2000, 20) + _prompt(4000, 30), 20),
        (_prompt(5000, 100) + _prompt(7000, 9), 6),
        (SHARED[:40], 50),
        (_prompt(8000, 150), 25),
        (SHARED + _prompt(9000, 60), 10),
    ],
}
OUTPUT_BASE = 100000


#: staggered arrivals: request i is added before the schedule() of step ARRIVE_STEPS[i]
#: (the engine is never idle in between), for kvsim's closed loop with arrivals over time
ARRIVE_STEPS = [0, 0, 2, 5, 9, 14, 22, 31]


def run_closed(kinds, arrive_steps=None) -> dict:
    """vLLM's real ``Scheduler`` (synchronous) with the hybrid KVCacheConfig, a fake model
    runner sampling ``OUTPUT_BASE + 1000 * request + k`` as output token k; every request
    arrives before step 0, or request i before step ``arrive_steps[i]``.  Per step: scheduled (request, tokens), new admissions with
    their hit tokens, preempted, finished, free blocks after schedule() and after the step."""
    import shutil

    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from record_scheduler import _tiny_model_dir

    eng = CLOSED["engine"]
    bs = 16
    model_dir = _tiny_model_dir()
    try:
        model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16",
                                   max_model_len=eng["max_model_len"], seed=0)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    sched_config = SchedulerConfig(
        max_num_seqs=eng["max_num_seqs"], max_num_batched_tokens=eng["max_num_batched_tokens"],
        max_model_len=eng["max_model_len"], is_encoder_decoder=False,
        enable_chunked_prefill=True, scheduler_reserve_full_isl=eng["scheduler_reserve_full_isl"],
        async_scheduling=False)
    mamba = any(k == "mamba" for k, _, _ in kinds)
    cache_config = CacheConfig(block_size=bs, enable_prefix_caching=True,
                               **({"mamba_cache_mode": "align"} if mamba else {}))
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=sched_config,
                             cache_config=cache_config, device_config=DeviceConfig(device="cpu"))
    groups = group_specs(kinds)
    kv_cache_config = KVCacheConfig(num_blocks=eng["num_gpu_blocks"], kv_cache_tensors=[],
                                    kv_cache_groups=groups)
    cache_config.num_gpu_blocks = eng["num_gpu_blocks"]
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(vllm_config),
                      block_size=bs, hash_block_size=bs, log_stats=True)
    hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(bs, hash_fn)
    preempt_order: list[str] = []
    _orig = sched._preempt_request

    def _recording_preempt(request, *a, **kw):  # observation only
        preempt_order.append(request.request_id)
        return _orig(request, *a, **kw)

    sched._preempt_request = _recording_preempt
    vreqs = {}
    arrive = arrive_steps or [0] * len(CLOSED["requests"])
    for i, (prompt, out_len) in enumerate(CLOSED["requests"]):
        sp = SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0)
        vreqs[str(i)] = Request(request_id=str(i), prompt_token_ids=list(prompt),
                                sampling_params=sp, pooling_params=None,
                                arrival_time=float(arrive[i]), block_hasher=hasher)
    added = 0
    steps = []
    while (sched.has_requests() or added < len(vreqs)) and len(steps) < 5000:
        while added < len(vreqs) and arrive[added] <= len(steps):  # between steps
            sched.add_request(vreqs[str(added)])
            added += 1
        if not sched.has_requests():
            raise RuntimeError("the engine went idle before the last arrival")
        seen = {rid for rid, r in vreqs.items() if r.num_computed_tokens > 0}
        so = sched.schedule()
        nst = so.num_scheduled_tokens
        rec = {"sched": [[int(rid), n] for rid, n in nst.items()],
               "new": [[int(nr.req_id), nr.num_computed_tokens] for nr in so.scheduled_new_reqs
                       if nr.req_id not in seen],
               "preempted": [int(x) for x in preempt_order],
               "free_sched": sched.kv_cache_manager.block_pool.get_num_free_blocks()}
        preempt_order.clear()
        req_ids = list(nst)
        sampled = []
        for rid in req_ids:
            vr = vreqs[rid]
            if vr.num_computed_tokens >= vr.num_tokens:
                sampled.append([OUTPUT_BASE + 1000 * int(rid) + len(vr.output_token_ids)])
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: j for j, r in
                                                                  enumerate(req_ids)},
                                sampled_token_ids=sampled)
        ecos = sched.update_from_output(so, mro)
        rec["finished"] = sorted(int(o.request_id) for eco in ecos.values()
                                 for o in eco.outputs if o.finish_reason is not None)
        rec["free_blocks"] = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        steps.append(rec)
    return {"groups": [{"kind": k, "block_size": b, **e} for k, b, e in kinds],
            "engine": eng, "output_base": OUTPUT_BASE,
            "requests": [{"prompt": p, "output_len": n} for p, n in CLOSED["requests"]],
            **({"arrive_steps": list(arrive_steps)} if arrive_steps else {}),
            "steps": steps}


def main() -> int:
    import vllm

    out = {"vllm": vllm.__version__, "recorder": "bench/vllm/record_hybrid.py",
           "configs": {name: run(name, g) for name, g in CONFIGS.items()},
           "closed_loop": run_closed(CONFIGS["swa"]),
           "closed_loop_mamba": run_closed(CONFIGS["mamba"]),
           "staggered": run_closed(CONFIGS["swa"], ARRIVE_STEPS),
           "staggered_mamba": run_closed(CONFIGS["mamba"], ARRIVE_STEPS)}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
