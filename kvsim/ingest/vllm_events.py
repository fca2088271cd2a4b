"""Reader for recorded vLLM KV-cache events (the ``KVEventBatch`` stream of ``--kv-events-config``).

vLLM publishes, once per engine step that changed its prefix cache, a ``KVEventBatch``
over ZeroMQ (``vllm/distributed/kv_events.py``): ``(topic, 8-byte big-endian seq,
msgpack payload)``.  The payload is a msgspec struct:

* ``KVEventBatch``: ``ts`` (float, seconds), ``events`` (list), ``data_parallel_rank``
  (int or None; absent in older versions);
* ``BlockStored``: ``block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
  kv_cache_spec_sliding_window`` (fields after ``lora_id`` were added over time and are
  omitted when at their default);
* ``BlockRemoved``: ``block_hashes, medium, group_idx``;
* ``AllBlocksCleared``: no field.

Two encodings exist.  vLLM v0.9 (commit b4e69e0a of ``kv_events.py``) declares the structs
``array_like=True, tag=True``: a batch is ``[ts, [event, ...], dp_rank?]`` and an event
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, ...]``
(the tag first, then the fields in declaration order).  Later versions (commit 0181ea31)
drop ``array_like``: a batch is ``{"ts": .., "events": [..], "data_parallel_rank": ..}`` and
an event ``{"type": "BlockStored", "block_hashes": [..], ...}`` (msgspec's default tag
field).  Both are read, from msgpack (payloads written back to back, as
``bench/record_vllm_kv_events.py`` records them) or from JSONL (one batch a line, either
form; hashes that are bytes in msgpack are hex strings in JSON).

Block hashes are 64-bit integers in older vLLM (``hash()``: signed; ``xxhash``: unsigned)
and sha256 digests (``bytes``) in newer ones (``ExternalBlockHash = bytes | int``).  They
are kept as Python ``int`` / ``bytes``, never cast to a fixed-width type, so nothing
overflows; :func:`hash_label` renders one for messages.

Only events for the GPU pool are kept (``medium`` None or ``"GPU"``, ``group_idx`` None or
0); others (CPU offloading tiers, other KV-cache groups of hybrid models) are counted in
``KvEventRecording.skipped``.

:func:`read_vllm_events_requests` reconstructs requests from the stored blocks' token ids
(one request per ``BlockStored`` event: the tokens of its block chain, from the root to
its last block) for ``kvsim import-request-trace``; ``kvsim validate``
(:mod:`kvsim.analysis.validate`) replays them or a request log through kvsim's pool.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import strip_compression_suffix
from kvsim.ingest.detect import MSGPACK_SUFFIXES
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import as_int_list, json_lines, parse_json

HashKey = int | bytes

#: Field order of each event in the array_like encoding (after the tag), vLLM's
#: ``kv_events.py`` declaration order.
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
BATCH_FIELDS = ("ts", "events", "data_parallel_rank")
#: The medium of vLLM's own GPU block pool (``MEDIUM_GPU``).
MEDIUM_GPU = "GPU"


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[HashKey, ...]
    parent_block_hash: HashKey | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[HashKey, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    """One published batch: its position in the file (``where``, e.g. ``line 3``)."""

    index: int
    ts: float
    data_parallel_rank: int | None
    events: tuple[KvEvent, ...]
    where: str


@dataclass
class KvEventRecording:
    """A whole recording: GPU-pool batches in file order, and what was left out."""

    path: str
    batches: list[EventBatch]
    block_size_tokens: int | None
    skipped: dict[str, int] = field(default_factory=dict)
    encoding: str = ""


def hash_label(h: HashKey | None) -> str:
    """A short printable form of an engine hash (bytes as hex)."""
    if h is None:
        return "None"
    if isinstance(h, bytes):
        return h.hex()[:16] + ("..." if len(h) > 8 else "")
    return str(h)


def _hash(value: Any, path, loc: str, fld: str) -> HashKey:
    if isinstance(value, bool):
        raise bad_value(path, loc, fld, "a block hash (integer or bytes)", value)
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise bad_value(path, loc, fld, "a 64-bit block hash", value)
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    raise bad_value(path, loc, fld, "a block hash (integer, bytes or hex string)", value)


def _fields(ev: Any, names: tuple[str, ...], path, loc: str) -> dict[str, Any]:
    if isinstance(ev, dict):
        return ev
    return dict(zip(names, ev[1:]))


def _int(value: Any, path, loc: str, fld: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (
            minimum is not None and value < minimum):
        raise bad_value(path, loc, fld, "an integer" + (f" >= {minimum}" if minimum is not None
                                                        else ""), value)
    return value


def _event(ev: Any, path, loc: str, skipped: dict[str, int]) -> KvEvent | None:
    if isinstance(ev, dict):
        tag = ev.get("type")
    elif isinstance(ev, list) and ev:
        tag = ev[0]
    else:
        raise bad_value(path, loc, None, "an event (a tagged array or an object with 'type')",
                        ev)
    if tag not in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        raise bad_value(path, loc, "type", "BlockStored, BlockRemoved or AllBlocksCleared", tag)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    f = _fields(ev, STORED_FIELDS if tag == "BlockStored" else REMOVED_FIELDS, path, loc)
    medium, group = f.get("medium"), f.get("group_idx")
    if medium not in (None, MEDIUM_GPU) or group not in (None, 0):
        key = f"{tag} medium={medium} group_idx={group}"
        skipped[key] = skipped.get(key, 0) + 1
        return None
    hashes = f.get("block_hashes")
    if not isinstance(hashes, list):
        raise bad_value(path, loc, "block_hashes", "a list of block hashes", hashes)
    hs = tuple(_hash(h, path, loc, "block_hashes") for h in hashes)
    if tag == "BlockRemoved":
        return BlockRemoved(hs)
    for req in ("parent_block_hash", "token_ids", "block_size"):
        if req not in f:
            raise KvsimInputError("missing required field", path, loc, req)
    bs = _int(f["block_size"], path, loc, "block_size", 1)
    tokens = as_int_list(f["token_ids"], path, loc, "token_ids")
    if tokens and min(tokens) < 0:  # a vocabulary index (main read -5 as a token)
        i = next(i for i, t in enumerate(tokens) if t < 0)
        raise bad_value(path, loc, f"token_ids[{i}]", "a token id >= 0", tokens[i])
    if len(tokens) != bs * len(hs):
        raise KvsimInputError(f"expected block_size x len(block_hashes) = {bs * len(hs)} token "
                              f"ids, got {len(tokens)}", path, loc, "token_ids")
    parent = f["parent_block_hash"]
    parent = None if parent is None else _hash(parent, path, loc, "parent_block_hash")
    # block i's parent is block i-1 (the first block's: parent_block_hash); a block that is
    # its own parent has no root (main read it as a chain)
    for i, (h, up) in enumerate(zip(hs, (parent, *hs[:-1]))):
        if h == up:
            raise bad_value(path, loc, "parent_block_hash" if i == 0 else
                            f"block_hashes[{i}]", "a block other than its parent "
                            "(a block is not its own parent)", hash_label(h))
    lora = f.get("lora_id")
    if lora is not None:
        lora = _int(lora, path, loc, "lora_id")
    return BlockStored(hs, parent, tuple(tokens), bs, lora, f.get("lora_name"))


def _batch(obj: Any, index: int, path, where: str, skipped: dict[str, int]) -> EventBatch:
    if isinstance(obj, dict):
        b = obj
    elif isinstance(obj, list):
        b = dict(zip(BATCH_FIELDS, obj))
    else:
        raise bad_value(path, where, None, "a KVEventBatch ([ts, events, dp_rank] or "
                        "{ts, events, data_parallel_rank})", obj)
    if "ts" not in b or "events" not in b:
        raise KvsimInputError("expected a KVEventBatch with ts and events", path, where,
                              "ts" if "ts" not in b else "events")
    ts = b["ts"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise bad_value(path, where, "ts", "a finite time in seconds", ts)
    if not isinstance(b["events"], list):
        raise bad_value(path, where, "events", "a list of events", b["events"])
    rank = b.get("data_parallel_rank")
    if rank is not None:
        rank = _int(rank, path, where, "data_parallel_rank", 0)
    events = []
    for i, ev in enumerate(b["events"]):
        e = _event(ev, path, f"{where}: events[{i}]", skipped)
        if e is not None:
            events.append(e)
    return EventBatch(index, float(ts), rank, tuple(events), where)


#: Bytes read (after decompression) per chunk of a msgpack recording.
MSGPACK_CHUNK_BYTES = 1 << 16


def _msgpack_chunks(path: Path) -> Iterator[bytes]:
    """The bytes of a msgpack recording (``.gz`` / ``.zst`` decompressed), a chunk at a
    time; a decompression error is one line naming the file."""
    if path.suffix == ".gz":
        opener, kind = (lambda: gzip.open(path, "rb")), "gzip"
    elif path.suffix == ".zst":
        import zstandard

        def opener():
            return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
        kind = "zstd"
    else:
        opener, kind = (lambda: open(path, "rb")), ""
    with opener() as fh:
        while True:
            try:
                chunk = fh.read(MSGPACK_CHUNK_BYTES)
            except (OSError, EOFError, ValueError) as exc:
                if not kind:
                    raise
                raise KvsimInputError(f"not a readable {kind} file ({exc})", path) from None
            except Exception as exc:  # zstandard.ZstdError
                if type(exc).__module__.startswith("zstandard"):
                    raise KvsimInputError(f"not a readable {kind} file ({exc})", path) \
                        from None
                raise
            if not chunk:
                return
            yield chunk


def _msgpack_objects(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based frame number, object) of every msgpack object written back to back, read
    a chunk at a time: at most one frame (one ``KVEventBatch``) and one chunk are held, and
    a frame is held to the ``max_line_chars`` limit (in bytes), like a line of a JSONL
    recording (a recording was read whole: a 2 GB frame in a small ``.gz`` was 2 GB)."""
    try:
        import msgpack
    except ImportError:  # pragma: no cover - msgpack comes with the vllm-events extra
        raise KvsimInputError("reading msgpack recordings needs the msgpack package "
                              "(pip install 'kvsim[vllm-events]')", path) from None
    from kvsim.core.limits import get_limits

    cap = get_limits().max_line_chars

    def too_long(frame: int) -> KvsimInputError:
        return KvsimInputError(f"msgpack frame longer than {cap:,} bytes (kvsim limit "
                               "max_line_chars; raise it with KVSIM_LIMIT_MAX_LINE_CHARS)",
                               path, f"frame {frame}")

    # the buffer holds the frame being read and one chunk; msgpack's own per-string /
    # per-array bounds follow it (an array of n items is at least n bytes)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                max_buffer_size=cap + MSGPACK_CHUNK_BYTES)
    frame = fed = done = 0
    for chunk in _msgpack_chunks(path):
        fed += len(chunk)
        try:
            unpacker.feed(chunk)
            for obj in unpacker:
                frame += 1
                end = unpacker.tell()
                if end - done > cap:
                    raise too_long(frame)
                done = end
                yield frame, obj
        except msgpack.BufferFull:
            raise too_long(frame + 1) from None
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
                UnicodeDecodeError, TypeError) as exc:  # TypeError: a map key that is a list
            if isinstance(exc, ValueError) and "exceeds max_" in str(exc):
                raise too_long(frame + 1) from None  # a string / array over the buffer
            raise KvsimInputError(f"invalid msgpack ({type(exc).__name__})", path,
                                  f"frame {frame + 1}") from None
        if fed - done > cap:  # an incomplete frame already longer than the limit
            raise too_long(frame + 1)
    if done != fed:
        raise KvsimInputError(f"truncated: {fed - done} bytes after the "
                              "last complete frame", path, f"frame {frame + 1}")


