"""The partial last prompt block of a trace that names it with a per-block id (Mooncake's
last hash id, a generic trace's last block id): vLLM never hashes a partial block at
admission, and once decode fills it its hash is over (prompt tail + output tokens), a
content no full prompt block has.  kvsim hashes it with its token count
(:func:`kvsim.ingest.hashing.partial_hash`), so it never matches a full block with the
same id, in engine mode and in cache mode's ``vllm`` variant alike (docs/importers.md,
"The partial last block")."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.engine.lowering import lower_requests
from kvsim.engine.serial_lowering import stream_from_requests
from kvsim.ingest import build_request_table
from kvsim.ingest.hashing import partial_hash
from kvsim.spec.sim_config import SimConfig


def two_turns(T: int = 16):
    """r0: ids [1, 2], 16 + 10 tokens, 20 output tokens (decode fills its block 1 and
    starts block 2); r1, long after: ids [1, 2, 3], 48 tokens, block 1 FULL with id 2."""
    return build_request_table(
        {"arrival_us": [0, 10_000_000_000], "prompt_tokens": [T + 10, 3 * T],
         "output_tokens": [20, 1], "block_ids": [[1, 2], [1, 2, 3]],
         "hashed_tokens": [T + 10, 3 * T]},
        block_size_tokens=T)


def engine_hits(tmp_path, table, B=16, hbm_blocks=64):
    trace = tmp_path / "e.parquet"
    lower_requests(table, trace, block_size_tokens=B, num_gpu_blocks=hbm_blocks)
    cfg = SimConfig(engine="interpreted", check_invariants=True, dram_gb=0,
                    hbm_blocks=hbm_blocks)
    return simulate(trace, "lru", cfg).summary


def test_decode_filled_partial_block_is_not_hit_by_a_full_block_with_the_same_id(tmp_path):
    """vLLM: r1 hits block 0 only (16 tokens): r0's block 1 held 10 prompt tokens + 6
    output tokens, not id 2's full content.  Before: r0's filled block was cached under
    id 2's hash and r1 hit 32 tokens."""
    s = engine_hits(tmp_path, two_turns())
    assert s["hit_tokens"] == 16


def test_identical_prompts_still_share_full_blocks(tmp_path):
    """Two identical 26-token prompts: the second hits the full block 0 only (the partial
    block is never looked up), as in vLLM."""
    t = build_request_table(
        {"arrival_us": [0, 10_000_000_000], "prompt_tokens": [26, 26],
         "output_tokens": [20, 1], "block_ids": [[1, 2], [1, 2]],
         "hashed_tokens": [26, 26]}, block_size_tokens=16)
    assert engine_hits(tmp_path, t)["hit_tokens"] == 16


def test_partial_hash_is_distinct():
    h = np.int64(123456789)
    p = partial_hash(h, 10)
    assert p != h and p != partial_hash(h, 11) and p > 0


def test_cache_stream_partial_tail_matches_only_the_same_partial_block():
    """Cache mode's ``prefix`` variant still caches an identified partial last block, but
    under its partial hash: r0's 10-token block 1 (id 2) is not r1's full block 1 (id 2)."""
    s = stream_from_requests(two_turns(), block_size_tokens=16)
    assert s.tails().tolist() == [10, 0]
    assert s.chain[0] == s.chain[2] and s.chain[1] != s.chain[3]


def test_mooncake_conversation_hits_follow_vllm_rules(shared_traces, tmp_path):
    """The Mooncake conversation trace at 512-token blocks, with a cache that never evicts:
    engine mode's hit tokens, cache mode's ``vllm`` variant and vLLM's rules counted here
    in plain Python (requests in arrival order; a hit is the leading FULL prompt blocks
    already seen, at most ``(prompt - 1) // 512`` of them; partial blocks never enter,
    decode-filled ones hold output no prompt has) are the same number.  And no partial
    block's hash equals a full block's in the lowered file."""
    from kvsim.core.schema import EventKind
    from kvsim.events import read_events
    from kvsim.ingest import read_requests

    path = shared_traces / "mooncake" / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    B = 512
    table = read_requests(path)
    s = stream_from_requests(table, block_size_tokens=B)
    tails = s.tails()
    seen: set[int] = set()
    rule = 0
    for k in range(s.num_requests):
        ch = s.chain[s.offsets[k]:s.offsets[k + 1]]
        full = ch[:len(ch) - 1] if tails[k] > 0 else ch
        n, lim = 0, min((int(s.prompt_tokens[k]) - 1) // B, len(full))
        while n < lim and int(full[n]) in seen:
            n += 1
        rule += n * B
        seen.update(int(x) for x in full)
    trace = tmp_path / "mc.parquet"
    lower_requests(table, trace, block_size_tokens=B)
    _, df = read_events(trace)
    a = df[(df.kind == EventKind.ALLOCATE) & (df.content_hash != 0)]
    partial = a.content_hash[a.num_tokens < B].to_numpy()
    assert len(partial) > 0
    assert not np.isin(partial, a.content_hash[a.num_tokens == B].to_numpy()).any()
    big = dict(hbm_blocks=400_000, dram_gb=0, cxl_gb=0, nvme_gb=0)
    engine = simulate(trace, "lru", SimConfig(**big)).summary["hit_tokens"]
    cache = simulate(trace, "lru", SimConfig(mode="cache", cache_variant="vllm",
                                             **big)).summary["hit_tokens"]
    assert engine == cache == rule == 54_063_104
