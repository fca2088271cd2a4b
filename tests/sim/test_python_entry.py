"""numba's CPython wrapper only where Python calls (issue 17: the cold compile).

numba builds, beside every compiled function, a CPython wrapper that unboxes each argument
from Python objects; in the README job these were 14.5 of the 62 MB of LLVM IR compiled,
most of them for pool and tier operations only compiled code calls.
:func:`kvsim.jit.disk_cache.seal` (``python_called``) compiles every other function without
it; a call from Python then builds (or loads from numba's disk cache) a jitted trampoline
with the wrapper, :func:`kvsim.jit.disk_cache.python_entry`, and puts it in the dispatcher's
C-level table so later calls run it directly.

The functions here are tiny (a toy module written to a temporary folder, so that numba can
cache it); nothing of the replay core compiles.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba.core.errors import TypingError

from kvsim.jit import disk_cache as numba_cache

TOY = textwrap.dedent('''
    import numpy as np
    from numba import njit

    @njit(cache=True)
    def inner(a, k, scale=2):
        return a[k] * scale

    @njit(cache=True)
    def outer(a):
        return inner(a, 1, 2) + 1

    @njit(cache=True)
    def pub(a):
        return inner(a, 0, 3)
''')


def _toy(tmp_path, name):
    (tmp_path / f"{name}.py").write_text(TOY)
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
    numba_cache.seal(mod, sources=(), python_called=("pub",))
    return mod


def _child(script: str, tmp_path) -> dict:
    """Run ``script`` in a fresh process with its numba cache under ``tmp_path``; its JSON."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _has_cpython_wrapper(dispatcher) -> bool:
    (cres,) = dispatcher.overloads.values()
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_cpython_wrapper_name) != 0