def is_msgpack_path(path: str | Path) -> bool:
    return strip_compression_suffix(path).lower().endswith(MSGPACK_SUFFIXES)


def read_kv_events(path: str | Path, data_parallel_rank: int | None = None
                   ) -> KvEventRecording:
    """Read a recording (msgpack or JSONL) into a :class:`KvEventRecording`.

    With several data-parallel ranks in one file, ``data_parallel_rank`` picks one (each
    rank has its own block pool); it is required then."""
    path = Path(path)
    skipped: dict[str, int] = {}
    batches: list[EventBatch] = []
    if is_msgpack_path(path):
        encoding = "msgpack"
        source = ((f"frame {n}", obj) for n, obj in _msgpack_objects(path))
    else:
        encoding = "jsonl"
        source = ((f"line {n}", parse_json(path, n, text)) for n, text in json_lines(path))
    for where, obj in source:
        batches.append(_batch(obj, len(batches), path, where, skipped))
    if not batches:
        raise KvsimInputError("no KVEventBatch in the recording (empty file)", path)
    ranks = sorted({b.data_parallel_rank for b in batches if b.data_parallel_rank is not None})
    if data_parallel_rank is None and len(ranks) > 1:
        raise KvsimInputError(f"the recording holds data-parallel ranks {ranks}: choose one "
                              "(each rank has its own pool)", path, None, "--dp-rank")
    if data_parallel_rank is not None:
        if data_parallel_rank not in ranks:
            raise bad_value(path, None, "--dp-rank", "one of " + str(ranks),
                            data_parallel_rank)
        dropped = sum(1 for b in batches if b.data_parallel_rank not in (None,
                                                                        data_parallel_rank))
        if dropped:
            skipped["batches of other data-parallel ranks"] = dropped
        batches = [b for b in batches if b.data_parallel_rank in (None, data_parallel_rank)]
    sizes = {e.block_size for b in batches for e in b.events if isinstance(e, BlockStored)}
    if len(sizes) > 1:
        raise KvsimInputError(f"expected one block_size, the recording has {sorted(sizes)}",
                              path, None, "block_size")
    return KvEventRecording(str(path), batches, sizes.pop() if sizes else None, skipped,
                            encoding)


