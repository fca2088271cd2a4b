"""The lower tiers' pages faulted in ahead of the cascade (kvsim.replay.lower_tiers.
TierPrefault): the pages of the slots filled so far and a bounded stretch beyond are
resident after it ran, the rest of the tier is not, and no value changes."""

from __future__ import annotations

import ctypes
import sys
import time

import numpy as np
import pytest

from kvsim.core import layout as L
from kvsim.policy.registry import resolve_policy
from kvsim.replay import lower_tiers as lt

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or lt._madvise() is None,
                                reason="madvise(MADV_POPULATE_WRITE) is Linux-only")


def _resident(addr: int, nbytes: int) -> np.ndarray:
    """mincore(2): one flag per 4 KiB page of ``[addr, addr + nbytes)``."""
    libc = ctypes.CDLL(None, use_errno=True)
    lo = addr & ~4095
    pages = (addr + nbytes - lo + 4095) // 4096
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(addr + nbytes - lo), vec) == 0
    return np.frombuffer(vec, np.uint8) & 1


def test_pages_of_filled_slots_and_a_bounded_stretch_are_faulted_in():
    slots = 400_000  # 35 MB of view rows, 12.8 MB of L_i: both far beyond the stretch
    T = lt._lower_tier(1, slots, resolve_policy("lru"), {}, slots, lt._lower_table(slots))
    view = T.L_view
    filled = 1000
    T.L_i[7, L.LI_OWNER] = 42  # written by the "core" before: kept
    T.Lm[L.LM_FREE_TOP] = slots - filled
    rows = view.last_access_us
    spans = ((rows.ctypes.data, slots * rows.strides[0]), (T.L_i.ctypes.data, T.L_i.nbytes))
    # pages already resident (memory the allocator reused) stay so: only new ones count
    before = [_resident(base, nbytes) for base, nbytes in spans]
    pf = lt.TierPrefault([T], [view])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = _resident(rows.ctypes.data, slots * rows.strides[0])
        if got[: (filled * rows.strides[0] + lt.PREFAULT_AHEAD_BYTES) // 4096].all():
            break
        time.sleep(0.01)
    pf.stop()
    for (base, nbytes), was in zip(spans, before):
        stride = nbytes // slots
        got = _resident(base, nbytes)
        assert got[: (filled * stride + lt.PREFAULT_AHEAD_BYTES) // 4096].all()
        # past the stretch (and the 2 MiB huge page it may end in, at any alignment):
        # never asked for
        tail = slice((filled * stride + lt.PREFAULT_AHEAD_BYTES + (4 << 20)) // 4096, None)
        assert len(got[tail]) >= (4 << 20) // 4096
        assert not np.any(got[tail] > was[tail])
    assert T.L_i[7, L.LI_OWNER] == 42 and int(np.count_nonzero(T.L_i)) == 1
    assert not np.any(rows)
