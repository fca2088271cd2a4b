"""A replay leaves no compiled object behind: numba's live meminfos (every array a compiled
function allocated or took from Python, every structref) are as many after a replay as
before it, however many batches it ran.

On main before :mod:`kvsim.jit.uncounted_call` each call of the compiled ``core.run``
(``_nrt=False``) from the driver kept its :class:`kvsim.replay.kernel.core_ref.CoreRef`
alive, with the 37 meminfos it holds (the batch's ``seen`` flags among them): the peak
resident set grew with the trace's length (issue 38).
"""

from __future__ import annotations

import gc

import pytest
from numba.core.runtime import _nrt_python as nrt

from kvsim.jit.uncounted_call import call_uncounted
from kvsim.replay.driver import replay
from kvsim.spec.sim_config import SimConfig
from tests.sim.conftest import random_trace


@pytest.fixture
def live_meminfos():
    """A function giving numba's live meminfos (allocated - freed since the fixture
    started counting), after a garbage collection."""
    was_on = nrt.memsys_stats_enabled()
    nrt.memsys_enable_stats()

    def live() -> int:
        gc.collect()
        return nrt.memsys_get_stats_mi_alloc() - nrt.memsys_get_stats_mi_free()

    yield live
    if not was_on:
        nrt.memsys_disable_stats()


@pytest.mark.parametrize("batch_rows", [1 << 18, 16])
def test_a_replay_keeps_no_meminfo(builder, tmp_path, live_meminfos, batch_rows):
    trace = random_trace(builder, seed=3, n_requests=60).write(tmp_path / "t.parquet")
    config = SimConfig(engine="compiled", batch_rows=batch_rows, hbm_blocks=24)
    first = replay(trace, "lru", config).summary  # compiles, memoises what it types
    before = live_meminfos()
    again = replay(trace, "lru", config)
    assert again.summary == first
    del again
    assert live_meminfos() - before == 0


def _pool_session(pool) -> None:
    seq = pool.open_seq()
    pool.allocate(seq, [11, 12, 13, 0], num_tokens=14, now_us=1.0)
    pool.lookup([11, 12], 8)
    pool.free(seq, now_us=2.0)
    pool.close_seq(seq)


def test_a_python_pool_is_freed_with_its_last_reference(live_meminfos):
    """:class:`kvsim.memory.pool_handle.FastPool`'s operations (compiled without reference
    counting) left their structrefs one reference up per call: a pool was never freed."""
    from kvsim.memory.fast import PoolConfig
    from kvsim.memory.pool_handle import FastPool

    config = PoolConfig(num_blocks=8, block_size_tokens=4, max_seqs=2, max_blocks_per_seq=4,
                        block_bytes=64)
    _pool_session(FastPool(config))  # compiles, memoises what it types
    before = live_meminfos()
    pool = FastPool(config)
    _pool_session(pool)
    assert pool.st_c._meminfo.refcount == 1  # the proxy's own reference, no more
    del pool
    assert live_meminfos() - before == 0


def test_call_uncounted_leaves_a_counting_callee_alone():
    """A callee that gives its references back itself (compiled with counting, or Python)
    is not given any more back."""
    from kvsim.memory import fast as mem
    from kvsim.memory.pool_ref import pool_ref

    ref = pool_ref(mem.new_state(mem.PoolConfig(num_blocks=8, block_size_tokens=4,
                                                max_seqs=2, max_blocks_per_seq=4,
                                                block_bytes=64)))
    mi = ref._meminfo
    count = mi.refcount
    assert call_uncounted(mem.pool_check, ref) == 0  # compiled with counting
    assert call_uncounted(lambda r: 7, (ref, 1)) == 7
    assert mi.refcount == count
