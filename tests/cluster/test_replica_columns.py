"""Every replica of a cluster reads ONE copy of the request columns (issue 38, "Memory"):
the scheduler's request arguments that need a dtype conversion (``n``, ``beam_width``,
``request_priority``, ``spec_draft_tokens`` to int64, ``session_continues`` to bool) were
copied per replica, ~33 bytes a request per replica; now converted once per table column
(:func:`kvsim.engine.scheduler_state.as_writable`) and shared, as the int64 columns always were."""

from __future__ import annotations

import gc

import numpy as np

from kvsim.engine import scheduler_state


def _schedules(k: int):
    """``k`` replicas' schedulers as :class:`kvsim.modes.closed.closed_loop.Engine` builds
    them (one table, each replica its own ``order``)."""
    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_loop import EngineOptions, prepare
    from kvsim.spec.sim_config import SimConfig

    table = build_request_table({"arrival_us": [0, 1_000, 2_000],
                                 "prompt_tokens": [64, 64, 32],
                                 "output_tokens": [30, 12, 25],
                                 "block_ids": [[1, 2, 3, 4], [1, 2, 5, 6], [7, 8]],
                                 "hashed_tokens": [64, 64, 32]}, block_size_tokens=16)
    config = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0,
                       engine="interpreted")
    opts = EngineOptions(scheduler="vllm")
    cost, hbm, costs, bb, off, ids, table, _ = prepare(table, config, opts)
    cfg = opts.engine_config(hbm, config.seed)
    return table, [scheduler_state.new_schedule(
        table.columns(), off, ids, table.block_size_tokens, cfg, cost, hbm,
        cfg.watermark_blocks(hbm), 1, closed=True, order=np.zeros(3, np.int64))
        for _ in range(k)]


def test_replicas_share_the_request_columns() -> None:
    table, (a, b, c) = _schedules(3)
    for k, (x, y, z) in enumerate(zip(a.req_args, b.req_args, c.req_args)):
        assert x is y is z, k
    # the values are the table's, as the scheduler's dtypes
    ra = a.req_args
    assert ra[5].dtype == np.int64 and ra[5].tolist() == [1, 1, 1]  # n
    assert ra[7].tolist() == [50, 50, 50]  # request_priority
    assert ra[8].dtype == np.bool_ and ra[8].flags.writeable  # session_continues
    assert ra[8] is not table.column("session_continues") or \
        table.column("session_continues").flags.writeable


def test_conversions_go_with_their_column() -> None:
    """A converted copy lives as long as the column it was made from."""
    col = np.arange(5, dtype=np.int32)
    first = scheduler_state.as_writable(col, np.int64)
    assert scheduler_state.as_writable(col, np.int64) is first and first.tolist() == [0, 1, 2, 3, 4]
    key = (id(col), np.dtype(np.int64).str)
    assert key in scheduler_state._CONVERTED
    del col, first
    gc.collect()
    assert key not in scheduler_state._CONVERTED
    same = np.arange(3, dtype=np.int64)
    assert scheduler_state.as_writable(same, np.int64) is same  # no copy, as before


def test_read_only_priority_and_tenant_columns_give_the_engine_its_one_type() -> None:
    """A table whose ``request_priority`` / ``tenant`` columns are read-only (a Parquet
    table's, a constant column) gives the engine the same array types as a writable one:
    numba types a read-only array apart, and the engine reference holding them as they
    were compiled ``closed_step.advance`` a second time (~15 CPU-s from an empty cache)."""
    import numba

    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    def engine(read_only: bool) -> Engine:
        prio, tenant = np.full(3, 50, np.int8), np.arange(3, dtype=np.int32)
        prio.flags.writeable = tenant.flags.writeable = not read_only
        table = build_request_table({"arrival_us": [0, 1_000, 2_000],
                                     "prompt_tokens": [64, 64, 32],
                                     "output_tokens": [30, 12, 25],
                                     "block_ids": [[1, 2, 3, 4], [1, 2, 5, 6], [7, 8]],
                                     "hashed_tokens": [64, 64, 32],
                                     "request_priority": prio, "tenant": tenant},
                                    block_size_tokens=16)
        assert table.column("tenant").flags.writeable is not read_only
        config = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0,
                           engine="interpreted")
        opts = EngineOptions(scheduler="vllm")
        cost, hbm, costs, bb, off, ids, table2, _ = prepare(table, config, opts)
        return Engine(table2, off, ids, resolve_policy("lru"), config, opts, cost, hbm,
                      costs, bb)

    a, b = engine(read_only=False), engine(read_only=True)
    for name in ("rprio", "tenant"):
        assert numba.typeof(getattr(b, name)) == numba.typeof(getattr(a, name)), name
        assert getattr(b, name).tolist() == getattr(a, name).tolist()
