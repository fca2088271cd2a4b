"""``engine=auto``: compiled when the trace is big enough to pay for a compile, or when the
compiled core is already in numba's disk cache (kvsim.replay.variants.dispatcher_is_cached).

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

from kvsim.policy.registry import get_policy
from kvsim.replay import driver as replay
from kvsim.replay.variants import compiled_is_cached, dispatcher_is_cached
from kvsim.spec.sim_config import AUTO_COMPILE_MIN_ROWS, AUTO_HOOKS_MIN_ROWS

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
         "from kvsim.replay.variants import dispatcher_is_cached\n"
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
    from kvsim.replay import variants
    from kvsim.replay.kernel import core

    lru, fifo = get_policy("lru"), get_policy("fifo")
    lower = [lru] * 3

    class PyPolicy:  # a plain-Python policy never runs compiled
        compiled = False

    from kvsim.jit import disk_cache

    def cached(test):  # the core's check (variants) and the hooks' check (jit) alike
        monkeypatch.setattr(variants, "dispatcher_is_cached", test)
        monkeypatch.setattr(disk_cache, "dispatcher_is_cached", test)

    assert compiled_is_cached(PyPolicy(), lower) is False
    cached(lambda d: True)
    assert compiled_is_cached(fifo, lower) is True
    cached(lambda d: d is not core.run)
    assert compiled_is_cached(fifo, lower) is False  # the core is cold
    cold_hook = fifo.victim
    cached(lambda d: d is not cold_hook)
    assert compiled_is_cached(fifo, lower) is False  # one hook of the HBM policy is cold
    assert compiled_is_cached(lru, lower) is True  # lru's hooks are all warm
    # the core alone (a long enough trace then compiles only the cold hooks)
    assert variants.core_is_warm(fifo, lower) is True
    assert variants.core_is_warm(PyPolicy(), lower) is False
    cached(lambda d: d is not core.run)
    assert variants.core_is_warm(fifo, lower) is False


def test_auto_picks_compiled_when_cached_or_big(monkeypatch):
    lru = get_policy("lru")
    lower = [lru] * 3
    monkeypatch.setattr(replay, "compiled_is_cached", lambda p, lo: False)
    assert replay.choose_engine("auto", 10, lru, lower) == "interpreted"
    assert replay.choose_engine("auto", AUTO_COMPILE_MIN_ROWS, lru, lower) == "compiled"
    # the core cached, the hooks not: compiled from AUTO_HOOKS_MIN_ROWS events (the hooks'
    # compile, 1-4 CPU-s, against the interpreter's 3-6 CPU-s per 100 k events every run)
    monkeypatch.setattr(replay, "core_is_warm", lambda p, lo: True)
    assert replay.choose_engine("auto", AUTO_HOOKS_MIN_ROWS - 1, lru, lower) == "interpreted"
    assert replay.choose_engine("auto", AUTO_HOOKS_MIN_ROWS, lru, lower) == "compiled"
    monkeypatch.setattr(replay, "core_is_warm", lambda p, lo: False)
    assert replay.choose_engine("auto", AUTO_HOOKS_MIN_ROWS, lru, lower) == "interpreted"
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


def test_compiled_hooks_over_an_old_tuple_state_run_interpreted_with_a_warning(tiny_hw,
                                                                              tmp_path):
    """A policy with njit hooks whose init returns a plain tuple of arrays (the state form
    before PolicyState) cannot be passed to the one compiled core: the replay warns once
    and runs it on the interpreted engine, with the results of an equivalent policy."""
    import types

    from numba import njit

    from kvsim.api import simulate
    from kvsim.policy.api import dll_ends, dll_links, dll_push_tail, dll_remove, list_walk
    from kvsim.policy.registry import policy_from_module
    from kvsim.spec.sim_config import SimConfig

    spec = importlib.util.spec_from_file_location(
        "kvsim_tests_sim_conftest_ec", os.path.join(os.path.dirname(__file__), "conftest.py"))
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)

    mod = types.ModuleType("old_tuple_lru")
    mod.NAME, mod.DESCRIPTION, mod.REASONS = "old_tuple_lru", "tuple-state LRU", ("lru",)

    def init(capacity_blocks, num_slots, params):
        prev, nxt = dll_links(num_slots)
        return (prev, nxt, dll_ends())

    def on_insert(state, view, b, now_us):
        dll_push_tail(state[0], state[1], state[2], b)

    def on_remove(state, view, b):
        dll_remove(state[0], state[1], state[2], b)

    def on_hit(state, view, b, now_us):
        if state[0][b] != -2:
            dll_remove(state[0], state[1], state[2], b)
            dll_push_tail(state[0], state[1], state[2], b)

    def victim(state, view, now_us, alt_blocks, alt_scores):
        b = state[2][0]
        if b < 0:
            return -1, 0, 0
        return b, 0, list_walk(state[0], state[1], state[2], alt_blocks, alt_scores,
                               view.last_access_us)

    mod.init = init
    mod.on_insert, mod.on_hit = njit(on_insert), njit(on_hit)
    mod.on_remove, mod.victim = njit(on_remove), njit(victim)
    old = policy_from_module(mod, "test")
    assert old.compiled
    trace = helpers.random_trace(helpers.TraceBuilder, 5).write(tmp_path / "r.parquet")
    with pytest.warns(UserWarning, match="does not return a kvsim.policy.api.PolicyState"):
        got = simulate(trace, old, SimConfig(hardware=tiny_hw, hbm_blocks=10,
                                             engine="compiled"))
    want = simulate(trace, "lru", SimConfig(hardware=tiny_hw, hbm_blocks=10,
                                            engine="interpreted"))
    drop = ("policy",)
    assert {k: v for k, v in got.summary.items() if k not in drop} == \
        {k: v for k, v in want.summary.items() if k not in drop}


CACHED_CHECK = ("import importlib.util, sys\n"
                "import kvsim\n"
                "from kvsim.replay.variants import dispatcher_is_cached\n"
                "spec = importlib.util.spec_from_file_location('sealmod', sys.argv[1])\n"
                "m = importlib.util.module_from_spec(spec); sys.modules['sealmod'] = m\n"
                "spec.loader.exec_module(m)\n"
                "before = dispatcher_is_cached(m.f)\n"
                "print(before, m.f(2), dispatcher_is_cached(m.f))\n")


def test_cache_never_mixes_numba_optimisation_settings(tmp_path):
    """numba's own cache key leaves out NUMBA_OPT and the vectorizer switches, so code
    compiled at one level would load under another; kvsim keys numba's cache directory on
    them (kvsim.jit.cache_key): code compiled under another setting is never seen, and
    each setting keeps its own entries."""
    path = tmp_path / "sealmod.py"
    path.write_text(SRC.format(k=1))
    base = {k: v for k, v in os.environ.items()
            if k not in ("NUMBA_OPT", "NUMBA_LOOP_VECTORIZE", "NUMBA_SLP_VECTORIZE",
                         "KVSIM_CACHE_DIR")}  # KVSIM_CACHE_DIR would win over NUMBA_CACHE_DIR
    base["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")

    def run(**env):
        return subprocess.run([sys.executable, "-c", CACHED_CHECK, str(path)],
                              capture_output=True, text=True, check=True,
                              env={**base, **env}).stdout.split()

    assert run() == ["False", "7", "True"]  # cold at kvsim's default (opt 1), then written
    assert run() == ["True", "7", "True"]  # warm at the same setting
    assert run(NUMBA_OPT="1") == ["True", "7", "True"]  # the same setting, said explicitly
    assert run(NUMBA_OPT="3") == ["False", "7", "True"]  # not opt 1's code
    assert run(NUMBA_LOOP_VECTORIZE="0") == ["False", "7", "True"]
    assert run(NUMBA_LOOP_VECTORIZE="0") == ["True", "7", "True"]
    assert run(NUMBA_OPT="3") == ["True", "7", "True"]  # opt 3's directory was kept
    assert run() == ["True", "7", "True"]
    keyed = sorted(p.name for p in (tmp_path / "numba").iterdir())
    assert len(keyed) == 3 and all(k.startswith("kvsim-") for k in keyed)


OPT_CHECK = ("import sys, os\n"
             "if sys.argv[1] == 'numba-first': import numba\n"
             "import kvsim\n"
             "from numba.core import config\n"
             "from kvsim.jit.cache_key import cache_dir\n"
             "print(int(config.OPT), config.CACHE_DIR == cache_dir())\n")


@pytest.mark.parametrize("order", ["kvsim-first", "numba-first"])
def test_kvsim_defaults_numba_opt_to_1_unless_the_user_set_it(order):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_OPT"}

    def run(**extra):
        return subprocess.run([sys.executable, "-c", OPT_CHECK, order], capture_output=True,
                              text=True, check=True, env={**env, **extra}).stdout.split()

    assert run() == ["1", "True"]
    assert run(NUMBA_OPT="3") == ["3", "True"]


def test_cache_key_follows_the_codegen_settings(monkeypatch):
    from kvsim.jit.cache_key import key

    monkeypatch.setenv("NUMBA_OPT", "1")
    k1 = key()
    monkeypatch.setenv("NUMBA_OPT", "3")
    assert key() != k1
    monkeypatch.setenv("NUMBA_OPT", "1")
    assert key() == k1
    monkeypatch.setenv("NUMBA_SLP_VECTORIZE", "1")
    assert key() != k1


def test_one_rule_every_engine_choice_delegates_to(monkeypatch):
    """resolve_engine is the rule (size of all runs, else the caller's warm test, asked only
    when the size does not decide); choose_engine, auto_engine and compare_engine call it."""
    from kvsim.replay import precompile, variants
    from kvsim.spec import sim_config

    asked = []

    def warm(answer):
        return lambda: asked.append(1) or answer

    rule = sim_config.resolve_engine
    assert rule("auto", AUTO_COMPILE_MIN_ROWS, is_warm=warm(False)) == "compiled" and not asked
    assert rule("auto", AUTO_COMPILE_MIN_ROWS // 4, 4, warm(False)) == "compiled" and not asked
    assert rule("auto", 10, 1, warm(False)) == "interpreted" and asked == [1]
    assert rule("auto", 10, 1, warm(True)) == "compiled"
    assert rule("auto", 10) == "interpreted"  # no warm test: the size decides
    assert rule("interpreted", 10**9, is_warm=warm(True)) == "interpreted"
    assert rule("compiled", 1) == "compiled"
    # the hooks alone cold: a trace long enough compiles them (the core being cached)
    n = AUTO_HOOKS_MIN_ROWS
    assert rule("auto", n, 1, warm(False), lambda: True) == "compiled"
    assert rule("auto", n - 1, 1, warm(False), lambda: True) == "interpreted"
    assert rule("auto", n, 1, warm(False), lambda: False) == "interpreted"  # the core cold
    asked.clear()
    assert rule("auto", 10, 1, warm(False), warm(True)) == "interpreted" and asked == [1]

    calls = []

    def spy(engine, num_rows, runs=1, is_warm=None, core_warm=None):
        calls.append((engine, num_rows, runs))
        return "sentinel"

    lru = get_policy("lru")
    monkeypatch.setattr(replay, "resolve_engine", spy)
    monkeypatch.setattr(sim_config, "resolve_engine", spy)
    assert replay.choose_engine("auto", 5, lru, [lru] * 3) == "sentinel"
    assert variants.auto_engine("auto", 6, lru, [lru] * 3, runs=2) == "sentinel"
    assert precompile.compare_engine("auto", 7, 3) == "sentinel"
    assert calls == [("auto", 5, 1), ("auto", 6, 2), ("auto", 7, 3)]
