"""The closed loop's speed-ups (issue 34) keep every value: the load estimate's vectorised
first-seen count, the once-typed scheduler value, advance's entry point, the catalog
parsed once.  Speed itself is measured in docs/benchmarks.md, not asserted here."""

from __future__ import annotations

import tomllib

import numba
import numpy as np
import pandas as pd
import pytest

from kvsim.jit.decorators import njit
from tests.helpers import small_closed_engine


def _load_by_loop(table, model, hardware, max_num_seqs, max_num_batched_tokens):
    """estimate_load's prefill and compute sums as they were written before (a set of the
    blocks seen, request by request)."""
    from kvsim.engine.engine_model import build_cost_model

    cost = build_cost_model(model, hardware)
    df = table.df
    bs = int(table.block_size_tokens)
    seen: set[int] = set()
    prefill, compute_us, cold_us = 0, 0.0, 0.0
    for prompt, ids in zip(df["prompt_tokens"].to_numpy(np.int64), df["block_ids"]):
        new = 0
        for h in ids:
            if int(h) not in seen:
                seen.add(int(h))
                new += 1
        fresh = min(int(prompt), new * bs) + max(int(prompt) - len(ids) * bs, 0)
        prefill += fresh
        compute_us += cost.prefill_us(int(prompt) - fresh, fresh)
        cold_us += cost.prefill_us(0, int(prompt))
    return prefill, compute_us, cold_us


def test_estimate_load_counts_first_seen_blocks_as_the_loop_did():
    from kvsim.analysis.sizing import estimate_load
    from kvsim.engine.engine_model import build_cost_model
    from kvsim.ingest.requests import RequestTable

    rng = np.random.default_rng(7)
    n = 300
    # shared prefixes, a block repeated inside one request, requests without blocks,
    # prompts longer than their identified blocks
    ids = []
    for i in range(n):
        k = int(rng.integers(0, 9))
        row = [int(x) for x in rng.integers(0, 60, size=k)]
        if k and i % 5 == 0:
            row.append(row[0])
        ids.append(row)
    df = pd.DataFrame({"request_id": np.arange(n), "arrival_us": np.arange(n) * 997,
                       "prompt_tokens": rng.integers(1, 6000, size=n),
                       "output_tokens": rng.integers(1, 300, size=n), "block_ids": ids})
    table = RequestTable(df, 512)
    got = estimate_load(table, "llama-3-8b", "h100-sxm", 256, 8192)
    prefill, compute_us, cold_us = _load_by_loop(table, "llama-3-8b", "h100-sxm", 256, 8192)
    assert got.prefill_tokens == prefill
    cost = build_cost_model("llama-3-8b", "h100-sxm")
    step_us = cost.weight_bytes / cost.hbm_bytes_per_us + cost.step_overhead_us
    prefill_us = compute_us + int(np.ceil(prefill / 8192)) * step_us
    cold_prefill_us = cold_us + int(np.ceil(int(df["prompt_tokens"].sum()) / 8192)) * step_us
    decode_s = got.busy_s - prefill_us / 1e6
    assert got.busy_upper_s - cold_prefill_us / 1e6 == pytest.approx(decode_s, abs=1e-9)


def test_typed_tuple_has_the_plain_tuples_type_made_once():
    from kvsim.replay.variants import TypedTuple

    plain = (np.zeros(3, np.int64), np.ones((2, 2)), np.int64(4), (np.zeros(1, np.int8),))
    t = TypedTuple(plain)
    assert numba.typeof(t) == numba.typeof(plain)
    assert numba.typeof(t) is numba.typeof(t)  # cached: not typed again
    assert tuple(t) == plain and t[1] is plain[1]


@njit(cache=False)
def _add_all(x, a, b):
    return x + a.sum() + b[0].sum()


def test_entry_point_is_the_overload_for_the_arguments():
    from kvsim.modes.closed.closed_loop import _entry
    from kvsim.replay.variants import TypedTuple

    args = (1.5, np.arange(4, dtype=np.int64), TypedTuple((np.ones(2), np.ones(1))))
    # not compiled for these types yet: compiled first (compile_for, by one process at a
    # time), then the overload's entry point, for exactly these types
    assert not _add_all.overloads
    call = _entry(_add_all, args)
    assert call is not _add_all and call(*args) == 9.5 and len(_add_all.overloads) == 1
    assert _entry(_add_all, args) is call
    py = _add_all.py_func
    assert _entry(py, args) is py  # interpreted: the function itself


def test_catalog_is_a_fresh_parse_each_call():
    from kvsim.spec.models import catalog

    a = catalog._catalog()
    assert a == tomllib.loads(catalog._catalog_text())
    a.clear()
    assert catalog._catalog() and catalog._catalog() is not catalog._catalog()


def test_advance_keeps_its_arguments_across_yields(monkeypatch):
    """Engine.advance types its ~65 arguments (closed_loop._entry: ~1 ms) again only after
    a buffer was grown or replaced: not at a yield (every ``max_steps`` steps; the
    8-replica Mooncake loop yields or flushes its step buffer ~70 times) -- once more
    after its first call (the dispatcher compiled or loaded the code then) -- and a
    yield every step runs the same steps as one uninterrupted call."""
    from kvsim.modes.closed import closed_loop

    calls = []
    real = closed_loop._entry

    def counted(advance, args):
        calls.append(1)
        return real(advance, args)

    monkeypatch.setattr(closed_loop, "_entry", counted)
    whole, stepwise = small_closed_engine("interpreted"), small_closed_engine("interpreted")
    whole.advance()
    n = len(calls)
    stepwise.advance(-1.0, max_steps=1)  # a yield after every step
    assert stepwise.steps == whole.steps > 20
    assert len(calls) - n <= 2  # main: one per step
    for e in (whole, stepwise):
        e.finish()
    assert stepwise.rows == whole.rows
    np.testing.assert_array_equal(stepwise.in_system, whole.in_system)
    np.testing.assert_array_equal(stepwise.sched.st, whole.sched.st)
    np.testing.assert_array_equal(stepwise.sched.stf, whole.sched.stf)
    np.testing.assert_array_equal(stepwise.run.C, whole.run.C)
    np.testing.assert_array_equal(stepwise.run.R_i, whole.run.R_i)
