"""What the closed loop knows of the future: per prompt block, its next use and whether
it was used before, in the Request table's arrival order.

The open-loop replay learns ``next_use`` and ``seen`` from a pre-pass over the event file
(:func:`kvsim.sim.replay.scan_trace`).  In the closed loop the event order is decided as
the replay runs, so the offline policies (belady) see the order requests *arrive* in: a
block's next use is the position of the next prompt block with the same content in
arrival order (an approximation of the schedule's order; exact for one request at a
time).  ``seen`` feeds the recompute metric (a miss on content computed before).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.ingest.hashing import root_hash
from kvsim.sim.sched_blocks import _prompt_hashes

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
    df = table.df
    prompt = np.ascontiguousarray(df["prompt_tokens"].to_numpy(), dtype=np.int64)
    hashed = np.ascontiguousarray(df["hashed_tokens"].to_numpy(), dtype=np.int64)
    nb = (prompt + B - 1) // B
    pb_off = np.zeros(len(prompt) + 1, dtype=np.int64)
    np.cumsum(nb, out=pb_off[1:])
    out = np.zeros(int(pb_off[-1]), dtype=np.int64)
    with np.errstate(over="ignore"):
        _all_prompt_hashes(B, table.block_size_tokens, prompt, hashed, off, ids, pb_off, out)
    return pb_off, out


def prompt_block_facts(table, off, ids, B: int):
    """(offsets, next_use, seen) per prompt block, in arrival order (module docstring)."""
    pb_off, h = prompt_block_hashes(table, off, ids, B)
    m = len(h)
    next_use = np.full(m, NEVER, dtype=np.int64)
    seen = np.zeros(m, dtype=np.int8)
    elig = np.flatnonzero(h != 0)
    if len(elig):
        order = elig[np.argsort(h[elig], kind="stable")]
        same = h[order[1:]] == h[order[:-1]]
        next_use[order[:-1][same]] = order[1:][same]
        seen[order[1:][same]] = 1
    return pb_off, next_use, seen
