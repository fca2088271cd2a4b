"""The lower tiers' arrays (DRAM, CXL, NVMe) as the replay driver builds them: how many
slots each tier gets, the hash table the three share (:mod:`kvsim.replay.kernel.tiers`),
and which tiers run the built-in lru inline.

Slots follow what a tier can ever hold, not the trace's length.  A lower tier holds hashed
blocks only, at most one slot per distinct content hash (a content is in at most one lower
tier at a time), so a tier of ``cap`` blocks needs ``min(cap, distinct hashes)`` slots.
The open-loop replay bounds the distinct hashes by the trace's ALLOCATE rows
(``TraceFacts.num_allocs``); the closed loop by the hashed blocks of the distinct request
contents (``TraceFacts.max_distinct_hashes``, :func:`kvsim.engine.vllm_rows.shared_hashes`),
which does not grow when the same requests come again.
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.replay.kernel.tiers import Tier, new_record_view


def _lower_slots(cap: int, max_blocks: int) -> int:
    """Slots of a lower tier of ``cap`` blocks when at most ``max_blocks`` distinct hashes
    can reach it: a capacity above that can never bind, and sizing the arrays by it would
    cost gigabytes for a multi-TB NVMe tier of small blocks."""
    return max(min(cap, max(max_blocks, 1)), 1)


def _lower_table(slots: int) -> np.ndarray:
    """The lower tiers' shared hash table (kvsim.replay.kernel.tiers) for ``slots`` slots in all:
    a power of two >= 2 x slots of entries, keys (0 = empty) and values interleaved."""
    table = 1 << max(1, int(2 * slots - 1).bit_length())
    L_h = np.zeros(2 * table, dtype=np.int64)
    L_h[1::2] = -1
    return L_h


def _lower_tier(tier: int, cap: int, policy, params: dict, max_blocks: int,
                L_h: np.ndarray, max_hashes: int = -1):
    """Arrays of one lower tier (``L_h``: the table the three tiers share).  ``max_blocks``:
    the trace's ALLOCATE rows, the capacity the tier's policy is told (``init``) when it is
    below ``cap``; ``max_hashes`` (-1: ``max_blocks``): at most this many distinct hashes
    reach the tier, so it gets ``min(cap, max_hashes)`` slots.  The tier's own capacity
    (``Lm[LM_CAP]``, the free-slot stack's size) is its slots: a tier holding every hash
    the run has never needs one more, so it never evicts where a larger one would not.
    The policy's ``params`` also carry ``"max_contents"``: the distinct hashes that can
    reach the tier (a policy sizes what it keeps per content, ARC's and S3-FIFO's ghosts,
    by the smaller of it and its capacity's bound; kvsim.policy.api, "params")."""
    cap = min(cap, max(max_blocks, 1))
    most = max_blocks if max_hashes < 0 else min(max_hashes, max_blocks)
    slots = _lower_slots(cap, most)
    L_i = np.zeros((slots, L.NLI), dtype=np.int64)
    L_free = np.arange(slots - 1, -1, -1, dtype=np.int64)
    L_view = new_record_view(slots, initialise=False)  # a row per slot, written at fill
    L_ps = policy.init(max(cap, 1), slots, dict(params, max_contents=max(most, 1)))
    held = min(cap, slots)  # 0: a disabled tier stays disabled
    Lm = np.array([tier, held, held, 0], dtype=np.int64)
    return Tier(L_i, L_free, L_h, L_view, L_ps, Lm)


def _is_lru(policy) -> bool:
    """The built-in lru, whose hooks the compiled core runs inline (kvsim.memory.pool_ops,
    kvsim.replay.kernel.spill: "Built-in lru"), at the places these constants name."""
    from kvsim.memory import pool_ops
    from kvsim.policies import lru
    from kvsim.replay.kernel import spill

    for m in (pool_ops, spill):
        assert [lru.STATE.index(n) for n in ("prev", "nxt", "lru")] == \
            [("i64", m.LRU_PREV), ("i64", m.LRU_NXT), ("i64", m.LRU_ENDS)]
    return policy.module is lru


def _lru_mask(lower) -> int:
    """Bit ``t`` set for each lower tier ``t`` (1..3) whose policy is the built-in lru."""
    return sum(1 << t for t, p in enumerate(lower, 1) if _is_lru(p))


# ---------------------------------------------------------------------------------------
# the lower tiers' pages, faulted in ahead of the cascade
# ---------------------------------------------------------------------------------------

#: Bytes of each lower tier's arrays (``L_i`` and the view's rows) faulted in ahead of the
#: highest slot filled so far; how often the thread looks (s).  A tier fills its slots in
#: order (its free stack hands out 0, 1, 2, ...), so the pages the cascade writes next are
#: known.  Chosen, not tuned (2 huge pages).
PREFAULT_AHEAD_BYTES = 4 << 20
PREFAULT_POLL_S = 0.002
_MADV_POPULATE_WRITE = 23  # linux/mman.h (Linux >= 5.14)
_PAGE_BYTES = 4096


def _madvise():
    """libc's ``madvise`` (ctypes releases the GIL during the call), or None.  From the
    process's own symbols (the C library is loaded; ``ctypes.util.find_library`` would run
    ``ldconfig -p`` in a child process, ~15 ms)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


class TierPrefault:
    """Faults in the pages of the lower tiers' arrays a little ahead of the slots the
    replay has filled, in a daemon thread, while the core (no GIL) replays: the kernel's
    zeroing of those fresh pages (numpy's large arrays are huge pages: 2 MiB zeroed per
    first write) leaves the core's thread for the other core.  At 16-token blocks the
    cascade's first touch of the NVMe tier's 1.8 M slots was ~3 % of an end-to-end
    replay's samples (docs/benchmarks.md).  ``madvise(MADV_POPULATE_WRITE)`` maps the
    pages as a write would, without writing: the arrays' contents (zeros, or what the core
    wrote meanwhile) never change, so results cannot.  Memory: at most
    :data:`PREFAULT_AHEAD_BYTES` per array beyond the slots a tier has filled.  Does
    nothing where the call is missing (not Linux, a kernel before 5.14)."""

    def __init__(self, tiers, views) -> None:
        """``tiers``: the lower tiers (:class:`kvsim.replay.kernel.tiers.Tier`: ``L_i``,
        ``Lm``); ``views``: their views as :func:`kvsim.replay.kernel.tiers.new_record_view`
        made them (the BlockViews, not the compiled code's refs)."""
        import threading

        self._fn = _madvise()
        self._spans = []  # per tier: Lm, slots, [(base address, bytes per slot, done)]
        for T, view in zip(tiers, views):
            slots = int(T.L_i.shape[0])
            if int(T.Lm[L.LM_CAP]) <= 0 or slots == 0:
                continue
            rows = view.last_access_us  # row 0 of the record view (tiers.record_rows)
            arrays = [[int(T.L_i.ctypes.data), T.L_i.strides[0], 0],
                      [int(rows.ctypes.data), rows.strides[0], 0]]
            self._spans.append((T.Lm, slots, arrays))
        self._stop = threading.Event()
        self._thread = None
        if self._fn is not None and self._spans:
            self._thread = threading.Thread(target=self._loop, name="kvsim-tier-prefault",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        try:
            self._faults()
        except Exception:  # noqa: BLE001 - a speed-up only: the core faults pages in itself
            return  # (no traceback on stderr from a daemon thread mid-run)

    def _faults(self) -> None:
        while not self._stop.wait(PREFAULT_POLL_S):
            left = False
            for Lm, slots, arrays in self._spans:
                filled = slots - int(Lm[L.LM_FREE_TOP])  # slots 0 .. filled - 1 handed out
                for span in arrays:
                    base, stride, done = span
                    end = min(slots * stride, filled * stride + PREFAULT_AHEAD_BYTES)
                    if end > done:
                        lo = (base + done) & ~(_PAGE_BYTES - 1)
                        if self._fn(lo, base + end - lo, _MADV_POPULATE_WRITE) != 0:
                            return  # unsupported here: the core faults them in itself
                        span[2] = end
                    left = left or span[2] < slots * stride
            if not left:
                return

    def stop(self) -> None:
        """Stop the thread and wait for it (it finishes the call it is in)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
