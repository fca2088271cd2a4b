"""Data structures for policies, numba-compiled over plain arrays: intrusive doubly linked
lists (``dll_*``), an indexed binary min-heap (``heap_*``) and ghost sets of content hashes
(``ghost_*``).  Optional tooling: a policy may use them or not, and imports them from
:mod:`kvsim.policy.api`, which re-exports every public name here (a policy touches only
the policy interface).  All structures are numpy arrays indexed by block id, so they fit
in a policy's ``PolicyState``; each operation is O(1) (lists, ghosts: expected) or
O(log n) (heap).  Exact behaviour is pinned by tests/policies/test_structs*.py and the
policies' order tests."""

from __future__ import annotations

import numpy as np

from kvsim.jit.decorators import njit

# Every structure operation is compiled without a C wrapper (``no_cfunc_wrapper``, set by
# kvsim.jit.decorators.njit for every function not listed in its FIRST_CLASS): only hooks are
# passed as first-class function values (kvsim.policy.hooks), and a wrapper is compiled
# code too.  The CPython wrapper stays: an interpreted policy's Python hooks call these
# compiled functions.

#: ``prev``/``next`` value of a block that is in no list.
OUT = -2
#: ``prev``/``next`` value at the ends of a list, and "no block".
NIL = -1


# ---- intrusive doubly linked lists ----------------------------------------------------
# Several lists may share one ``prev``/``next`` pair as long as a block is in at most one
# of them at a time; each list has its own ``ends`` array ``[head, tail, size]``.
# Orientation used by every built-in policy: HEAD = next to evict (oldest),
# TAIL = most recently inserted / touched.


def dll_links(num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prev, next)`` arrays for ``num_slots`` blocks, every block in no list."""
    return np.full(num_slots, OUT, np.int64), np.full(num_slots, OUT, np.int64)


def dll_ends() -> np.ndarray:
    """An empty list's ``ends``: ``[head, tail, size] = [NIL, NIL, 0]``."""
    return np.array([NIL, NIL, 0], np.int64)


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def dll_contains(prev, b):
    """True if ``b`` is in some list sharing these links."""
    return prev[b] != OUT


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def dll_push_tail(prev, nxt, ends, b):
    """Append ``b`` (in no list) at the tail.  Invariant: ``ends[2]`` counts the nodes."""
    tail = ends[1]
    prev[b] = tail
    nxt[b] = NIL
    if tail == NIL:
        ends[0] = b
    else:
        nxt[tail] = b
    ends[1] = b
    ends[2] += 1


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def dll_push_head(prev, nxt, ends, b):
    """Insert ``b`` (in no list) at the head (it becomes the next to evict)."""
    head = ends[0]
    nxt[b] = head
    prev[b] = NIL
    if head == NIL:
        ends[1] = b
    else:
        prev[head] = b
    ends[0] = b
    ends[2] += 1


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def dll_remove(prev, nxt, ends, b):
    """Unlink ``b`` from the list described by ``ends`` (it must be in that list)."""
    p = prev[b]
    n = nxt[b]
    if p == NIL:
        ends[0] = n
    else:
        nxt[p] = n
    if n == NIL:
        ends[1] = p
    else:
        prev[n] = p
    prev[b] = OUT
    nxt[b] = OUT
    ends[2] -= 1


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def dll_move_to_tail(prev, nxt, ends, b):
    """Move ``b`` (in this list) to the tail: the LRU "touch"."""
    if ends[1] != b:
        dll_remove(prev, nxt, ends, b)
        dll_push_tail(prev, nxt, ends, b)


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def dll_pop_head(prev, nxt, ends):
    """Remove and return the head, or NIL if the list is empty."""
    b = ends[0]
    if b != NIL:
        dll_remove(prev, nxt, ends, b)
    return b


# ---- indexed binary min-heap ---------------------------------------------------------------
# Entries are blocks ordered by ``(key[b], tie[b])`` (lexicographic, smallest first).
# ``pos[b]`` is the block's index in ``heap`` or -1; ``meta[0]`` the number of entries.
# push / remove / update are O(log n); peek is O(1); the k smallest in O(k^2) without
# touching the heap.


def heap_new(num_slots: int) -> tuple:
    """An empty heap for blocks ``0..num_slots-1``: ``(key, tie, heap, pos, meta)``."""
    return (np.zeros(num_slots, np.float64), np.zeros(num_slots, np.int64),
            np.full(num_slots, NIL, np.int64), np.full(num_slots, NIL, np.int64),
            np.zeros(1, np.int64))


