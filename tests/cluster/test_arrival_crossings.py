"""The per-call and per-replica costs of the closed loop's arrival loop (issue 34, 8
replicas): ``core.run``'s function value unboxed once, not at every call of the compiled
``advance``; a speculative-acceptance set-up without a Python loop per request.  Values
are pinned exactly; speed is measured in docs/benchmarks.md, not asserted here."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from kvsim.engine.vllm_spec import UNITS, acceptance_units


def _ceil_calls(fn) -> int:
    """How many times ``fn()`` calls the builtin ``math.ceil`` (a profile hook's
    ``c_call`` events)."""
    n = 0

    def hook(frame, event, arg):
        nonlocal n
        if event == "c_call" and arg is math.ceil:
            n += 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def test_acceptance_units_is_one_numpy_pass_with_the_loops_values():
    rng = np.random.default_rng(3)
    edge = [0.0, -0.0, 1.0, 0.5, 2.0 ** -53, 1 - 2.0 ** -53, 5e-324, 1e-300, 2.0, -1.0,
            0.1, 1 / 3]
    p = np.concatenate([rng.random(2000), edge])
    loop = np.array([math.ceil(x * UNITS) for x in np.clip(p, 0.0, 1.0)], np.int64)
    got = acceptance_units(p)
    assert got.dtype == np.int64 and got.shape == p.shape
    np.testing.assert_array_equal(got, loop)
    assert int(acceptance_units(np.float64(1.0))) == UNITS
    assert acceptance_units(np.zeros((2, 3))).shape == (2, 3)
    # one numpy pass: no Python ceil per request (main: one per request and replica)
    assert _ceil_calls(lambda: acceptance_units(p)) == 0
    with pytest.raises(ValueError, match="NaN"):  # as math.ceil refused it
        acceptance_units(np.array([0.5, np.nan]))


def _compiled_engine():
    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    ids = [[1, 2, 3, 4], [1, 2, 5, 6], [7, 8], [1, 2, 3, 9]]
    table = build_request_table({"arrival_us": [0, 1_000, 2_000, 3_000],
                                 "prompt_tokens": [64, 64, 32, 64],
                                 "output_tokens": [30, 12, 25, 8], "block_ids": ids,
                                 "hashed_tokens": [64, 64, 32, 64]}, block_size_tokens=16)
    config = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0,
                       engine="compiled")
    opts = EngineOptions(scheduler="vllm")
    cost, hbm_blocks, costs, block_bytes, off, ids, table2, _ = prepare(table, config, opts)
    e = Engine(table2, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks,
               costs, block_bytes)
    e.set_block_facts(block_facts(table2, off, ids, opts.block_size_tokens))
    return e


def test_advance_unboxes_core_run_once_not_per_call(monkeypatch):
    """numba unboxes a first-class function argument by asking the value for its address
    (``__wrapper_address__``) at every call of the compiled ``advance``: ~9 us a call,
    ~9,500 calls in an 8-replica Mooncake run.  Held in a RunRef, the address is asked for
    once (when the ref is made), however many calls follow; the steps are the same as
    one uninterrupted call's."""
    from kvsim.replay import variants
    from kvsim.replay.kernel.run_ref import RunRef

    asked = []
    real = variants.RunValue.__wrapper_address__

    def counted(self):
        asked.append(1)
        return real(self)

    monkeypatch.setattr(variants.RunValue, "__wrapper_address__", counted)
    whole, stepwise = _compiled_engine(), _compiled_engine()
    whole.advance()
    stepwise.advance(-1.0, max_steps=1)  # one compiled call per step
    assert stepwise.steps == whole.steps > 20
    assert len(asked) <= 1  # main: one per call of advance (> 20)
    ref = stepwise._args[-1]
    assert isinstance(ref, RunRef) and ref is whole._args[-1]  # one per signature
    for e in (whole, stepwise):
        e.finish()
    assert stepwise.rows == whole.rows
    np.testing.assert_array_equal(stepwise.in_system, whole.in_system)
    np.testing.assert_array_equal(stepwise.sched.stf, whole.sched.stf)
    np.testing.assert_array_equal(stepwise.run.C, whole.run.C)
