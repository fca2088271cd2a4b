"""vLLM's compiled scheduler step runs without reference counting.

``schedule()``, ``update_from_output()``, ``allocate_slots`` and the pool calls under them
(kvsim.engine.vllm_step) are compiled ``_nrt=False``: each call of a counted function
counted every array and structref it received (an atomic update on entry and on exit),
and the non-quiet steps of the closed loop make ~10 such calls a step (docs/benchmarks.md,
"vLLM's scheduler step without reference counts").  They read
the pool's members through :func:`kvsim.policy.state_access.register_borrowed_members`,
since numba's own structref member read needs NRT.  On main before that change they were
compiled with counting, and a function compiled ``_nrt=False`` could not read
``st.ref_cnt`` on a PoolRef."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from kvsim.engine import vllm_step as V
from kvsim.memory import fast, pool_ops
from kvsim.memory.fast import PoolConfig, new_state
from kvsim.memory.pool_ref import pool_ref

STEP = ["schedule", "update_from_output", "allocate_slots", "_cache_blocks", "release",
        "lookup", "lookup_ext", "preempt", "_blocks_out", "step"]


#: what they call in the pool: a callee without its own setting is compiled under the
#: first caller's, so these are marked themselves (else a counted copy may be linked in)
POOL = [(pool_ops, "allocate"), (pool_ops, "free"), (pool_ops, "cache_blocks"),
        (pool_ops, "clear_cache"), (fast, "seq_open"), (fast, "seq_close"),
        (fast, "pool_lookup"), (fast, "pool_cache_block")]


@pytest.mark.parametrize("name", STEP)
def test_step_functions_compiled_without_counts(name):
    f = getattr(V, name)
    assert f.targetoptions.get("_nrt") is False, f"vllm_step.{name}"


@pytest.mark.parametrize("mod,name", POOL, ids=[f"{m.__name__}.{n}" for m, n in POOL])
def test_pool_operations_compiled_without_counts(mod, name):
    assert getattr(mod, name).targetoptions.get("_nrt") is False, f"{mod.__name__}.{name}"


@njit(_nrt=False)
def _members(st, seq):
    """A PoolRef's members read in a function compiled without NRT."""
    return st.seq_len[seq] + st.sc.shape[0] + st.tables.shape[1]


def test_pool_members_read_without_nrt():
    st = new_state(PoolConfig(8, 4, max_seqs=3, max_blocks_per_seq=5))
    st.seq_len[2] = 7
    assert _members(pool_ref(st), 2) == 7 + st.sc.shape[0] + 5
    ir = _members.inspect_llvm(_members.signatures[0])
    assert "NRT_incref" not in ir and "NRT_decref" not in ir
    assert np.array_equal(st.seq_len, [0, 0, 7])
