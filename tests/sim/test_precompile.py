"""A cold compile split over worker processes (kvsim.replay.precompile) and ``auto`` for a
compare (one engine for every policy, the compile paid once).

No replay core is compiled here: the split is checked with a user policy written to a
fresh file (its hooks are cold by construction) and a stand-in for the first replay; the
engine choice with the cache checks monkeypatched (the checks themselves are tested on a
real numba cache in test_engine_choice.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvsim.jit import disk_cache
from kvsim.policy.registry import get_policy
from kvsim.replay import precompile, variants
from kvsim.spec.sim_config import AUTO_COMPILE_MIN_ROWS

SPLIT = """
import json
from kvsim.policy.hooks import HOOK_NAMES, hooks_are_cached
from kvsim.policy.registry import get_policy
from kvsim.replay import precompile

fifo = get_policy("fifo")
before = precompile.cold_hooks(["optimal", "fifo", "lru"], skip=["lru"])
calls = []
out = precompile.first_then_hooks(lambda x: calls.append(x) or {"row": x}, (7,), before,
                                  workers=2)
own = {id(getattr(fifo, h)): getattr(fifo, h) for h in HOOK_NAMES}
print(json.dumps({"before": before, "out": out, "calls": calls,
                  "compiled_here": sum(len(f.overloads) for f in own.values()),
                  "cached_after": hooks_are_cached(fifo),
                  "after": precompile.cold_hooks(["fifo"])}))
"""


@pytest.mark.slow  # a fresh process compiles fifo's hooks from an empty cache (~5-30 s)
def test_first_then_hooks_compiles_the_other_hooks_in_a_worker(tmp_path):
    """From an empty numba cache (a fresh process): fifo's hooks are cold; a forked
    worker compiles them (this process compiles none) and they are in numba's disk cache
    when ``first_then_hooks`` returns; the first replay ran once, here, and its result
    comes back unchanged."""
    # an empty cache whatever the caller set (KVSIM_CACHE_DIR takes precedence over
    # NUMBA_CACHE_DIR in kvsim.jit: a developer's warm cache made "before" empty)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "KVSIM_CACHE_DIR": str(tmp_path / "numba")}
    res = subprocess.run([sys.executable, "-c", SPLIT], capture_output=True, text=True,
                         env=env, check=True)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"before": ["fifo"], "out": {"row": 7}, "calls": [7], "compiled_here": 0,
                   "cached_after": True, "after": []}


SHARED = """
import json
from kvsim.policy.hooks import compiled_hooks, hooks_are_cached
from kvsim.policy.registry import get_policy
from kvsim.replay import precompile

names = ["fifo", "lru", "sieve", "s3fifo", "lfu"]
before = precompile.cold_hooks(names)
calls = []


def replay(x):
    if isinstance(x, str):  # a policy this process takes: its hooks compile here
        for h in compiled_hooks(get_policy(x)):
            h.compile()
    calls.append(x)
    return {"row": x}


done = {}
out = precompile.first_then_hooks(replay, (7,), before, workers=2, done=done)
print(json.dumps({"before": before, "out": out, "calls": calls, "done": done,
                  "cached_after": [hooks_are_cached(get_policy(n)) for n in names]}))
