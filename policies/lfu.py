"""LFU with LRU tie-break, libCacheSim's ``LFU`` exactly, in O(1) frequency buckets.

libCacheSim's LFU (cache/eviction/LFU.c) is *in-cache* LFU: a block's count starts at 1
when its content enters the tier and is forgotten when it leaves.  It keeps one FIFO list
per frequency, appends a block to the list of its new frequency on every hit and evicts
the head of the lowest non-empty frequency; so among equal counts the block that reached
that count first (its least recent access) goes first.

Structure (the O(1) LFU of Shah, Mitra & Matani 2010, as libCacheSim's freq nodes): a
sorted linked list of frequency *nodes*, one per count that some resident block has; each
node holds the FIFO list of its *candidate* blocks and ``n_res``, its resident blocks
(held ones included).  A hit moves a block to the node of count + 1 (created next to its
node if missing; an emptied node is freed).  A held HBM block keeps its count and node
while held and still gets its hits (``on_hit``); it leaves the node's list on ``on_hold``
and is appended to it on ``on_release`` (release counts as its latest access among equal
counts).  ``victim`` walks nodes from the lowest count to the first with a candidate:
O(1) unless the lowest counts belong to held blocks only.  Score: the count.
"""

import numpy as np
from numba import njit

from kvsim.policy.api import NIL, OUT, dll_contains, dll_push_tail, dll_remove, policy_state

NAME = "lfu"
DESCRIPTION = "Least frequently used since entering the tier; least recently used among ties."
OFFLINE = False
REASONS = ("least frequently used since it entered the tier (oldest access among ties)",)

# state (kvsim.policy.api.PolicyState): i64 = bprev, bnext, freq, node_of, nfreq, nprev, nnext,
# nres, free, meta; i64_2d = nends
# meta = [free_top, lowest node]


def init(capacity_blocks, num_slots, params):
    m = num_slots + 2  # live nodes <= resident blocks, +1 while a hit moves a block
    nends = np.zeros((m, 3), np.int64)
    nends[:, :2] = NIL
    # i64: bprev, bnext, freq, node_of, nfreq, nprev, nnext, nres, free, meta; i64_2d: nends
    return policy_state(i64=(np.full(num_slots, OUT, np.int64), np.full(num_slots, OUT, np.int64),
                              np.zeros(num_slots, np.int64), np.full(num_slots, NIL, np.int64),
                              np.zeros(m, np.int64), np.full(m, NIL, np.int64),
                              np.full(m, NIL, np.int64), np.zeros(m, np.int64),
                              np.arange(m - 1, -1, -1, dtype=np.int64),
                              np.array([m, NIL], np.int64)),
                        i64_2d=(nends,))


@njit(cache=True)
def _node_new(state, f, after):
    """A node of count ``f`` linked after node ``after`` (NIL: as the lowest)."""
    nfreq, nprev, nnext, nres, nends, free, meta = (state.i64[4], state.i64[5], state.i64[6], state.i64[7], state.i64_2d[0], state.i64[8], state.i64[9])
    meta[0] -= 1
    node = free[meta[0]]
    nfreq[node] = f
    nres[node] = 0
    nends[node, 0] = NIL
    nends[node, 1] = NIL
    nends[node, 2] = 0
    nxt = meta[1] if after == NIL else nnext[after]
    nprev[node] = after
    nnext[node] = nxt
    if after == NIL:
        meta[1] = node
    else:
        nnext[after] = node
    if nxt != NIL:
        nprev[nxt] = node
    return node


@njit(cache=True)
def _node_drop(state, node):
    """Unlink and free a node with no resident block."""
    nprev, nnext, free, meta = state.i64[5], state.i64[6], state.i64[8], state.i64[9]
    p = nprev[node]
    n = nnext[node]
    if p == NIL:
        meta[1] = n
    else:
        nnext[p] = n
    if n != NIL:
        nprev[n] = p
    free[meta[0]] = node
    meta[0] += 1


@njit(cache=True)
def on_insert(state, view, b, now_us):
    bprev, bnext, freq, node_of, nfreq, nres, nends, meta = (
        state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i64[4], state.i64[7], state.i64_2d[0], state.i64[9])
    node = meta[1]
    if node == NIL or nfreq[node] != 1:
        node = _node_new(state, 1, NIL)
    freq[b] = 1
    node_of[b] = node
    nres[node] += 1
    dll_push_tail(bprev, bnext, nends[node], b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    bprev, bnext, freq, node_of, nfreq, nnext, nres, nends = (
        state.i64[0], state.i64[1], state.i64[2], state.i64[3], state.i64[4], state.i64[6], state.i64[7], state.i64_2d[0])
    node = node_of[b]
    f = freq[b] + 1
    target = nnext[node]
    if target == NIL or nfreq[target] != f:
        target = _node_new(state, f, node)
    if dll_contains(bprev, b):
        dll_remove(bprev, bnext, nends[node], b)
        dll_push_tail(bprev, bnext, nends[target], b)
    nres[node] -= 1
    nres[target] += 1
    node_of[b] = target
    freq[b] = f
    if nres[node] == 0:
        _node_drop(state, node)


@njit(cache=True)
def on_hold(state, view, b):
    dll_remove(state.i64[0], state.i64[1], state.i64_2d[0][state.i64[3][b]], b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    dll_push_tail(state.i64[0], state.i64[1], state.i64_2d[0][state.i64[3][b]], b)


@njit(cache=True)
def on_remove(state, view, b):
    bprev, bnext, freq, node_of, nres, nends = (state.i64[0], state.i64[1], state.i64[2], state.i64[3],
                                                state.i64[7], state.i64_2d[0])
    node = node_of[b]
    if dll_contains(bprev, b):
        dll_remove(bprev, bnext, nends[node], b)
    nres[node] -= 1
    if nres[node] == 0:
        _node_drop(state, node)
    freq[b] = 0
    node_of[b] = NIL


@njit(cache=True)
def victim(state, view, now_us, alt_blocks, alt_scores):
    bnext, freq, nnext, nends, meta = state.i64[1], state.i64[2], state.i64[6], state.i64_2d[0], state.i64[9]
    node = meta[1]
    while node != NIL and nends[node, 2] == 0:
        node = nnext[node]
    if node == NIL:
        return -1, 0, 0
    b = nends[node, 0]
    n_alt = 0
    c = b
    while n_alt < alt_blocks.shape[0]:  # runners-up: this node's list, then higher counts
        if c == NIL:
            node = nnext[node]
            if node == NIL:
                break
            c = nends[node, 0]
            continue
        alt_blocks[n_alt] = c
        alt_scores[n_alt] = float(freq[c])
        n_alt += 1
        c = bnext[c]
    return b, 0, n_alt
