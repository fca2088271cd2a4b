"""``kvsim validate``: check kvsim's vLLM-faithful block pool against a real engine's own
KV-cache events.

Data flow: a vLLM KV-event recording (:mod:`kvsim.ingest.vllm_events`) and the requests of
the same run (a request log, or requests reconstructed from the stored blocks' token ids)
-> the requests replayed through :class:`kvsim.memory.reference.KVCacheManager` (the
plain-Python pool, differential-tested against the compiled one), which emits the events
vLLM's ``BlockPool`` would emit -> both event streams compared.

Events are compared per block, in order: a ``BlockStored`` of ``n`` hashes is ``n``
*stored* events, a ``BlockRemoved`` of ``n`` hashes ``n`` *removed* events.  Engine hashes
are mapped to content: a stored block's key is kvsim's chain hash of (its parent's key, its
token ids), so kvsim's and vLLM's blocks compare by the tokens they hold, whatever hash
function vLLM used (``hash``, xxhash or sha256, int or bytes).  A removed hash takes the key
its stored event gave it.  What kvsim emits, per request, is what vLLM's ``BlockPool``
emits: on allocation one ``removed`` per cached block popped from the free queue's head
(``_maybe_evict_cached_block``), then one ``stored`` per new full block
(``cache_full_blocks``); a decode token completing a block stores it.

Request log (JSONL, one request a line, in the order the engine saw them)::

    {"request_id": "r0", "prompt_token_ids": [...], "output_token_ids": [...],
     "start_step": 0, "finish_step": 1}

``output_token_ids`` (optional) fill decode blocks, in the finish step; ``start_step`` /
``finish_step`` (optional, any non-decreasing step counter; default the line index for
both: one request at a time) order the replay: for each step, the requests starting then
are allocated (file order), then those finishing then are filled and freed (file order),
as vLLM's scheduler allocates in ``schedule()`` and frees after the step.  Without a log
:func:`validate` refuses (:data:`NEEDS_REQUEST_LOG`); with ``reconstruct=True`` (API only)
every ``BlockStored`` event becomes a request (its block chain's tokens) that starts and
finishes in its batch: the engine held those blocks longer, so eviction orders may differ
where requests overlapped, and ``validate`` shows where.

Agreement: ``matched / max(engine events, kvsim events)`` where ``matched`` counts
positions at which both streams hold the same kind and block; the first position where
they differ is ``first_divergence`` (after it the streams may stay shifted, so the figure
is a lower bound).  Resident set: after each engine batch, the multiset of blocks each
side holds in its prefix cache (stored minus removed) at the same stream position.  Block
hit rate: the engine's is ``1 - stored / referenced`` full blocks, kvsim's its pool's hit
blocks / referenced, ``referenced`` = the full blocks
of the requests' computed tokens (each is either a hit or stored; clamped at 0 when a
side stored more blocks than the requests reference: then the requests are not that run's).
A request that does not fit the pool is skipped and counted (``alloc_failures``); vLLM
would have kept it waiting.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.ingest.tracefile import as_int, as_int_list, json_lines, parse_json
from kvsim.ingest.vllm_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventRecording,
    hash_label,
    read_kv_events,
    reconstruct_requests,
)
from kvsim.ingest.vllm_hashing import NONE_HASH, hash_block
from kvsim.memory.fast import KIND_EVICTED
from kvsim.memory.reference import KVCacheManager

__all__ = ["Divergence", "LoggedRequest", "StreamEvent", "ValidationResult",
           "read_request_log", "validate"]

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
#: Events shown before a divergence in its context.
CONTEXT_EVENTS = 3


@dataclass(frozen=True)
class StreamEvent:
    """One per-block event of either stream."""

    kind: str                 # stored / removed / cleared
    key: int                  # content key (0 for cleared)
    label: str                # engine hash (engine side) or content key (kvsim side)
    batch: int = -1           # engine batch index (engine side)
    event: int = -1           # event index inside the batch (engine side)
    block_id: int = -1        # kvsim physical block (kvsim side)
    request: str = ""         # request that caused it (kvsim side)

    def describe(self) -> str:
        where = (f"batch {self.batch} event {self.event}" if self.batch >= 0 else
                 f"request {self.request}, kvsim block {self.block_id}")
        if self.kind == CLEARED:
            return f"AllBlocksCleared ({where})"
        return f"{'BlockStored' if self.kind == STORED else 'BlockRemoved'} {self.label} " \
               f"({where})"


@dataclass(frozen=True)
class Divergence:
    """The first stream position where engine and kvsim differ."""

    index: int                       # position in the per-block stream (0-based)
    batch: int                       # engine batch (-1: past the engine's last event)
    event_in_batch: int              # event index in that batch (-1: past the end)
    expected: str                    # what kvsim's pool emits there ("end of stream" if none)
    found: str                       # what the engine recorded there
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ValidationResult:
    """What ``kvsim validate`` reports (``--json`` keys: every field but the streams)."""

    events_path: str
    requests_path: str | None
    requests_source: str            # "log" or "reconstructed"
    num_requests: int
    num_gpu_blocks: int
    block_size_tokens: int
    engine_batches: int
    engine_events: int
    kvsim_events: int
    matched_events: int
    agreement: float
    stored: dict[str, int]
    removed: dict[str, Any]
    resident_steps: int
    resident_steps_equal: int
    resident_agreement: float
    engine_block_hit_rate: float
    kvsim_block_hit_rate: float
    kvsim_token_hit_rate: float
    alloc_failures: int
    skipped_events: dict[str, int]
    first_divergence: Divergence | None
    engine_stream: list[StreamEvent] = field(repr=False, default_factory=list)
    kvsim_stream: list[StreamEvent] = field(repr=False, default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        d = asdict(self)
        d.pop("engine_stream")
        d.pop("kvsim_stream")
        return d


@dataclass(frozen=True)
class LoggedRequest:
    request_id: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    start_step: int
    finish_step: int
    extra: tuple = ()


def read_request_log(path: str | Path) -> list[LoggedRequest]:
    """Read a request log (module docstring) with one-line errors."""
    out: list[LoggedRequest] = []
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        rec = parse_json(path, lineno, text)
        if not isinstance(rec, dict):
            raise KvsimInputError("expected a JSON object", path, loc)
        if "prompt_token_ids" not in rec:
            raise KvsimInputError("missing required field", path, loc, "prompt_token_ids")
        toks = [tuple(as_int_list(rec.get(name, []), path, loc, name))
                for name in ("prompt_token_ids", "output_token_ids")]
        if not toks[0]:
            raise bad_value(path, loc, "prompt_token_ids", "at least one token", [])
        i = len(out)
        start = as_int(rec.get("start_step", i), path, loc, "start_step", 0)
        finish = as_int(rec.get("finish_step", start if "start_step" in rec else i), path, loc,
                        "finish_step", 0)
        if finish < start:
            raise bad_value(path, loc, "finish_step", f"a step >= start_step ({start})",
                            rec.get("finish_step"))
        lora = rec.get("lora_id")
        if lora is not None:
            lora = as_int(lora, path, loc, "lora_id")
        out.append(LoggedRequest(str(rec.get("request_id", i)), toks[0], toks[1], start, finish,
                                 () if lora is None else (lora,)))
    if not out:
        raise KvsimInputError("no request in the request log (empty file)", path)
    return out


def _raw_key(h) -> int:
    """A content key for an engine hash whose tokens are unknown (never equal to a real one
    except by a 64-bit collision)."""
    raw = h if isinstance(h, bytes) else repr(h).encode()
    return int.from_bytes(hashlib.blake2b(b"engine:" + raw, digest_size=8).digest(),
                          "little", signed=True) or 1


def engine_stream(rec: KvEventRecording) -> tuple[list[StreamEvent], list[int]]:
    """The recording as per-block events with content keys, and the stream length after
    each batch."""
    key_of: dict[Any, int] = {}
    out: list[StreamEvent] = []
    ends: list[int] = []
    for b in rec.batches:
        for j, e in enumerate(b.events):
            if isinstance(e, BlockStored):
                if e.parent_block_hash is None:
                    parent = NONE_HASH
                else:
                    parent = key_of.get(e.parent_block_hash)
                    if parent is None:
                        parent = _raw_key(e.parent_block_hash)
                extra = () if e.lora_id is None else (e.lora_id,)
                for i, h in enumerate(e.block_hashes):
                    tokens = e.token_ids[i * e.block_size:(i + 1) * e.block_size]
                    parent = hash_block(parent, tokens, extra if parent == NONE_HASH else ())
                    key_of[h] = parent
                    out.append(StreamEvent(STORED, parent, hash_label(h), b.index, j))
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    out.append(StreamEvent(REMOVED, key_of.get(h, _raw_key(h)), hash_label(h),
                                           b.index, j))
            elif isinstance(e, AllBlocksCleared):
                out.append(StreamEvent(CLEARED, 0, "", b.index, j))
        ends.append(len(out))
    return out, ends


def _keys(tokens: tuple[int, ...], bs: int, extra: tuple) -> list[int]:
    keys, parent = [], NONE_HASH
    for i in range(len(tokens) // bs):
        parent = hash_block(parent, tokens[i * bs:(i + 1) * bs], extra if i == 0 else ())
        keys.append(parent)
    return keys


def kvsim_stream(requests: list[LoggedRequest], bs: int, num_gpu_blocks: int
                 ) -> tuple[list[StreamEvent], KVCacheManager, int, int]:
    """Replay ``requests`` through the reference pool; (events, pool, referenced full
    blocks, allocation failures)."""
    pool = KVCacheManager(num_gpu_blocks, bs)
    out: list[StreamEvent] = []
    seq_of: dict[int, int] = {}
    referenced = failures = 0
    starts: dict[int, list[int]] = {}
    finishes: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        starts.setdefault(r.start_step, []).append(i)
        finishes.setdefault(r.finish_step, []).append(i)
    for step in sorted(starts.keys() | finishes.keys()):
        for i in starts.get(step, ()):
            r = requests[i]
            seq = pool.open_seq()
            keys = _keys(r.prompt, bs, r.extra)
            hashes = keys + ([0] if len(r.prompt) % bs else [])
            res = pool.allocate(seq, hashes, len(r.prompt))
            if res is None:
                failures += 1
                pool.close_seq(seq)
                continue
            seq_of[i] = seq
            referenced += len(keys)
            _emit_alloc(out, res, hashes, r.request_id)
        for i in finishes.get(step, ()):
            if i not in seq_of:
                continue
            r = requests[i]
            seq = seq_of.pop(i)
            fail = [0]
            referenced += _decode(pool, out, seq, r, bs, fail)
            failures += fail[0]
            pool.free(seq)
            pool.close_seq(seq)
    return out, pool, referenced, failures


def _emit_alloc(out: list[StreamEvent], res, hashes: list[int], rid: str) -> None:
    n_hit = res.n_hit
    new = list(range(n_hit, len(hashes)))
    for i in new:
        if res.kinds[i] == KIND_EVICTED:
            out.append(StreamEvent(REMOVED, res.evicted_hashes[i], str(res.evicted_hashes[i]),
                                   block_id=res.blocks[i], request=rid))
    for i in new:
        if hashes[i]:
            out.append(StreamEvent(STORED, hashes[i], str(hashes[i]), block_id=res.blocks[i],
                                   request=rid))


def _decode(pool: KVCacheManager, out: list[StreamEvent], seq: int, r: LoggedRequest, bs: int,
            failures: list[int]) -> int:
    """Fill decode blocks: the KV of prompt + output[:-1] is computed (the last sampled
    token is never fed back).  Returns the full blocks completed during decode."""
    tokens = r.prompt + r.output
    computed = len(tokens) - 1 if r.output else len(r.prompt)
    keys = _keys(tokens[:computed], bs, r.extra)
    done = 0
    for p in range(len(r.prompt), computed):
        b = p // bs
        if p % bs == 0 and b >= len(pool.tables[seq]):
            res = pool.allocate(seq, [0], 0)
            if res is None:
                failures[0] += 1
                return done
            _emit_alloc(out, res, [0], r.request_id)
        if p % bs == bs - 1:
            block = pool.tables[seq][b]
            if block.block_hash == 0:
                pool.cache_block(seq, b, keys[b])
                out.append(StreamEvent(STORED, keys[b], str(keys[b]), block_id=block.block_id,
                                       request=r.request_id))
            done += 1
    return done


def _same(a: StreamEvent, b: StreamEvent) -> bool:
    return a.kind == b.kind and a.key == b.key


def _resident_after(stream: list[StreamEvent], ends: list[int]) -> list[Counter]:
    out, cur, pos = [], Counter(), 0
    for end in ends:
        while pos < min(end, len(stream)):
            e = stream[pos]
            if e.kind == STORED:
                cur[e.key] += 1
            elif e.kind == REMOVED:
                cur[e.key] -= 1
                if cur[e.key] <= 0:
                    del cur[e.key]
            else:
                cur.clear()
            pos += 1
        out.append(+cur)
    return out


#: Why ``validate`` needs the request log (the one-line error without one).
NEEDS_REQUEST_LOG = (
    "expected --requests REQUEST_LOG with --events: a KV-event recording holds only the "
    "token ids of full blocks, so requests rebuilt from it lack their partial last block, "
    "their output and their overlap, and miss the evictions those cause (docs/cli.md, "
    "\"kvsim validate\")")


def validate(events: str | Path, requests: str | Path | None = None, *,
             num_gpu_blocks: int | None = None, data_parallel_rank: int | None = None,
             reconstruct: bool = False) -> ValidationResult:
    """Compare the recording ``events`` with kvsim's pool replaying the same requests.

    ``requests``: the request log of the same run (module docstring); required, because
    the recording cannot give the requests back exactly (:data:`NEEDS_REQUEST_LOG`).
    ``reconstruct=True`` (API only, no log): rebuild them from the stored blocks' token
    ids anyway, one at a time: exact only for requests that ended on a block boundary,
    produced no output block and did not overlap (an approximation, not a check).
    ``num_gpu_blocks``: the engine's pool size, null block included (vLLM's
    ``num_gpu_blocks``); None = large enough that kvsim never evicts."""
    if requests is not None and reconstruct:
        raise KvsimInputError("expected a request log or reconstruct=True, not both", None,
                              None, "reconstruct")
    rec = read_kv_events(events, data_parallel_rank)  # a bad recording is named first
    if requests is None and not reconstruct:
        raise KvsimInputError(NEEDS_REQUEST_LOG, None, None, "--requests")
    bs = rec.block_size_tokens
    if requests is not None:
        reqs = read_request_log(requests)
        source = "log"
    else:
        reqs = [LoggedRequest(f"stored#{k}", r.token_ids, (), r.batch, r.batch,
                              () if r.lora_id is None else (r.lora_id,))
                for k, r in enumerate(reconstruct_requests(rec))]
        source = "reconstructed"
    if bs is None:
        if requests is None:
            raise KvsimInputError("the recording stores no block: nothing to validate",
                                  events, None, "events")
        bs = 16  # vLLM's default block size; the recording names none
    if num_gpu_blocks is None:
        num_gpu_blocks = 1 + sum(-(-(len(r.prompt) + len(r.output)) // bs) for r in reqs)
    elif num_gpu_blocks < 2:
        raise bad_value(None, None, "--num-gpu-blocks", "at least 2 (block 0 is the null "
                        "block)", num_gpu_blocks)
    eng, ends = engine_stream(rec)
    kv, pool, _, failures = kvsim_stream(reqs, bs, num_gpu_blocks)
    referenced = sum((len(r.prompt) + max(len(r.output) - 1, 0)) // bs for r in reqs)
    label = {e.key: e.label for e in eng if e.kind != CLEARED}
    kv = [replace(e, label=label.get(e.key, f"(content key {e.key}, never stored by the "
                                            "engine)")) for e in kv]
    matched = sum(1 for a, b in zip(eng, kv) if _same(a, b))
    first = None
    for i in range(max(len(eng), len(kv))):
        a = eng[i] if i < len(eng) else None
        b = kv[i] if i < len(kv) else None
        if a is None or b is None or not _same(a, b):
            first = Divergence(
                index=i, batch=a.batch if a else -1, event_in_batch=a.event if a else -1,
                expected=b.describe() if b else "end of stream",
                found=a.describe() if a else "end of stream",
                context={"engine_before": [e.describe() for e in eng[max(0, i - CONTEXT_EVENTS):i]],
                         "kvsim_before": [e.describe() for e in kv[max(0, i - CONTEXT_EVENTS):i]],
                         "matched_before": i})
            break
    n = max(len(eng), len(kv))
    es = Counter(e.key for e in eng if e.kind == STORED)
    ks = Counter(e.key for e in kv if e.kind == STORED)
    er = [e.key for e in eng if e.kind == REMOVED]
    kr = [e.key for e in kv if e.kind == REMOVED]
    res_e = _resident_after(eng, ends)
    res_k = _resident_after(kv, ends)
    equal = sum(1 for x, y in zip(res_e, res_k) if x == y)
    stored_e, stored_k = sum(es.values()), sum(ks.values())
    c = pool.counters
    return ValidationResult(
        events_path=str(events), requests_path=None if requests is None else str(requests),
        requests_source=source, num_requests=len(reqs), num_gpu_blocks=num_gpu_blocks,
        block_size_tokens=bs, engine_batches=len(rec.batches), engine_events=len(eng),
        kvsim_events=len(kv), matched_events=matched,
        agreement=round(matched / n, 6) if n else 1.0,
        stored={"engine": stored_e, "kvsim": stored_k,
                "common": sum((es & ks).values())},
        removed={"engine": len(er), "kvsim": len(kr),
                 "common": sum((Counter(er) & Counter(kr)).values()),
                 "same_order": er == kr},
        resident_steps=len(ends), resident_steps_equal=equal,
        resident_agreement=round(equal / len(ends), 6) if ends else 1.0,
        engine_block_hit_rate=round(max(0.0, 1 - stored_e / referenced), 6)
        if referenced else 0.0,
        kvsim_block_hit_rate=round(c["hit_blocks"] / referenced, 6) if referenced else 0.0,
        kvsim_token_hit_rate=round(c["hit_tokens"] / c["query_tokens"], 6)
        if c["query_tokens"] else 0.0,
        alloc_failures=failures, skipped_events=dict(rec.skipped), first_divergence=first,
        engine_stream=eng, kvsim_stream=kv)
