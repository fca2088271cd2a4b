"""The compiled block pool: vLLM v1 prefix caching in numpy arrays and ``@njit`` functions.

This is the HBM pool of the replay (``kvsim.replay``); the API is documented in
:mod:`kvsim.memory` and its semantics in ``docs/memory-model.md``.  The plain-Python twin
:mod:`kvsim.memory.reference` is the oracle: tests/memory/test_differential.py checks that
both agree on every block id and counter.

State (one :class:`PoolState`, all arrays indexed by block id or seq slot):

* every block ``1 .. N-1`` is in exactly one of three states (block 0, the null block, in
  none): **held** (``ref_cnt > 0``), **empty** (ref 0, no hash; linked in the empties
  deque ``e_next/e_prev``, sentinel ``N``), **cached** (ref 0, hashed; a candidate of the
  order policy, ``in_cand``);
* ``block_hash[b] != 0`` iff ``b`` is registered in the prefix index: an open-addressing
  table ``hidx`` (linear probing, key 0 = empty slot, load <= 1/2; keys and values
  interleaved in one array, ``hidx[2i]`` the key of entry ``i`` and ``hidx[2i + 1]`` the
  first block registered with it, so a probe that finds its key has the block in the same
  cache line) maps a hash to the first block registered with it; further blocks with the same hash (vLLM does not
  de-duplicate) follow in the circular list ``h_next/h_prev`` in registration order.  (A
  numba typed Dict worked too but was slower and much slower to compile);
* ``tables[seq, :seq_len[seq]]`` is a seq's block table; ``ref_cnt[b]`` equals the number
  of table entries naming ``b`` (caches hold no references in vLLM).

Why two free structures where vLLM has one queue: vLLM's queue is always
``[empty blocks][cached blocks]`` (unhashed blocks are prepended, hashed ones appended,
initial blocks are empty), so popping its head = "an empty block if any, else the oldest
cached one".  Splitting it lets a policy order the cached part.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field

import numpy as np

from kvsim.core.errors import bad_value
from kvsim.jit.decorators import njit

# ---- allocation result kinds (out.kind) ----------------------------------------------
KIND_HIT = 0  # prefix hit on a block another seq holds: shared, ref + 1
KIND_REVIVED = 1  # prefix hit on a cached block (ref 0): taken out of the candidate set
KIND_NEW = 2  # a new block from the empties
KIND_EVICTED = 3  # a new block obtained by evicting a cached block (out.evicted_hash)

PREEMPT_RECOMPUTE = 0
PREEMPT_SWAP = 1

# ---- counters (st.counters) ------------------------------------------------------------
COUNTER_NAMES = (
    "admissions",  # allocations on an empty table (first admission, not reruns)
    "query_tokens",  # prompt tokens at admission (vLLM PrefixCacheStats.queries)
    "hit_tokens",  # prefix-hit tokens at admission (vLLM PrefixCacheStats.hits)
    "rerun_admissions",  # admissions of preempted requests (counted apart, like vLLM)
    "rerun_query_tokens",
    "rerun_hit_tokens",
    "hit_blocks",  # prefix-hit blocks (first admissions and reruns)
    "revived_blocks",  # hits on cached (ref 0) blocks
    "new_blocks",  # blocks taken from the empties
    "evicted_blocks",  # cached blocks evicted to make room
    "alloc_failures",  # allocations refused (did not fit; nothing changed)
    "released_blocks",  # ref count reached 0
    "cow_copies",  # copy-on-write copies of a shared last block
    "cow_bytes",  # bytes copied by copy-on-write (cow_copies * block_bytes)
    "forks",
    "preempt_recompute",
    "preempt_swap",
    "swap_out_blocks",  # blocks of swapped-out seqs (to the next tier)
    "swap_out_bytes",
)
C = {name: i for i, name in enumerate(COUNTER_NAMES)}
C_ADMISSIONS, C_QUERY_TOKENS, C_HIT_TOKENS = 0, 1, 2
C_RERUN_ADMISSIONS, C_RERUN_QUERY_TOKENS, C_RERUN_HIT_TOKENS = 3, 4, 5
C_HIT_BLOCKS, C_REVIVED_BLOCKS, C_NEW_BLOCKS, C_EVICTED_BLOCKS = 6, 7, 8, 9
C_ALLOC_FAILURES, C_RELEASED_BLOCKS, C_COW_COPIES, C_COW_BYTES = 10, 11, 12, 13
C_FORKS, C_PREEMPT_RECOMPUTE, C_PREEMPT_SWAP = 14, 15, 16
C_SWAP_OUT_BLOCKS, C_SWAP_OUT_BYTES = 17, 18
assert len(COUNTER_NAMES) == 19 and C["swap_out_bytes"] == C_SWAP_OUT_BYTES

# ---- scalars (st.sc) -------------------------------------------------------------------
S_N_EMPTY, S_N_CAND, S_N_HELD, S_SEQ_TOP = 0, 1, 2, 3
# ---- config (st.cfg) -------------------------------------------------------------------
F_NUM_BLOCKS, F_BLOCK_SIZE, F_CACHING, F_BLOCK_BYTES, F_DEBUG = 0, 1, 2, 3, 4
F_LRU = 5  # 1 = the policy's order is one list in the built-in lru's layout, run inline
#  (kvsim.memory.pool_ops): lru, or vLLM's order (kvsim.memory.fifo_order.use_inline); 0 = hooks

#: Runners-up a victim() call may report (decision log).
MAX_ALT = 8

#: Invariant codes returned by :func:`pool_check` (0 = all hold).
INVARIANTS = {
    1: "the null block (0) is held, free or hashed",
    2: "a block is not in exactly one of held / empty / cached",
    3: "an empty block has a hash, or a cached block has none",
    4: "a ref count differs from the references held by block tables",
    5: "the empties deque does not match its count",
    6: "the number of cached candidates does not match its count",
    7: "held + empty + cached != num_blocks - 1 (a block is unaccounted for)",
    8: "the prefix index does not match the block hashes",
    9: "a closed seq slot still holds blocks",
}

PoolState = namedtuple("PoolState", [
    "cfg", "sc", "counters",
    "ref_cnt", "block_hash", "in_empty", "in_cand", "e_next", "e_prev",
    "hidx", "h_next", "h_prev",
    "tables", "seq_len", "seq_is_open", "seq_tenant", "seq_rerun", "seq_free",
    "seq_query_tokens", "seq_hit_tokens", "tenant_query_tokens", "tenant_hit_tokens",
    "block_hits",
])

AllocOut = namedtuple("AllocOut", ["blocks", "kind", "evicted_hash", "reason", "n_alt",
                                   "alt_blocks", "alt_scores"])


@dataclass(frozen=True)
class PoolConfig:
    """Shape of one block pool (one tier).  Frozen: build a new pool to change it."""

    num_blocks: int = field(metadata={"help": "physical blocks including the null block 0"})
    block_size_tokens: int = field(metadata={"help": "tokens per block (vLLM default 16)"})
    enable_caching: bool = field(default=True, metadata={"help": "prefix caching on/off"})
    max_seqs: int = field(default=1024, metadata={"help": "block tables held at once"})
    max_blocks_per_seq: int = field(default=8192, metadata={"help": "longest block table"})
    block_bytes: int = field(default=0, metadata={"help": "bytes of one block (CoW/swap)"})
    max_tenants: int = field(default=1, metadata={"help": "tenant ids 0 .. max_tenants-1"})
    debug: bool = field(default=False, metadata={"help": "check invariants after each op"})

    def __post_init__(self) -> None:
        """Bad sizes are user input (CLI options, profiles): KvsimInputError."""
        minimum = {"num_blocks": 2, "block_size_tokens": 1, "max_seqs": 1,
                   "max_blocks_per_seq": 1, "max_tenants": 1, "block_bytes": 0}
        for name, low in minimum.items():
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < low:
                why = " (block 0 is the reserved null block)" if name == "num_blocks" else ""
                raise bad_value(None, None, name, f"an integer >= {low}{why}", value)


@dataclass(frozen=True)
class AllocResult:
    """What one allocation did: block ids in table order and how each was obtained."""

    n_hit: int  # leading blocks that were prefix hits (KIND_HIT or KIND_REVIVED)
    blocks: list[int]
    kinds: list[int]  # KIND_* per block
    evicted_hashes: list[int]  # per block: hash of the cached block it replaced, else 0


def new_state(config: PoolConfig) -> PoolState:
    """A pool with every block 1..N-1 empty, in id order (vLLM's initial free queue)."""
    n = config.num_blocks
    cfg = np.array([n, config.block_size_tokens, int(config.enable_caching),
                    config.block_bytes, int(config.debug), 0], dtype=np.int64)
    e_next = np.empty(n + 1, dtype=np.int64)
    e_prev = np.empty(n + 1, dtype=np.int64)
    in_empty = np.zeros(n, dtype=np.bool_)
    ids = np.arange(1, n)
    # sentinel n -> 1 -> 2 -> ... -> n-1 -> sentinel
    order = np.concatenate(([n], ids, [n]))
    e_next[order[:-1]] = order[1:]
    e_prev[order[1:]] = order[:-1]
    e_next[0] = e_prev[0] = -1
    in_empty[1:] = True
    cap = 1 << max(4, int(2 * n - 1).bit_length())  # power of two >= 2n: load <= 1/2
    sc = np.zeros(4, dtype=np.int64)
    sc[S_N_EMPTY] = n - 1
    sc[S_SEQ_TOP] = config.max_seqs
    return PoolState(
        cfg=cfg, sc=sc, counters=np.zeros(len(COUNTER_NAMES), dtype=np.int64),
        ref_cnt=np.zeros(n, dtype=np.int64), block_hash=np.zeros(n, dtype=np.int64),
        in_empty=in_empty, in_cand=np.zeros(n, dtype=np.bool_), e_next=e_next,
        e_prev=e_prev, hidx=new_index(cap),
        h_next=np.full(n, -1, dtype=np.int64), h_prev=np.full(n, -1, dtype=np.int64),
        tables=np.zeros((config.max_seqs, config.max_blocks_per_seq), dtype=np.int32),
        seq_len=np.zeros(config.max_seqs, dtype=np.int64),
        seq_is_open=np.zeros(config.max_seqs, dtype=np.bool_),
        seq_tenant=np.zeros(config.max_seqs, dtype=np.int64),
        seq_rerun=np.zeros(config.max_seqs, dtype=np.bool_),
        # free slots as a stack, lowest id on top: seq_free[top-1] is the next slot
        seq_free=np.arange(config.max_seqs - 1, -1, -1, dtype=np.int64),
        seq_query_tokens=np.zeros(config.max_seqs, dtype=np.int64),
        seq_hit_tokens=np.zeros(config.max_seqs, dtype=np.int64),
        tenant_query_tokens=np.zeros(config.max_tenants, dtype=np.int64),
        tenant_hit_tokens=np.zeros(config.max_tenants, dtype=np.int64),
        block_hits=np.zeros(n, dtype=np.int64),
    )


def new_out(config: PoolConfig, n_alt: int = MAX_ALT) -> AllocOut:
    """Scratch arrays of one allocation.  ``n_alt`` (0..``MAX_ALT``) is how many runners-up
    each HBM ``victim()`` call may report: the replay passes the decision log's candidate
    count, 0 without a log, because a list policy walks its list for every runner-up it
    writes (8 dependent reads per eviction: ``lru.victim`` was 4.7 % of the samples of an
    lru replay of the Mooncake 16-token import, 1.2 % without them; docs/benchmarks.md),
    and nothing reads them without a log."""
    if not 0 <= n_alt <= MAX_ALT:
        raise ValueError(f"n_alt: expected 0..{MAX_ALT}, got {n_alt}")
    m = config.max_blocks_per_seq
    return AllocOut(np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64),
                    np.zeros(m, np.int64), np.zeros(m, np.int64),
                    np.zeros((m, n_alt), np.int64), np.zeros((m, n_alt), np.float64))


