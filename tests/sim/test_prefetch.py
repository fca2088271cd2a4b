"""kvsim.jit.prefetch: a prefetch hint that compiles to LLVM's prefetch intrinsic and
changes nothing else (the loops that use it are checked for exact victims in
tests/sim/test_cachesim_fast.py)."""

from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.jit.prefetch import prefetch, prefetch_row


@njit
def _gather_sum(a, idx):
    s = 0
    for t in range(idx.shape[0]):
        if t + 4 < idx.shape[0]:
            prefetch(a, idx[t + 4])
        s += a[idx[t]]
    return s


def test_prefetch_compiles_to_the_intrinsic_and_changes_no_result():
    a = np.arange(1000, dtype=np.int64) * 3
    idx = np.random.default_rng(0).integers(0, 1000, 500)
    assert _gather_sum(a, idx) == int(a[idx].sum())
    ir = _gather_sum.inspect_llvm(_gather_sum.signatures[0])
    assert "@llvm.prefetch" in ir


def test_prefetch_is_a_no_op_in_plain_python():
    a = np.zeros(3, np.int32)
    assert prefetch(a, 2) is None
    assert _gather_sum.py_func(np.arange(10), np.array([9, 0, 4])) == 13
    np.testing.assert_array_equal(a, 0)


@njit
def _row_sum(a, rows):
    s = 0
    for t in range(rows.shape[0]):
        if t + 2 < rows.shape[0]:
            prefetch_row(a, rows[t + 2])
        s += a[rows[t], 1]
    return s


def test_prefetch_row_compiles_to_the_intrinsic_and_changes_no_result():
    a = np.arange(300, dtype=np.int64).reshape(100, 3)
    rows = np.array([5, 99, 0, 42, 7])
    assert _row_sum(a, rows) == int(a[rows, 1].sum())
    assert "@llvm.prefetch" in _row_sum.inspect_llvm(_row_sum.signatures[0])
    assert prefetch_row(a, 3) is None  # plain Python: nothing
    assert _row_sum.py_func(a, rows) == int(a[rows, 1].sum())
