"""The ALLOCATE rows of vLLM's scheduler in the closed loop carry each block's prefill cost
(``F[F_RC]``, a lost block's recompute cost): the timing model's ``prefill_cost_us(fp, b * B,
B)``, computed once per block index of a run and kept in ``vs[VS_PCOST]``
(kvsim.engine.vllm_rows._alloc_rows): the same values as computed per block, a block index
past the table computed without it, on the compiled code and its Python twin alike."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.engine import scheduler as S
from kvsim.engine.engine_model import build_cost_model
from kvsim.engine.timing.step_time import prefill_cost_us
from kvsim.engine.vllm_rows import _alloc_rows


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("timing", ["measured", "roofline"])
def test_block_costs_are_the_timing_models_and_kept_per_block_index(compiled, timing):
    fp = build_cost_model("llama-3-8b", "h100-sxm", timing=timing).as_array()
    B, n_rows = 16, 64
    run = _alloc_rows if compiled else _alloc_rows.py_func
    pc = np.full(6, -1.0)  # blocks 0-5 kept; 6 and 7 past the table
    I = np.zeros((S.NUM_INT_COLUMNS, n_rows), np.int64)  # the rows' layout (scheduler._row)
    F = np.zeros((2, n_rows), np.float64)  # F_DUR, F_RC
    hh = np.arange(1, 9, dtype=np.int64)
    n = run(I, F, np.int64(0), fp, pc, np.int64(3), 0.0, np.int64(0), np.int64(2), np.int64(8),
            np.int64(8 * B), np.int64(B), hh, np.int64(0), np.int64(8), -1.0, 0, np.int64(4))
    assert n == 6
    want = np.array([prefill_cost_us(fp, b * B, B) for b in range(2, 8)])
    np.testing.assert_array_equal(F[S.F_RC, :6], want)
    np.testing.assert_array_equal(I[S.C_BIDX, :6], np.arange(2, 8))
    np.testing.assert_array_equal(pc[:2], [-1.0, -1.0])  # not used: not computed
    np.testing.assert_array_equal(pc[2:], want[:4])
    pc[2] = 12345.0  # a kept value is read, not computed again
    run(I, F, np.int64(0), fp, pc, np.int64(4), 0.0, np.int64(0), np.int64(2), np.int64(3),
        np.int64(8 * B), np.int64(B), hh, np.int64(0), np.int64(8), -1.0, 0, np.int64(4))
    assert F[S.F_RC, 0] == 12345.0