# ======================================================================================
# compiled primitives
# ======================================================================================

# (Each helper binds the arrays it uses to locals first: every attribute access of the
# state tuple costs an atomic refcount pair, which dominated the run time before.)

@njit(cache=True, inline="always")
def _empty_unlink(st, b):
    e_next = st.e_next
    e_prev = st.e_prev
    p = e_prev[b]
    nx = e_next[b]
    e_next[p] = nx
    e_prev[nx] = p
    st.in_empty[b] = False
    st.sc[S_N_EMPTY] -= 1


@njit(cache=True, inline="always")
def _empty_push_front(st, b):
    e_next = st.e_next
    e_prev = st.e_prev
    s = e_next.shape[0] - 1
    first = e_next[s]
    e_next[s] = b
    e_prev[b] = s
    e_next[b] = first
    e_prev[first] = b
    st.in_empty[b] = True
    st.sc[S_N_EMPTY] += 1


@njit(cache=True, inline="always")
def _empty_push_back(st, b):
    e_next = st.e_next
    e_prev = st.e_prev
    s = e_next.shape[0] - 1
    last = e_prev[s]
    e_next[last] = b
    e_prev[b] = last
    e_next[b] = s
    e_prev[s] = b
    st.in_empty[b] = True
    st.sc[S_N_EMPTY] += 1


