"""What a call of the closed loop's compiled step driver and of the prefix router unboxes
(issue 34, 8 replicas): ``advance``'s ~65 arrays held in one EngineRef, the router's five
tuples of one array per replica in one RouteRef.  numba's C wrapper unboxes every argument
at every call (an array: its buffer read and a reference taken); ~9,500 calls of
``advance`` and ~12,000 of the router in an 8-replica Mooncake run.  The counts are
pinned exactly; speed is measured in docs/benchmarks.md, not asserted here."""

from __future__ import annotations

import inspect

import numpy as np
from numba import types

from tests.helpers import small_closed_engine


def _leaves(t) -> int:
    """The values numba's wrapper unboxes for an argument of type ``t`` (a tuple: each)."""
    if isinstance(t, types.BaseTuple):
        return sum(_leaves(x) for x in t.types)
    return 1


def test_advance_unboxes_one_engine_ref_per_call():
    """Each compiled signature of ``advance`` is (limit, max steps, EngineRef, RunRef):
    four values unboxed a call (main: ~90, the arrays one by one), and steps run call by
    call give the results of one uninterrupted call."""
    from kvsim.replay.kernel import closed_step
    from kvsim.replay.kernel.engine_ref import FIELDS, EngineRef, EngineRefType

    assert list(inspect.signature(closed_step.advance.py_func).parameters) == [
        "limit_us", "max_steps", "er", "run_ref"]
    whole, stepwise = small_closed_engine("compiled"), small_closed_engine("compiled")
    whole.advance()
    stepwise.advance(-1.0, max_steps=1)  # one compiled call per step
    assert stepwise.steps == whole.steps > 20
    assert isinstance(stepwise._args[0], EngineRef)
    sigs = closed_step.advance.signatures
    assert sigs
    for sig in sigs:
        assert sum(_leaves(t) for t in sig) == 4
        assert isinstance(sig[2], EngineRefType)
        assert tuple(sig[2].field_dict) == FIELDS
    for e in (whole, stepwise):
        e.finish()
    assert stepwise.rows == whole.rows
    np.testing.assert_array_equal(stepwise.in_system, whole.in_system)
    np.testing.assert_array_equal(stepwise.run.C, whole.run.C)


def test_interpreted_advance_takes_the_same_members():
    """The interpreted twin reads the same members from a namespace: same steps, rows
    and counters as the compiled engine."""
    a, b = small_closed_engine("compiled"), small_closed_engine("interpreted")
    for e in (a, b):
        e.advance()
        e.finish()
    assert a.steps == b.steps and a.rows == b.rows
    np.testing.assert_array_equal(a.in_system, b.in_system)
    np.testing.assert_array_equal(a.run.C, b.run.C)


def test_prefix_router_unboxes_one_route_ref(monkeypatch):
    """The prefix scorer makes its RouteRef once per ``waiting`` array and then calls
    numba's entry with 8 scalars and pointers (main: five tuples of one array per replica,
    typed and unboxed at every call); its picks equal ``_route_prefix`` on the tuples."""
    from kvsim.engine.scheduler import S_DONE, S_QN
    from kvsim.engine.scheduler_blocks import _route_prefix
    from kvsim.modes.closed.routing import PREFIX_OVERLAP_WEIGHT, prefix_scorer
    from kvsim.replay.kernel import engine_ref

    made = []
    real = engine_ref.new_route_ref

    def counted(*a):
        made.append(1)
        return real(*a)

    monkeypatch.setattr(engine_ref, "new_route_ref", counted)
    engines = [small_closed_engine("compiled") for _ in range(3)]
    engines[1].advance()  # replica 1 has the shared prefix cached
    waiting = np.array([0, 2, 1], dtype=np.int64)
    score = prefix_scorer(engines)
    tuples = (tuple(e.sched.st for e in engines),
              tuple(e.sched.slot_args[20] for e in engines),
              *(tuple(e.sched.lookup[k] for e in engines) for k in range(3)))
    phk = engines[1].sched.lookup[0]
    cached = phk[phk != 0]  # hashes replica 1's pool holds
    assert cached.shape[0] > 0
    rng = np.random.default_rng(5)
    picks = set()
    for nb in range(1, 6):
        for hb in (np.zeros(nb, np.int64), np.resize(cached, nb),
                   rng.permutation(np.resize(cached, nb))):
            for prompt in (16 * nb, 16 * nb - 5):
                got = score(hb, nb, prompt, 16, waiting)
                assert got == _route_prefix(hb, nb, prompt, 16, PREFIX_OVERLAP_WEIGHT, waiting,
                                            *tuples, S_QN, S_DONE)
                picks.add(got)
    assert len(picks) > 1
    assert len(made) == 1  # one RouteRef for the run's waiting array
    waiting[0] = 0
    assert score(np.zeros(1, np.int64), 1, 16, 16, waiting) == _route_prefix(
        np.zeros(1, np.int64), 1, 16, 16, PREFIX_OVERLAP_WEIGHT, waiting, *tuples, S_QN, S_DONE)
    assert len(made) == 1  # the same array, read in place
    score(np.zeros(1, np.int64), 1, 16, 16, waiting.copy())
    assert len(made) == 2  # another array: another ref
