"""``kvsim validate`` against recordings written by hand from vLLM's semantics.

The golden recording is vLLM's own test_prefill scenario (tests/v1/core/
test_prefix_caching.py, block_size 16, 11 blocks) expressed as the events vLLM's
``BlockPool`` publishes, written here from vLLM's code, not from kvsim's pool:

* req0 (3 full blocks + 7 tokens) stores its 3 full blocks: one ``BlockStored`` of 3
  hashes (``cache_full_blocks``); the partial block is not stored;
* req1 and req2 hit the 3 cached blocks and store nothing (their partial blocks are not
  full); free queue after freeing req0, req1 = [5, 4, 6, 7, 8, 9, 10, 3, 2, 1];
* req3 (160 tokens of 99) pops 10 blocks from the head: blocks 3, 2, 1 still carry
  hashes and are evicted in that order: ``BlockRemoved`` h2, h1, h0 (one event per block,
  ``_maybe_evict_cached_block``), then one ``BlockStored`` of its 10 hashes.

Steps without events publish no batch, so the recording has 2 batches.  Hashes are sha256
digests (bytes), as newer vLLM sends.
"""

from __future__ import annotations

import hashlib
import json

import msgpack
import pytest
from typer.testing import CliRunner

from kvsim.analysis.validate import validate
from kvsim.cli import app
from tests.helpers import assert_one_line_error

runner = CliRunner()
BS = 16
COMMON = [i for i in range(3) for _ in range(BS)]