"""


@pytest.mark.slow  # a fresh process compiles five policies' hooks from an empty cache
def test_first_then_hooks_shares_the_hooks_with_this_process(tmp_path):
    """``done``: once its first replay is done, this process replays policies too (those
    no worker started, or whose hooks a worker compiled) instead of waiting: each policy
    is replayed here at most once, its result in ``done``, and every hook is in numba's
    disk cache at the end.  Which ones this process takes depends on timing."""
    # an empty cache whatever the caller set (KVSIM_CACHE_DIR takes precedence over
    # NUMBA_CACHE_DIR in kvsim.jit: a developer's warm cache made "before" empty)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "KVSIM_CACHE_DIR": str(tmp_path / "numba")}
    res = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True,
                         env=env, check=True)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["before"] == ["fifo", "lru", "sieve", "s3fifo", "lfu"]
    assert got["out"] == {"row": 7} and got["calls"][0] == 7
    here = got["calls"][1:]
    # the stand-in first replay returns at once, before the forked worker has even
    # imported kvsim: this process takes the last policy at least
    assert "lfu" in here
    assert len(here) == len(set(here)) and set(here) <= set(got["before"])
    assert got["done"] == {n: {"row": n} for n in here}
    assert got["cached_after"] == [True] * 5


def test_first_then_hooks_with_one_worker_runs_first_alone():
    calls = []
    assert precompile.first_then_hooks(lambda: calls.append(1) or {"a": 1}, (), ["lru"],
                                       workers=1) == {"a": 1}
    assert calls == [1]


def test_compare_engine_auto(monkeypatch):
    """auto for a compare: compiled when the core is cached, or when every replay together
    has enough events to pay for the one compile; else interpreted.  Explicit engines are
    obeyed without looking at the cache."""
    monkeypatch.setattr(variants, "core_is_cold", lambda closed=False: True)
    assert precompile.compare_engine("auto", 10, 13) == "interpreted"
    n = AUTO_COMPILE_MIN_ROWS // 13 + 1
    assert precompile.compare_engine("auto", n, 1) == "interpreted"
    assert precompile.compare_engine("auto", n, 13) == "compiled"  # the compile is shared
    monkeypatch.setattr(variants, "core_is_cold", lambda closed=False: False)
    assert precompile.compare_engine("auto", 10, 13) == "compiled"

    def boom(closed=False):
        raise AssertionError("an explicit engine never checks the cache")

    monkeypatch.setattr(variants, "core_is_cold", boom)
    assert precompile.compare_engine("interpreted", 10**9, 13) == "interpreted"
    assert precompile.compare_engine("compiled", 10, 1) == "compiled"


def test_closed_loop_cache_check_needs_the_step_driver(monkeypatch):
    """The closed loop runs ``closed_step.advance`` besides ``core.run``: auto counts it
    as cached only when both are (and every hook)."""
    from kvsim.modes.closed.closed_loop import closed_engine
    from kvsim.replay.kernel import closed_step, core
    from kvsim.spec.sim_config import SimConfig

    lru = get_policy("lru")
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: d is not closed_step.advance)
    monkeypatch.setattr(disk_cache, "dispatcher_is_cached", lambda d: d is not closed_step.advance)
    assert variants.compiled_is_cached(lru, [lru] * 3) is True  # open loop: warm
    assert variants.compiled_is_cached(lru, [lru] * 3, closed=True) is False
    assert variants.core_is_cold(closed=False) is False
    assert variants.core_is_cold(closed=True) is True
    assert closed_engine(SimConfig(engine="auto"), "lru", 10) == "interpreted"
    assert closed_engine(SimConfig(engine="auto"), "lru", AUTO_COMPILE_MIN_ROWS) == "compiled"
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: True)
    monkeypatch.setattr(disk_cache, "dispatcher_is_cached", lambda d: True)
    assert closed_engine(SimConfig(engine="auto"), "lru", 10) == "compiled"
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: d is not core.run)
    monkeypatch.setattr(disk_cache, "dispatcher_is_cached", lambda d: d is not core.run)
    assert variants.core_is_cold(closed=True) is True
    assert closed_engine(SimConfig(engine="auto"), "lru", 10) == "interpreted"
    assert closed_engine(SimConfig(engine="compiled"), "lru", 10) == "compiled"


def test_advance_is_compiled_and_cached_per_scheduler(monkeypatch):
    """``closed_step.advance`` takes the scheduler it runs and None for the other, and None
    for vLLM's native offloading and resets when the run has none (``scheduler_args``), so
    numba prunes what is None before typing and a run compiles one scheduler; the cache
    check then asks for that scheduler's specialisation (issue 34, cold).  On main
    ``advance`` took vLLM's value only and compiled both schedulers."""
    import inspect

    import numpy as np
    from numba import types

    from kvsim.engine.vllm_rows import VS_RESETS
    from kvsim.modes.closed.closed_loop import closed_engine
    from kvsim.replay.kernel import closed_step
    from kvsim.spec.sim_config import SimConfig

    no_resets = tuple(np.zeros((0, 4), np.int64) if k == VS_RESETS else k
                      for k in range(VS_RESETS + 1))
    assert closed_step.scheduler_args(True, no_resets) == (None, no_resets, None, None)
    assert closed_step.scheduler_args(True, no_resets, True) == (None, no_resets, no_resets,
                                                                 None)
    assert closed_step.scheduler_args(False, no_resets, True) == (True, None, None, None)
    resets = no_resets[:VS_RESETS] + (np.zeros((1, 4), np.int64),)
    assert closed_step.scheduler_args(True, resets)[3] is resets[VS_RESETS]
    from kvsim.replay.kernel.engine_ref import FIELDS, EngineRefType

    # the step loop takes them as arguments (numba prunes a None one before typing);
    # advance takes them as members of its EngineRef
    params = list(inspect.signature(closed_step._advance.py_func).parameters)
    at = params.index("vs")
    assert params[at - 1: at + 3] == ["ks", "vs", "vo", "rs"]
    assert list(inspect.signature(closed_step.advance.py_func).parameters) == [
        "limit_us", "max_steps", "er", "run_ref"]

    def sig(vs_type):
        kinds = {"ks": types.none if vs_type is not types.none else types.boolean,
                 "vs": vs_type, "vo": types.none, "rs": types.none}
        er = EngineRefType([(f, kinds.get(f, types.int64)) for f in FIELDS])
        return (types.float64, types.int64, er, types.int64)

    kvsim_sig = sig(types.none)
    vllm_sig = sig(types.UniTuple(types.int64, 2))
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: True)
    monkeypatch.setattr(disk_cache, "dispatcher_is_cached", lambda d: True)
    monkeypatch.setattr(disk_cache, "cached_signatures", lambda d: [kvsim_sig])
    adv = closed_step.advance
    assert variants.advance_is_cached(adv, "kvsim") is True
    assert variants.advance_is_cached(adv, "vllm") is False
    assert variants.advance_is_cached(adv, True) is True  # either scheduler
    assert variants.core_is_cold("vllm") is True
    assert variants.core_is_cold("kvsim") is False
    assert closed_engine(SimConfig(engine="auto"), "lru", 10, "vllm") == "interpreted"
    assert closed_engine(SimConfig(engine="auto"), "lru", 10, "kvsim") == "compiled"
    monkeypatch.setattr(disk_cache, "cached_signatures", lambda d: [kvsim_sig, vllm_sig])
    assert variants.core_is_cold("vllm") is False
    assert closed_engine(SimConfig(engine="auto"), "lru", 10, "vllm") == "compiled"