def test_compiled_callers_and_python_calls_work_without_the_wrapper(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    mod = _toy(tmp_path, "toy_entry_a")
    a = np.arange(5.0)
    assert mod.outer(a) == 3.0  # from Python, through its trampoline; inner compiled
    assert not _has_cpython_wrapper(mod.outer)
    assert not _has_cpython_wrapper(mod.inner)  # compiled for compiled callers only
    assert mod.pub(a) == 0.0
    assert _has_cpython_wrapper(mod.pub)  # listed in python_called

    built = []
    real = mod.inner._compile_for_args
    monkeypatch.setattr(mod.inner, "_compile_for_args",
                        lambda *args: built.append(args) or real(*args))
    assert mod.inner(a, 4) == 8.0  # from Python: the trampoline, default argument kept
    assert mod.inner(a, 3, 10) == 30.0
    assert mod.inner(a, k=2) == 4.0  # keywords folded by numba's dispatcher
    # the first call of a signature asks _compile_for_args (numba's dispatcher passes
    # a left-out default as an "omitted" argument, its own type), which puts the
    # trampoline in the C-level table: later calls with the same types do not come back
    assert [len(b) for b in built] == [3, 3]
    assert mod.inner(a, np.int64(1)) == 2.0
    assert len(built) == 2  # a numpy integer is typed as int64 like a Python int
    assert numba_cache.python_entry(mod.inner) is mod.inner._kvsim_entry


def test_a_python_call_with_bad_types_raises_numbas_typing_error(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    mod = _toy(tmp_path, "toy_entry_b")
    with pytest.raises(TypingError):
        mod.inner(np.arange(3.0), "x")
    assert mod.inner(np.arange(3.0), 1) == 2.0


def test_seal_leaves_an_already_compiled_function_alone(tmp_path, monkeypatch):
    """The wrapper setting must hold for every overload of a dispatcher: one compiled
    before sealing keeps numba's behaviour."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "toy_entry_c.py").write_text(TOY)
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("toy_entry_c")
    finally:
        sys.path.remove(str(tmp_path))
    assert mod.inner(np.arange(3.0), 1) == 2.0
    numba_cache.seal(mod, sources=(), python_called=())
    assert "no_cpython_wrapper" not in mod.inner.targetoptions
    assert _has_cpython_wrapper(mod.inner)


CHILD = textwrap.dedent('''
    import importlib, json, sys
    import numpy as np
    from kvsim.jit import disk_cache as numba_cache
    sys.path.insert(0, sys.argv[1])
    mod = importlib.import_module("toy_entry_d")
    numba_cache.seal(mod, sources=(), python_called=())
    value = float(mod.inner(np.arange(5.0), 4))
    stats = mod.inner._kvsim_entry.stats
    print(json.dumps({"value": value, "hits": len(stats.cache_hits),
                      "misses": len(stats.cache_misses),
                      "target_compiled": len(mod.inner.overloads)}))
''')


def test_the_trampoline_is_cached_and_goes_stale_with_its_target(tmp_path):
    """Second process: the trampoline loads from the disk cache and the target does not
    compile; after an edit of the target's source file it compiles again."""
    (tmp_path / "toy_entry_d.py").write_text(TOY)

    def child():
        return _child(CHILD, tmp_path)

    assert child() == {"value": 8.0, "hits": 0, "misses": 1, "target_compiled": 1}
    assert child() == {"value": 8.0, "hits": 1, "misses": 0, "target_compiled": 0}
    (tmp_path / "toy_entry_d.py").write_text(TOY.replace("* scale", "* scale + 0"))
    assert child() == {"value": 8.0, "hits": 0, "misses": 1, "target_compiled": 1}


def test_the_replays_python_callers_are_listed():
    """Every name in PYTHON_CALLED and FIRST_CLASS exists in its module (a rename would
    silently drop the wrapper a Python caller needs, costing a trampoline compile)."""
    for table in (numba_cache.PYTHON_CALLED, numba_cache.FIRST_CLASS):
        for module, names in table.items():
            mod = importlib.import_module(module)
            for name in names:
                assert hasattr(getattr(mod, name), "py_func"), (module, name)


CHILD_LINKED = textwrap.dedent('''
    import importlib, json, sys
    import numpy as np
    from numba.core.caching import NullCache
    from kvsim.jit import disk_cache as numba_cache
    sys.path.insert(0, sys.argv[1])
    mod = importlib.import_module("toy_entry_e")
    numba_cache.seal(mod, sources=(), values_only=(), python_called=("pub",))
    value = float(mod.pub(np.arange(5.0)))
    out = {"value": value, "pub_hits": len(mod.pub.stats.cache_hits),
           "inner_compiled": len(mod.inner.overloads),
           "inner_not_cached": isinstance(mod.inner._cache, NullCache)}
    if mod.inner.overloads:
        (cres,) = mod.inner.overloads.values()
        lib = cres.library
        out["linked_only"] = bool(getattr(lib, "_kvsim_linked_only", False))
        # never added to numba's JIT engine: none of its symbols has an address
        out["machine_code"] = any(lib.get_pointer_to_function(f.name) != 0
                                  for f in lib._final_module.functions
                                  if not f.is_declaration)
    out["python_call"] = float(mod.inner(np.arange(5.0), 4))  # through its trampoline
    print(json.dumps(out))
''')


def test_a_function_only_compiled_code_calls_is_linked_only(tmp_path):
    """Neither wrapper (``values_only=()``, not in ``python_called``): its library is
    linked into its callers, never machine-compiled or cached on its own; the caller's
    cached code runs it in the next process with nothing compiled."""
    (tmp_path / "toy_entry_e.py").write_text(TOY)

    def child():
        return _child(CHILD_LINKED, tmp_path)

    first = child()
    assert first == {"value": 0.0, "pub_hits": 0, "inner_compiled": 1,
                     "inner_not_cached": True, "linked_only": True,
                     "machine_code": False, "python_call": 8.0}
    # pub and inner's trampoline load from the cache: inner does not compile at all
    assert child() == {"value": 0.0, "pub_hits": 1, "inner_compiled": 0,
                       "inner_not_cached": True, "python_call": 8.0}
