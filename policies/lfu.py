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

from kvsim.policy.api import NIL, OUT, StateSpec, dll_contains, dll_push_tail, dll_remove

NAME = "lfu"
DESCRIPTION = "Least frequently used since entering the tier; least recently used among ties."
OFFLINE = False
REASONS = ("least frequently used since it entered the tier (oldest access among ties)",)

FREE_TOP, LOWEST = 0, 1  # ``meta``: free-list top, the node of the lowest count (NIL: none)

STATE = StateSpec(i64=("bprev", "bnext",  # links of the blocks in their node's list
                        "freq",  # per block: its count
                        "node_of",  # per block: its node
                        "nfreq", "nprev", "nnext",  # per node: count, sorted node links
                        "nres",  # per node: its resident blocks (held ones included)
                        "free",  # stack of free nodes
                        "meta"),  # see FREE_TOP, LOWEST
                   i64_2d=("nends",))  # per node: [head, tail, size] of its candidate list


def init(capacity_blocks, num_slots, params):
    m = num_slots + 2  # live nodes <= resident blocks, +1 while a hit moves a block
    nends = np.zeros((m, 3), np.int64)
    nends[:, :2] = NIL
    return STATE.new(bprev=np.full(num_slots, OUT, np.int64),
                     bnext=np.full(num_slots, OUT, np.int64), freq=np.zeros(num_slots, np.int64),
                     node_of=np.full(num_slots, NIL, np.int64), nfreq=np.zeros(m, np.int64),
                     nprev=np.full(m, NIL, np.int64), nnext=np.full(m, NIL, np.int64),
                     nres=np.zeros(m, np.int64), free=np.arange(m - 1, -1, -1, dtype=np.int64),
                     meta=np.array([m, NIL], np.int64), nends=nends)


@njit(cache=True)
def _node_new(state, f, after):
    """A node of count ``f`` linked after node ``after`` (NIL: as the lowest)."""
    nfreq, nprev, nnext, nres = state.nfreq, state.nprev, state.nnext, state.nres
    nends, free, meta = state.nends, state.free, state.meta
    meta[FREE_TOP] -= 1
    node = free[meta[FREE_TOP]]
    nfreq[node] = f
    nres[node] = 0
    nends[node, 0] = NIL
    nends[node, 1] = NIL
    nends[node, 2] = 0
    nxt = meta[LOWEST] if after == NIL else nnext[after]
    nprev[node] = after
    nnext[node] = nxt
    if after == NIL:
        meta[LOWEST] = node
    else:
        nnext[after] = node
    if nxt != NIL:
        nprev[nxt] = node
    return node


@njit(cache=True)
def _node_drop(state, node):
    """Unlink and free a node with no resident block."""
    nprev, nnext, free, meta = state.nprev, state.nnext, state.free, state.meta
    p = nprev[node]
    n = nnext[node]
    if p == NIL:
        meta[LOWEST] = n
    else:
        nnext[p] = n
    if n != NIL:
        nprev[n] = p
    free[meta[FREE_TOP]] = node
    meta[FREE_TOP] += 1


@njit(cache=True)
def on_insert(state, view, b, now_us):
    state = STATE.of(state)
    bprev, bnext, freq, node_of = state.bprev, state.bnext, state.freq, state.node_of
    nfreq, nres, nends, meta = state.nfreq, state.nres, state.nends, state.meta
    node = meta[LOWEST]
    if node == NIL or nfreq[node] != 1:
        node = _node_new(state, 1, NIL)
    freq[b] = 1
    node_of[b] = node
    nres[node] += 1
    dll_push_tail(bprev, bnext, nends[node], b)


@njit(cache=True)
def on_hit(state, view, b, now_us):
    state = STATE.of(state)
    bprev, bnext, freq, node_of = state.bprev, state.bnext, state.freq, state.node_of
    nfreq, nnext, nres, nends = state.nfreq, state.nnext, state.nres, state.nends
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
    state = STATE.of(state)
    dll_remove(state.bprev, state.bnext, state.nends[state.node_of[b]], b)


@njit(cache=True)
def on_release(state, view, b, now_us):
    state = STATE.of(state)
    dll_push_tail(state.bprev, state.bnext, state.nends[state.node_of[b]], b)


@njit(cache=True)
def on_remove(state, view, b):
    state = STATE.of(state)
    bprev, bnext, freq, node_of = state.bprev, state.bnext, state.freq, state.node_of
    nres, nends = state.nres, state.nends
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
    state = STATE.of(state)
    bnext, freq, nnext, nends = state.bnext, state.freq, state.nnext, state.nends
    node = state.meta[LOWEST]
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
