"""Record a running vLLM's KV-cache events to a file ``kvsim validate`` reads.

Start vLLM with events on, for example::

    vllm serve MODEL --enable-prefix-caching --kv-events-config \\
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv"}'

then::

    python bench/record_vllm_kv_events.py --endpoint tcp://localhost:5557 --topic kv \\
        --out run.msgpack            # or run.jsonl

Each message vLLM publishes is ``(topic, 8-byte big-endian sequence number, msgpack
payload)`` (``ZmqEventPublisher`` in ``vllm/distributed/kv_events.py``).  With a
``.msgpack`` output the payloads are written back to back, byte for byte as received
(msgpack objects delimit themselves); with ``.jsonl`` each payload is decoded and written
as one JSON line (bytes hashes as hex strings).  A gap in the sequence numbers (a dropped
message: ZeroMQ PUB/SUB drops when a subscriber is slow) is reported on stderr; such a
recording cannot validate exactly.  ``kvsim validate`` also needs the run's request log
(``--requests``, docs/cli.md): the events hold only full blocks' tokens.  Stop with Ctrl-C; the file is flushed after each
message.  Needs ``pip install 'kvsim[vllm-events]'`` (pyzmq, msgpack).

This script could not be run against a real vLLM where it was written (no GPU engine
there); kvsim's reader is tested on recordings generated to the documented schema.
"""

from __future__ import annotations

import argparse
import json
import sys


def _jsonable(obj):
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj).hex()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", default="tcp://localhost:5557",
                    help="vLLM's publisher endpoint (connect address)")
    ap.add_argument("--topic", default="", help="topic vLLM publishes on (kv-events-config)")
    ap.add_argument("--out", required=True, help="output file: *.msgpack or *.jsonl")
    ap.add_argument("--max-messages", type=int, default=0, help="stop after N (0 = never)")
    args = ap.parse_args(argv)

    import msgpack
    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(args.endpoint)
    sub.setsockopt_string(zmq.SUBSCRIBE, args.topic)
    as_json = args.out.endswith(".jsonl")
    last_seq = None
    n = 0
    with open(args.out, "w" if as_json else "wb") as fh:
        try:
            while not args.max_messages or n < args.max_messages:
                frames = sub.recv_multipart()
                if len(frames) != 3:
                    print(f"skipping a message of {len(frames)} frames", file=sys.stderr)
                    continue
                _, seq_bytes, payload = frames
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if last_seq is not None and seq != last_seq + 1:
                    print(f"gap: sequence {last_seq} -> {seq} (messages lost)", file=sys.stderr)
                last_seq = seq
                if as_json:
                    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                    fh.write(json.dumps(_jsonable(obj)) + "\n")
                else:
                    fh.write(payload)
                fh.flush()
                n += 1
        except KeyboardInterrupt:
            pass
    print(f"recorded {n} batches to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
