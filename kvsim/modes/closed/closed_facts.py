"""What the closed loop knows of the future: per prompt block, its next use and whether
it was used before, in the Request table's arrival order.

The open-loop replay learns ``next_use`` and ``seen`` from a pre-pass over the event file
(:func:`kvsim.replay.driver.scan_trace`).  In the closed loop the event order is decided as
the replay runs, so the offline policies (belady) see the order requests *arrive* in: a
block's next use is the position of the next prompt block with the same content in
arrival order (an approximation of the schedule's order; exact for one request at a
time).  ``seen`` feeds the recompute metric (a miss on content computed before).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.engine.scheduler_blocks import _prompt_hashes
from kvsim.ingest.hashing import chain_hash, root_hash

NEVER = np.iinfo(np.int64).max


@njit(cache=True)
def _all_prompt_hashes(B, T, prompt, hashed, off, ids, pb_off, out):
    root = root_hash(0)
    for c in range(prompt.shape[0]):
        nb = pb_off[c + 1] - pb_off[c]
        hb = out[pb_off[c]:pb_off[c + 1]]
        _prompt_hashes(c, nb, B, T, prompt, hashed, off, ids, root, hb)
        for b in range(nb):  # only full blocks are shared (the replay's rule)
            if (b + 1) * B > prompt[c]:
                hb[b] = 0


def prompt_block_hashes(table, off, ids, B: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[N+1], hashes int64[total]): every request's prompt block hashes at
    block size ``B`` (0 = partial or unidentified: never shared)."""
    prompt = np.ascontiguousarray(table.column("prompt_tokens"), dtype=np.int64)
    hashed = np.ascontiguousarray(table.column("hashed_tokens"), dtype=np.int64)
    nb = (prompt + B - 1) // B
    pb_off = np.zeros(len(prompt) + 1, dtype=np.int64)
    np.cumsum(nb, out=pb_off[1:])
    out = np.zeros(int(pb_off[-1]), dtype=np.int64)
    with np.errstate(over="ignore"):
        _all_prompt_hashes(B, table.block_size_tokens, prompt, hashed, off, ids, pb_off, out)
    return pb_off, out


class PromptHashes:
    """The router's view of :func:`prompt_block_hashes`: request ``i``'s prompt block hashes
    (``slice(i)``), made :data:`ROUTER_CHUNK` requests at a time when first asked for and
    dropped once :data:`ROUTER_KEEP` newer chunks were made (the routers ask in arrival
    order, the decode pool's in about that order), so the hashes held are a chunk's, not
    the trace's.  The same values as :func:`prompt_block_hashes`."""

    def __init__(self, table, off, ids, B: int):
        self.prompt = np.ascontiguousarray(table.column("prompt_tokens"), dtype=np.int64)
        self.hashed = np.ascontiguousarray(table.column("hashed_tokens"), dtype=np.int64)
        self.off = np.ascontiguousarray(off, dtype=np.int64)
        self.ids = ids
        self.B, self.T = B, table.block_size_tokens
        nb = (self.prompt + B - 1) // B
        self.pb_off = np.zeros(len(self.prompt) + 1, dtype=np.int64)
        np.cumsum(nb, out=self.pb_off[1:])
        self._chunks: dict[int, tuple] = {}  # chunk index -> (hashes, offsets), oldest first

    def _chunk(self, k: int) -> tuple[np.ndarray, list]:
        got = self._chunks.get(k)
        if got is None:
            c0, c1 = k * ROUTER_CHUNK, min((k + 1) * ROUTER_CHUNK, len(self.prompt))
            po = self.pb_off[c0:c1 + 1] - self.pb_off[c0]
            hb = np.zeros(int(po[-1]), dtype=np.int64)
            with np.errstate(over="ignore"):
                _all_prompt_hashes(self.B, self.T, self.prompt[c0:c1], self.hashed[c0:c1],
                                   self.off[c0:c1 + 1], self.ids, po, hb)
            if len(self._chunks) >= ROUTER_KEEP:
                del self._chunks[next(iter(self._chunks))]
            got = self._chunks[k] = (hb, po.tolist())  # offsets as Python ints: cheap reads
        return got

    def slice(self, i: int) -> np.ndarray:
        """Request ``i``'s prompt block hashes (0 = partial or unidentified)."""
        k, j = divmod(i, ROUTER_CHUNK)
        hb, po = self._chunk(k)
        return hb[po[j]:po[j + 1]]


#: requests per chunk of :class:`PromptHashes` and the chunks it keeps (chosen bounds: a
#: chunk of Mooncake's requests is ~0.5 MB of hashes; one call per chunk, not per request)
ROUTER_CHUNK = 1024
ROUTER_KEEP = 4


