"""The replay's views in a record layout (kvsim.replay.kernel.tiers.new_record_view: one 88-byte row
per slot, each BlockView field a strided view of it): exact byte positions, initial values
as new_block_view's, the cache lines a row touches, and that compiled code (copy_view, the
hooks' view type) treats it as the contiguous view."""

import numpy as np
from numba import typeof

from kvsim.policy.api import BLOCK_VIEW_FIELDS, NEVER, new_block_view
from kvsim.policy.hooks import VIEW_REF, view_ref
from kvsim.replay.kernel.tiers import ROW_BYTES, ROW_OFFSET_BYTES, copy_view, new_record_view

COPIED = [f for f in BLOCK_VIEW_FIELDS if f not in ("insert_us", "last_access_us")]


def _addr(a, s):
    return a.ctypes.data + s * a.strides[0]


def test_row_layout_exact():
    v = new_record_view(9)
    base = v.last_access_us.ctypes.data
    assert base % 64 == 0  # row 0 on a line boundary
    assert ROW_BYTES == 88
    for name in BLOCK_VIEW_FIELDS:
        a = getattr(v, name)
        assert a.shape == (9,) and a.strides == (88,) and a.flags.writeable
        for s in range(9):
            assert _addr(a, s) == base + 88 * s + ROW_OFFSET_BYTES[name]
    # fields do not overlap: all 88 bytes of each row used (tenant: the last 4), by
    # exactly one field each
    used = sorted((ROW_OFFSET_BYTES[n], ROW_OFFSET_BYTES[n] + getattr(v, n).itemsize)
                  for n in BLOCK_VIEW_FIELDS)
    for (lo0, hi0), (lo1, _) in zip(used, used[1:]):
        assert hi0 <= lo1
    assert used[-1][1] == 88


def test_initial_values_as_new_block_view():
    v, w = new_record_view(6), new_block_view(6)
    for name in BLOCK_VIEW_FIELDS:
        a, b = getattr(v, name), getattr(w, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (v.deadline_us == -1).all() and (v.target_decode_step == -1).all()
    assert (v.next_use == NEVER).all() and (v.content_hash == 0).all()
    assert new_record_view(0).content_hash.shape == (0,)


def test_a_write_changes_only_its_bytes():
    v = new_record_view(4)
    n_bytes = 4 * 88
    buf = np.frombuffer((np.ctypeslib.as_ctypes_type(np.uint8) * n_bytes).from_address(
        v.last_access_us.ctypes.data), dtype=np.uint8)
    for name in BLOCK_VIEW_FIELDS:
        before = buf.copy()
        a = getattr(v, name)
        a[2] = 1 if a.dtype != np.float64 else 2.5
        changed = np.flatnonzero(before != buf)
        lo = 2 * 88 + ROW_OFFSET_BYTES[name]
        assert changed.min() >= lo and changed.max() < lo + a.itemsize, name


def test_cache_lines_per_row():
    """A row touches 2 lines, or 3 at 2 of the 8 row positions modulo 64 bytes; the three
    fields prefetch_lines asks for (bytes 0, 40, 83) lie in every line the row touches."""
    v = new_record_view(16)
    three = 0
    for s in range(16):
        lines = {(_addr(getattr(v, n), s) + k) // 64
                 for n in BLOCK_VIEW_FIELDS for k in range(getattr(v, n).itemsize)}
        assert len(lines) in (2, 3)
        three += len(lines) == 3
        asked = {_addr(v.last_access_us, s) // 64, _addr(v.target_decode_step, s) // 64,
                 _addr(v.pinned, s) // 64}
        assert asked == lines
    assert three == 4  # rows 2 and 5 of every 8 (start offsets 48 and 56 bytes)


def test_one_view_type_for_both_layouts():
    assert typeof(view_ref(new_record_view(3))) == VIEW_REF
    assert typeof(view_ref(new_block_view(3))) == VIEW_REF


def test_copy_view_between_layouts_exact():
    rec, soa = new_record_view(5), new_block_view(5)
    rng = np.random.default_rng(1)
    for name in BLOCK_VIEW_FIELDS:
        a = getattr(soa, name)
        if a.dtype == np.bool_:
            a[:] = rng.integers(0, 2, 5).astype(bool)
        elif a.dtype == np.float64:
            a[:] = rng.random(5) * 1e6
        else:
            a[:] = rng.integers(-100, 100, 5)
    before = {n: getattr(rec, n).copy() for n in BLOCK_VIEW_FIELDS}
    copy_view(view_ref(rec), 3, view_ref(soa), 1)  # compiled: strided <- contiguous
    for name in BLOCK_VIEW_FIELDS:
        r, s, b = getattr(rec, name), getattr(soa, name), before[name]
        want = b.copy()
        if name in COPIED:
            want[3] = s[1]
        assert np.array_equal(r, want), name  # timestamps and other rows untouched
    back = new_block_view(5)
    copy_view(view_ref(back), 0, view_ref(rec), 3)  # contiguous <- strided
    for name in COPIED:
        assert getattr(back, name)[0] == getattr(soa, name)[1], name
    copy_view.py_func(rec, 4, rec, 3)  # the interpreted twin on the same layout
    for name in COPIED:
        assert getattr(rec, name)[4] == getattr(soa, name)[1], name


def test_a_tier_fill_writes_every_field():
    """Lower tiers' views are not initialised (new_record_view(n, initialise=False)):
    sound because a fill writes all 15 fields, copy_view's 13 and the two timestamps the
    fill sets (kvsim.replay.kernel.spill, kvsim.replay.kernel.tier_ops)."""
    assert set(COPIED) | {"insert_us", "last_access_us"} == set(BLOCK_VIEW_FIELDS)
    src = new_block_view(2)
    for name in BLOCK_VIEW_FIELDS:
        getattr(src, name)[1] = 7 if name != "pinned" else True
    dst = new_record_view(3, initialise=False)
    assert all((getattr(dst, n) == 0).all() for n in BLOCK_VIEW_FIELDS)
    copy_view(view_ref(dst), 2, view_ref(src), 1)
    for name in COPIED:
        assert getattr(dst, name)[2] == getattr(src, name)[1] != 0, name  # copied
        assert getattr(dst, name)[1] == 0  # the other rows untouched