@njit(cache=True, inline="always")
def _home(h, mask):
    """Home slot of key h: folds high bits into low ones with shifts and xors only, so the
    interpreted twin (Python ints, numpy scalars) computes exactly what the compiled code
    does -- no multiplication that could overflow.  Keys are hashes (random bits) or, in
    some traces, small sequential ids (which then land in consecutive slots)."""
    return (h ^ (h >> 17) ^ (h >> 31) ^ (h >> 47)) & mask


def new_index(entries: int) -> np.ndarray:
    """An empty prefix index of ``entries`` entries (a power of two): keys 0, values -1,
    interleaved (``hidx[2i]``, ``hidx[2i + 1]``)."""
    hidx = np.zeros(2 * entries, dtype=np.int64)
    hidx[1::2] = -1
    return hidx


def index_keys_values(hidx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index's keys and values as two strided views of ``hidx`` (entry ``i`` at
    position ``i`` of each, as :func:`kvsim.engine.scheduler_blocks._cached_prefix` probes them:
    the closed loop's scheduler reads the replay's index through these)."""
    return hidx[0::2], hidx[1::2]


@njit(cache=True, inline="always")
def _hslot(hidx, h):
    """Position in ``hidx`` of key h (even: its value follows it), or of the empty key
    (0) where it would go.  Linear probing over the entries; the load factor stays <= 1/2
    (entries >= 2 * blocks)."""
    mask = (hidx.shape[0] >> 1) - 1
    i = _home(h, mask)
    while True:
        k = hidx[2 * i]
        if k == h or k == 0:
            return 2 * i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _hdel(hidx, p):
    """Empty the entry at position p (even), shifting later entries of the probe run back
    (no tombstones)."""
    mask = (hidx.shape[0] >> 1) - 1
    i = p >> 1
    j = i
    while True:
        j = (j + 1) & mask
        k = hidx[2 * j]
        if k == 0:
            break
        home = _home(k, mask)
        # the entry at j may move to i unless its home lies cyclically in (i, j]
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            hidx[2 * i] = k
            hidx[2 * i + 1] = hidx[2 * j + 1]
            i = j
    hidx[2 * i] = 0
    hidx[2 * i + 1] = -1


@njit(cache=True, inline="always")
def _index_get(st, h):
    """First block registered under hash h, or -1."""
    hidx = st.hidx
    i = _hslot(hidx, h)
    return hidx[i + 1] if hidx[i] == h else -1


@njit(cache=True, inline="always")
def _index_add(st, b, h):
    """Register held block b under hash h (after the blocks already registered with h)."""
    index_add(st.block_hash, st.hidx, st.h_next, st.h_prev, b, h)


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def index_add(block_hash, hidx, h_next, h_prev, b, h):
    """:func:`_index_add` on the index's arrays: a loop that binds them once calls this
    per block without reference-counting the whole state tuple (an inlined helper taking
    ``st`` copies its ~20 arrays, a refcount pair each; kvsim.replay.kernel.spill, "Per-call
    cost")."""
    block_hash[b] = h
    i = _hslot(hidx, h)
    if hidx[i] == h:
        first = hidx[i + 1]
        last = h_prev[first]
        h_next[last] = b
        h_prev[b] = last
        h_next[b] = first
        h_prev[first] = b
    else:
        hidx[i] = h
        hidx[i + 1] = b
        h_next[b] = b
        h_prev[b] = b


@njit(cache=True, inline="always")
def _index_remove(st, b):
    """Drop b from the prefix index (vLLM _maybe_evict_cached_block); returns its hash."""
    return index_remove(st.block_hash, st.hidx, st.h_next, st.h_prev, b)


@njit(cache=True, _nrt=False)  # plain arrays only: no reference counts per call
def index_remove(block_hash, hidx, h_next, h_prev, b):
    """:func:`_index_remove` on the index's arrays (see :func:`index_add`)."""
    h = block_hash[b]
    i = _hslot(hidx, h)
    nx = h_next[b]
    if nx == b:
        _hdel(hidx, i)
    else:
        p = h_prev[b]
        h_next[p] = nx
        h_prev[nx] = p
        if hidx[i + 1] == b:
            hidx[i + 1] = nx
    h_next[b] = -1
    h_prev[b] = -1
    block_hash[b] = 0
    return h


@njit(cache=True, _nrt=False)  # no reference counts per call
def seq_open(st, tenant):
    """Take a free seq slot (lowest id first); -1 if none.  The table starts empty."""
    top = st.sc[S_SEQ_TOP]
    if top == 0:
        return -1
    seq = st.seq_free[top - 1]
    st.sc[S_SEQ_TOP] = top - 1
    st.seq_is_open[seq] = True
    st.seq_len[seq] = 0
    st.seq_tenant[seq] = tenant
    st.seq_rerun[seq] = False
    st.seq_query_tokens[seq] = 0
    st.seq_hit_tokens[seq] = 0
    return seq


@njit(cache=True, _nrt=False)  # no reference counts per call
def seq_close(st, seq):
    """Return a slot whose table is empty (free it first)."""
    if not st.seq_is_open[seq] or st.seq_len[seq] != 0:
        raise ValueError("seq_close: slot not open or still holds blocks")
    st.seq_is_open[seq] = False
    st.seq_free[st.sc[S_SEQ_TOP]] = seq
    st.sc[S_SEQ_TOP] += 1


@njit(cache=True, _nrt=False)  # no reference counts per call
def pool_lookup(st, hashes, n, num_tokens, out_blocks):
    """Longest cached prefix of ``hashes[:n]``: stop at the first miss, at most
    ``(num_tokens - 1) // block_size`` blocks (the last token is always recomputed).
    Writes the hit blocks (first block registered with each hash) to ``out_blocks``.
    Changes nothing."""
    if st.cfg[F_CACHING] == 0:
        return 0
    limit = (num_tokens - 1) // st.cfg[F_BLOCK_SIZE]
    if limit > n:
        limit = n
    k = 0
    while k < limit:
        h = hashes[k]
        if h == 0:
            break
        b = _index_get(st, h)
        if b < 0:
            break
        out_blocks[k] = b
        k += 1
    return k


@njit(cache=True, _nrt=False)  # no reference counts per call
def pool_cache_block(st, seq, index, h):
    """Block ``index`` of ``seq`` became full: register it under hash ``h`` (vLLM
    cache_full_blocks).  No-op if caching is off, ``h`` is 0 or the block has a hash."""
    if st.cfg[F_CACHING] == 0 or h == 0:
        return
    b = st.tables[seq, index]
    if st.block_hash[b] == 0:
        _index_add(st, b, h)


@njit(cache=True, _nrt=False)  # reached from core.run: compiled as it is
def pool_fork(st, parent, child):
    """Copy-on-write fork: ``child`` (open, empty) shares every block of ``parent``."""
    if st.seq_len[child] != 0 or not st.seq_is_open[child]:
        raise ValueError("pool_fork: child must be an open, empty seq")
    m = st.seq_len[parent]
    for i in range(m):
        b = st.tables[parent, i]
        st.tables[child, i] = b
        st.ref_cnt[b] += 1
    st.seq_len[child] = m
    st.counters[C_FORKS] += 1


@njit(cache=True)
def pick_preemption_victim(running, n_running, request_priority, arrival, by_priority):
    """Index in ``running[:n_running]`` of the request to preempt (vLLM v1 Scheduler):
    the last running one; under priority scheduling the lowest ``request_priority``
    (kvsim: 0 lowest .. 100 highest), ties broken by the latest ``arrival``, then by
    position (the first, as Python's ``max`` in vLLM).  -1 if none."""
    if n_running == 0:
        return -1
    if not by_priority:
        return n_running - 1
    best = 0
    for i in range(1, n_running):
        r = running[i]
        q = running[best]
        if request_priority[r] < request_priority[q] or (
                request_priority[r] == request_priority[q] and arrival[r] > arrival[q]):
            best = i
    return best


@njit(cache=True)
def pool_check(st):
    """0 if every invariant holds, else the code of the first broken one (INVARIANTS)."""
    n = st.cfg[F_NUM_BLOCKS]
    if st.ref_cnt[0] != 0 or st.in_empty[0] or st.in_cand[0] or st.block_hash[0] != 0:
        return 1
    n_held = 0
    n_empty = 0
    n_cand = 0
    n_hashed = 0
    for b in range(1, n):
        held = st.ref_cnt[b] > 0
        k = int(held) + int(st.in_empty[b]) + int(st.in_cand[b])
        if k != 1 or st.ref_cnt[b] < 0:
            return 2
        if (st.in_empty[b] and st.block_hash[b] != 0) or (
                st.in_cand[b] and st.block_hash[b] == 0):
            return 3
        n_held += int(held)
        n_empty += int(st.in_empty[b])
        n_cand += int(st.in_cand[b])
        n_hashed += int(st.block_hash[b] != 0)
    refs = np.zeros(n, dtype=np.int64)
    for s in range(st.tables.shape[0]):
        if not st.seq_is_open[s] and st.seq_len[s] != 0:
            return 9
        for i in range(st.seq_len[s]):
            refs[st.tables[s, i]] += 1
    for b in range(n):
        if refs[b] != st.ref_cnt[b]:
            return 4
    # the empties deque
    cnt = 0
    cur = st.e_next[n]
    while cur != n:
        if cur < 1 or cur >= n or not st.in_empty[cur] or cnt > n:
            return 5
        cnt += 1
        cur = st.e_next[cur]
    if cnt != n_empty or cnt != st.sc[S_N_EMPTY]:
        return 5
    if n_cand != st.sc[S_N_CAND]:
        return 6
    if n_held + n_empty + n_cand != n - 1 or n_held != st.sc[S_N_HELD]:
        return 7
    total = 0
    for i in range(0, st.hidx.shape[0], 2):
        h = st.hidx[i]
        if h == 0:
            continue
        if _hslot(st.hidx, h) != i:  # unreachable by probing from its home slot
            return 8
        first = st.hidx[i + 1]
        cur = first
        while True:
            if st.block_hash[cur] != h:
                return 8
            total += 1
            cur = st.h_next[cur]
            if cur == first:
                break
    if total != n_hashed:
        return 8
    return 0


