"""The closed loop's core request tables hold the requests a replica holds at once, not
every request of the trace (issue 38, "Memory grows with what is resident, not with the
trace"; :mod:`kvsim.modes.closed.closed_slots`): the same requests repeated leave them the
same size, and rows recycled at every request give the same per-request results as rows
never recycled."""

from __future__ import annotations

import numpy as np
import pytest

#: six requests (a shared 3-block prefix, two tenants, one unhashed), 2-5 blocks each
_BASE = {"prompt_tokens": [64, 64, 80, 40, 64, 33], "output_tokens": [4, 20, 4, 2, 20, 3],
         "block_ids": [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 9], [7, 8, 9], [1, 2, 3, 6],
                       [11, 12, 13]],
         "hashed_tokens": [64, 48, 80, 40, 48, 0], "tenant": [0, 0, 1, 0, 0, 0]}
_N = len(_BASE["prompt_tokens"])


def _table(copies: int):
    """``copies`` of the six requests, a copy a second (requests 1 ms apart)."""
    from kvsim.ingest.requests import build_request_table

    cols = {k: v * copies for k, v in _BASE.items()}
    cols["arrival_us"] = [k * 1_000_000 + i * 1000 for k in range(copies) for i in range(_N)]
    return build_request_table(cols, block_size_tokens=16)


def _served(copies: int, scheduler: str = "vllm", log=None):
    """An engine that served ``copies`` of the six requests (interpreted), and its
    per-request columns.  A 24-block HBM: a finished request keeps its row while a block
    it allocated is in HBM (its ``evictions_suffered`` may still change), so at most ~24
    rows are held here."""
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    config = SimConfig(mode="engine", hbm_blocks=24, dram_gb=1, cxl_gb=0, nvme_gb=0,
                       engine="interpreted")
    opts = EngineOptions(scheduler=scheduler)
    cost, hbm_blocks, costs, block_bytes, off, ids, table, _ = prepare(_table(copies), config,
                                                                      opts)
    e = Engine(table, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks, costs,
               block_bytes, log)
    e.set_block_facts(block_facts(table, off, ids, opts.block_size_tokens, next_use=False))
    e.advance(-1.0)
    e.finish()

    rows = e.run.R_i.shape[0]
    return e, rows, e.run.slots.columns(e.run, 0)


def test_request_rows_do_not_grow_when_the_trace_repeats(monkeypatch):
    """On the old main the core's request tables had a row per request of the trace
    (145 rows here, one per request: 344 bytes a request in every replica); now 16 rows
    to start with, doubled while more requests are held at once (24 HBM blocks)."""
    from kvsim.modes.closed import closed_loop

    monkeypatch.setattr(closed_loop, "FIRST_ROWS", 16, raising=False)  # new in slots7
    _, rows, cols = _served(24)
    assert rows <= 64 < _N * 24
    assert list(cols["request_id"]) == list(range(_N * 24))


@pytest.mark.parametrize("scheduler", ["vllm", "kvsim"])
def test_recycled_rows_give_the_same_requests(monkeypatch, scheduler):
    """One row to start with (recycled or doubled whenever a request needs one) and rows
    for every request: the same per-request table, value for value."""
    from kvsim.modes.closed import closed_loop

    monkeypatch.setattr(closed_loop, "FIRST_ROWS", 1)
    _, small, a = _served(24, scheduler)
    monkeypatch.setattr(closed_loop, "FIRST_ROWS", 1 << 12)
    _, big, b = _served(24, scheduler)
    assert small <= 64 < _N * 24 <= big
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