@dataclass(frozen=True)
class ReconstructedRequest:
    """A request implied by one BlockStored event: the token chain of its blocks."""

    batch: int
    ts: float
    token_ids: tuple[int, ...]
    lora_id: int | None


def reconstruct_requests(rec: KvEventRecording) -> list[ReconstructedRequest]:
    """One request per ``BlockStored`` event: its prompt = the tokens of every block from the
    chain's root (or the first block whose parent the recording never stored) to the
    event's last block.  Several events of one real request (chunked prefill, decode
    blocks) become several requests; a request that hit every block stored nothing and is
    invisible."""
    node: dict[HashKey, tuple[HashKey | None, tuple[int, ...]]] = {}  # hash -> (parent, tokens)
    out: list[ReconstructedRequest] = []
    for b in rec.batches:
        for e in b.events:
            if not isinstance(e, BlockStored):
                continue
            parts: list[tuple[int, ...]] = []
            cur, seen = e.parent_block_hash, 0
            while cur is not None and cur in node and seen <= len(node):
                cur, toks = node[cur][0], node[cur][1]
                parts.append(toks)
                seen += 1
            parts.reverse()
            parent = e.parent_block_hash
            for i, h in enumerate(e.block_hashes):
                toks = e.token_ids[i * e.block_size:(i + 1) * e.block_size]
                node.setdefault(h, (parent, toks))
                parts.append(toks)
                parent = h
            out.append(ReconstructedRequest(b.index, b.ts, tuple(t for p in parts for t in p),
                                            e.lora_id))
    return out