@njit(cache=True, inline="always")
def heap_in(state, f, i):
    """The heap whose key array is ``state.f64[f]`` and whose tie, heap, pos and meta
    arrays are ``state.i64[i .. i+3]`` (the layout :func:`heap_new` returns, stored with
    :func:`heap_slots`)."""
    return (state.f64[f], state.i64[i], state.i64[i + 1], state.i64[i + 2],
            state.i64[i + 3])


@njit(cache=True, inline="always")
def heap_of(key, parts):
    """The heap whose key array is ``key`` and whose tie, heap, pos and meta arrays are the
    4-tuple ``parts``: a policy's named state (``StateSpec(f64=("key",), i64=(("heap",
    4),))``, ``heap_of(state.key, state.heap)``) as :func:`heap_in` reads slots."""
    return (key, parts[0], parts[1], parts[2], parts[3])


def heap_slots(h) -> tuple[tuple, tuple]:
    """``(f64 arrays, i64 arrays)`` of a heap from :func:`heap_new`, in the order
    :func:`heap_in` reads them back: ``([key], [tie, heap, pos, meta])``."""
    return (h[0],), tuple(h[1:])


@njit(cache=True)
def _heap_less(key, tie, a, b):
    return key[a] < key[b] or (key[a] == key[b] and tie[a] < tie[b])


@njit(cache=True)
def _heap_sift_up(key, tie, heap, pos, i):
    b = heap[i]
    while i > 0:
        parent = (i - 1) >> 1
        pb = heap[parent]
        if _heap_less(key, tie, b, pb):
            heap[i] = pb
            pos[pb] = i
            i = parent
        else:
            break
    heap[i] = b
    pos[b] = i


