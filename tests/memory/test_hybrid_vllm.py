"""The hybrid pool (kvsim.memory.hybrid) against vLLM 0.33.0's own KVCacheManager.

tests/fixtures/vllm_hybrid.json is bench/vllm/record_hybrid.py's recording of vLLM's
``HybridKVCacheCoordinator`` (full + sliding window; full + Mamba "align"; full with block
size 32 + sliding window with 16): after every operation the free-block count, the
request's block ids per group (0 = the null block) and the hit tokens.  kvsim replays the
same script and must match every row exactly.  The exact tests below pin the rules one by
one (docs/memory-model.md, "Hybrid models").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.memory.hybrid import FULL, MAMBA, SLIDING_WINDOW, GroupSpec, HybridPool, HybridRequest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_hybrid.json"
RECORDING = json.loads(FIXTURE.read_text())


def _replay(cfg: dict) -> list[tuple]:
    groups = [GroupSpec(g["kind"], g["block_size"], g.get("sliding_window", 0))
              for g in cfg["groups"]]
    pool = HybridPool(groups, cfg["blocks"], max_model_len=4096)
    assert pool.scheduler_block_size == cfg["scheduler_block_size"]
    assert pool.hash_block_size == cfg["hash_block_size"]
    reqs: dict[str, HybridRequest] = {}
    out = []
    for r in cfg["rows"]:
        op, rid = r["op"], r["req"]
        hit, ok = None, None
        if op == "admit":
            req = reqs[rid] = HybridRequest(rid, list(r["prompt"]), len(r["prompt"]))
            pool.new_step_starts()
            blocks, hit = pool.get_computed_blocks(req)
            n = r.get("chunk", len(r["prompt"])) - hit
            ok = pool.allocate_slots(req, n, hit, blocks)
            if ok:
                req.num_computed = hit + n
        elif op == "prefill":
            req = reqs[rid]
            pool.new_step_starts()
            ok = pool.allocate_slots(req, r["n"])
            if ok:
                req.num_computed += r["n"]
        elif op == "decode":
            req = reqs[rid]
            ok = True
            for tok in r["out_tokens"][len(req.tokens) - req.num_prompt:]:
                req.tokens.append(tok)
                pool.new_step_starts()
                ok = pool.allocate_slots(req, 1)
                if not ok:
                    break
                req.num_computed += 1
        else:
            pool.free(rid)
        ids = pool.block_ids(rid) if op != "finish" else [[] for _ in groups]
        out.append((op, rid, hit, ok, pool.num_free_blocks(), ids))
    return out


@pytest.mark.parametrize("name", sorted(RECORDING["configs"]))
def test_matches_vllm_hybrid_manager(name):
    cfg = RECORDING["configs"][name]
    want = [(r["op"], r["req"], r.get("hit_tokens"), r.get("ok"), r["free_blocks"],
             r["block_ids"]) for r in cfg["rows"]]
    assert RECORDING["vllm"] == "0.33.0"
    assert _replay(cfg) == want


def _run(pool, rid, tokens, chunk=None):
    req = HybridRequest(rid, list(tokens), len(tokens))
    pool.new_step_starts()   # a Mamba state cached in this very step cannot be hit yet
    blocks, hit = pool.get_computed_blocks(req)
    n = (chunk or len(tokens)) - hit
    assert pool.allocate_slots(req, n, hit, blocks)
    req.num_computed = hit + n
    return req, hit


def _decode(pool, req, k, first=900000):
    for t in range(k):
        req.tokens.append(first + t)
        assert pool.allocate_slots(req, 1)
        req.num_computed += 1


def test_sliding_window_frees_blocks_outside_the_window():
    # window 32, block 16: at 97 computed tokens the window covers tokens 66..97, so
    # blocks 0-3 (tokens 0..63) are wholly outside it; block 4 (64..79) still holds 66..79
    pool = HybridPool([GroupSpec(FULL, 16), GroupSpec(SLIDING_WINDOW, 16, 32)], 40)
    req, _ = _run(pool, "a", range(84))
    assert pool.held_blocks("a") == 6 + 6          # nothing skipped before the prompt ran
    _decode(pool, req, 14)                          # 98 tokens, 97 computed
    sw = pool.block_ids("a")[1]
    assert sw[:4] == [0, 0, 0, 0] and all(b != 0 for b in sw[4:]) and len(sw) == 7
    assert pool.freed_by_window == 4
    assert pool.num_free_blocks() == 40 - 7 - 3
    # the freed blocks stay cached: the same prompt again hits its whole length
    # (the sliding-window group needs only the 2 blocks before the hit point)
    pool.free("a")
    blocks, hit = pool.get_computed_blocks(HybridRequest("b", list(range(84)) + [1], 85))
    assert hit == 80
    assert [b.is_null for b in blocks[1]] == [True, True, True, False, False]


def test_sliding_window_hit_needs_only_the_window_blocks():
    # a prompt whose early blocks were evicted still hits: only the last
    # cdiv(window - 1, block) = 2 blocks before the hit point must be cached
    pool = HybridPool([GroupSpec(SLIDING_WINDOW, 16, 32)], 40)
    _run(pool, "a", range(64))
    pool.free("a")
    for b in pool.blocks[1:]:                       # evict blocks 0 and 1 of the prompt
        if b.keys and b.key_tokens <= 32:
            pool._drop_keys(b)
    _, hit = pool.get_computed_blocks(HybridRequest("b", list(range(64)) + [7], 65))
    assert hit == 64


def test_mamba_state_hit_at_a_block_boundary_and_miss_off_it():
    groups = [GroupSpec(FULL, 16), GroupSpec(MAMBA, 16)]
    pool = HybridPool(groups, 40)
    # a 32-token prompt ends on a block boundary: its state after token 32 is cached
    _run(pool, "a", range(32))
    pool.free("a")
    _, hit = _run(pool, "b", list(range(32)) + list(range(500, 520)))
    assert hit == 32
    pool.free("b")
    # a 40-token prompt in one chunk ends off a boundary: no state at 32 or 16 is kept,
    # so a request sharing its 40 tokens misses (full attention alone would hit 32)
    pool2 = HybridPool(groups, 40)
    _run(pool2, "c", range(1000, 1040))
    assert pool2.held_blocks("c") == 3 + 1          # one Mamba state block per request
    pool2.free("c")
    _, hit = _run(pool2, "d", list(range(1000, 1040)) + [1])
    assert hit == 0
    full_only = HybridPool([GroupSpec(FULL, 16)], 40)
    _run(full_only, "c", range(1000, 1040))
    full_only.free("c")
    assert full_only.get_computed_blocks(
        HybridRequest("d", list(range(1000, 1040)) + [1], 41))[1] == 32


def test_mamba_holds_one_state_block_while_decoding():
    pool = HybridPool([GroupSpec(MAMBA, 16)], 10)
    req, _ = _run(pool, "a", range(20))
    _decode(pool, req, 40)
    assert pool.held_blocks("a") == 1
    assert pool.num_free_blocks() == 9


def test_scheduler_and_hash_block_sizes_are_lcm_and_gcd():
    pool = HybridPool([GroupSpec(FULL, 32), GroupSpec(SLIDING_WINDOW, 16, 48)], 8)
    assert (pool.scheduler_block_size, pool.hash_block_size) == (32, 16)


def test_bad_group_refused():
    with pytest.raises(ValueError, match="sliding_window"):
        GroupSpec(SLIDING_WINDOW, 16)
    with pytest.raises(ValueError, match="kind"):
        GroupSpec("mla", 16)


def test_mamba_state_cached_this_step_cannot_be_hit_yet():
    # MambaManager.get_num_blocks_to_allocate: a hit on a state cached in the same step
    # asks for num_gpu_blocks + 1 blocks, so the request waits for the next step
    pool = HybridPool([GroupSpec(FULL, 16), GroupSpec(MAMBA, 16)], 40)
    pool.new_step_starts()
    _run(pool, "a", range(32))
    req = HybridRequest("b", list(range(40)), 40)
    blocks, hit = pool.get_computed_blocks(req)
    assert hit == 32
    assert not pool.allocate_slots(req, 40 - hit, hit, blocks)
    pool.new_step_starts()
    assert pool.allocate_slots(req, 40 - hit, hit, blocks)


def test_model_groups_as_vllm_plans_them():
    """vLLM's kv_cache_planning: layers per group = the smallest bucket (or the largest
    when under 1.5x the smallest), buckets split into equal groups, the last padded."""
    from kvsim.memory.hybrid import model_groups
    from kvsim.spec.models.catalog import load_model

    groups, size, nbytes = model_groups(load_model("gpt-oss-20b"))
    assert groups == [GroupSpec(FULL, 16), GroupSpec(SLIDING_WINDOW, 16, 128)]
    assert (size, nbytes) == (12, 12 * 16 * 2048)           # bf16, 8 KV heads of 64
    groups, size, nbytes = model_groups(load_model("qwen3-next-80b-a3b"))
    assert groups == [GroupSpec(FULL, 544)] + [GroupSpec(MAMBA, 544)] * 3
    assert (size, nbytes) == (12, 12 * 544 * 2048)
    groups, size, _ = model_groups(load_model("gemma-3-27b"))
    assert size == 10 and len(groups) == 1 + 6               # 10 full, 52 sliding (padded)
    groups, size, _ = model_groups(load_model("llama-3.1-8b"))
    assert groups == [GroupSpec(FULL, 16)] and size == 32