PYFIFO = """
NAME = "{name}"
DESCRIPTION = "plain-Python FIFO"
REASONS = ("oldest",)
def init(capacity_blocks, num_slots, params): return ([],)
def on_insert(state, view, b, now_us): state[0].append(b)
def on_hit(state, view, b, now_us): pass
def on_remove(state, view, b): state[0].remove(b)
def victim(state, view, now_us, alt_blocks, alt_scores):
    return (state[0][0], 0, 0) if state[0] else (-1, 0, 0)
"""


def test_split_starts_with_the_first_compiled_policy(monkeypatch, tmp_path):
    """A plain-Python policy runs interpreted, so it cannot compile the core: the split
    replays the first policy with compiled hooks first."""
    path = tmp_path / "pyfifo_split.py"
    path.write_text(PYFIFO.format(name="pyfifo_split_test"))
    monkeypatch.setattr(variants, "core_is_cold", lambda closed=False: True)
    monkeypatch.setattr(precompile, "cold_hooks", lambda names, skip=(): [])
    assert precompile.needs_split("compiled", False, [str(path), "optimal", "fifo"]) == (
        True, "fifo", [])
    assert precompile.needs_split("compiled", False, [str(path), "optimal"]) == (
        False, None, [])


def test_needs_split(monkeypatch):
    monkeypatch.setattr(variants, "core_is_cold", lambda closed=False: True)
    monkeypatch.setattr(precompile, "cold_hooks", lambda names, skip=(): [])
    assert precompile.needs_split("interpreted", False, ["lru", "fifo"]) == (False, None, [])
    assert precompile.needs_split("compiled", False, ["optimal", "lru"]) == (True, "lru", [])
    monkeypatch.setattr(variants, "core_is_cold", lambda closed=False: False)
    assert precompile.needs_split("compiled", True, ["lru"]) == (False, "lru", [])
    monkeypatch.setattr(precompile, "cold_hooks",
                        lambda names, skip=(): [n for n in names if n not in skip])
    # core warm, two policies' hooks cold: the hooks still compile in parallel
    assert precompile.needs_split("compiled", True, ["lru", "fifo", "arc"]) == (
        True, "lru", ["fifo", "arc"])
    assert precompile.needs_split("compiled", True, ["lru", "fifo"]) == (False, "lru",
                                                                          ["fifo"])


