"""The per-call and per-replica costs of the closed loop's arrival loop (issue 34, 8
replicas): ``core.run``'s function value unboxed once, not at every call of the compiled
``advance``; a speculative-acceptance set-up without a Python loop per request.  Values
are pinned exactly; speed is measured in docs/benchmarks.md, not asserted here."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from kvsim.engine.vllm_spec import UNITS, acceptance_units
from tests.helpers import small_closed_engine


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
    whole, stepwise = small_closed_engine("compiled"), small_closed_engine("compiled")
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


def _old_run_cluster(table, engines, router, B, pb, warmup=0, on_progress=None,
                     on_release=None):
    """The arrival loop as main had it before arrive7: every replica's state read at every
    arrival (the reference the loop keeping ``due`` times must equal).  ``on_release`` (the
    row store's page release, session 22) is not called: it changes no result."""
    from kvsim.engine import scheduler as S
    from kvsim.modes.closed.routing import _route, prefix_scorer

    arr = np.asarray(table.column("arrival_us"), dtype=np.float64)
    prompt = np.asarray(table.column("prompt_tokens"), dtype=np.int64)
    session = np.asarray(table.column("session"), dtype=np.int64)
    R = len(engines)
    waiting_blocks = np.zeros(R, dtype=np.int64)
    admitted = [0] * R
    nb_all = ((prompt + B - 1) // B).tolist()
    score = prefix_scorer(engines) if router == "prefix" else None
    sticky: dict = {}
    for i in range(len(table)):
        t = float(arr[i])
        for w, e in enumerate(engines):
            st = e.sched.st
            if e.has_work() and e.clock_us < t:
                e.advance(t)
            adm = int(st[S.S_ADMIT])
            if adm > admitted[w]:
                for j in range(admitted[w], adm):
                    waiting_blocks[w] -= nb_all[e.sched.order[j]]
                admitted[w] = adm
        if i == warmup and warmup > 0:
            for e in engines:
                e.start_measuring()
        nb = nb_all[i]
        w = _route(router, i, engines, pb.slice(i), nb, int(prompt[i]), B, int(session[i]),
                   sticky, waiting_blocks, score)
        e = engines[w]
        if not e.has_work() and e.clock_us < t:
            e.sched.stf[0] = t
        e.enqueue(i)
        waiting_blocks[w] += nb
    for e in engines:
        e.advance(-1.0)


@pytest.mark.parametrize("router", ["prefix", "round_robin", "least_loaded", "session",
                                    "tiered"])
def test_arrival_loop_reads_replica_state_only_after_it_changes(monkeypatch, router):
    """The arrival loop reads a replica's work, clock and admissions only after it ran
    or was routed a request (its ``due`` time), not at every arrival: the same steps,
    routes and results as the loop reading every replica at every arrival -- bursts, idle
    gaps, a warm-up, and a pool small enough to preempt (vLLM re-queues: admissions step
    back)."""
    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed import cluster
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    rng = np.random.default_rng(11)
    n, B = 36, 16
    arrival = np.cumsum(rng.choice([0, 3_000, 40_000, 2_000_000], size=n, p=[.3, .4, .2, .1]))
    base = [list(range(100 * k, 100 * k + 6)) for k in range(4)]
    ids = [base[int(rng.integers(0, 4))][:int(rng.integers(1, 7))]
           + [10_000 + i] * int(rng.integers(0, 2)) for i in range(n)]
    table = build_request_table({
        "arrival_us": arrival, "prompt_tokens": [len(x) * B for x in ids],
        "output_tokens": rng.integers(1, 100, size=n), "block_ids": ids,
        "hashed_tokens": [len(x) * B for x in ids],
        "session": rng.integers(0, 5, size=n)}, block_size_tokens=B)
    config = SimConfig(engine="interpreted", hbm_blocks=16, dram_gb=0, cxl_gb=0, nvme_gb=0,
                       warmup_requests=5)
    got = serve(table, "lru", config, replicas=3, router=router)
    monkeypatch.setattr(cluster, "_run_cluster", _old_run_cluster)
    ref = serve(table, "lru", config, replicas=3, router=router)
    assert got.summary["preemptions"] > 0  # admissions stepped back
    pd_testing = pytest.importorskip("pandas").testing
    pd_testing.assert_frame_equal(got.requests, ref.requests)
    assert json.dumps(got.summary, sort_keys=True, default=str) == json.dumps(
        ref.summary, sort_keys=True, default=str)
