"""Cache-mode lowering: requests one at a time, in arrival order, as a serialized event stream.

Cache mode is the semantics of the Mooncake paper's and kvcache-simulator's hit-rate
studies: each request's prompt is looked up, then inserted, before the next request
arrives; no concurrency, no engine timing.  kvsim runs it through the same tiered replay
(pool, tiers, policy hooks) as engine mode by lowering the requests to a stream in which
that is what happens:

* one ``STEP`` per request (step ``k`` = the request's rank in arrival order, time = its
  arrival), then ``ARRIVE``, the ``ALLOCATE`` rows of its prompt's **identified blocks**
  (the chain of content hashes up to the first block with no identity), then ``FREE``.
  An identified *partial* last block (Mooncake's hash ids name it) is cached as
  kvcache-simulator and the Mooncake paper cache it: it is written as a full-size row
  (so the pool shares it with the same partial block of another request: same id, same
  tokens, :func:`kvsim.ingest.hashing.partial_hash`) and a hit on it counts its real tokens
  (:attr:`CacheStream.tail_tokens`).  Engine mode (vLLM) never shares a partial block;
* ``prefix`` variant: one request = one lookup of the whole chain, which the pool stops at
  the first missing block (vLLM, kvcache-simulator);
* ``vllm`` variant: the ``prefix`` lookup with vLLM's two rules (what the engine mode and
  vLLM itself hit, docs/simulate.md "Fidelity to vLLM"): the ``ARRIVE`` row carries the
  real prompt tokens, so the lookup serves at most ``(prompt - 1) // block`` blocks (the
  last token is recomputed for its logits: an exact repeat of a block-aligned prompt hits
  all but its last block), and an identified partial last block is allocated without a
  hash (never shared, as vLLM hashes only full blocks);
* ``block`` variant: every block of the chain is its own one-block request (a *pseudo
  request*) in its own step, at time = its access ordinal, so every resident block hits,
  each block one access: the pool then sees the same key stream, on the same virtual
  clock, as the single-tier simulator (:mod:`kvsim.cachesim.simulator`).

The ``ARRIVE`` row's ``num_tokens`` is the identified tokens **plus one**: the pool's
lookup (vLLM) never serves a prompt's last token (it is recomputed for its logits); cache
mode has no such rule, and one extra token lifts it.  The replay then reports each
request's real prompt tokens (:class:`CacheStream` keeps them), never this number.

Sources: an event file (any lowering: the prompt is the request's ``PREFILL``
``ALLOCATE`` rows, first occurrence of each block index, up to ``ceil(prompt / block)``
blocks) or a Request table (hashed exactly as :mod:`kvsim.engine.lowering` hashes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import EventHeader, EventKind, Phase

VARIANTS = ("prefix", "block", "vllm")


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
    #: blocks of each chain that are looked up (None = all): engine-mode bound entries
    #: look up at most ``(prompt - 1) // block`` blocks, and production entries none
    lookup_len: np.ndarray | None = None
    #: tokens of each chain's last block when it is an identified *partial* block (0 =
    #: the chain ends with a full block).  Cache mode caches it as kvcache-simulator and
    #: the Mooncake paper do (its hash id names it); a hit on it is worth these tokens.
    tail_tokens: np.ndarray | None = None

    def tails(self) -> np.ndarray:
        """:attr:`tail_tokens`, zeros when not set."""
        if self.tail_tokens is None:
            return np.zeros(self.num_requests, np.int64)
        return self.tail_tokens

    def lookups(self) -> np.ndarray:
        """Looked-up blocks per entry (the whole chain unless ``lookup_len`` says less)."""
        full = np.diff(self.offsets)
        return full if self.lookup_len is None else np.minimum(self.lookup_len, full)

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
    last = b_bi == nb_prompt[pos_b] - 1
    ok = ((b_tok == bs) | (last & (b_tok > 0) & (b_tok < bs))) & (b_hash != 0) & \
        (b_bi < nb_prompt[pos_b])
    starts = np.searchsorted(b_req, ids)
    rank = np.arange(len(b_req)) - starts[pos_b]
    ok &= b_bi == rank
    # a broken chain stops it: keep a row only if every earlier row of its request is ok
    bad_before = np.zeros(len(b_req), np.int64)
    cum = np.cumsum(~ok)
    bad_before = cum - np.where(starts[pos_b] > 0, cum[np.maximum(starts[pos_b] - 1, 0)], 0)
    keep = ok & (bad_before == 0)
    length = np.bincount(pos_b[keep], minlength=n).astype(np.int64)
    tail = np.zeros(n, np.int64)
    part = keep & (b_tok < bs)
    tail[pos_b[part]] = b_tok[part]
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
                       chain.astype(np.int64), bs, block_bytes, header,
                       tail_tokens=tail[by_arrival])


def stream_from_requests(table, block_size_tokens: int = 16, kv_bytes_per_token: int = 0,
                         model: str = "") -> CacheStream:
    """The cache-mode requests of a :class:`kvsim.ingest.RequestTable`, hashed as the
    engine lowering hashes them (:func:`kvsim.engine.scheduler_blocks._prompt_hashes`)."""
    from kvsim.engine.scheduler_blocks import _prompt_hashes
    from kvsim.ingest.hashing import root_hash

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
    chains, lengths, tail = [], np.zeros(n, np.int64), np.zeros(n, np.int64)
    for c in range(n):
        _prompt_hashes(c, int(nb[c]), B, T, prompt, hashed, off, ids, root, hb)
        k = 0
        while k < nb[c] and (k + 1) * B <= prompt[c] and hb[k] != 0:
            k += 1
        if k == nb[c] - 1 and hb[k] != 0:  # the identified partial last block
            tail[c] = prompt[c] - k * B
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
                       chain.astype(np.int64), B, int(kv_bytes_per_token) * B, header,
                       tail_tokens=tail)


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
    if variant in ("prefix", "vllm"):
        vllm = variant == "vllm"
        tails = stream.tails()
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
            chain_k = stream.chain[stream.offsets[k]:stream.offsets[k + 1]].copy()
            toks = [bs] * m
            arrive = m * bs + 1
            if vllm:
                arrive = int(stream.prompt_tokens[k])
                if m and tails[k] > 0:  # the identified partial last block: no hash
                    chain_k[m - 1] = 0
                    toks[m - 1] = int(tails[k])
            h.append(np.concatenate(([0, 0], chain_k, [0])))
            ntok.append(np.array([0, arrive] + toks + [0]))
            nbytes.append(np.array([0, 0] + [size] * m + [0]))
    else:
        total = int(lengths.sum())
        orig_of = np.repeat(stream.request_id, lengths)
        first_pseudo = stream.offsets[:-1].copy()
        # one step per access, at time = the access ordinal: the single-tier simulator's
        # virtual clock (access i happens at i us), so time-based policies see the same
        # ages in both
        p = np.arange(total, dtype=np.int64)
        step.append(np.repeat(p, 4)); time_us.append(np.repeat(p, 4))
        kind.append(np.tile([EventKind.STEP, EventKind.ARRIVE, EventKind.ALLOCATE,
                             EventKind.FREE], total))
        req.append(np.stack([np.full(total, -1), p, p, p], 1).ravel())
        bi.append(np.tile([-1, -1, 0, -1], total))
        hh = np.zeros((total, 4), np.int64)
        hh[:, 2] = stream.chain
        h.append(hh.ravel())
        ntok.append(np.tile([0, bs + 1, bs, 0], total))
        nbytes.append(np.tile([0, 0, size, 0], total))
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


@dataclass
class BoundStream:
    """An engine trace as the entries of the offline bound (:mod:`kvsim.bounds.optimal`), in
    the order the replay meets them: ``stream`` (its ``lookup_len`` set), the request of
    each entry (``owner``) and whether the entry is that request's admission lookup."""

    stream: CacheStream
    owner: np.ndarray
    is_admission: np.ndarray
    prompt_tokens: dict


