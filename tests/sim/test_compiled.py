"""The compiled engine (numba: ONE core for every policy, the hooks passed to it as
first-class functions) gives exactly the interpreted engine's results: same source, two
executions; and the core is compiled once, whatever the policy.

The comparison runs in the default test run: the open-loop core compiles once (~40-45
CPU-s from an empty numba cache, docs/benchmarks.md "One core"; tests/sim/
test_compiled_reference.py compiles the same core and checks it against the independent
reference), each policy's hooks ~0.5 CPU-s.  The check that every core function compiles
for one signature runs in the slow step (tests/run_suite.sh step 2)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvsim.api import simulate
from kvsim.spec.sim_config import SimConfig

_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_c",
                                               Path(__file__).with_name("conftest.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)


def _builtins():
    from kvsim.policy.registry import list_policies

    return [p.name for p in list_policies()]


@pytest.mark.slow  # the default run checks the compiled core against the reference
@pytest.mark.parametrize("policy", _builtins())  # (test_compiled_reference.py)
def test_compiled_equals_interpreted(tiny_hw, tmp_path, policy):
    """Every built-in, in HBM and in DRAM, through the one compiled core (a new policy
    compiles only its hooks: ~12 x a few CPU-s once the core is cached)."""
    trace = _helpers.random_trace(_helpers.TraceBuilder, 3).write(tmp_path / "r.parquet")
    logs = {}
    results = {}
    for engine in ("interpreted", "compiled"):
        cfg = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine=engine,
                        check_invariants=True, tier_policies=(("dram", policy),))
        logs[engine] = tmp_path / f"{engine}.parquet"
        results[engine] = simulate(trace, policy, cfg, decision_log=logs[engine])
    a, b = results["interpreted"], results["compiled"]
    assert a.summary == b.summary
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert b.checks["pool_ok"] and b.checks["peak_within_capacity"]
    # same rows (the file metadata differs: it records the engine in the config)
    import pandas as pd

    assert pd.read_parquet(logs["interpreted"]).equals(pd.read_parquet(logs["compiled"]))


@pytest.mark.slow
def test_one_compilation_per_core_function(tiny_hw, tmp_path):
    """The replay's entry points compile for ONE signature, for every policy and for the
    open and the closed loop in one process: the policies' hooks are values of one type
    (kvsim.policy.hooks), and read-only and writable event columns are passed as one type
    of ``core.run`` (kvsim.replay.variants.run_cols).  (Callees passed constants at call
    sites, ``f(x, 0)``, are specialised by numba on the literal; kvsim no longer retypes
    those calls since #31 (it patched numba's dispatchers): docs/jit.md.)"""
    from kvsim.engine.lowering import lower_requests
    from kvsim.ingest.requests import build_request_table
    from kvsim.replay.kernel import closed_step, core

    t = build_request_table({"arrival_us": [0, 10, 20], "prompt_tokens": [40, 60, 40],
                             "output_tokens": [3, 2, 4], "block_ids": [[1, 2, 3],
                                                                      [1, 2, 4, 5], [1, 6, 7]],
                             "hashed_tokens": [40, 60, 40]}, block_size_tokens=16)
    # first, the recorded-schedule lowering: it calls the scheduler from Python before any
    # replay (it compiled the scheduler unsealed, 16 signatures of _row, until
    # schedule_state sealed first)
    lower_requests(t, tmp_path / "lowered.parquet")
    # advance is compiled once per scheduler (and per offload / resets argument: #34, cold):
    # a test run earlier in this process may have compiled another scheduler's
    before = set(closed_step.advance.signatures)
    trace = _helpers.random_trace(_helpers.TraceBuilder, 3).write(tmp_path / "r.parquet")
    for policy, prio, swap in (("lru", False, False), ("fifo", True, True),
                               ("s3fifo", False, True)):
        cfg = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="compiled",
                        priority_scheduling=prio, preemption="swap" if swap else "recompute",
                        write_policy="write_through", check_invariants=True,
                        tier_policies=(("dram", policy),))
        simulate(trace, policy, cfg, decision_log=tmp_path / f"log{policy}.parquet")
    # the closed loop in the same process: its writable event columns reach core.run
    # typed as the Parquet trace's (kvsim.replay.variants.run_cols)
    from kvsim.modes.closed.cluster import serve

    serve(t, "lru", SimConfig(hbm_gb=0.1, dram_gb=0.034, cxl_gb=0.0, nvme_gb=0.0,
                              engine="compiled"), decision_log=tmp_path / "closed.parquet")
    assert len(core.run.signatures) == 1
    assert len(set(closed_step.advance.signatures) - before) <= 1  # this run's scheduler


@pytest.mark.slow  # the closed-loop driver's own cold compile: ~40-50 CPU-s more
@pytest.mark.parametrize("policy, preemption", [("lru", "recompute"), ("s3fifo", "swap"),
                                                ("deadline", "recompute")])
def test_closed_loop_compiled_equals_interpreted(tmp_path, policy, preemption):
    """The closed loop (``closed_step.advance`` driving the scheduler and the core) gives
    the same summary, per-request and per-step tables and decision-log rows compiled and
    interpreted: 40 requests of two prompt families (shared prefix blocks), an HBM of
    ~48 blocks of 2 MiB (llama-3-8b, 16-token blocks) that evicts to a DRAM of 16 and
    preempts."""
    import numpy as np
    import pandas as pd

    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.cluster import serve

    rng = np.random.default_rng(7)
    n, B = 40, 16
    arrival = np.sort(rng.integers(0, 300_000, n)).tolist()
    prompt = rng.integers(40, 500, n).tolist()
    output = rng.integers(1, 80, n).tolist()
    ids = []
    for i, p in enumerate(prompt):
        nb = (p + B - 1) // B
        fam = 1_000 * (i % 2)
        ids.append([fam + j for j in range(min(nb, 6))] + [10_000 + 100 * i + j
                                                         for j in range(nb - min(nb, 6))])
    t = build_request_table({"arrival_us": arrival, "prompt_tokens": prompt,
                             "output_tokens": output, "block_ids": ids,
                             "hashed_tokens": [min(len(x) * B, p) for x, p in
                                               zip(ids, prompt)]}, block_size_tokens=B)
    res, logs = {}, {}
    for engine in ("interpreted", "compiled"):
        cfg = SimConfig(hbm_gb=0.1, dram_gb=0.034, cxl_gb=0.0, nvme_gb=0.0,
                        preemption=preemption, engine=engine, check_invariants=True)
        logs[engine] = tmp_path / f"{engine}.parquet"
        res[engine] = serve(t, policy, cfg, decision_log=logs[engine])
    a, b = res["interpreted"], res["compiled"]
    assert a.summary["schedule"] == "closed"
    assert a.summary["preemptions"] > 0 and a.summary["spills_hbm"] > 0, a.summary
    assert a.summary == b.summary
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert pd.read_parquet(logs["interpreted"]).equals(pd.read_parquet(logs["compiled"]))
