"""kvsim.core.row_store: per-request arrays in files mapped shared, pages given back below a
row (issue 38, "Memory"); small arrays in memory; a full disk is one line."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pytest

from kvsim.core import row_store
from kvsim.core.errors import KvsimInputError, KvsimResourceError
from tests.helpers import file_size_limit

MIB = 1 << 20


def test_small_arrays_stay_in_memory():
    s = row_store.RowStore()
    a = s.zeros(1000, np.int64)
    assert not s.holds(a) and len(s) == 0 and not a.any()
    assert row_store.zeros(10, np.int64).base is None  # no store current: numpy's
    x = np.arange(10)
    assert s.copy(x) is x


def test_a_file_array_is_numpys_type_and_keeps_its_values(tmp_path, monkeypatch):
    """The same numba type as np.zeros' (no new compile); the values survive release."""
    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path))
    s = row_store.RowStore()
    n = 4 * MIB // 8
    a = s.full(n, -1, np.int64)
    q = s.zeros((n // 4, 3), np.int64)
    assert s.holds(a) and len(s) == 2
    assert numba.typeof(a) == numba.typeof(np.zeros(3, np.int64))
    assert numba.typeof(q) == numba.typeof(np.zeros((3, 3), np.int64))
    a[::1000] = np.arange(len(a[::1000]))
    want = a.copy()
    assert s.resident_bytes() >= a.nbytes  # written: mapped
    s.release_below(n // 2)
    res = s.resident_bytes()
    assert a.nbytes // 2 - row_store.PAGE <= res <= a.nbytes // 2 + row_store.PAGE
    assert np.array_equal(a, want)  # read back from the file
    s.release_all()
    assert s.resident_bytes() == 0
    assert np.array_equal(a, want) and not q.any()


def test_release_below_follows_the_offsets_of_block_arrays(tmp_path, monkeypatch):
    """A per-block array (``index``: offsets) is released below the row's first block; a
    bit array (``bits``) below its first bit."""
    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path))
    s = row_store.RowStore(min_bytes=0)
    off = np.arange(0, 8 * MIB + 1, 8 * MIB // 4, dtype=np.int64)  # 4 rows, 2 Mi blocks each
    blocks = s.full(int(off[-1]), 7, np.uint8, index=off)
    bits = s.full(int(off[-1]) // 8, 255, np.uint8, index=off, bits=True)
    s.release_below(2)
    got = s.resident_bytes()
    assert got == (blocks.nbytes + bits.nbytes) // 2
    assert (blocks == 7).all() and (bits == 255).all()




def test_a_full_disk_names_the_folder(tmp_path: Path, monkeypatch):
    """The file's space is reserved when it is made: a full disk (here ``ulimit -f``) is
    one line naming the folder, as a spill file's, never a fault at a first write."""
    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path))
    with file_size_limit(64 * 1024), pytest.raises(KvsimResourceError) as info:
        row_store.RowStore().zeros(4 * MIB, np.uint8)
    message = str(info.value)
    assert message.startswith(f"{tmp_path}: cannot write a temporary file"), message
    assert "KVSIM_TMPDIR" in message and info.value.exit_code == 1
    # a KVSIM_TMPDIR that is not there is the user's input: one line naming it, exit 2
    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path / "gone"))
    with pytest.raises(KvsimInputError, match="KVSIM_TMPDIR.*gone' \\(no such folder\\)"):
        row_store.RowStore().zeros(4 * MIB, np.uint8)