@njit(cache=True)
def _all_block_hashes(B, T, prompt, hashed, nb, off, ids, pb_off, out, full):
    """Every block a request will write whose content the trace identifies: its prompt
    blocks (the hashes its admission ``ALLOCATE`` rows carry) and its decode blocks (the
    scheduler's hash, kvsim.engine.scheduler: by the full content, when ``hashed`` covers it).
    ``full`` = looked up at admission (a full prompt block: only these can hit).  A partial
    prompt block hashed by its partial content only (Mooncake's last id) gets 0: cached
    once full under that hash, it can match no full block."""
    root = root_hash(0)
    for c in range(prompt.shape[0]):
        npb = (prompt[c] + B - 1) // B
        hb = out[pb_off[c]:pb_off[c + 1]]
        _prompt_hashes(c, npb, B, T, prompt, hashed, off, ids, root, hb)
        h = hb[npb - 1] if npb > 0 else root
        for b in range(npb, nb[c]):  # decode blocks: chain on from the last prompt block
            if h != 0 and (b + 1) * B <= hashed[c]:
                h = chain_hash(h, ids[off[c]:off[c + 1]], (b * B) // T,
                               ((b + 1) * B - 1) // T, (b * B) % T)
            else:
                h = 0
            hb[b] = h
        for b in range(nb[c]):
            full[pb_off[c] + b] = 1 if (b + 1) * B <= prompt[c] else 0
            if (b + 1) * B > hashed[c]:
                hb[b] = 0


@njit(cache=True)
def _facts(h, full, order, next_use, seen):
    """``order``: the positions with a hash, sorted by (hash, position).  ``next_use[p]`` =
    the next position of the same content that is looked up (``full``); ``seen[p]`` = an
    earlier position has that content."""
    nxt = -1  # the nearest looked-up position after j in j's group
    for j in range(order.shape[0] - 1, -1, -1):
        p = order[j]
        if j + 1 < order.shape[0] and h[order[j + 1]] != h[p]:
            nxt = -1  # a new group (scanning backwards)
        if nxt >= 0:
            next_use[p] = nxt
        if full[p] != 0:
            nxt = p
        if j > 0 and h[order[j - 1]] == h[p]:
            seen[p] = 1


#: blocks per chunk of :func:`block_facts`: its working arrays are sized by a chunk, not by
#: the trace (~80 bytes a block, ~21 MB a chunk).  A chosen bound: on the Mooncake trace
#: (9.1 M blocks) 2^18 keeps the per-chunk cost (a pass over the distinct hashes) small
CHUNK_BLOCKS = 1 << 18


def _chunks(pb_off: np.ndarray, target: int):
    """Request ranges ``(c0, c1)`` of about ``target`` blocks each (one request at least)."""
    N = pb_off.shape[0] - 1
    c0 = 0
    while c0 < N:
        c1 = int(np.searchsorted(pb_off, pb_off[c0] + target, side="right")) - 1
        c1 = min(max(c1, c0 + 1), N)
        yield c0, c1
        c0 = c1


class _Chunk:
    """One chunk's block hashes, ``full`` flags and the positions with a hash sorted by
    (hash, position), with :func:`_facts`' answers inside the chunk (``nxt``: positions
    relative to the chunk, NEVER when no later looked-up block of the chunk has the hash;
    ``dup``: an earlier block of the chunk has it; ``tail``: the positions whose next use
    is not in the chunk)."""

    def __init__(self, args, pb_off, c0: int, c1: int):
        B, T, prompt, hashed, nb, off, ids = args
        p0, p1 = int(pb_off[c0]), int(pb_off[c1])
        self.p0 = p0
        h = np.zeros(p1 - p0, dtype=np.int64)
        full = np.zeros(p1 - p0, dtype=np.int8)
        with np.errstate(over="ignore"):
            _all_block_hashes(B, T, prompt[c0:c1], hashed[c0:c1], nb[c0:c1], off[c0:c1 + 1],
                              ids, pb_off[c0:c1 + 1] - p0, h, full)
        elig = np.flatnonzero(h != 0)
        order = elig[np.argsort(h[elig], kind="stable")]  # by hash, then position
        self.nxt = np.full(p1 - p0, NEVER, dtype=np.int64)
        self.dup = np.zeros(p1 - p0, dtype=np.int8)
        _facts(h, full, order, self.nxt, self.dup)
        hs = h[order]
        first = np.ones(order.shape[0], dtype=bool)  # the first position of each group
        first[1:] = hs[1:] != hs[:-1]
        self.first = order[first]  # the chunk's first position of each distinct hash
        self.keys = hs[first]  # the chunk's distinct hashes, ascending
        # per group: its first looked-up (full) position, -1 when none
        gid = np.cumsum(first) - 1
        fl = full[order] != 0
        self.first_full = np.full(self.keys.shape[0], -1, dtype=np.int64)
        self.first_full[gid[fl][::-1]] = order[fl][::-1]  # the smallest position wins
        # positions with a hash and no later looked-up one in the chunk: their next use,
        # if any, is in a later chunk
        later = self.nxt[order] == NEVER
        self.tail = order[later]
        self.tail_keys = hs[later]


def _member(keys: np.ndarray, sorted_set: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(where ``keys`` would go in ``sorted_set``, whether they are in it)."""
    at = np.searchsorted(sorted_set, keys)
    hit = np.zeros(keys.shape[0], dtype=bool)
    ok = at < sorted_set.shape[0]
    hit[ok] = sorted_set[at[ok]] == keys[ok]
    return at, hit


def block_facts(table, off, ids, B: int, next_use: bool = True):
    """(offsets, next_use, seen) per block a request writes (prompt blocks, then decode
    blocks), in arrival order (module docstring).  A decode block is cached once full, so
    its next use is the next prompt block of the same content (the next turn's).

    ``next_use=False`` (a policy that does not read the future: the core reads next_use
    only under an OFFLINE policy, kvsim.replay.kernel.core): next_use is an empty array
    (kvsim.replay.kernel.closed_step then gives every block NEVER).  The hashes are made
    :data:`CHUNK_BLOCKS` blocks at a time in arrival order: ``seen`` from the sorted distinct
    hashes of the chunks before (they grow with the distinct contents, not with how often
    they come) and, when asked, next_use from a backward pass keeping each distinct hash's
    nearest later looked-up position: the working arrays are a chunk's, the results 1 byte
    a block (seen) and 8 (next_use)."""
    prompt = np.ascontiguousarray(table.column("prompt_tokens"), dtype=np.int64)
    hashed = np.ascontiguousarray(table.column("hashed_tokens"), dtype=np.int64)
    output = np.ascontiguousarray(table.column("output_tokens"), dtype=np.int64)
    npb = (prompt + B - 1) // B
    nkv = (prompt + np.maximum(output - 1, 0) + B - 1) // B  # blocks the request writes
    nb = np.maximum(npb, np.minimum(nkv, hashed // B))
    del npb, nkv
    pb_off = np.zeros(len(prompt) + 1, dtype=np.int64)
    np.cumsum(nb, out=pb_off[1:])
    m = int(pb_off[-1])
    args = (B, table.block_size_tokens, prompt, hashed, nb,
            np.ascontiguousarray(off, dtype=np.int64), ids)
    chunks = list(_chunks(pb_off, CHUNK_BLOCKS))
    seen = np.zeros(m, dtype=np.int8)
    known = np.zeros(0, dtype=np.int64)  # the distinct hashes of the chunks so far, sorted
    for c0, c1 in chunks:
        ch = _Chunk(args, pb_off, c0, c1)
        seen[ch.p0:ch.p0 + ch.dup.shape[0]] = ch.dup
        at, hit = _member(ch.keys, known)
        seen[ch.p0 + ch.first[hit]] = 1
        known = np.insert(known, at[~hit], ch.keys[~hit])
    del known
    if not next_use:
        return pb_off, np.zeros(0, dtype=np.int64), seen
    nu = np.full(m, NEVER, dtype=np.int64)
    # backward: each distinct hash's nearest looked-up position in the chunks after
    kk = np.zeros(0, dtype=np.int64)  # sorted hashes
    kv = np.zeros(0, dtype=np.int64)  # their positions
    for c0, c1 in reversed(chunks):
        ch = _Chunk(args, pb_off, c0, c1)
        inner = ch.nxt != NEVER
        part = nu[ch.p0:ch.p0 + ch.nxt.shape[0]]
        part[inner] = ch.nxt[inner] + ch.p0
        at, hit = _member(ch.tail_keys, kk)
        part[ch.tail[hit]] = kv[at[hit]]
        has = ch.first_full >= 0
        keys, pos = ch.keys[has], ch.first_full[has] + ch.p0
        at, hit = _member(keys, kk)
        kv[at[hit]] = pos[hit]
        kk = np.insert(kk, at[~hit], keys[~hit])
        kv = np.insert(kv, at[~hit], pos[~hit])
    return pb_off, nu, seen


# this module's compiled code has the scheduler's (``_prompt_hashes``) and the hashes'
# (kvsim.ingest.hashing) linked in: stamp it with their digest, so an edit of either makes
# its disk-cache entries stale (kvsim.jit.disk_cache)
