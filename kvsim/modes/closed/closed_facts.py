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


def block_facts(table, off, ids, B: int):
    """(offsets, next_use, seen) per block a request writes (prompt blocks, then decode
    blocks), in arrival order (module docstring).  A decode block is cached once full, so
    its next use is the next prompt block of the same content (the next turn's)."""
    prompt = np.ascontiguousarray(table.column("prompt_tokens"), dtype=np.int64)
    hashed = np.ascontiguousarray(table.column("hashed_tokens"), dtype=np.int64)
    output = np.ascontiguousarray(table.column("output_tokens"), dtype=np.int64)
    npb = (prompt + B - 1) // B
    nkv = (prompt + np.maximum(output - 1, 0) + B - 1) // B  # blocks the request writes
    nb = np.maximum(npb, np.minimum(nkv, hashed // B))
    pb_off = np.zeros(len(prompt) + 1, dtype=np.int64)
    np.cumsum(nb, out=pb_off[1:])
    m = int(pb_off[-1])
    h = np.zeros(m, dtype=np.int64)
    full = np.zeros(m, dtype=np.int8)
    with np.errstate(over="ignore"):
        _all_block_hashes(B, table.block_size_tokens, prompt, hashed, nb, off, ids, pb_off, h,
                          full)
    next_use = np.full(m, NEVER, dtype=np.int64)
    seen = np.zeros(m, dtype=np.int8)
    elig = np.flatnonzero(h != 0)
    order = elig[np.argsort(h[elig], kind="stable")]  # by hash, then position
    _facts(h, full, order, next_use, seen)
    return pb_off, next_use, seen


# this module's compiled code has the scheduler's (``_prompt_hashes``) and the hashes'
# (kvsim.ingest.hashing) linked in: stamp it with their digest, so an edit of either makes
# its disk-cache entries stale (kvsim.jit.disk_cache)
