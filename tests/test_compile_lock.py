"""Two processes that need the same compiled function at the same moment compile it once
(:func:`kvsim.jit.disk_cache.compile_once`: the second waits on the entry's lock, then loads
what the first saved); a lock left by a killed process blocks nobody; a holder that never
lets go delays the others by the wait limit only.  Forked processes and a two-line
function: no kvsim code is compiled here."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time

import pytest
from numba import types

from kvsim.jit import disk_cache

fcntl = pytest.importorskip("fcntl")

SRC = """
from numba import njit


@njit(cache=True)
def f(x):
    return x * 3 + 1
"""
SIG = (types.int64,)


def _module(tmp_path, name: str):
    """A fresh module with one ``cache=True`` function (its disk-cache entries are new)."""
    path = tmp_path / f"{name}.py"
    path.write_text(SRC)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # numba's cache entry names its module: a load imports it
    spec.loader.exec_module(mod)
    return mod


def _child(mod, go_r: int, ready_w: int, out_w: int) -> None:
    """In a forked process: count numba's compiles of ``mod.f`` around ``compile_once``
    (started once the parent holds the entry's lock)."""
    code = 1
    try:
        os.read(go_r, 1)
        from numba.core import event

        compiles = []

        class Count(event.Listener):
            def on_start(self, ev):
                if ev.data["dispatcher"] is mod.f:
                    compiles.append(1)

            def on_end(self, ev):
                pass

        event.register("numba:compile", Count())
        os.write(ready_w, b"r")
        disk_cache.compile_once(mod.f, SIG)
        os.write(out_w, f"{len(compiles)} {mod.f(2)}\n".encode())
        code = 0
    except BaseException:  # noqa: BLE001 - say why in the parent's captured stderr
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def test_two_processes_compiling_the_same_function_compile_it_once(tmp_path):
    mod = _module(tmp_path, "kvsim_lock_probe_a")
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    out_r, out_w = os.pipe()
    pids = []
    for _ in range(2):  # forked before the lock is taken (a child would inherit its file)
        pid = os.fork()
        if pid == 0:
            _child(mod, go_r, ready_w, out_w)
        pids.append(pid)
    # this process holds the entry's lock while both children start: both miss the disk
    # cache and ask for the lock at the same time, then race for it when it is released
    with disk_cache.entry_lock(mod.f, SIG):
        os.write(go_w, b"gg")
        assert os.read(ready_r, 1) + os.read(ready_r, 1) == b"rr"
        time.sleep(0.3)  # both are waiting on the lock now (without it: both compiling)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    os.close(out_w)
    with os.fdopen(out_r) as out:
        lines = out.read().split("\n")
    assert codes == [0, 0]
    rows = sorted(line.split() for line in lines if line)
    assert rows == [["0", "7"], ["1", "7"]]  # one compiled, the other loaded its entry


def test_a_lock_left_by_a_killed_process_blocks_nobody(tmp_path):
    mod = _module(tmp_path, "kvsim_lock_probe_b")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with disk_cache.entry_lock(mod.f, SIG):
                os.write(w, b"x")
                time.sleep(60)
        finally:
            os._exit(0)
    assert os.read(r, 1) == b"x"  # the child holds the lock
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    t0 = time.monotonic()
    with disk_cache.entry_lock(mod.f, SIG, wait_s=30):
        waited = time.monotonic() - t0
    assert waited < 5  # released by the kernel at the holder's death, not by the wait limit


def test_a_holder_that_never_lets_go_delays_by_the_wait_limit_only(tmp_path):
    mod = _module(tmp_path, "kvsim_lock_probe_c")
    with disk_cache.entry_lock(mod.f, SIG):  # noqa: SIM117 - the same lock, held twice
        # each entry_lock opens the lock file anew: another holder as far as flock goes
        t0 = time.monotonic()
        with disk_cache.entry_lock(mod.f, SIG, wait_s=0.3):
            waited = time.monotonic() - t0
    assert 0.3 <= waited < 5


def test_kvsim_entry_points_called_from_python_compile_through_compile_once(monkeypatch):
    """``closed_step.advance`` (the closed loop's entry), ``vllm_step.step``
    (CompiledVllmScheduler) and ``vllm_rows``' set-up loops (``shared_hashes``) are
    compiled or loaded through :func:`compile_for` / :func:`compile_once` before their
    first call (main: numba compiled them on that call, unlocked, so two test workers
    compiled them twice), for the very types the call then uses: no second entry."""
    from kvsim.engine import vllm_rows
    from kvsim.engine import vllm_step as V
    from kvsim.engine.vllm_compiled import CompiledVllmScheduler
    from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest
    from kvsim.replay.kernel import closed_step
    from tests.helpers import small_closed_engine

    watched = {"advance": closed_step.advance, "step": V.step,
               "_content_keys": vllm_rows._content_keys,
               "_split_unequal": vllm_rows._split_unequal,
               "_own_hashes": vllm_rows._own_hashes}
    before = {n: set(d.overloads) for n, d in watched.items()}
    seen: dict[str, set] = {}
    real = disk_cache.compile_for

    def spy(dispatcher, args):
        types = real(dispatcher, args)
        seen.setdefault(dispatcher.py_func.__name__, set()).add(types)
        return types

    monkeypatch.setattr(disk_cache, "compile_for", spy)
    e = small_closed_engine("compiled")
    e.advance(-1.0)
    e.finish()
    cfg = EngineConfig(block_size=16, num_gpu_blocks=32, max_num_seqs=4,
                       max_num_batched_tokens=256)
    comp = CompiledVllmScheduler(cfg, [SimRequest(idx=i, request_id=f"r{i}",
                                                  all_tokens=[1] * 43, prompt_len=40,
                                                  output_len=3) for i in range(2)])
    for i in range(2):
        comp.add_request(i)
    while comp.has_requests():
        comp.step()
    assert set(watched) <= set(seen), sorted(seen)
    for name, d in watched.items():  # every entry added here is one compile_for made
        assert set(d.overloads) - before[name] <= seen[name], name
