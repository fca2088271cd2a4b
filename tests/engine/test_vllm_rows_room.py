"""vLLM's steps as the closed loop's rows (:func:`kvsim.engine.vllm_rows.vllm_rows`): its
rows are the core's request-table rows (the requests a replica holds) and its per-step
lists are sized by what one step can name, not by the trace (issue 38), and it is
compiled without reference counting (issue 34): it asks its caller for row room and
resumes the step it stopped, with the same rows.

On the old main vLLM's rows (``R`` 152 bytes, its arrival, queues, first token and mark:
~200 bytes) and the per-step lists (``VS_SCHED``, ``VS_BL``, ``VS_ADM``, ``VS_PRE``,
``VS_FIN``, ``VS_EV``: ~224 bytes) had a row per request of the trace in every replica,
and ``vllm_rows`` was compiled with counting (it grew its row buffers itself)."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.engine import vllm_rows as VR


def test_step_lists_do_not_grow_when_the_trace_repeats():
    """10,000 and 1,000,000 requests (900 blocks, 256 sequences at most): the same lists
    (on the old main, 100x the rows)."""
    a = VR.new_outputs(10_000, 900, 256, 40)
    b = VR.new_outputs(1_000_000, 900, 256, 40)
    assert [x.shape for x in a] == [x.shape for x in b]
    # sized by max_num_seqs: 257 scheduled, 514 preempted, 2 x 900 + 4 x 256 + 64 events
    assert a[0].shape == (257, 2) and a[1].shape == (514, 2)
    assert a[6].shape == (2 * 900 + 4 * 256 + 64, 4)
    # fewer requests than sequences: sized by the requests
    assert VR.new_outputs(3, 900, 256, 40)[0].shape == (4, 2)


def test_vllm_rows_compiled_without_counts():
    assert VR.vllm_rows.targetoptions.get("_nrt") is False


#: six requests (a shared 3-block prefix, one unhashed), 2-5 blocks each, a copy a second
_BASE = {"prompt_tokens": [64, 64, 80, 40, 64, 33], "output_tokens": [4, 20, 4, 2, 20, 3],
         "block_ids": [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 9], [7, 8, 9], [1, 2, 3, 6],
                       [11, 12, 13]], "hashed_tokens": [64, 48, 80, 40, 48, 0]}


def _table(copies: int):
    from kvsim.ingest.requests import build_request_table

    cols = {k: v * copies for k, v in _BASE.items()}
    cols["arrival_us"] = [k * 1_000_000 + i * 1000 for k in range(copies) for i in range(6)]
    return build_request_table(cols, block_size_tokens=16)


def _served(copies: int, rows: int | None, engine: list | None = None):
    """An engine that served ``copies`` of six requests under vLLM's scheduler
    (interpreted), with its row buffers cut to ``rows`` rows first (None: as made), and
    its per-request columns and step records."""
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    config = SimConfig(mode="engine", hbm_blocks=24, dram_gb=1, cxl_gb=0, nvme_gb=0,
                       engine="interpreted")
    opts = EngineOptions(scheduler="vllm")
    cost, hbm_blocks, costs, block_bytes, off, ids, table, _ = prepare(_table(copies), config,
                                                                      opts)
    e = Engine(table, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks, costs,
               block_bytes, None)
    e.set_block_facts(block_facts(table, off, ids, opts.block_size_tokens, next_use=False))
    if rows is not None:
        e.sched.I = np.zeros((e.sched.I.shape[0], rows), e.sched.I.dtype)
        e.sched.F = np.zeros((e.sched.F.shape[0], rows), e.sched.F.dtype)
        e._args = None
    e.advance(-1.0)
    if engine is not None:
        engine.append(e)
    steps = np.array(e.in_system)
    e.finish()
    return e.run.slots.columns(e.run, 0), steps, e.sched.I.shape[1]


@pytest.mark.parametrize("rows", [1, 7])
def test_steps_stopped_for_row_room_resume_with_the_same_rows(monkeypatch, rows):
    """Row buffers of 1-7 rows grown by just the room asked: steps stop for room before
    their arrivals (started again) and after their schedule() (resumed at their rows), and
    the caller grows them; the same requests, value for value, and the same steps, as with
    buffers never short."""
    from kvsim.engine import scheduler as S

    b, sb, _ = _served(8, None)
    stops = []

    def tight(I, F, n, need):  # grown by exactly the room asked (no doubling)
        if n + need <= I.shape[1]:
            return I, F
        stops.append(need)
        I2 = np.zeros((I.shape[0], n + need), I.dtype)
        F2 = np.zeros((F.shape[0], n + need), F.dtype)
        I2[:, :n], F2[:, :n] = I[:, :n], F[:, :n]
        return I2, F2

    monkeypatch.setattr(S, "_ensure", tight)
    # and in the scheduler's Python twin, which the interpreted loop reads instead while
    # vLLM's compiled step is cold (kvsim.replay.variants.python_vllm): with only the
    # module patched, the test passed or failed by the state of numba's disk cache
    from kvsim.replay.variants import _scheduler_twin

    monkeypatch.setattr(_scheduler_twin(), "_ensure", tight)
    a, sa, grown = _served(8, rows)
    assert grown > rows
    # a stop after schedule() asks at least 12 rows; before arrivals 2 + arrivals (3 here,
    # with 1 row to start with)
    assert max(stops) >= 12 and (rows > 3 or min(stops) == 3)
    assert np.array_equal(sa, sb)
    assert list(a) == list(b)
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k


def test_vllm_rows_do_not_grow_when_the_trace_repeats(monkeypatch):
    """24 copies of six requests (144) through a 24-block pool, 16 rows to start with: vLLM's
    rows are the core's rows (at most 64 here; one per request, 144, on the old main), and
    recycled rows give the same requests as rows never recycled."""
    from kvsim.engine.vllm_rows import VS_ARR, VS_FIRST, VS_MARK, VS_R, VS_RUN, VS_WQ
    from kvsim.modes.closed import closed_loop

    monkeypatch.setattr(closed_loop, "FIRST_ROWS", 16)
    got: list = []
    a, _, _ = _served(24, None, got)
    e = got[0]
    rows = e.slots.rid_of.shape[0]
    assert rows <= 64 < 144
    for k in (VS_R, VS_ARR, VS_RUN, VS_WQ, VS_FIRST, VS_MARK):
        assert e.vs[k].shape[0] == rows, k
    monkeypatch.setattr(closed_loop, "FIRST_ROWS", 1 << 12)
    b, _, _ = _served(24, None)
    assert list(a["request_id"]) == list(range(144))
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
