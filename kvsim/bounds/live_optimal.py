"""The offline bound of the live-offload mode: ``optimal`` with ``--live-offload``.

Belady's MIN over the blocks resident in HBM, with each block's next use known exactly
from the trace (kvsim/modes/live/live_offload.py holds the replay; the registry's ``belady``
hooks rank its units by ``view.next_use``):

* **A block's next use** (:func:`true_next`) is the earliest of: the next ``ACCESS`` row of
  each request holding it (the need rule: an ACCESS reads every block of its request; the
  request being served needs its blocks now), and the first ACCESS of the next admission
  that will find it by content hash (a later request's ``ALLOCATE`` of the same hash
  before that request's first read hits a block that is still held or cached: the block
  is read then too).  A shared prefix block is thus ranked by the *earliest* of its
  readers, current and coming, not by the request that first allocated it.
* **Units, lazily exact.**  Policies rank units (a request's resident blocks); MIN ranks
  a unit by its request's next use.  Every block sits in the unit of a request that holds
  it, or (*lent*) of the admission that will hit it next, whose next use is never earlier
  than the block's: a unit's rank may overstate a block's next use, never understate it.
  When MIN names a unit, :func:`exact_top` checks its top blocks; one needed sooner moves
  to the unit of the request that needs it (top of that unit) instead of being spilled,
  and MIN is asked again.  What is spilled is always a block whose next use is the
  farthest of all: MIN over blocks.  A block lent to an admission that does not hit it
  (its lookup stopped at an earlier miss) goes back when that request starts reading
  (:func:`settle`).
* **Finished cached blocks** (ref 0) are dropped before any live block is spilled
  (``view.next_use = NEVER``): in this mode keeping one never saves a load (the admission
  that would hit it allocates a new block in HBM instead, with no transfer), it only
  takes a slot.  The bound is on loads, not on prefix hits (``hit_blocks`` may be lower
  than a policy's).
* Pinned units are still spilled only when nothing else can be (the mode's rule holds for
  the bound too).

What it bounds: the number of blocks brought up into HBM (``blocks_fetched`` +
``prefetches``).  For unit-size pages MIN needs the fewest loads of any schedule,
prefetching ones included (Belady 1966; Mattson et al. 1970); an ACCESS needing a whole
set of blocks at once does not change that (a block of the set is needed now, so MIN never
evicts it).  Hence also the fewest bytes up the links and, with link latency 0, the least
stall time; with a latency per batch the stall time of MIN is not always the least (a
policy may merge fetches into fewer batches).  Checked: tests/sim/test_live_bound.py
(equal to a brute force over every spill/drop choice on traces whose requests share
prefix chains, held and cached, and no built-in policy loads fewer) and
tests/sim/test_live_offload.py (traces without sharing).
Memory: one int64 per ACCESS row and three per admission ALLOCATE row (read once).
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np

from kvsim.core.schema import EventKind, Priority
from kvsim.policy.api import NEVER

PR_CRIT = int(Priority.DECODE_CRITICAL)


DEPTH_CAP = (1 << 30) - 1
CACHED_RANK = NEVER - (1 << 31)  # above every row ordinal, below NEVER (no further read)


class NextUse:
    """Next uses of a trace: ``after_access[ordinal]`` = the ordinal of the next ACCESS row
    of the same request (absent: never), ``first_access[r]``, and per content hash the
    admissions that look it up: ``hash_rows[h]`` = (ordinals of the hashed ALLOCATE rows of
    ``h`` written before their request's first ACCESS, those requests, their first
    ACCESS)."""

    def __init__(self, after_access: dict, first_access: dict, hash_rows: dict) -> None:
        self.after_access = after_access
        self.first_access = first_access
        self.hash_rows = hash_rows

    def hash_use(self, h: int, ordinal: int) -> tuple[int, int]:
        """(first ACCESS, request) of the next admission after row ``ordinal`` that looks
        up content hash ``h``; (NEVER, -1) if none."""
        rows = self.hash_rows.get(h)
        if rows is None:
            return NEVER, -1
        i = bisect.bisect_right(rows[0], ordinal)
        if i == len(rows[0]):
            return NEVER, -1
        return rows[2][i], rows[1][i]


def next_uses(trace_path: str | Path, batch_rows: int = 1 << 20) -> NextUse:
    """One streaming pass over the event file (kind, request and hash columns kept)."""
    from kvsim.replay.prepass import _open

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
    rows: dict[int, tuple] = {}
    for o, r, hv in zip(al.tolist(), rid[al].tolist(), h[al].tolist()):
        fa = first.get(r, NEVER)
        if o < fa:  # an admission lookup (a request that has read looks nothing up)
            e = rows.get(hv)
            if e is None:
                e = rows[hv] = ([], [], [])
            e[0].append(o)
            e[1].append(r)
            e[2].append(fa)
    return NextUse(after, first, rows)


def true_next(rep, b: int) -> tuple[int, int]:
    """(next use, request) of resident block ``b``: the earliest next ACCESS among its
    holders (the request being served: now, -1) and the first ACCESS of the next admission
    that will find it by its content hash (it is the indexed copy); (NEVER, -1) if none."""
    cur, hs, nu = rep.cur_req, rep.b_holders[b], rep.next_use_of
    if cur >= 0 and cur in hs:
        return -1, cur
    best, to = NEVER, -1
    for q in hs:
        if nu[q] < best:
            best, to = nu[q], q
    h = rep.b_hash[b]
    if h != 0 and rep.index.get(h) == b:
        use, q = rep.next_access.hash_use(h, rep.ordinal)
        if q >= 0 and (use < best or q == cur):
            best, to = (-1 if q == cur else use), q
    return best, to


def cached_next(rep, b: int) -> int:
    """MIN's rank of finished, cached block ``b``: after every live block's next use (the
    bound drops cached blocks first: keeping one saves no load), the deepest block of a
    chain first (``CACHED_RANK + depth``), so a chain loses its tail before its head and
    an admission that misses part of it indexes its own copies of the rest (dropping a
    chain's middle would leave its deeper cached blocks to be hit by the next admission
    while the previous one holds its own copies of them: duplicates, more live blocks)."""
    return CACHED_RANK + min(rep.b_idx[b], DEPTH_CAP)


def exact_top(rep, r: int, cls: int, k: int) -> int:
    """Make the top blocks of request ``r``'s unit ``cls`` (the unit MIN named, ranked by
    ``r``'s next use) blocks whose next use really is ``r``'s; return how many of its top
    ``k`` blocks may be spilled (0: none; the caller asks MIN again).

    A block's next use (:func:`true_next`) is the earliest next read among its holders and
    the admissions that will hit it.  A block sits in one request's unit, ranked by that
    request's next use, which is never earlier than the block's own while the request holds
    it or will hit it; so the unit's rank may overstate a block's next use, never understate
    it (:func:`settle` returns a block lent to an admission that did not hit it).  The check
    is lazy: a block whose next use is earlier than ``r``'s is handed to the request that
    reads it then (a holder: it becomes that holder's; an admission still to come: it is
    *lent* to that request, ``rep.lent``, until the request hits it or starts reading)
    instead of being spilled.  What is spilled is then always a block used farthest in the
    future: Belady's MIN over blocks, exact."""
    st = rep.stack[r][cls]
    k = min(k, len(st))
    if k <= 0:
        return 0
    nu, cur, holders, b_hash, index = (rep.next_use_of, rep.cur_req, rep.b_holders,
                                       rep.b_hash, rep.index)
    hash_rows, ordinal, mine = rep.next_access.hash_rows, rep.ordinal, nu[r]
    keep: list[int] = []
    moved: list[tuple[int, int]] = []
    i = len(st)
    while i > 0 and len(keep) < k:  # true_next of each block, inlined (the hot loop)
        i -= 1
        b = st[i]
        hs = holders[b]
        if cur >= 0 and cur in hs:
            (keep.append(b) if cur == r else moved.append((b, cur)))
            continue
        best, to = NEVER, -1
        for q in hs:
            if nu[q] < best:
                best, to = nu[q], q
        h = b_hash[b]
        if h != 0:
            rows = hash_rows.get(h)
            if rows is not None and index.get(h) == b:
                j = bisect.bisect_right(rows[0], ordinal)
                if j < len(rows[0]) and (rows[2][j] < best or rows[1][j] == cur):
                    to = rows[1][j]
                    best = -1 if to == cur else rows[2][j]
        if best >= mine or to == r or to < 0:
            keep.append(b)
        else:
            moved.append((b, to))
    if not moved:
        return len(keep)
    region = st[i:]
    del st[i:]
    gone = {b for b, _ in moved}
    st.extend(b for b in region if b not in gone)
    cnt = rep.ucnt[2 * r + cls]
    for b, _ in moved:
        pr = rep.b_intent[b][1]
        cnt[0 if pr < 0 else 3 if pr > 3 else pr] -= 1
    u = rep.C + 2 * r + cls
    if not st and rep.in_pol[u]:
        rep._remove(u, cls)
    _hand_many(rep, moved)
    return len(keep)


