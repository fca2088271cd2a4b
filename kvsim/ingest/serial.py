"""Cache-mode lowering: requests one at a time, in arrival order, as a serialized event stream.

Cache mode is the semantics of the Mooncake paper's and kvcache-simulator's hit-rate
studies: each request's prompt is looked up, then inserted, before the next request
arrives; no concurrency, no engine timing.  kvsim runs it through the same tiered replay
(pool, tiers, policy hooks) as engine mode by lowering the requests to a stream in which
that is what happens:

* one ``STEP`` per request (step ``k`` = the request's rank in arrival order, time = its
  arrival), then ``ARRIVE``, the ``ALLOCATE`` rows of its prompt's **identified full
  blocks** (the chain of content hashes up to the first block that is partial or has no
  identity: only those can be shared, docs/memory-model.md), then ``FREE``;
* ``prefix`` variant: one request = one lookup of the whole chain, which the pool stops at
  the first missing block (vLLM, kvcache-simulator);
* ``block`` variant: every block of the chain is its own one-block request (a *pseudo
  request*), so every resident block hits, each block one access: the pool then sees the
  same key stream as the single-tier simulator (:mod:`kvsim.sim.cachesim`).

The ``ARRIVE`` row's ``num_tokens`` is the identified tokens **plus one**: the pool's
lookup (vLLM) never serves a prompt's last token (it is recomputed for its logits); cache
mode has no such rule, and one extra token lifts it.  The replay then reports each
request's real prompt tokens (:class:`CacheStream` keeps them), never this number.

Sources: an event file (any lowering: the prompt is the request's ``PREFILL``
``ALLOCATE`` rows, first occurrence of each block index, up to ``ceil(prompt / block)``
blocks) or a Request table (hashed exactly as :mod:`kvsim.ingest.lower` hashes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.errors import KvsimInputError
from kvsim.schema import EventHeader, EventKind, Phase

VARIANTS = ("prefix", "block")


@dataclass
class CacheStream:
    """Requests in arrival order with their prompt chains (CSR), the input of cache mode.

    ``request_id[k]``: id of the k-th request to arrive; ``prompt_tokens[k]``: its prompt;
    ``chain[offsets[k]:offsets[k + 1]]``: content hashes of its identified full prompt
    blocks, in order.  ``block_size_tokens`` and ``block_bytes`` come from the source."""

    request_id: np.ndarray
    arrival_us: np.ndarray
    prompt_tokens: np.ndarray
    offsets: np.ndarray
    chain: np.ndarray
    block_size_tokens: int
    block_bytes: int
    header: EventHeader

    @property
    def num_requests(self) -> int:
        return int(len(self.request_id))

    def key_stream(self) -> np.ndarray:
        """Every chain block of every request in order: the single-tier key stream."""
        return self.chain.copy()


def stream_from_events(path: str | Path, batch_rows: int = 1 << 20) -> CacheStream:
    """The cache-mode requests of an event file (see the module docstring)."""
    from kvsim.events import open_events

    a_req, a_time, a_tok = [], [], []
    b_req, b_bi, b_hash, b_tok, b_time = [], [], [], [], []
    with open_events(path) as reader:
        header = reader.header
        for cols in reader.batches(batch_rows):
            kind = cols["kind"]
            m = kind == EventKind.ARRIVE
            a_req.append(cols["request_id"][m]); a_time.append(cols["time_us"][m])
            a_tok.append(cols["num_tokens"][m])
            m = (kind == EventKind.ALLOCATE) & (cols["phase"] == Phase.PREFILL)
            b_req.append(cols["request_id"][m]); b_bi.append(cols["block_index"][m])
            b_hash.append(cols["content_hash"][m]); b_tok.append(cols["num_tokens"][m])
            b_time.append(cols["time_us"][m])
    bs = int(header.block_size_tokens)
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    a_req, a_time, a_tok = cat(a_req), cat(a_time), cat(a_tok)
    b_req, b_bi, b_hash, b_tok, b_time = cat(b_req), cat(b_bi), cat(b_hash), cat(b_tok), \
        cat(b_time)
    # first ALLOCATE of each (request, block index): a preempted rerun repeats rows
    order = np.lexsort((np.arange(len(b_req)), b_bi, b_req))
    b_req, b_bi, b_hash, b_tok, b_time = (x[order] for x in (b_req, b_bi, b_hash, b_tok,
                                                              b_time))
    first = np.ones(len(b_req), bool)
    first[1:] = (b_req[1:] != b_req[:-1]) | (b_bi[1:] != b_bi[:-1])
    b_req, b_bi, b_hash, b_tok, b_time = (x[first] for x in (b_req, b_bi, b_hash, b_tok,
                                                              b_time))
    ids = np.union1d(a_req, b_req)
    n = len(ids)
    pos_a = np.searchsorted(ids, a_req)
    prompt = np.zeros(n, np.int64)
    arrival = np.full(n, np.iinfo(np.int64).max, np.int64)
    has_arrive = np.zeros(n, bool)
    prompt[pos_a] = a_tok
    arrival[pos_a] = a_time
    has_arrive[pos_a] = True
    pos_b = np.searchsorted(ids, b_req)
    no_arr = ~has_arrive[pos_b]
    np.add.at(prompt, pos_b[no_arr], b_tok[no_arr])
    np.minimum.at(arrival, pos_b[no_arr], b_time[no_arr])
    # the chain: block index 0, 1, 2, ... while full, hashed and within the prompt
    nb_prompt = (prompt + bs - 1) // bs
    ok = (b_tok == bs) & (b_hash != 0) & (b_bi < nb_prompt[pos_b])
    starts = np.searchsorted(b_req, ids)
    rank = np.arange(len(b_req)) - starts[pos_b]
    ok &= b_bi == rank
    # a broken chain stops it: keep a row only if every earlier row of its request is ok
    bad_before = np.zeros(len(b_req), np.int64)
    cum = np.cumsum(~ok)
    bad_before = cum - np.where(starts[pos_b] > 0, cum[np.maximum(starts[pos_b] - 1, 0)], 0)
    keep = ok & (bad_before == 0)
    length = np.bincount(pos_b[keep], minlength=n).astype(np.int64)
    by_arrival = np.lexsort((ids, arrival))
    chains = b_hash[keep]
    owner = pos_b[keep]
    seg = np.zeros(n + 1, np.int64)
    np.cumsum(length, out=seg[1:])
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(length[by_arrival], out=offsets[1:])
    chain = np.concatenate([chains[seg[i]:seg[i + 1]] for i in by_arrival]) if n else \
        np.zeros(0, np.int64)
    del owner
    block_bytes = int(header.kv_bytes_per_token) * bs
    return CacheStream(ids[by_arrival], arrival[by_arrival], prompt[by_arrival], offsets,
                       chain.astype(np.int64), bs, block_bytes, header)


def stream_from_requests(table, block_size_tokens: int = 16, kv_bytes_per_token: int = 0,
                         model: str = "") -> CacheStream:
    """The cache-mode requests of a :class:`kvsim.ingest.RequestTable`, hashed as the
    engine lowering hashes them (:func:`kvsim.ingest.scheduler._prompt_hashes`)."""
    from kvsim.ingest.hashing import root_hash
    from kvsim.ingest.scheduler import _prompt_hashes

    df = table.df
    B = int(block_size_tokens)
    if B < 1:
        raise KvsimInputError(f"expected an integer >= 1, got {B}", None, None,
                              "block_size_tokens")
    T = int(table.block_size_tokens)
    prompt = df["prompt_tokens"].to_numpy(np.int64)
    hashed = df["hashed_tokens"].to_numpy(np.int64)
    off, ids = table.flat_block_ids()
    root = root_hash(0)
    n = len(prompt)
    nb = (prompt + B - 1) // B
    hb = np.zeros(max(int(nb.max()) if n else 1, 1), np.int64)
    chains, lengths = [], np.zeros(n, np.int64)
    for c in range(n):
        _prompt_hashes(c, int(nb[c]), B, T, prompt, hashed, off, ids, root, hb)
        k = 0
        while k < nb[c] and (k + 1) * B <= prompt[c] and hb[k] != 0:
            k += 1
        chains.append(hb[:k].copy())
        lengths[c] = k
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    chain = np.concatenate(chains) if n else np.zeros(0, np.int64)
    header = EventHeader(block_size_tokens=B, kv_bytes_per_token=int(kv_bytes_per_token),
                         model=model, source={"cache_mode_from": "request table"})
    return CacheStream(df["request_id"].to_numpy(np.int64),
                       df["arrival_us"].to_numpy(np.int64), prompt, offsets,
                       chain.astype(np.int64), B, int(kv_bytes_per_token) * B, header)


@dataclass
class CacheLowering:
    """A written cache-mode event file and how its (pseudo) requests map back.

    ``orig_of[p]``: the source request of event-file request ``p``; ``first_pseudo[k]``:
    the first event-file request of the k-th source request in arrival order (the block
    variant makes one per chain block; the prefix variant one per request)."""

    path: Path
    variant: str
    stream: CacheStream
    orig_of: np.ndarray
    first_pseudo: np.ndarray


def write_cache_events(stream: CacheStream, out_path: str | Path,
                       variant: str = "prefix") -> CacheLowering:
    """Write ``stream`` as a cache-mode event file (module docstring)."""
    from kvsim.events import EventWriter

    if variant not in VARIANTS:
        raise KvsimInputError(f"expected one of {', '.join(VARIANTS)}, got {variant!r}",
                              None, None, "cache_variant")
    bs = stream.block_size_tokens
    n = stream.num_requests
    lengths = np.diff(stream.offsets)
    size = max(int(stream.block_bytes), 1)
    step, time_us, kind, req, bi, h, ntok, nbytes = ([] for _ in range(8))
    if variant == "prefix":
        orig_of = stream.request_id.copy()
        first_pseudo = np.arange(n, dtype=np.int64)
        for k in range(n):
            r = int(stream.request_id[k])
            m = int(lengths[k])
            rows = m + 3
            step.append(np.full(rows, k)); time_us.append(np.full(rows, stream.arrival_us[k]))
            kind.append(np.array([EventKind.STEP, EventKind.ARRIVE] + [EventKind.ALLOCATE] * m
                                 + [EventKind.FREE]))
            req.append(np.array([-1] + [r] * (m + 2)))
            bi.append(np.concatenate(([-1, -1], np.arange(m), [-1])))
            h.append(np.concatenate(([0, 0], stream.chain[stream.offsets[k]:stream.offsets[k + 1]],
                                     [0])))
            ntok.append(np.array([0, m * bs + 1] + [bs] * m + [0]))
            nbytes.append(np.array([0, 0] + [size] * m + [0]))
    else:
        total = int(lengths.sum())
        orig_of = np.repeat(stream.request_id, lengths)
        first_pseudo = stream.offsets[:-1].copy()
        p = 0
        for k in range(n):
            m = int(lengths[k])
            rows = 1 + 3 * m
            step.append(np.full(rows, k)); time_us.append(np.full(rows, stream.arrival_us[k]))
            kind.append(np.array([EventKind.STEP] + [EventKind.ARRIVE, EventKind.ALLOCATE,
                                                     EventKind.FREE] * m))
            pseudo = np.repeat(np.arange(p, p + m), 3)
            req.append(np.concatenate(([-1], pseudo)))
            bi.append(np.concatenate(([-1], np.tile([-1, 0, -1], m))))
            hk = stream.chain[stream.offsets[k]:stream.offsets[k + 1]]
            hh = np.zeros(3 * m, np.int64)
            hh[1::3] = hk
            h.append(np.concatenate(([0], hh)))
            nt = np.tile([bs + 1, bs, 0], m)
            ntok.append(np.concatenate(([0], nt)))
            nbytes.append(np.concatenate(([0], np.tile([0, size, 0], m))))
            p += m
        assert p == total
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    header = EventHeader(block_size_tokens=bs,
                         kv_bytes_per_token=int(stream.header.kv_bytes_per_token),
                         model=stream.header.model, hardware=stream.header.hardware,
                         source={"cache_mode": variant,
                                 "from": dict(stream.header.source or {})})
    columns = {"step": cat(step), "time_us": cat(time_us), "kind": cat(kind),
               "request_id": cat(req), "block_index": cat(bi), "content_hash": cat(h),
               "num_tokens": cat(ntok), "size_bytes": cat(nbytes)}
    with EventWriter(out_path, header) as writer:
        if len(columns["step"]):
            writer.write(columns)
    return CacheLowering(Path(out_path), variant, stream, orig_of.astype(np.int64),
                         first_pseudo.astype(np.int64))