def test_run_value_is_typed_from_its_signature_alone():
    """``core.run`` as a value: numba types it from the declared signature (nothing is
    compiled until it is called), so ``advance`` can compile before or beside ``run``."""
    from numba import typeof, types

    arg_types = (types.int64, types.float64)
    v = variants.RunValue(object(), arg_types)
    assert typeof(v) == types.FunctionType(variants.RUN_RESULT(*arg_types))
    assert v._hook is None


@pytest.mark.parametrize("jobs", [1, 2, 5])
def test_compile_workers_at_least_the_cores(monkeypatch, jobs):
    monkeypatch.delenv("KVSIM_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 2)
    assert precompile.compile_workers(jobs) == max(jobs, 2)
    monkeypatch.setenv("KVSIM_COMPILE_WORKERS", "1")
    assert precompile.compile_workers(jobs) == 1


@pytest.mark.parametrize("bad", ["0", "two", "-3"])
def test_compile_workers_env_must_be_a_positive_integer(monkeypatch, bad):
    from kvsim.core.errors import KvsimInputError

    monkeypatch.setenv("KVSIM_COMPILE_WORKERS", bad)
    with pytest.raises(KvsimInputError, match="KVSIM_COMPILE_WORKERS = an integer >= 1"):
        precompile.compile_workers(1)


def test_every_compiled_replay_module_is_sealed():
    """numba keys a cached function on its own file only; kvsim keys numba's cache
    directory on every replay source (kvsim.jit.cache_key), so an edit of any of them
    recompiles.  Every jitted function the compiled replay modules reach (those they import
    included, such as kvsim.replay.kernel.placement split from core) is defined in a module
    that is listed and digested."""
    import importlib

    from numba.core.dispatcher import Dispatcher

    from kvsim.jit import disk_cache as numba_cache

    seen, todo = set(), ["kvsim.replay.kernel.core", "kvsim.replay.kernel.closed_step"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, Dispatcher) and value.py_func.__module__.startswith("kvsim."):
                todo.append(value.py_func.__module__)
    assert "kvsim.replay.kernel.placement" in seen
    assert seen <= set(numba_cache.COMPILED)
    assert set(numba_cache.COMPILED) <= set(numba_cache.SOURCES)


def test_replay_jobs_every_core_on_a_cold_small_run(monkeypatch):
    """A compare that ``auto`` sent to the interpreted engine (small work, cold compiled
    code) replays its policies on every core, as the replays after a cold compile do; any
    other engine choice keeps ``--jobs``."""
    monkeypatch.delenv("KVSIM_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 4)
    assert precompile.replay_jobs("auto", "interpreted", 1) == 4
    assert precompile.replay_jobs("auto", "interpreted", 6) == 6
    assert precompile.replay_jobs("auto", "compiled", 1) == 1  # a cold compile splits itself
    assert precompile.replay_jobs("interpreted", "interpreted", 1) == 1  # asked for: obeyed
    monkeypatch.setenv("KVSIM_COMPILE_WORKERS", "1")
    assert precompile.replay_jobs("auto", "interpreted", 1) == 1
