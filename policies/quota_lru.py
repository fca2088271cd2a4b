"""quota_lru: LRU that keeps each tenant within its quota in this tier (hard cap and
guaranteed share, docs/policies.md "Tenant quotas").

Quotas come from ``params["tenant_quotas"]``: ``{tier: ((tenant, cap_blocks,
share_blocks[, high_blocks, low_blocks]), ...)}`` (``SimConfig.tenant_quotas``,
``--tenant-quota``), and
``params["tier"]`` names the tier the instance serves ("hbm", "dram", "cxl", "nvme").
Tenants without a quota in this tier are pooled into one group with no cap and no share.
A tenant's *usage* is the number of blocks of its content resident in the tier, held or
cached (``on_insert`` adds one, ``on_remove`` takes it away; the block's tenant is
``view.tenant``, the tenant of the request that brought it in).  In HBM only hashed blocks
(the ones the pool caches) are counted: a request's partial last block is never a
candidate and never seen by a policy.

Order: one LRU list of the candidates (as ``lru``).  ``victim`` walks it from the least
recently used end and names

0. the first candidate whose tenant is above its hard cap (``usage > cap``);
3. else the first candidate whose tenant is *draining*: its usage rose above its high
   watermark (``usage > high`` after an insertion) and has not yet come down to its low
   watermark (``usage <= low`` after a removal ends it): Mooncake Store's watermark
   eviction, made lazy (below);
1. else the first candidate whose tenant is above its guaranteed share (``usage > share``;
   the pooled tenants' share is 0);
2. else the least recently used candidate (every tenant is within its share: the tier is
   smaller than the shares promise).

(The numbers are the reason codes of the decision log; 3 was added with the watermarks, so
the older codes kept their meaning.)  A watermark pair is hysteresis: once a tenant passes
its high watermark, the tier's next evictions take its blocks until it is down to its low
one, however recently they were used; with ``low == high`` draining ends at the first
removal and the watermark is a cap at that level (the coinciding watermarks of Mooncake
#3741).  Mooncake evicts at once when the high watermark is passed; kvsim's tiers evict
only when they need room, so here the watermarks decide *whose* blocks go and how many in
a row, not *when*.

So under pressure a tenant over its cap pays first and a tenant within its guaranteed
share is evicted last.  Eviction happens only when the tier needs room: a cap bounds a
tenant whenever the tier is full, not while free blocks remain.  ``victim`` is O(walk)
(the list up to the first eligible candidate); every other hook is O(1).  With no quota
for the tier it names exactly what ``lru`` names.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import (
    NIL,
    StateSpec,
    dll_contains,
    dll_ends,
    dll_links,
    dll_move_to_tail,
    dll_push_tail,
    dll_remove,
    list_walk,
)

NAME = "quota_lru"
DESCRIPTION = ("LRU within per-tenant quotas: tenants over their hard cap are evicted first, "
               "tenants within their guaranteed share last (--tenant-quota).")
OFFLINE = False
#: not run by `kvsim compare` without --policies: without quotas it is lru
IN_DEFAULT_LIST = False
REASONS = ("its tenant is above its hard cap: least recently used of such tenants",
           "its tenant is above its guaranteed share: least recently used of such tenants",
           "every tenant is within its guaranteed share: least recently used",
           "its tenant passed its high watermark and is not yet down to its low one: "
           "least recently used of such tenants")

#: usage index of the tenants without a quota in this tier (after the listed ones)
STATE = StateSpec(i64=("prev", "nxt", "lru",  # the LRU list of candidates, as lru
                        "tenants",  # listed tenant ids (index k = quota k)
                        "cap", "share", "usage",  # per index, the last one = the pool
                        "high", "low", "draining",  # watermarks per index, 1 = draining
                        "counted"))  # per block: usage index it is counted in, -1 = none

NO_CAP = np.iinfo(np.int64).max


def init(capacity_blocks, num_slots, params):
    prev, nxt = dll_links(num_slots)
    quotas = dict(params.get("tenant_quotas") or {}).get(params.get("tier", "hbm"), ())
    # (tenant, cap, share[, high, low]); no watermark: high = low = NO_CAP (never drains)
    quotas = sorted(tuple(int(v) for v in q) + ((NO_CAP, NO_CAP) if len(q) == 3 else ())
                    for q in quotas)
    n = len(quotas)
    tenants = np.array([q[0] for q in quotas], np.int64)
    cap = np.array([q[1] for q in quotas] + [NO_CAP], np.int64)
    share = np.array([q[2] for q in quotas] + [0], np.int64)
    high = np.array([q[3] for q in quotas] + [NO_CAP], np.int64)
    low = np.array([q[4] for q in quotas] + [NO_CAP], np.int64)
    return STATE.new(prev=prev, nxt=nxt, lru=dll_ends(), tenants=tenants, cap=cap,
                     share=share, usage=np.zeros(n + 1, np.int64), high=high, low=low,
                     draining=np.zeros(n + 1, np.int64),
                     counted=np.full(num_slots, -1, np.int64))


@njit(cache=True)
def _index(tenants, t):
    for k in range(tenants.shape[0]):
        if tenants[k] == t:
            return k
    return tenants.shape[0]


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    k = _index(state.tenants, np.int64(view.tenant[b]))
    state.counted[b] = k
    state.usage[k] += 1
    if state.usage[k] > state.high[k]:
        state.draining[k] = 1
    dll_push_tail(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    if dll_contains(state.prev, b):  # a held block is reordered at its release
        dll_move_to_tail(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_hold(state, view, b):
    state = STATE.of(state)
    dll_remove(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    dll_push_tail(state.prev, state.nxt, state.lru, b)


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    if dll_contains(state.prev, b):
        dll_remove(state.prev, state.nxt, state.lru, b)
    k = state.counted[b]
    if k >= 0:
        state.usage[k] -= 1
        state.counted[b] = -1
        if state.usage[k] <= state.low[k]:
            state.draining[k] = 0


@njit(cache=True)
def _first(state, rule):
    """The least recently used candidate whose tenant is above its cap (``rule`` 0), above
    its share (1) or draining (3); NIL if none."""
    b = state.lru[0]
    while b != NIL:
        k = state.counted[b]
        if k >= 0:
            if rule == 3:
                if state.draining[k] != 0:
                    return b
            elif state.usage[k] > (state.cap[k] if rule == 0 else state.share[k]):
                return b
        b = state.nxt[b]
    return NIL


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    state = STATE.of(state)
    head = state.lru[0]
    if head < 0:
        return -1, 0, 0
    n_alt = list_walk(state.prev, state.nxt, state.lru, alt_blocks, alt_scores,
                      view.last_access_us)
    # walk only for a group that is over: O(groups) to know, O(walk) to find its block
    over_cap = False
    over_share = False
    draining = False
    for k in range(state.usage.shape[0]):
        over_cap = over_cap or state.usage[k] > state.cap[k]
        over_share = over_share or state.usage[k] > state.share[k]
        draining = draining or state.draining[k] != 0
    if over_cap:
        b = _first(state, 0)
        if b != NIL:
            return b, 0, n_alt
    if draining:
        b = _first(state, 3)
        if b != NIL:
            return b, 3, n_alt
    if over_share:
        b = _first(state, 1)
        if b != NIL:
            return b, 1, n_alt
    return head, 2, n_alt
