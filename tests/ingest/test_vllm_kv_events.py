"""vLLM KV-event recordings: both msgspec encodings (array_like and map), msgpack and JSONL,
int hashes over the signed 64-bit range and sha256 bytes, GPU-only filtering, data-parallel
ranks, request reconstruction, bad input (one line, exit 2)."""

from __future__ import annotations

import gzip
import json

import msgpack
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.ingest import detect_format, read_requests
from kvsim.ingest.vllm_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    read_kv_events,
    reconstruct_requests,
)
from kvsim.ingest.vllm_hashing import block_hashes
from tests.helpers import assert_one_line_error

runner = CliRunner()
BS = 4
BIG = (1 << 64) - 1          # an unsigned 64-bit hash (xxhash) that int64 cannot hold
NEG = -(1 << 63)             # a signed one (Python hash())
T1, T2, T3 = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]


def array_like_batches():
    """vLLM v0.9's array_like encoding: [ts, [[tag, fields...]...], dp_rank]."""
    return [
        [10.0, [["BlockStored", [BIG, NEG], None, T1 + T2, BS, None, "GPU"]], 0],
        [10.5, [["BlockStored", [7], NEG, T3, BS, None, "GPU"],
                ["BlockStored", [8], None, T3, BS, None, "CPU"]], 0],
        [11.0, [["BlockRemoved", [7], "GPU"], ["BlockRemoved", [BIG], "CPU"],
                ["AllBlocksCleared"]], 0],
    ]


def map_batches():
    """Later vLLM: plain structs, {"type": tag, ...}; sha256 bytes hashes."""
    h = [bytes([i]) * 32 for i in range(1, 4)]
    return [
        {"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": [h[0], h[1]],
                                "parent_block_hash": None, "token_ids": T1 + T2,
                                "block_size": BS, "lora_id": None, "medium": "GPU",
                                "lora_name": None}]},
        {"ts": 2.0, "events": [{"type": "BlockStored", "block_hashes": [h[2]],
                                "parent_block_hash": h[0], "token_ids": T3,
                                "block_size": BS, "lora_id": None, "medium": "GPU",
                                "lora_name": None, "group_idx": 0},
                               {"type": "BlockRemoved", "block_hashes": [h[1]],
                                "medium": "GPU"}]},
    ]


def write_msgpack(path, batches):
    path.write_bytes(b"".join(msgpack.packb(b, use_bin_type=True) for b in batches))
    return path


def _hex(obj):
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, dict):
        return {k: _hex(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex(v) for v in obj]
    return obj


def write_jsonl(path, batches):
    path.write_text("".join(json.dumps(_hex(b)) + "\n" for b in batches))
    return path


def test_array_like_msgpack_exact(tmp_path):
    p = write_msgpack(tmp_path / "run.msgpack", array_like_batches())
    assert detect_format(p) == "vllm-kv-events"
    rec = read_kv_events(p)
    assert rec.encoding == "msgpack" and rec.block_size_tokens == BS
    assert [b.ts for b in rec.batches] == [10.0, 10.5, 11.0]
    assert rec.batches[0].events == (BlockStored((BIG, NEG), None, tuple(T1 + T2), BS),)
    assert rec.batches[1].events == (BlockStored((7,), NEG, tuple(T3), BS),)
    assert rec.batches[2].events == (BlockRemoved((7,)), AllBlocksCleared())
    assert rec.skipped == {"BlockStored medium=CPU group_idx=None": 1,
                           "BlockRemoved medium=CPU group_idx=None": 1}
    reqs = reconstruct_requests(rec)
    assert [r.token_ids for r in reqs] == [tuple(T1 + T2), tuple(T1 + T2 + T3)]
    assert [r.batch for r in reqs] == [0, 1]


def test_map_encoding_msgpack_and_jsonl_agree(tmp_path):
    a = read_kv_events(write_msgpack(tmp_path / "m.msgpack", map_batches()))
    b = read_kv_events(write_jsonl(tmp_path / "m.jsonl", map_batches()))
    assert detect_format(tmp_path / "m.jsonl") == "vllm-kv-events"
    assert [x.events for x in a.batches] == [x.events for x in b.batches]
    h = [bytes([i]) * 32 for i in range(1, 4)]
    assert a.batches[1].events == (BlockStored((h[2],), h[0], tuple(T3), BS),
                                   BlockRemoved((h[1],)))
    # gzip is looked through for both encodings
    gz = tmp_path / "m.msgpack.gz"
    gz.write_bytes(gzip.compress((tmp_path / "m.msgpack").read_bytes()))
    assert [x.events for x in read_kv_events(gz).batches] == [x.events for x in a.batches]
    jl = write_jsonl(tmp_path / "a.jsonl", array_like_batches())
    assert detect_format(jl) == "vllm-kv-events"
    assert [x.events for x in read_kv_events(jl).batches] == [
        x.events for x in read_kv_events(write_msgpack(tmp_path / "a.msgpack",
                                                       array_like_batches())).batches]


def test_requests_reconstructed_for_import(tmp_path):
    p = write_msgpack(tmp_path / "m.msgpack", map_batches())
    t = read_requests(p)
    df = t.df
    assert t.block_size_tokens == BS
    assert df["arrival_us"].tolist() == [0, 1_000_000]
    assert df["prompt_tokens"].tolist() == [8, 8]
    ids = [list(x) for x in df["block_ids"]]
    expect = [[h & 0x7FFFFFFFFFFFFFFF or 1 for h in block_hashes(T1 + T2, BS)],
              [h & 0x7FFFFFFFFFFFFFFF or 1 for h in block_hashes(T1 + T3, BS)]]
    assert ids == expect and ids[0][0] == ids[1][0] and ids[0][1] != ids[1][1]
    out = tmp_path / "ev.jsonl"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out),
                            "--block-size", "4"])
    assert r.exit_code == 0, r.output
    s = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)
    assert (s["requests"], s["prompt_block_refs"], s["prompt_block_reuses"]) == (2, 4, 1)
    assert s["unique_blocks"] == s["allocated_blocks"] - 1
    assert s["prefix_reuse_fraction"] == 0.25