@njit(cache=True)
def _heap_sift_down(key, tie, heap, pos, n, i):
    b = heap[i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _heap_less(key, tie, heap[c + 1], heap[c]):
            c += 1
        cb = heap[c]
        if _heap_less(key, tie, cb, b):
            heap[i] = cb
            pos[cb] = i
            i = c
        else:
            break
    heap[i] = b
    pos[b] = i


@njit(cache=True)
def heap_contains(h, b):
    return h[3][b] != NIL


@njit(cache=True)
def heap_size(h):
    return h[4][0]


@njit(cache=True)
def heap_push(h, b, k, t):
    """Add block ``b`` (not in the heap) with key ``(k, t)``."""
    key, tie, heap, pos, meta = h
    key[b] = k
    tie[b] = t
    n = meta[0]
    heap[n] = b
    pos[b] = n
    meta[0] = n + 1
    _heap_sift_up(key, tie, heap, pos, n)


@njit(cache=True)
def heap_remove(h, b):
    """Remove block ``b`` (in the heap)."""
    key, tie, heap, pos, meta = h
    i = pos[b]
    n = meta[0] - 1
    meta[0] = n
    pos[b] = NIL
    if i == n:
        heap[n] = NIL
        return
    last = heap[n]
    heap[n] = NIL
    heap[i] = last
    pos[last] = i
    if i > 0 and _heap_less(key, tie, last, heap[(i - 1) >> 1]):
        _heap_sift_up(key, tie, heap, pos, i)
    else:
        _heap_sift_down(key, tie, heap, pos, n, i)


@njit(cache=True)
def heap_update(h, b, k, t):
    """Change the key of block ``b`` (in the heap) to ``(k, t)``."""
    key, tie, heap, pos, meta = h
    old_k = key[b]
    old_t = tie[b]
    key[b] = k
    tie[b] = t
    if k < old_k or (k == old_k and t < old_t):
        _heap_sift_up(key, tie, heap, pos, pos[b])
    else:
        _heap_sift_down(key, tie, heap, pos, meta[0], pos[b])


@njit(cache=True)
def heap_peek(h):
    """The block with the smallest key, or NIL if empty."""
    if h[4][0] == 0:
        return NIL
    return h[2][0]


@njit(cache=True)
def heap_smallest(h, out_blocks, out_keys):
    """Write the ``len(out_blocks)`` smallest entries in order; return how many.

    Does not modify the heap: a small frontier of heap positions is expanded best-first,
    so the cost is O(k^2) for k outputs (k is the decision log's runners-up count, <= ~8).
    """
    key, tie, heap, pos, meta = h
    n = meta[0]
    k = out_blocks.shape[0]
    if k == 0 or n == 0:
        return 0
    frontier = np.empty(2 * k + 2, np.int64)
    nf = 1
    frontier[0] = 0
    written = 0
    while written < k and nf > 0:
        best = 0
        for j in range(1, nf):
            if _heap_less(key, tie, heap[frontier[j]], heap[frontier[best]]):
                best = j
        i = frontier[best]
        frontier[best] = frontier[nf - 1]
        nf -= 1
        out_blocks[written] = heap[i]
        out_keys[written] = key[heap[i]]
        written += 1
        for c in (2 * i + 1, 2 * i + 2):
            if c < n:
                frontier[nf] = c
                nf += 1
    return written


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def list_walk(prev, nxt, ends, out_blocks, out_scores, scores):
    """Write up to ``len(out_blocks)`` blocks from the head of a list, with
    ``scores[b]`` as their score; return how many (runners-up of list policies)."""
    b = ends[0]
    i = 0
    while b != NIL and i < out_blocks.shape[0]:
        out_blocks[i] = b
        out_scores[i] = scores[b]
        i += 1
        b = nxt[b]
    return i


# ---- ghost sets: content hashes without data, in FIFO/LRU lists ---------------------------
# Ghost lists (ARC's B1/B2, S3-FIFO's ghost queue) remember *content* that was evicted.
# Block ids are slots that new content reuses at once, so ghosts are keyed by the content
# hash (``view.content_hash``), in a pool of ``max_ghosts`` nodes: node links ``prev``/
# ``nxt`` (several lists may share them, each with its own ``ends``), ``node_hash`` and an
# open-addressing map hash -> node (linear probing, backward-shift deletion, load <= 1/2).
# Every operation is O(1) expected.


def ghost_new(max_ghosts: int) -> tuple:
    """An empty ghost pool: ``(map_keys, map_vals, node_hash, prev, nxt, free, meta)``;
    ``meta = [free_top]``."""
    n = max(int(max_ghosts), 1)
    size = 4
    while size < 2 * n + 2:
        size *= 2
    prev, nxt = dll_links(n)
    return (np.zeros(size, np.int64), np.full(size, NIL, np.int64), np.zeros(n, np.int64),
            prev, nxt, np.arange(n - 1, -1, -1, dtype=np.int64), np.array([n], np.int64))


@njit(cache=True, inline="always")
def ghost_in(state, i):
    """The ghost pool stored as ``state.i64[i .. i+6]`` (the seven arrays
    :func:`ghost_new` returns, in that order)."""
    return (state.i64[i], state.i64[i + 1], state.i64[i + 2], state.i64[i + 3],
            state.i64[i + 4], state.i64[i + 5], state.i64[i + 6])


@njit(cache=True, inline="always")
def _g_home(h, mask):
    return (h ^ (h >> 17) ^ (h >> 31) ^ (h >> 47)) & mask


@njit(cache=True)
def _g_slot(keys, h):
    mask = keys.shape[0] - 1
    i = _g_home(h, mask)
    while True:
        k = keys[i]
        if k == h or k == 0:
            return i
        i = (i + 1) & mask


@njit(cache=True)
def ghost_find(g, h):
    """The node holding hash ``h``, or NIL (``h == 0`` is never a ghost)."""
    if h == 0:
        return NIL
    keys = g[0]
    i = _g_slot(keys, h)
    return g[1][i] if keys[i] == h else NIL


@njit(cache=True)
def ghost_push_tail(g, ends, h):
    """Append hash ``h`` (not a ghost yet, non-zero) to the list ``ends``; False when the
    pool is full (the caller drops its oldest ghost first)."""
    keys, vals, node_hash, prev, nxt, free, meta = g
    if meta[0] == 0:
        return False
    meta[0] -= 1
    node = free[meta[0]]
    node_hash[node] = h
    i = _g_slot(keys, h)
    keys[i] = h
    vals[i] = node
    dll_push_tail(prev, nxt, ends, node)
    return True


@njit(cache=True)
def ghost_remove(g, ends, node):
    """Drop ghost ``node`` (in the list ``ends``)."""
    keys, vals, node_hash, prev, nxt, free, meta = g
    dll_remove(prev, nxt, ends, node)
    mask = keys.shape[0] - 1
    i = _g_slot(keys, node_hash[node])
    j = i
    while True:  # backward-shift deletion (no tombstones)
        j = (j + 1) & mask
        k = keys[j]
        if k == 0:
            break
        home = _g_home(k, mask)
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            keys[i] = k
            vals[i] = vals[j]
            i = j
    keys[i] = 0
    vals[i] = NIL
    node_hash[node] = 0
    free[meta[0]] = node
    meta[0] += 1


@njit(cache=True)
def ghost_pop_head(g, ends):
    """Drop the oldest ghost of the list ``ends`` (no-op if empty)."""
    node = ends[0]
    if node != NIL:
        ghost_remove(g, ends, node)
