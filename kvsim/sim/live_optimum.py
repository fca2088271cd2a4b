"""The offline bound of the live-offload mode: ``optimal`` with ``--live-offload``.

Belady's MIN over the live-offload replay's units (kvsim/sim/live_offload.py): every
running request's resident blocks and every cached block, with each one's next use known
exactly from the trace.

* A live unit's next use is the row ordinal of its request's next ``ACCESS`` (the need
  rule: an ACCESS reads every block of the request, so all of them are next used then);
  before the request's first ACCESS, that first ACCESS.
* A cached block's next use is the next ``ALLOCATE`` row carrying its content hash (the
  only way a finished block is read again: a later prompt hitting it).
* Victim: the unit used farthest in the future (the registry's ``belady`` hooks reading
  ``view.next_use``); pinned units still only when nothing else can go (the mode's rule
  holds for the bound too); a cached block chosen is dropped (bypass: a block never
  used again is evicted before any live one).

What it bounds: the number of blocks brought up into HBM (``blocks_fetched`` +
``prefetches``): for unit-size pages, MIN needs the fewest loads of any replacement
schedule, including those that prefetch (Belady 1966; Mattson et al. 1970 for demand
paging being optimal among all paging algorithms), hence also the fewest bytes up the
links and, when the link latency is 0, the least stall time.  With a latency per batch
the stall time of MIN is not always the least (a policy may merge fetches into fewer
batches); tests/sim/test_live_offload.py checks the bound against a brute force over every
spill choice on tiny traces and against every built-in policy on small ones.
Memory: one int64 per ACCESS row and per hashed ALLOCATE row of the trace (read once).
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

from kvsim.policy_api import NEVER
from kvsim.schema import EventKind


class NextUse:
    """Next uses of a trace: ``after_access[ordinal]`` = the ordinal of the next ACCESS row
    of the same request (absent: never), ``first_access[r]``, and per content hash the
    ordinals of its ALLOCATE rows."""

    def __init__(self, after_access: dict, first_access: dict, hash_ords: dict) -> None:
        self.after_access = after_access
        self.first_access = first_access
        self.hash_ords = hash_ords

    def hash_after(self, h: int, ordinal: int) -> int:
        ords = self.hash_ords.get(h)
        if ords is None:
            return NEVER
        i = bisect.bisect_right(ords, ordinal)
        return int(ords[i]) if i < len(ords) else NEVER


def next_uses(trace_path: str | Path, batch_rows: int = 1 << 20) -> NextUse:
    """One streaming pass over the event file (kind, request and hash columns kept)."""
    from kvsim.sim.prepass import _open

    kinds, rids, hashes = [], [], []
    with _open(trace_path) as reader:
        for cols in reader.batches(batch_rows):
            kinds.append(np.asarray(cols["kind"], np.int8))
            rids.append(np.asarray(cols["request_id"], np.int64))
            hashes.append(np.asarray(cols["content_hash"], np.int64))
    kind = np.concatenate(kinds) if kinds else np.zeros(0, np.int8)
    rid = np.concatenate(rids) if rids else np.zeros(0, np.int64)
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.int64)
    acc = np.flatnonzero(kind == int(EventKind.ACCESS))
    after: dict[int, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for o, r in zip(acc.tolist(), rid[acc].tolist()):
        if r in last:
            after[last[r]] = o
        else:
            first[r] = o
        last[r] = o
    al = np.flatnonzero((kind == int(EventKind.ALLOCATE)) & (h != 0))
    hash_ords: dict[int, list] = {}
    for o, hv in zip(al.tolist(), h[al].tolist()):
        hash_ords.setdefault(hv, []).append(o)
    return NextUse(after, first, hash_ords)


__all__ = ["NextUse", "next_uses"]