def _hand_many(rep, moved: list) -> None:
    """:func:`_hand` of each ``(block, request)``, inlined (the bound's other hot loop)."""
    lent, lent_to, holders, b_req, b_cls, b_pin, b_intent, req_pin, stack, ucnt = (
        rep.lent, rep.lent_to, rep.b_holders, rep.b_req, rep.b_cls, rep.b_pin,
        rep.b_intent, rep.req_pin, rep.stack, rep.ucnt)
    C, held = rep.C, rep.held_units
    for b, to in moved:
        q = lent.pop(b, None)
        if q is not None:
            lent_to[q].discard(b)
        if to not in holders[b]:
            lent[b] = to
            lent_to.setdefault(to, set()).add(b)
        pr = b_intent[b][1]
        cls = 1 if (b_pin[b] or pr == PR_CRIT or req_pin[to]) else 0  # LiveReplay._cls_of
        b_req[b] = to
        b_cls[b] = cls
        st = stack[to][cls]  # LiveReplay._push
        st.append(b)
        k = 2 * to + cls
        ucnt[k][0 if pr < 0 else 3 if pr > 3 else pr] += 1
        if len(st) == 1 and C + k not in held:
            rep.view.insert_us[C + k] = rep.now_us
            rep._fill_unit(C + k, b)
            rep._insert(C + k, cls)


