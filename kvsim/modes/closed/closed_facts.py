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

from kvsim.core import row_store
from kvsim.engine.scheduler_blocks import _prompt_hashes
from kvsim.ingest.hashing import chain_hash, root_hash
from kvsim.jit.disk_cache import setup_func
from kvsim.jit.prefetch import prefetch

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

    def __init__(self, table, off, ids, B: int, python: bool = False):
        self.python = python  # the interpreted engine's (kvsim.jit.disk_cache.setup_func)
        self.prompt = np.ascontiguousarray(table.column("prompt_tokens"), dtype=np.int64)
        self.hashed = np.ascontiguousarray(table.column("hashed_tokens"), dtype=np.int64)
        self.off = np.ascontiguousarray(off, dtype=np.int64)
        self.ids = ids
        self.B, self.T = B, table.block_size_tokens
        nb = (self.prompt + B - 1) // B
        self.pb_off = row_store.zeros(len(self.prompt) + 1, np.int64)  # the run's row store
        np.cumsum(nb, out=self.pb_off[1:])
        self._chunks: dict[int, tuple] = {}  # chunk index -> (hashes, offsets), oldest first

    def _chunk(self, k: int) -> tuple[np.ndarray, list]:
        got = self._chunks.get(k)
        if got is None:
            c0, c1 = k * ROUTER_CHUNK, min((k + 1) * ROUTER_CHUNK, len(self.prompt))
            po = self.pb_off[c0:c1 + 1] - self.pb_off[c0]
            hb = np.zeros(int(po[-1]), dtype=np.int64)
            with np.errstate(over="ignore"):
                setup_func(_all_prompt_hashes, self.python)(
                    self.B, self.T, self.prompt[c0:c1], self.hashed[c0:c1],
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


@njit(cache=True, inline="always")
def _home(x, mask):
    return (x ^ (x >> 17) ^ (x >> 31) ^ (x >> 47)) & mask


#: blocks ahead whose home slot :func:`_mark_seen`, :func:`_mark_next` and :func:`_rehash`
#: prefetch (kvsim.jit.prefetch; no effect on results): the tables are tens of MB at
#: 16-token blocks (the Mooncake trace: 5.7 M distinct contents of 9.1 M blocks), each probe
#: a cache miss otherwise.  8: ahead of a probe's ~100 ns miss at a few ns a block
PROBE_AHEAD = 8


@njit(cache=True)
def _mark_seen(h, j0, p0, keys, meta, bits):
    """From ``h[j0]`` on (the hashes of blocks ``p0 + j``, in arrival order): set bit
    ``p0 + j`` of ``bits`` when an earlier block had hash ``h[j]`` (in the set ``keys``:
    open addressing, 0 = empty, ``meta[0]`` keys held), else add it.  Returns the index to
    resume at: ``h.shape[0]``, or earlier when the set is 3/4 full (the caller grows it)."""
    mask = keys.shape[0] - 1
    n = h.shape[0]
    for j in range(j0, n):
        if j + PROBE_AHEAD < n:  # the home slot of a later block's hash, asked for now
            prefetch(keys, _home(h[j + PROBE_AHEAD], mask))
        x = h[j]
        if x == 0:  # unidentified content: never seen before
            continue
        i = _home(x, mask)
        while True:
            k = keys[i]
            if k == x:
                p = p0 + j
                bits[p >> 3] |= np.uint8(1 << (p & 7))
                break
            if k == 0:
                keys[i] = x
                meta[0] += 1
                break
            i = (i + 1) & mask
        if 4 * meta[0] >= 3 * keys.shape[0]:
            return j + 1
    return h.shape[0]


@njit(cache=True)
def _mark_next(h, full, j1, p0, keys, vals, meta, nu):
    """Backward from ``h[j1 - 1]``: ``nu[p0 + j]`` = the nearest later looked-up
    (``full``) position of hash ``h[j]`` (the map ``keys`` -> ``vals`` holds each hash's
    nearest one so far), then position ``p0 + j`` becomes its hash's when looked up.
    Returns the index to resume below: 0, or more when the map is 3/4 full."""
    mask = keys.shape[0] - 1
    for j in range(j1 - 1, -1, -1):
        if j >= PROBE_AHEAD:  # as in _mark_seen, going down
            ahead = _home(h[j - PROBE_AHEAD], mask)
            prefetch(keys, ahead)
            prefetch(vals, ahead)
        x = h[j]
        if x == 0:
            continue
        i = _home(x, mask)
        while True:
            k = keys[i]
            if k == x:
                nu[p0 + j] = vals[i]
                if full[j] != 0:
                    vals[i] = p0 + j
                break
            if k == 0:
                if full[j] != 0:
                    keys[i] = x
                    vals[i] = p0 + j
                    meta[0] += 1
                break
            i = (i + 1) & mask
        if 4 * meta[0] >= 3 * keys.shape[0]:
            return j
    return 0


@njit(cache=True)
def _rehash(keys, vals, new_keys, new_vals):
    """Every key of ``keys`` (and its value, when ``vals`` has any) into the larger table."""
    mask = new_keys.shape[0] - 1
    n = keys.shape[0]
    for i in range(n):
        if i + PROBE_AHEAD < n and keys[i + PROBE_AHEAD] != 0:  # its slot in the new table
            prefetch(new_keys, _home(keys[i + PROBE_AHEAD], mask))
        x = keys[i]
        if x == 0:
            continue
        j = _home(x, mask)
        while new_keys[j] != 0:
            j = (j + 1) & mask
        new_keys[j] = x
        if vals.shape[0] > 0:
            new_vals[j] = vals[i]


#: blocks per chunk of :func:`block_facts`: the hashes are made a chunk at a time into one
#: buffer (9 bytes a block, ~2.4 MB), reused by every chunk.  A chosen bound: one compiled
#: call per chunk, few on the Mooncake trace (9.1 M blocks: 35 chunks)
CHUNK_BLOCKS = 1 << 18
#: the hash tables' first size (entries; doubled when 3/4 full)
FIRST_KEYS = 1 << 16


def _chunks(pb_off: np.ndarray, target: int):
    """Request ranges ``(c0, c1)`` of about ``target`` blocks each (one request at least)."""
    N = pb_off.shape[0] - 1
    c0 = 0
    while c0 < N:
        c1 = int(np.searchsorted(pb_off, pb_off[c0] + target, side="right")) - 1
        c1 = min(max(c1, c0 + 1), N)
        yield c0, c1
        c0 = c1


class _Hashes:
    """The block hashes and ``full`` flags of one request range at a time, made into
    buffers sized by the largest range and reused (no allocation per chunk)."""

    def __init__(self, args, pb_off, chunks, python: bool = False):
        self.args, self.pb_off, self.python = args, pb_off, python
        most = max((int(pb_off[c1] - pb_off[c0]) for c0, c1 in chunks), default=0)
        self.h = np.zeros(most, dtype=np.int64)
        self.full = np.zeros(most, dtype=np.int8)

    def __call__(self, c0: int, c1: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(first position, hashes, full) of requests ``c0 .. c1 - 1``' blocks."""
        B, T, prompt, hashed, nb, off, ids = self.args
        p0, p1 = int(self.pb_off[c0]), int(self.pb_off[c1])
        h, full = self.h[:p1 - p0], self.full[:p1 - p0]
        h[:] = 0
        with np.errstate(over="ignore"):
            setup_func(_all_block_hashes, self.python)(
                B, T, prompt[c0:c1], hashed[c0:c1], nb[c0:c1], off[c0:c1 + 1], ids,
                self.pb_off[c0:c1 + 1] - p0, h, full)
        return p0, h, full


class _Table:
    """An open-addressing table of hashes (0 = empty), with values when asked: grown to
    twice its size when 3/4 full (linear probing: ~2.5 probes a
    hit, ~8.5 a miss at that load; 8-16 bytes a key)."""

    def __init__(self, with_values: bool, most: int = 0, python: bool = False):
        self.python = python
        size = FIRST_KEYS  # sized for ``most`` keys when known: never grown then
        while 4 * most >= 3 * size:
            size *= 2
        self.keys = np.zeros(size, dtype=np.int64)
        self.vals = np.zeros(size if with_values else 0, dtype=np.int64)
        self.meta = np.zeros(1, dtype=np.int64)  # keys held

    def grow(self) -> None:
        keys = np.zeros(2 * self.keys.shape[0], dtype=np.int64)
        vals = np.zeros(keys.shape[0] if self.vals.shape[0] else 0, dtype=np.int64)
        setup_func(_rehash, self.python)(self.keys, self.vals, keys, vals)
        self.keys, self.vals = keys, vals


def block_facts(table, off, ids, B: int, next_use: bool = True, python: bool = False):
    """(offsets, next_use, seen) per block a request writes (prompt blocks, then decode
    blocks), in arrival order (module docstring).  A decode block is cached once full, so
    its next use is the next prompt block of the same content (the next turn's).

    ``seen`` is a bit array (uint8, little bit order: block ``p`` is bit ``p & 7`` of byte
    ``p >> 3``; ``np.unpackbits(seen, count=m, bitorder="little")`` for one byte a block):
    1 = an earlier block had the content.  ``next_use=False`` (a policy that does not read
    the future: the core reads next_use only under an OFFLINE policy,
    kvsim.replay.kernel.core): next_use is an empty array (kvsim.replay.kernel.closed_step
    then gives every block NEVER).  The hashes are made :data:`CHUNK_BLOCKS` blocks at a
    time into one reused buffer, in arrival order: ``seen`` from a hash set of the contents
    so far (it grows with the distinct contents, not with how often they come) and, when
    asked, next_use from a backward pass with a map of each content's nearest later
    looked-up position: the working arrays are a chunk's and the distinct contents', the
    results 1 bit a block (seen) and 8 bytes (next_use).  ``python``: for the interpreted
    engine (the passes as Python while cold: :func:`kvsim.jit.disk_cache.setup_func`)."""
    prompt = np.ascontiguousarray(table.column("prompt_tokens"), dtype=np.int64)
    hashed = np.ascontiguousarray(table.column("hashed_tokens"), dtype=np.int64)
    output = np.ascontiguousarray(table.column("output_tokens"), dtype=np.int64)
    npb = (prompt + B - 1) // B
    nkv = (prompt + np.maximum(output - 1, 0) + B - 1) // B  # blocks the request writes
    nb = np.maximum(npb, np.minimum(nkv, hashed // B))
    del npb, nkv
    # the results in the run's row store when one is current (kvsim.core.row_store: the
    # run gives back their pages below the oldest request it still reads)
    pb_off = row_store.zeros(len(prompt) + 1, np.int64)
    np.cumsum(nb, out=pb_off[1:])
    m = int(pb_off[-1])
    args = (B, table.block_size_tokens, prompt, hashed, nb,
            np.ascontiguousarray(off, dtype=np.int64), ids)
    chunks = list(_chunks(pb_off, CHUNK_BLOCKS))
    hashes = _Hashes(args, pb_off, chunks, python)
    seen = row_store.zeros((m + 7) // 8, np.uint8, index=pb_off, bits=True)
    known = _Table(with_values=False, python=python)  # the contents so far
    for c0, c1 in chunks:
        p0, h, _full = hashes(c0, c1)
        j = 0
        while j < h.shape[0]:
            j = setup_func(_mark_seen, python)(h, j, p0, known.keys, known.meta, seen)
            if 4 * known.meta[0] >= 3 * known.keys.shape[0]:
                known.grow()
        row_store.release_below(c1)  # the pages written and read so far (set-up only)
    distinct = int(known.meta[0])
    del known
    if not next_use:
        return pb_off, np.zeros(0, dtype=np.int64), seen
    nu = row_store.full(m, NEVER, np.int64, index=pb_off)
    # each content's nearest later looked-up position: at most the distinct contents
    later = _Table(with_values=True, most=distinct, python=python)
    for c0, c1 in reversed(chunks):
        p0, h, full = hashes(c0, c1)
        j = h.shape[0]
        while j > 0:
            j = setup_func(_mark_next, python)(h, full, j, p0, later.keys, later.vals,
                                               later.meta, nu)
            if 4 * later.meta[0] >= 3 * later.keys.shape[0]:
                later.grow()
    return pb_off, nu, seen


# this module's compiled code has the scheduler's (``_prompt_hashes``) and the hashes'
# (kvsim.ingest.hashing) linked in: stamp it with their digest, so an edit of either makes
# its disk-cache entries stale (kvsim.jit.disk_cache)
