"""The policy interface: the one kvsim module a policy may import.

A placement policy orders the **eviction candidates** of one tier and names a victim when
the tier needs room.  Candidates are the blocks resident in the tier that nobody holds:
in HBM, blocks with reference count 0 that stay cached for reuse (vLLM's free queue); in
a lower tier (DRAM, CXL, NVMe) and in the single-tier simulator, every resident block.

Block history survives reuse
----------------------------
A policy's knowledge of a block lasts **as long as the block's content is resident in the
tier, held or cached**; only eviction or invalidation ends it.  The hooks name the
transition, so a policy can keep (say) an LFU count or a SIEVE visited bit across the
many times a cached prefix block is held by a request and released again:

``on_insert(state, view, b, now_us)``
    New content entered the tier in block ``b``: its state begins.  ``b`` is a candidate.
    In HBM a new block is held by the request that allocated it, so ``on_hold(b)``
    follows at once; the replay calls both once ``b``'s view describes the new content
    (after the victims evicted for it were demoted and logged).  Intent fields change
    while a block is held: read them again in ``on_release``.
``on_hit(state, view, b, now_us)``
    The content of ``b`` was accessed again: a single-tier or lower-tier hit (``b`` stays a
    candidate), or an HBM prefix hit, on a cached block (then ``on_hold(b)`` follows) or on
    a block other requests already hold (``b`` is not a candidate; policies that define
    ``on_hold`` receive these, see the defaults below).
``on_hold(state, view, b)``
    A cached HBM block is held again by a request: it stops being a candidate, its state is
    kept.  Never called in a tier without holds.
``on_release(state, view, b, now_us)``
    The last holder released ``b``: it is a candidate again.  For recency policies this is
    an access (a running request reads all its blocks at every step until it finishes);
    vLLM's free queue appends it here.  The view is current (intent, ``last_access_us``).
``on_remove(state, view, b)``
    ``b`` was evicted (after ``victim`` named it) or invalidated: its state ends.
    Only ever called for a candidate.
``victim(state, view, now_us, alt_blocks, alt_scores) -> (block, reason_code, n_alt)``
    Name the *candidate* to evict (never a held block; it is *not* removed yet: the core
    calls ``on_remove``).  Return -1 when there is no candidate.  The policy may write up
    to ``alt_blocks.shape[0]`` runners-up (the next candidates it would have chosen) with
    their scores into the two arrays and returns how many it wrote; the decision log
    records them.  Scores are "higher = more worth keeping"; the victim's own score goes
    in ``alt_scores[0]`` with ``alt_blocks[0] == block`` when ``n_alt >= 1``.
``on_miss(state, view, h, now_us)`` (optional)
    Content with hash ``h`` (``view.content_hash`` of the block it will occupy) was
    requested and is not resident: it will be inserted (``on_insert``) after the
    evictions made to fit it.  Called once, before those ``victim`` calls.  Policies with
    ghost lists (ARC, S3-FIFO) look ``h`` up there, exactly as libCacheSim does in
    ``find``.  Block ids are slots, so ghosts must be keyed by content, not by ``b``.

``prefetch_rank(view, b, now_us) -> float`` (optional; plain Python or ``njit``)
    Live offload only (``--live-offload``, kvsim/sim/live_prefetch.py).  ``b`` is a
    *unit* of the live replay: one running request's resident (or spilled) blocks of one
    pin class, its view the request's latest step (``last_access_us``, ``deadline_us``,
    ``slack_us``, ``target_decode_step``, ``phase``) and its most urgent block
    (``priority``).  Return when its spilled blocks are expected to be needed, smaller =
    sooner; ``inf`` = do not prefetch.  After each step the replay brings back spilled
    blocks in rank order within the link's per-step budget, displacing the policy's own
    ``victim`` only when that victim ranks later.  Default (hook absent): no prefetch,
    every spilled block is fetched on demand and stalls the step that needs it.  The
    built-ins that define it: ``deadline`` (deadline minus slack, deadlines still ahead
    only) and ``intent`` (priority and phase rank, deadlines still ahead only).

Legal sequences per block: ``on_insert`` (``on_hit``)* then any number of rounds of
``on_hold`` (``on_hit``)* ``on_release`` (``on_hit``)*, ended by ``on_remove`` (only while
a candidate).  Same stream, same tier, one decision each: a single-tier access of a
resident block is ``on_hit``; the HBM replay of a one-block request that is held and
released at once is ``on_hit, on_hold, on_release`` (hit) or ``on_miss, [victim,
on_remove], on_insert, on_hold, on_release`` (miss).  A built-in policy treats
``on_hold`` + ``on_release`` with nothing in between as no change of order, so both
streams give the same victims.

Defaults.  A policy may define only ``on_insert``, ``on_hit``, ``on_remove`` and
``victim`` (about 30 lines).  Then ``on_hold`` is its ``on_remove`` and ``on_release`` its
``on_insert``, and it does not receive ``on_hit`` for held blocks: it forgets a block
while the block is held and sees its release as a fresh insertion (what it knows about
the block's past lives in the view: ``insert_us``, ``access_count``, ``last_access_us``).
``on_hold`` and ``on_release`` come as a pair (define both or neither).

A policy is one module (``policies/<name>.py``, or a user file given with
``--policy-file``) defining the hooks above and:

``NAME: str``, ``DESCRIPTION: str``
    Registry name and a one-line description (shown by ``kvsim compare --help``).
``OFFLINE: bool`` (default False)
    True for policies that read the future (``view.next_use``), such as Belady's MIN.
    Their results are labelled as bounds, never as achievable.
``REASONS: tuple[str, ...]``
    Sentences explaining a choice, indexed by the reason code ``victim`` returns, e.g.
    ``("least recently used: idle for the longest time",)``.
``init(capacity_blocks: int, num_slots: int, params: dict) -> PolicyState``
    Plain Python.  Returns the policy's state, sized by ``num_slots`` (block ids of this
    tier run from 0 to ``num_slots - 1``), built with :func:`policy_state`: numpy arrays
    in four fixed-width groups, ``state.i64[k]`` (int64), ``state.f64[k]`` (float64),
    ``state.i8[k]`` (int8) and ``state.i64_2d[k]`` (2-D int64), unused slots empty.  One
    numba type for every policy, so ONE compiled replay core runs every policy's hooks
    (passed to it as first-class functions, :mod:`kvsim.sim.hooks`).  A policy names its
    slots (``PREV, NEXT, ENDS = 0, 1, 2``; ``dll_push_tail(state.i64[PREV], ...)``).
    A plain-Python policy may return anything (a tuple of lists, say): its hooks run
    interpreted.  A policy whose hooks are ``njit`` but whose ``init`` returns another
    type (the tuple form before kvsim 0.2) runs interpreted too, with a one-line note.
``explain(row: dict, now_us: float) -> dict[str, float]`` (optional, plain Python)
    The named score terms of one block given its logged intent fields, for
    ``kvsim log explain``.  Scored policies should provide it.

The hooks are ``numba.njit`` functions for built-ins (the replay loop is compiled once
for all policies; each policy compiles only its own hooks, one signature each, cached on
disk).  Plain Python functions work too: the core then runs its interpreted twin, the
same code, slower.  A policy must be deterministic: no global random state; if it needs
randomness it seeds a generator from ``params["seed"]`` in ``init``.

The view
--------
``view`` is a :class:`BlockView`: read-only per-block arrays of the tier, indexed by block
id, maintained by the core.  A policy must not write to it.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from kvsim.schema import Phase, Priority, Tier  # re-exported: policies import only this module

#: "Never used again" in ``BlockView.next_use``.
NEVER = np.iinfo(np.int64).max

#: Fields of :class:`BlockView`, each a numpy array indexed by the tier's block id.
BLOCK_VIEW_FIELDS = (
    "last_access_us",  # float64: engine time of the block's latest access
    "insert_us",  # float64: engine time the block entered this tier
    "access_count",  # int64: accesses since the content first entered this tier
    "phase",  # int8: Phase of the request that last touched it
    "priority",  # int8: Priority (COLD..DECODE_CRITICAL)
    "request_priority",  # int8: 0..100
    "deadline_us",  # int64: absolute deadline of the next expected use, -1 = none
    "slack_us",  # int64: slack at the last intent update
    "target_decode_step",  # int64: step at which it is next needed, -1 = unknown
    "recompute_cost_us",  # float64: prefill time to recompute the block
    "size_bytes",  # int64
    "pinned",  # bool: pin requested (DECODE_CRITICAL implies it); policies should avoid
    "next_use",  # int64: OFFLINE ONLY: ordinal of the next access, NEVER if none
    "content_hash",  # int64: content identity (0 = none)
)

BlockView = namedtuple("BlockView", BLOCK_VIEW_FIELDS)

_VIEW_DTYPES = {
    "last_access_us": np.float64,
    "insert_us": np.float64,
    "access_count": np.int64,
    "phase": np.int8,
    "priority": np.int8,
    "request_priority": np.int8,
    "deadline_us": np.int64,
    "slack_us": np.int64,
    "target_decode_step": np.int64,
    "recompute_cost_us": np.float64,
    "size_bytes": np.int64,
    "pinned": np.bool_,
    "next_use": np.int64,
    "content_hash": np.int64,
}


def new_block_view(num_slots: int) -> BlockView:
    """A zeroed view for a tier of ``num_slots`` blocks (``deadline_us`` etc. set to -1)."""
    arrays = {name: np.zeros(num_slots, dtype=_VIEW_DTYPES[name]) for name in BLOCK_VIEW_FIELDS}
    arrays["deadline_us"][:] = -1
    arrays["target_decode_step"][:] = -1
    arrays["next_use"][:] = NEVER
    return BlockView(**arrays)


# ---- the uniform policy state --------------------------------------------------------

#: Widths of the four groups of :class:`PolicyState` (the most any built-in needs:
#: deadline's five heaps take 21 int64 and 5 float64 arrays).  Unused slots hold an empty
#: array.  Raising a width changes the state's numba type: every compiled hook and the
#: core recompile once.
STATE_I64 = 24
STATE_F64 = 6
STATE_I8 = 4
STATE_I64_2D = 1

#: A policy's state: fixed-width tuples of 1-D int64 / float64 / int8 arrays and of 2-D
#: int64 arrays.  Build it with :func:`policy_state`.
PolicyState = namedtuple("PolicyState", ("i64", "f64", "i8", "i64_2d"))


def _group(arrays, width: int, dtype, ndim: int, name: str) -> tuple:
    arrays = tuple(arrays)
    if len(arrays) > width:
        raise ValueError(f"policy_state: {len(arrays)} {name} arrays, at most {width}")
    out = []
    for k, a in enumerate(arrays):
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ndim \
                or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"policy_state: {name}[{k}] must be a writeable C-contiguous "
                             f"{ndim}-D {np.dtype(dtype).name} array")
        out.append(a)
    empty = np.zeros((0,) * ndim, dtype)
    return tuple(out) + (empty,) * (width - len(out))


def policy_state(i64=(), f64=(), i8=(), i64_2d=()) -> PolicyState:
    """The :class:`PolicyState` holding these arrays, in order (``state.i64[0]`` is
    ``i64[0]``, ...), padded to the fixed widths with empty arrays.  Arrays are kept, not
    copied; each must be C-contiguous, writeable and of the group's dtype (int8 for
    flags: numba has no cheaper bool array)."""
    return PolicyState(_group(i64, STATE_I64, np.int64, 1, "i64"),
                       _group(f64, STATE_F64, np.float64, 1, "f64"),
                       _group(i8, STATE_I8, np.int8, 1, "i8"),
                       _group(i64_2d, STATE_I64_2D, np.int64, 2, "i64_2d"))


#: The optional pair of hold hooks and the required hook each one defaults to.
HOLD_HOOK_DEFAULTS = {"on_hold": "on_remove", "on_release": "on_insert"}


def keeps_held(module) -> bool:
    """True if ``module`` defines ``on_hold`` and ``on_release`` (it keeps a block's state
    while the block is held, and receives ``on_hit`` for held blocks)."""
    return hasattr(module, "on_hold") and hasattr(module, "on_release")


def hook_bindings(module) -> dict[str, str]:
    """Which function of ``module`` each hook a core calls is bound to: ``on_hold`` and
    ``on_release`` fall back to ``on_remove`` / ``on_insert``; ``on_hit_held`` (``on_hit``
    for a block other requests hold) is ``on_hit``, or None (not called) by default."""
    held = keeps_held(module)
    out = {h: h for h in ("on_hit", "on_insert", "on_remove", "victim")}
    for hook, default in HOLD_HOOK_DEFAULTS.items():
        out[hook] = hook if held else default
    out["on_hit_held"] = "on_hit" if held else None
    return out


# =========================================================================================
# Helpers for policies (numba-compiled data structures over arrays)
# =========================================================================================
#
# Everything below is optional tooling: a policy may use it or not.  All structures are
# plain numpy arrays indexed by block id, so they fit in a policy's ``state`` tuple and
# compile under ``numba.njit``.  Each operation is O(1) (lists) or O(log n) (heap).
#
from numba import njit  # noqa: E402  (kept below the contract part on purpose)

#: ``prev``/``next`` value of a block that is in no list.
OUT = -2
#: ``prev``/``next`` value at the ends of a list, and "no block".
NIL = -1


def njit_hook(fn):
    """``numba.njit`` for a hook that allocates nothing: compiled with ``cache=True`` and
    WITHOUT reference counting (numba's ``_nrt=False`` target option).

    Why: a hook that unpacks its ``state`` tuple and reads ``view`` takes a reference on
    every array it touches and drops it on return: two atomic read-modify-writes per
    array per call, which numba's reference-count pruning does not remove once the hook
    is inlined into the replay loop.  Measured on a 2 M-access Zipf stream
    (docs/benchmarks.md): ARC's hooks went from 0.69 to 4.28 M accesses/s at a 1,000-block
    cache with this decorator alone.  Safe because the arrays a hook receives are owned by
    the caller for the whole replay and a hook never keeps one.  A hook that allocates
    (``np.empty``, a new array, a list) must use plain ``njit``: numba refuses to compile
    it without NRT ("NRT required but not enabled").  Helpers it calls may be ordinary
    ``njit`` functions (they balance their own counts).
    """
    # WITHDRAWN: ``_nrt=False`` is a private numba option, and numba's on-disk cache does
    # not key entries on it: a helper first compiled under a reference-count-free caller
    # was later loaded from the cache by ordinary callers with its reference counting
    # missing, and corrupted memory (the deadline tests aborted in malloc).  Until a safe
    # way exists this is plain ``njit(cache=True)``; the speed figures measured with it are
    # marked as such in docs/benchmarks.md.
    return njit(cache=True)(fn)


@njit(cache=True)
def noop_hook(state, view, b, now_us):
    """A hook that does nothing (the default ``on_miss``)."""
    return None


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


@njit(cache=True)
def dll_contains(prev, b):
    """True if ``b`` is in some list sharing these links."""
    return prev[b] != OUT


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def dll_move_to_tail(prev, nxt, ends, b):
    """Move ``b`` (in this list) to the tail: the LRU "touch"."""
    if ends[1] != b:
        dll_remove(prev, nxt, ends, b)
        dll_push_tail(prev, nxt, ends, b)


@njit(cache=True)
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


@njit(cache=True)
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