def test_data_parallel_ranks(tmp_path):
    b = array_like_batches()
    b[1][2] = 1
    p = write_msgpack(tmp_path / "dp.msgpack", b)
    r = runner.invoke(app, ["validate", "--events", str(p)])
    assert_one_line_error(r, "dp.msgpack", "--dp-rank", "[0, 1]")
    rec = read_kv_events(p, data_parallel_rank=0)
    assert len(rec.batches) == 2
    assert rec.skipped["batches of other data-parallel ranks"] == 1


@pytest.mark.parametrize("batches,fragments", [
    ([[1.0, [["BlockStored", [1], None, [1, 2, 3], BS, None, "GPU"]]]],
     ("frame 1", "events[0]", "token_ids", "expected block_size x len(block_hashes) = 4")),
    ([[1.0, [["BlockEvicted", [1]]]]], ("frame 1", "events[0]", "type", "BlockStored")),
    ([{"events": []}], ("frame 1", "ts")),
    ([[1.0, [["BlockRemoved", [1.5], "GPU"]]]], ("frame 1", "block_hashes")),
    ([[1.0, [["BlockStored", [1], None, [1, 2, 3, 4], BS, None, "GPU"]]],
      [2.0, [["BlockStored", [2], None, [1, 2, 3, 4, 5, 6, 7, 8], 8, None, "GPU"]]]],
     ("block_size", "[4, 8]")),
    ([], ("empty file",)),
    ([[float("inf"), []]], ("frame 1", "ts", "finite")),
])
def test_bad_recording_one_line(tmp_path, batches, fragments):
    p = write_msgpack(tmp_path / "bad.msgpack", batches)
    r = runner.invoke(app, ["validate", "--events", str(p)])
    assert_one_line_error(r, "bad.msgpack", *fragments)


def test_truncated_and_garbage_msgpack(tmp_path):
    good = write_msgpack(tmp_path / "g.msgpack", array_like_batches()).read_bytes()
    p = tmp_path / "bad.msgpack"
    p.write_bytes(good[:-3])
    assert_one_line_error(runner.invoke(app, ["validate", "--events", str(p)]),
                          "bad.msgpack", "frame 3", "truncated")
    p.write_bytes(b"\x81\x91\x01\x01")  # {[1]: 1}: a map keyed by a list
    assert_one_line_error(runner.invoke(app, ["validate", "--events", str(p)]),
                          "bad.msgpack", "frame 1", "invalid msgpack")
    p.write_bytes(b"\xc1" * 4)  # 0xc1 is never used in msgpack
    assert_one_line_error(runner.invoke(app, ["validate", "--events", str(p)]),
                          "bad.msgpack", "frame 1", "invalid msgpack")


def test_hash_beyond_64_bits_jsonl(tmp_path):
    p = write_jsonl(tmp_path / "big.jsonl", [[1.0, [["BlockRemoved", [1 << 64], "GPU"]]]])
    r = runner.invoke(app, ["validate", "--events", str(p)])
    assert_one_line_error(r, "big.jsonl", "line 1", "block_hashes", "64-bit")


def test_bad_jsonl_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"ts": 1.0, "events": []}) + "\n{not json\n")
    out = tmp_path / "o.parquet"
    r = runner.invoke(app, ["import-request-trace", "--requests", str(p), "--out", str(out),
                            "--format", "vllm-kv-events"])
    assert_one_line_error(r, "bad.jsonl", "line 2", "invalid JSON")
    assert not out.exists()


def test_msgpack_recording_over_msgpacks_buffer_is_streamed(tmp_path, monkeypatch):
    """A recording of 101 frames of ~1 MB (101 MiB decompressed, past msgpack's default
    100 MiB buffer) is read a frame at a time (main fed the whole file to one Unpacker:
    ``BufferFull`` traceback), and a frame over the limit is one line naming it."""
    import struct

    from kvsim.ingest.vllm_events import _msgpack_objects

    def frame(tokens: int) -> bytes:  # [1.0, [["BlockStored", [1], None, [1] * tokens,
        # tokens, None]]], written by hand (packb would build the list)
        return (b"\x92\xcb" + struct.pack(">d", 1.0) + b"\x91\x96"
                + msgpack.packb("BlockStored") + b"\x91\x01\xc0\xdd"
                + struct.pack(">I", tokens) + b"\x01" * tokens + msgpack.packb(tokens)
                + b"\xc0")

    n = 1 << 20
    p = tmp_path / "big.msgpack.gz"
    with gzip.open(p, "wb", compresslevel=1) as fh:
        for _ in range(101):
            fh.write(frame(n))
    frames = 0
    for k, obj in _msgpack_objects(p):
        frames += 1
        assert k == frames and len(obj[1][0][3]) == n
    assert frames == 101 and 101 * len(frame(n)) > 100 * 2**20
    with gzip.open(p, "ab", compresslevel=1) as fh:  # a 102nd frame of 2 MB
        fh.write(frame(2 * n))
    monkeypatch.setenv("KVSIM_LIMIT_MAX_LINE_CHARS", str(3 * n // 2))
    with pytest.raises(KvsimInputError, match=r"frame 102: msgpack frame longer than "
                                              r"1,572,864 bytes"):
        for _ in _msgpack_objects(p):
            pass