def _hand(rep, b: int, to: int) -> None:
    """Resident ``b`` (out of its unit) goes on top of request ``to``'s unit."""
    unlend(rep, b)
    if to not in rep.b_holders[b]:
        rep.lent[b] = to
        rep.lent_to.setdefault(to, set()).add(b)
    rep.b_req[b] = to
    rep.b_cls[b] = rep._cls_of(b)
    rep._push(b)


def unlend(rep, b: int) -> None:
    """``b`` is no longer lent (its borrower hit it, another holder fetched it, or nobody
    holds it any more)."""
    q = rep.lent.pop(b, None)
    if q is not None:
        rep.lent_to[q].discard(b)


def settle(rep, r: int) -> None:
    """Request ``r`` starts reading: blocks lent to it that it did not hit go back to the
    request that reads them next (their holder by default), resident or not."""
    for b in list(rep.lent_to.pop(r, ())):
        rep.lent.pop(b, None)
        if rep.b_tier[b] == 0:
            rep._pop_from(b)
            t, to = true_next(rep, b)
            _hand(rep, b, to if to >= 0 else rep.b_holders[b][0])
        else:
            rep.b_req[b] = rep.b_holders[b][0]
            rep.b_cls[b] = rep._cls_of(b)


__all__ = ["NextUse", "next_uses", "cached_next", "exact_top", "true_next", "unlend",
           "settle"]
