"""``engine=auto``: compiled when the trace is big enough to pay for a compile, or when the
compiled core is already in numba's disk cache (kvsim.sim.variants.dispatcher_is_cached).

The cache check is tested on a small generated module (a real numba cache, written by one
process and read by another), so no replay core is compiled here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time

import pytest

from kvsim.policy_registry import get_policy
from kvsim.sim import replay
from kvsim.sim.config import AUTO_COMPILE_MIN_ROWS
from kvsim.sim.variants import compiled_is_cached, dispatcher_is_cached

SRC = textwrap.dedent("""
    from numba import njit

    @njit(cache=True)
    def f(x):
        return x * 3 + {k}

    @njit
    def g(x):
        return x + 1
""")


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


CHECK = ("import importlib.util, sys\n"
         "from kvsim.sim.variants import dispatcher_is_cached\n"
         "spec = importlib.util.spec_from_file_location('warmmod', sys.argv[1])\n"
         "m = importlib.util.module_from_spec(spec); sys.modules['warmmod'] = m\n"
         "spec.loader.exec_module(m)\n"
         "before = dispatcher_is_cached(m.f)\n"
         "print(before, m.f(2), dispatcher_is_cached(m.f))\n")


def test_cache_check_follows_numba_cache_across_processes(tmp_path):
    path = tmp_path / "warmmod.py"
    path.write_text(SRC.format(k=1))
    mod = _load(path, "warmmod")
    assert dispatcher_is_cached(mod.f) is False  # nothing compiled yet
    assert dispatcher_is_cached(mod.g) is False  # cache=False: never cached
    assert mod.f(2) == 7
    assert dispatcher_is_cached(mod.f) is True  # this process wrote the index
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", CHECK, str(path)], capture_output=True,
                         text=True, check=True, env=env).stdout.split()
    assert out == ["True", "7", "True"]  # a new process sees it warm before calling
    # an edit of the module file (new stamp) makes the cache stale: not warm
    time.sleep(0.01)
    path.write_text(SRC.format(k=2))
    os.utime(path, (time.time() + 5, time.time() + 5))
    out = subprocess.run([sys.executable, "-c", CHECK, str(path)], capture_output=True,
                         text=True, check=True, env=env).stdout.split()
    assert out == ["False", "8", "True"]


def test_compiled_is_cached_needs_the_core_and_every_hook(monkeypatch):
    """Warm = the one core's entry point AND each policy's hooks are in numba's cache (the
    check itself is tested on a real cache above)."""
    from kvsim.sim import core, variants

    lru, fifo = get_policy("lru"), get_policy("fifo")
    lower = [lru] * 3

    class PyPolicy:  # a plain-Python policy never runs compiled
        compiled = False

    assert compiled_is_cached(PyPolicy(), lower) is False
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: True)
    assert compiled_is_cached(fifo, lower) is True
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: d is not core.run)
    assert compiled_is_cached(fifo, lower) is False  # the core is cold
    cold_hook = fifo.victim
    monkeypatch.setattr(variants, "dispatcher_is_cached", lambda d: d is not cold_hook)
    assert compiled_is_cached(fifo, lower) is False  # one hook of the HBM policy is cold
    assert compiled_is_cached(lru, lower) is True  # lru's hooks are all warm


def test_auto_picks_compiled_when_cached_or_big(monkeypatch):
    lru = get_policy("lru")
    lower = [lru] * 3
    monkeypatch.setattr(replay, "compiled_is_cached", lambda p, lo: False)
    assert replay.choose_engine("auto", 10, lru, lower) == "interpreted"
    assert replay.choose_engine("auto", AUTO_COMPILE_MIN_ROWS, lru, lower) == "compiled"
    monkeypatch.setattr(replay, "compiled_is_cached", lambda p, lo: True)
    assert replay.choose_engine("auto", 10, lru, lower) == "compiled"
    # an explicit engine is obeyed
    assert replay.choose_engine("interpreted", 10**9, lru, lower) == "interpreted"
    assert replay.choose_engine("compiled", 10, lru, lower) == "compiled"


@pytest.mark.parametrize("engine", ["interpreted", "compiled"])
def test_explicit_engine_never_checks_the_cache(monkeypatch, engine):
    def boom(p, lo):
        raise AssertionError("the cache is only consulted for auto")

    monkeypatch.setattr(replay, "compiled_is_cached", boom)
    lru = get_policy("lru")
    assert replay.choose_engine(engine, 10, lru, [lru] * 3) == engine
