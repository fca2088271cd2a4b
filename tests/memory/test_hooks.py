"""A policy as one value for the compiled core: the uniform state (kvsim.policy.api
.PolicyState), the hooks as first-class functions of one type for every policy
(kvsim.policy.hooks), and the cache seal (kvsim.jit.disk_cache)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from numba import typeof

from kvsim.jit import disk_cache as numba_cache
from kvsim.policy import hooks
from kvsim.policy.api import (
    STATE_F64,
    STATE_I8,
    STATE_I64,
    STATE_I64_2D,
    PolicyState,
    new_block_view,
    policy_state,
)
from kvsim.policy.registry import get_policy, list_policies


def test_policy_state_pads_to_fixed_widths_and_keeps_the_arrays():
    a = np.zeros(5, np.int64)
    f = np.ones(3)
    st = policy_state(i64=(a,), f64=(f,))
    assert isinstance(st, PolicyState)
    assert (len(st.i64), len(st.f64), len(st.i8), len(st.i64_2d)) == (
        STATE_I64, STATE_F64, STATE_I8, STATE_I64_2D)
    assert st.i64[0] is a and st.f64[0] is f  # kept, not copied
    assert all(x.shape == (0,) for x in st.i64[1:]) and st.i64_2d[0].shape == (0, 0)
    assert typeof(st) == typeof(policy_state()) == hooks.state_type()


@pytest.mark.parametrize("kwargs, slot", [
    ({"i64": (np.zeros(3, np.int32),)}, "i64[0]"),
    ({"f64": (np.zeros(3, np.int64),)}, "f64[0]"),
    ({"i8": (np.zeros(3, np.bool_),)}, "i8[0]"),
    ({"i64": (np.zeros((3, 2), np.int64)[:, 0],)}, "i64[0]"),  # not C-contiguous
    ({"i64_2d": (np.zeros(3, np.int64),)}, "i64_2d[0]"),
])
def test_policy_state_rejects_other_arrays(kwargs, slot):
    with pytest.raises(ValueError, match=slot.replace("[", r"\[").replace("]", r"\]")):
        policy_state(**kwargs)


def test_policy_state_rejects_too_many_arrays():
    with pytest.raises(ValueError, match=f"at most {STATE_F64}"):
        policy_state(f64=[np.zeros(1)] * (STATE_F64 + 1))


@pytest.mark.parametrize("name", [p.name for p in list_policies()])
def test_every_builtin_state_has_the_one_type(name):
    pol = get_policy(name)
    state = pol.init(8, 10, {"seed": 0})
    assert hooks.is_uniform(state), name


def test_hooks_of_two_policies_are_values_of_one_type():
    """The core is compiled for one argument type whatever the policy."""
    view = hooks.view_ref(new_block_view(4))
    values = [hooks.policy_value(get_policy(n), get_policy(n).init(3, 4, {}), True)
              for n in ("lru", "fifo")]
    assert typeof(values[0]) == typeof(values[1])
    assert isinstance(values[0][0], hooks.StateRef)
    # the hooks run (called from Python here) on the StateRef, writing init's arrays
    lru_state = values[0][0]
    ins, victim = values[0][1][hooks.H_INSERT], values[0][1][hooks.H_VICTIM]
    for b in (2, 0, 3):
        ins(lru_state, view, b, 0.0)
    b, reason, n_alt = victim(lru_state, view, 0.0, np.zeros(0, np.int64), np.zeros(0))
    assert (b, reason, n_alt) == (2, 0, 0)


def test_python_hooks_follow_the_hold_defaults():
    lru = get_policy("lru")
    py = hooks.python_hooks(lru)
    assert [f.__name__ for f in py] == ["on_insert", "on_hit", "on_hold", "on_release",
                                        "on_remove", "victim", "on_hit", "noop_hook"]
    vllm_order = sys.modules["kvsim.memory.fifo_order"]
    names = [f.__name__ for f in hooks.python_hooks(vllm_order)]
    assert names[hooks.H_MISS] == "noop_hook" and names[hooks.H_HOLD] == "on_hold"


def test_cache_directory_is_keyed_on_the_compiled_sources(tmp_path, monkeypatch):
    """numba's stamp is per file: kvsim keys numba's whole cache directory on every
    compiled source (the single-tier loops' group included), so an edit of one recompiles
    everything that may have inlined it (kvsim.jit.cache_key)."""
    from kvsim.jit import cache_key

    k = cache_key.key()
    assert len(k) == 16 and cache_key.key() == k
    assert "kvsim.cachesim.fast_loops" in cache_key.SOURCES
    assert set(numba_cache.SINGLE_TIER) <= set(cache_key.SOURCES)
    assert set(numba_cache.COMPILED) <= set(cache_key.SOURCES)
    # an edited source is another key
    fake = tmp_path / "kvsim"
    (fake / "memory").mkdir(parents=True)
    monkeypatch.setattr(cache_key, "_PACKAGE", fake)
    (fake / "memory" / "fast.py").write_text("A = 1\n")
    k1 = cache_key.key()
    (fake / "memory" / "fast.py").write_text("A = 2\n")
    assert cache_key.key() != k1


def test_cache_dir_is_stable_for_workers():
    """A worker inherits its parent's NUMBA_CACHE_DIR, already keyed: the same directory."""
    import os

    from kvsim.jit.cache_key import cache_dir

    here = os.environ["NUMBA_CACHE_DIR"]
    assert cache_dir({"NUMBA_CACHE_DIR": here}) == here
    assert cache_dir({"NUMBA_CACHE_DIR": "/x/y"}).startswith("/x/y/kvsim-")


HOOK_CALLED_FIRST = '''
import numpy as np
from kvsim.policy.hooks import compiled_hooks, state_ref, view_ref
from kvsim.policy.api import new_block_view
from kvsim.policy.registry import get_policy
p = get_policy("lru")
sr = state_ref(p.init(8, 8, {"seed": 0}))
v = view_ref(new_block_view(8))
print(p.victim(sr, v, 0.0, np.zeros(8, np.int64), np.zeros(8, np.float64)))
print(compiled_hooks(p)[5].compile())
'''


def test_a_hook_called_from_python_first_still_compiles_as_a_value(tmp_path):
    """A policy's njit hook called directly from Python before the replay takes it as a
    value (live offload did; tests do): numba types that call's return value itself
    (Tuple(int64, Literal[int](0), int64)), and keeps one overload per argument types, so
    the value's declared signature compiles in a dispatcher of its own
    (kvsim.policy.hooks.CompiledHook.cres) rather than failing with "mismatch of return
    type"."""
    import os
    import subprocess

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "KVSIM_CACHE_DIR": str(tmp_path / "kvsim")}
    out = subprocess.run([sys.executable, "-c", HOOK_CALLED_FIRST], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["(-1, 0, 0)", "CompiledHook(kvsim.policies.lru.victim)"]
