"""bench/record_vllm_kv_events.py against a local ZeroMQ publisher that sends what vLLM's
ZmqEventPublisher sends: (topic, 8-byte big-endian seq, msgpack KVEventBatch)."""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq (the vllm-events extra) is not installed")
msgpack = pytest.importorskip("msgpack")

from kvsim.ingest.vllm_events import BlockRemoved, BlockStored, read_kv_events  # noqa: E402

RECORDER = Path(__file__).resolve().parents[2] / "bench" / "record_vllm_kv_events.py"


def _recorder():
    spec = importlib.util.spec_from_file_location("record_vllm_kv_events", RECORDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BATCHES = [
    [5.0, [["BlockStored", [(1 << 64) - 1], None, [1, 2, 3, 4], 4, None, "GPU"]], 0],
    [5.5, [["BlockRemoved", [(1 << 64) - 1], "GPU"]], 0],
]


@pytest.mark.parametrize("suffix", [".msgpack", ".jsonl"])
def test_recorder_writes_a_readable_file(tmp_path, suffix):
    rec = _recorder()
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    out = tmp_path / ("run" + suffix)
    t = threading.Thread(target=rec.main, args=([
        "--endpoint", f"tcp://127.0.0.1:{port}", "--topic", "kv", "--out", str(out),
        "--max-messages", "3"],), daemon=True)
    t.start()
    try:
        # ZeroMQ's slow joiner: send empty batches until the subscriber got one
        seq = 0
        deadline = time.monotonic() + 30
        while (not out.exists() or out.stat().st_size == 0) and time.monotonic() < deadline:
            pub.send_multipart((b"kv", seq.to_bytes(8, "big"), msgpack.packb([0.0, [], 0])))
            seq += 1
            time.sleep(0.02)
        assert out.exists() and out.stat().st_size > 0, "the recorder received nothing"
        for b in BATCHES:
            pub.send_multipart((b"kv", seq.to_bytes(8, "big"), msgpack.packb(b)))
            seq += 1
        t.join(timeout=30)
        assert not t.is_alive()
    finally:
        pub.close(linger=0)
    got = read_kv_events(out)
    assert len(got.batches) == 3
    assert got.batches[1].events == (BlockStored(((1 << 64) - 1,), None, (1, 2, 3, 4), 4),)
    assert got.batches[2].events == (BlockRemoved(((1 << 64) - 1,)),)