def sha_chain(tokens, bs=BS):
    out, parent = [], b""
    for i in range(len(tokens) // bs):
        parent = hashlib.sha256(parent + repr(tuple(tokens[i * bs:(i + 1) * bs])).encode()
                                ).digest()
        out.append(parent)
    return out


H = sha_chain(COMMON)
H99 = sha_chain([99] * 160)


def stored(hashes, parent, tokens, bs=BS):
    return ["BlockStored", list(hashes), parent, list(tokens), bs, None, "GPU"]


def removed(h):
    return ["BlockRemoved", [h], "GPU"]


def golden_batches():
    return [
        [100.0, [stored(H, None, COMMON)], 0],
        [100.4, [removed(H[2]), removed(H[1]), removed(H[0]),
                 stored(H99, None, [99] * 160)], 0],
    ]


def golden_log():
    return [
        {"request_id": "req0", "prompt_token_ids": COMMON + [3] * 7, "start_step": 0,
         "finish_step": 1},
        {"request_id": "req1", "prompt_token_ids": COMMON + [3] * 5, "start_step": 1,
         "finish_step": 1},
        {"request_id": "req2", "prompt_token_ids": COMMON + [3] * 6, "start_step": 2,
         "finish_step": 2},
        {"request_id": "req3", "prompt_token_ids": [99] * 160, "start_step": 3,
         "finish_step": 3},
    ]


def write(tmp_path, batches, log=None, name="run.msgpack"):
    ev = tmp_path / name
    ev.write_bytes(b"".join(msgpack.packb(b, use_bin_type=True) for b in batches))
    if log is None:
        return ev, None
    rl = tmp_path / "requests.jsonl"
    rl.write_text("".join(json.dumps(r) + "\n" for r in log))
    return ev, rl


def test_golden_full_agreement_exact_blocks(tmp_path):
    ev, rl = write(tmp_path, golden_batches(), golden_log())
    r = validate(ev, rl, num_gpu_blocks=11)
    assert r.agreement == 1.0 and r.first_divergence is None
    assert (r.engine_events, r.kvsim_events, r.matched_events) == (16, 16, 16)
    assert r.stored == {"engine": 13, "kvsim": 13, "common": 13}
    assert r.removed == {"engine": 3, "kvsim": 3, "common": 3, "same_order": True}
    assert (r.resident_steps, r.resident_steps_equal) == (2, 2)
    kv = [(e.kind, e.block_id, e.request) for e in r.kvsim_stream]
    assert kv[:3] == [("stored", b, "req0") for b in (1, 2, 3)]
    # vLLM's golden eviction order and block ids
    assert kv[3:6] == [("removed", b, "req3") for b in (3, 2, 1)]
    assert [b for _, b, _ in kv[6:]] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    # the engine's removed hashes are h2, h1, h0 in that order
    assert [e.label for e in r.engine_stream[3:6]] == [h.hex()[:16] + "..." for h in
                                                       (H[2], H[1], H[0])]
    # 19 full blocks referenced (3+3+3+10), 13 stored: 6 hits (req1, req2 hit 3 each)
    assert r.engine_block_hit_rate == r.kvsim_block_hit_rate == round(6 / 19, 6)
    assert r.kvsim_token_hit_rate == round(96 / (55 + 53 + 54 + 160), 6)


def test_golden_reconstructed_requests_agree(tmp_path):
    """``reconstruct=True`` (API only): exact here, one request at a time, no output."""
    ev, _ = write(tmp_path, golden_batches())
    r = validate(ev, num_gpu_blocks=11, reconstruct=True)
    assert r.requests_source == "reconstructed" and r.num_requests == 2
    assert r.agreement == 1.0 and r.first_divergence is None
    # one request at a time: req3 finds [4, 5, ..., 10, 3, 2, 1] (no overlap of req0/req1)
    assert [e.block_id for e in r.kvsim_stream[3:6]] == [3, 2, 1]


def test_altered_removal_order_first_divergence(tmp_path):
    b = golden_batches()
    b[1][1][0], b[1][1][1] = b[1][1][1], b[1][1][0]   # the engine "evicted" h1 before h2
    ev, rl = write(tmp_path, b, golden_log())
    r = validate(ev, rl, num_gpu_blocks=11)
    d = r.first_divergence
    assert (d.index, d.batch, d.event_in_batch) == (3, 1, 0)
    h1, h2 = H[1].hex()[:16] + "...", H[2].hex()[:16] + "..."
    assert d.expected == f"BlockRemoved {h2} (request req3, kvsim block 3)"
    assert d.found == f"BlockRemoved {h1} (batch 1 event 0)"
    assert d.context["matched_before"] == 3
    assert d.context["engine_before"][-1] == f"BlockStored {H[2].hex()[:16]}... (batch 0 event 0)"
    assert r.agreement == 14 / 16
    assert r.removed == {"engine": 3, "kvsim": 3, "common": 3, "same_order": False}
    assert r.stored["common"] == 13
    assert (r.resident_steps, r.resident_steps_equal) == (2, 2)  # same set in the end


def test_altered_token_first_divergence(tmp_path):
    b = golden_batches()
    toks = [99] * 160
    toks[40] = 98                                     # block 2 of req3 holds other tokens
    b[1][1][3] = stored(H99, None, toks)
    ev, rl = write(tmp_path, b, golden_log())
    r = validate(ev, rl, num_gpu_blocks=11)
    d = r.first_divergence
    assert (d.index, d.batch, d.event_in_batch) == (8, 1, 3)
    assert d.expected.endswith("(request req3, kvsim block 6)")
    assert d.expected.startswith("BlockStored (content key ")
    assert d.found == f"BlockStored {H99[2].hex()[:16]}... (batch 1 event 3)"
    # blocks 2..9 of that chain all differ (their prefix differs)
    assert r.matched_events == 8 and r.stored["common"] == 3 + 2
    assert r.resident_steps_equal == 1


def test_pool_too_small(tmp_path):
    ev, rl = write(tmp_path, golden_batches(), golden_log())
    r = validate(ev, rl, num_gpu_blocks=10)          # 9 usable blocks: req3 needs 10
    assert r.alloc_failures == 1
    d = r.first_divergence
    assert (d.index, d.expected) == (3, "end of stream")
    assert r.agreement == 3 / 16


def test_decode_blocks(tmp_path):
    bs = 4
    ha = sha_chain([1, 2, 3, 4, 5, 6, 7, 8], bs)
    # prefill of 6 tokens stores block 0; decode computes tokens 6, 7 (the last sampled
    # token, 9, is never fed back): block 1 becomes full and is stored
    batches = [[1.0, [stored(ha[:1], None, [1, 2, 3, 4], bs)]],
               [1.2, [stored(ha[1:], ha[0], [5, 6, 7, 8], bs)]]]
    log = [{"prompt_token_ids": [1, 2, 3, 4, 5, 6], "output_token_ids": [7, 8, 9],
            "start_step": 0, "finish_step": 1}]
    ev, rl = write(tmp_path, batches, log)
    r = validate(ev, rl, num_gpu_blocks=5)
    assert r.agreement == 1.0 and r.first_divergence is None
    assert [e.block_id for e in r.kvsim_stream] == [1, 2]
    assert r.engine_block_hit_rate == 0.0


def test_cli_json_and_table(tmp_path):
    b = golden_batches()
    b[1][1][0], b[1][1][1] = b[1][1][1], b[1][1][0]
    ev, rl = write(tmp_path, b, golden_log())
    res = runner.invoke(app, ["validate", "--events", str(ev), "--requests", str(rl),
                              "--num-gpu-blocks", "11", "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.stdout)
    assert j["agreement"] == 0.875
    assert j["first_divergence"]["index"] == 3 and j["first_divergence"]["batch"] == 1
    assert "engine_stream" not in j
    res = runner.invoke(app, ["validate", "--events", str(ev), "--requests", str(rl),
                              "--num-gpu-blocks", "11"])
    assert res.exit_code == 0 and "first divergence at per-block event 3" in res.stdout


@pytest.mark.parametrize("log,fragments", [
    ([{"request_id": "x"}], ("line 1", "prompt_token_ids", "missing")),
    ([{"prompt_token_ids": [1, 2], "start_step": 3, "finish_step": 1}],
     ("line 1", "finish_step", ">= start_step")),
    ([{"prompt_token_ids": "hello"}], ("line 1", "prompt_token_ids", "a list of integers")),
    ([{"prompt_token_ids": []}], ("line 1", "prompt_token_ids", "at least one token")),
    ([{"prompt_token_ids": [1, 1 << 70]}], ("line 1", "prompt_token_ids[1]", "int64")),
])
def test_bad_request_log(tmp_path, log, fragments):
    ev, rl = write(tmp_path, golden_batches(), log)
    res = runner.invoke(app, ["validate", "--events", str(ev), "--requests", str(rl)])
    assert_one_line_error(res, "requests.jsonl", *fragments)


def test_bad_option(tmp_path):
    ev, _ = write(tmp_path, golden_batches())
    res = runner.invoke(app, ["validate", "--events", str(ev), "--num-gpu-blocks", "1"])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_round_trip_random_workload(tmp_path):
    """kvsim's own event stream, written as a vLLM recording (int hashes in the map
    encoding, one BlockStored per block), validates at 1.0: the engine-side parsing and
    content keying agree with the replay on evictions, re-stores and decode blocks.  (A
    self-consistency check; the independent check is the golden recording above.)"""
    import random

    from kvsim.analysis.validate import LoggedRequest, kvsim_stream
    from kvsim.ingest.vllm_hashing import NONE_HASH, hash_block

    rng = random.Random(7)
    bs = 4
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 13))] for _ in range(4)]
    log, reqs = [], []
    for i in range(40):
        prompt = list(rng.choice(prefixes)) + [rng.randrange(50) for _ in
                                                range(rng.randrange(1, 9))]
        output = [rng.randrange(50) for _ in range(rng.randrange(0, 7))]
        start = i
        finish = i + rng.randrange(0, 3)
        log.append({"request_id": f"q{i}", "prompt_token_ids": prompt,
                    "output_token_ids": output, "start_step": start, "finish_step": finish})
        reqs.append(LoggedRequest(f"q{i}", tuple(prompt), tuple(output), start, finish))
    node = {}
    for r in reqs:
        toks = r.prompt + r.output
        parent = NONE_HASH
        for k in range(len(toks) // bs):
            block = toks[k * bs:(k + 1) * bs]
            key = hash_block(parent, block)
            node[key] = (parent, list(block))
            parent = key
    stream, _, _, _ = kvsim_stream(reqs, bs, 12)
    assert any(e.kind == "removed" for e in stream)  # the small pool evicts
    def eng(key):
        return (key & ((1 << 64) - 1)) ^ 0xA5A5  # any injective relabelling
    batches = []
    for e in stream:
        if e.kind == "stored":
            parent, block = node[e.key]
            ev = {"type": "BlockStored", "block_hashes": [eng(e.key)],
                  "parent_block_hash": None if parent == NONE_HASH else eng(parent),
                  "token_ids": block, "block_size": bs, "lora_id": None, "medium": "GPU"}
        else:
            ev = {"type": "BlockRemoved", "block_hashes": [eng(e.key)], "medium": "GPU"}
        batches.append({"ts": float(len(batches)), "events": [ev]})
    ev_path, rl = write(tmp_path, batches, log)
    r = validate(ev_path, rl, num_gpu_blocks=12)
    assert r.agreement == 1.0 and r.first_divergence is None
    assert r.resident_steps_equal == r.resident_steps == len(batches)


def test_without_request_log_refuses(tmp_path):
    """The recording holds only full blocks' tokens: requests rebuilt from it lack their
    partial last block (req0's 7 tokens here) and miss the evictions it causes, so
    validate needs the request log: one line, exit 2, naming --requests."""
    from kvsim.core.errors import KvsimInputError

    ev, _ = write(tmp_path, golden_batches())
    res = runner.invoke(app, ["validate", "--events", str(ev), "--num-gpu-blocks", "11"])
    line = assert_one_line_error(res, "--requests", "partial last block")
    assert "Traceback" not in line
    with pytest.raises(KvsimInputError, match="--requests"):
        validate(ev, num_gpu_blocks=11)