def read_vllm_events_requests(path: str | Path, data_parallel_rank: int | None = None
                              ) -> RequestTable:
    """Requests reconstructed from a recording (:func:`reconstruct_requests`) as a Request
    table: native block = the engine's block size, block ids = content chain hashes of the
    token ids, arrival = the batch's ``ts`` relative to the first batch, one output token."""
    from kvsim.ingest.vllm_hashing import block_hashes

    rec = read_kv_events(path, data_parallel_rank)
    reqs = reconstruct_requests(rec)
    bs = rec.block_size_tokens or 16
    t0 = min((r.ts for r in reqs), default=0.0)
    ids = [[h & 0x7FFFFFFFFFFFFFFF or 1 for h in
            block_hashes(list(r.token_ids), bs, () if r.lora_id is None else (r.lora_id,))]
           for r in reqs]
    return build_request_table(
        {"arrival_us": [int(round((r.ts - t0) * 1e6)) for r in reqs],
         "prompt_tokens": [len(r.token_ids) for r in reqs],
         "output_tokens": [1] * len(reqs), "block_ids": ids,
         "hashed_tokens": [len(r.token_ids) for r in reqs]},
        block_size_tokens=bs, path=str(path),
        source={"format": "vllm-kv-events", "file": Path(path).name,
                "encoding": rec.encoding, "skipped_events": rec.skipped})