def bound_stream_from_events(path: str | Path, batch_rows: int = 1 << 20) -> BoundStream:
    """The fixed schedule of an event file as bound entries.

    * each request's **admission** (its first ALLOCATE / ACCESS / FORK row) is an entry
      whose chain is its prompt's identified full blocks (PREFILL ALLOCATE rows, chained
      from block 0), looked up at most ``(prompt - 1) // block`` blocks deep (vLLM's rule,
      as the replay's pool);
    * every later ALLOCATE row of a full block that continues the request's chain (decode,
      a later prefill chunk) is a **production** entry: the chain up to that block, no
      lookup, offered for insertion at that row;
    * a block allocated partial (a prompt's partial last block, a decode block) whose
      ALLOCATE row names the hash of its full content is a **production** entry at the row
      of the request's next appended block, when the replay caches it
      (:func:`kvsim.replay.kernel.placement._fill_last`).  (Before this rule the bound
      left out every block completed by decode, so it fell below belady's replay on
      multi-turn traces.)  The last such block, when the request's computed tokens (its
      ACCESS rows) fill it exactly, is a production at the request's FREE row, when the
      replay caches it (:func:`kvsim.replay.kernel.placement._fill_at_finish`).

    Every block the replay can hold was produced by one of these entries, at or before the
    row at which the replay produces it, which is what makes the optimum over these
    entries an upper bound (docs/policies.md).  Preempted reruns re-produce blocks at rows
    the file does not mark: the bound does not model them (see its ``preemptions`` caveat).
    """
    from kvsim.events import open_events

    parts: dict[str, list] = {k: [] for k in ("row", "kind", "req", "bi", "hash", "ntok",
                                               "phase")}
    offset = 0
    with open_events(path) as reader:
        header = reader.header
        for cols in reader.batches(batch_rows):
            kind = cols["kind"]
            m = np.flatnonzero((kind == EventKind.ARRIVE) | (kind == EventKind.ALLOCATE)
                               | (kind == EventKind.ACCESS) | (kind == EventKind.FORK)
                               | (kind == EventKind.FREE))
            parts["row"].append(m + offset)
            parts["kind"].append(kind[m])
            parts["req"].append(cols["request_id"][m])
            parts["bi"].append(cols["block_index"][m])
            parts["hash"].append(cols["content_hash"][m])
            parts["ntok"].append(cols["num_tokens"][m])
            parts["phase"].append(cols["phase"][m])
            offset += len(kind)
    c = {k: (np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64))
         for k, v in parts.items()}
    bs = int(header.block_size_tokens)
    prompt: dict[int, int] = {}
    admitted: dict[int, int] = {}  # request -> row of its admission
    chain: dict[int, list[int]] = {}  # request -> its chain so far
    broken: set[int] = set()
    partial: dict[int, int] = {}  # request -> hash of its partial last block
    entries: list[tuple[int, int, bool, list[int], int]] = []  # row, req, admission, path, look
    pending_prompt: dict[int, list[int]] = {}
    gather: dict[int, int] = {}  # request -> row of its last gathered ALLOCATE (-2: done)
    computed: dict[int, int] = {}  # request -> tokens its ACCESS rows computed
    for i in range(len(c["row"])):
        k, r = int(c["kind"][i]), int(c["req"][i])
        if k == EventKind.ARRIVE:
            prompt[r] = int(c["ntok"][i])
            continue
        if k == EventKind.FREE:
            # the request is done: a partial last block its computed tokens fill exactly
            # is cached now (kvsim.replay.kernel.placement._fill_at_finish): a production
            if (int(c["bi"][i]) == -1 and r in partial and r not in broken
                    and computed.get(r, 0) >= (len(chain[r]) + 1) * bs):
                chain[r].append(partial.pop(r))
                entries.append((int(c["row"][i]), r, False, list(chain[r]), 0))
            continue
        if k == EventKind.ACCESS:
            computed[r] = computed.get(r, 0) + int(c["ntok"][i])
        row = int(c["row"][i])
        if r not in admitted:
            admitted[r] = row
            chain[r] = []
            pending_prompt[r] = []
            gather[r] = row - 1 if k == EventKind.ALLOCATE else -2
        if k != EventKind.ALLOCATE:
            gather[r] = -2
            continue
        # the replay gathers the ALLOCATE rows that directly follow the admission row
        # (no other row between them) and places them at once: that is the lookup
        gathered = gather[r] >= -1 and row == gather[r] + 1
        gather[r] = row if gathered else -2
        bi, h, nt = int(c["bi"][i]), int(c["hash"][i]), int(c["ntok"][i])
        if r in partial and bi == len(chain[r]):
            continue  # a write into the partial block itself (copy-on-write)
        if r in partial and not gathered and bi == len(chain[r]) + 1:
            # the replay caches a block allocated partial (a decode block, a prompt's
            # partial last block) under the hash its ALLOCATE row named once the request
            # appends the next block (kvsim.replay.kernel.placement._fill_last): a
            # production entry at this row
            chain[r].append(partial.pop(r))
            entries.append((row, r, False, list(chain[r]), 0))
        if r in broken or bi != len(chain[r]):
            if bi <= len(chain[r]) - 1:
                continue  # a rerun or copy-on-write of a block it already has
            broken.add(r)
            continue
        if nt != bs and h != 0:
            partial[r] = h  # full later: cached when the next block is appended
            continue
        if nt != bs or h == 0:
            broken.add(r)
            continue
        chain[r].append(h)
        if gathered and len(chain[r]) - 1 == len(pending_prompt[r]):
            pending_prompt[r].append(h)
        else:
            entries.append((int(c["row"][i]), r, False, list(chain[r]), 0))
    for r, row in admitted.items():
        path = pending_prompt[r]
        p = prompt.get(r, len(path) * bs)
        look = min(len(path), max(p - 1, 0) // bs)
        entries.append((row, r, True, path, look))
        prompt[r] = p
    entries.sort(key=lambda e: (e[0], not e[2]))
    lengths = np.array([len(e[3]) for e in entries], np.int64)
    offsets = np.zeros(len(entries) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.array([h for e in entries for h in e[3]], np.int64)
    stream = CacheStream(np.arange(len(entries), dtype=np.int64),
                         np.array([e[0] for e in entries], np.int64),
                         np.array([prompt[e[1]] if e[2] else 0 for e in entries], np.int64),
                         offsets, flat, bs, int(header.kv_bytes_per_token) * bs, header,
                         lookup_len=np.array([e[4] for e in entries], np.int64))
    return BoundStream(stream, np.array([e[1] for e in entries], np.int64),
                       np.array([e[2] for e in entries], bool), prompt)
