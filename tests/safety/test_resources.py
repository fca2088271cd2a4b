"""Resources an operator runs out of, and what a run keeps after it ends (issue 38, session
21's audit): a spill file that meets a full disk names its folder; the closed loop's shared
request constants do not outlive the run; the lower tiers' prefault thread cannot print a
traceback.  The CLI cases are corpus rows (tests/bad_inputs/cli_cases.toml)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.core.errors import KvsimResourceError
from tests.helpers import file_size_limit

TRACES = Path(__file__).resolve().parents[2] / "traces"




@pytest.mark.parametrize("table", ["SpilledRows", "Float64Values", "PackedBits", "IntsFile"])
def test_a_full_disk_under_a_spill_names_the_folder(tmp_path: Path, monkeypatch,
                                                    table: str) -> None:
    """A table kept out of memory in an anonymous temporary file: a refused write is one
    line naming the folder (``KVSIM_TMPDIR``) and the cause (main: an OSError with no
    path, printed as "disk full ..." with no file named)."""
    from kvsim.core.spill import IntsFile, PackedBits, SpilledRows
    from kvsim.results.step_records import Float64Values

    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path))
    make = {"SpilledRows": lambda: SpilledRows(4, mem_rows=0).append(np.ones((8192, 4))),
            "Float64Values": lambda: Float64Values(mem_values=0).append(np.ones(32768)),
            "PackedBits": lambda: PackedBits(mem_bytes=0).append(np.ones(1 << 20)),
            "IntsFile": lambda: IntsFile(np.ones(32768, np.int64))}[table]
    with file_size_limit(64 * 1024), pytest.raises(KvsimResourceError) as info:
        make()
    message = str(info.value)
    assert message.startswith(f"{tmp_path}: cannot write a temporary file"), message
    assert "File too large" in message and "KVSIM_TMPDIR" in message
    assert info.value.exit_code == 1


def test_a_missing_spill_folder_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """Bad input naming ``KVSIM_TMPDIR`` (exit 2), also from the API (main: a resource
    error, exit 1; the CLI checks it before any work: corpus rows ``*_tmpdir_*``)."""
    from kvsim.core.errors import KvsimInputError
    from kvsim.core.spill import SpilledRows

    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path / "gone"))
    with pytest.raises(KvsimInputError, match="field 'KVSIM_TMPDIR'.*gone.*no such folder"):
        SpilledRows(4, mem_rows=0).append(np.ones((10, 4)))


def test_spilled_tables_read_back_unchanged(tmp_path: Path, monkeypatch) -> None:
    """The unbuffered spill file reads back what was written (rows, values, bits)."""
    from kvsim.core.spill import PackedBits, SpilledRows
    from kvsim.results.step_records import Float64Values

    monkeypatch.setenv("KVSIM_TMPDIR", str(tmp_path))
    rng = np.random.default_rng(0)
    a = rng.random((5000, 3))
    rows = SpilledRows(3, mem_rows=100)
    for k in range(0, 5000, 700):
        rows.append(a[k:k + 700])
    assert np.array_equal(rows.to_array(), a)
    v = Float64Values(mem_values=10)
    v.append(a[:, 0])
    assert np.array_equal(np.concatenate(list(v.chunks(values=333))), a[:, 0])
    flags = rng.random(100_003) < 0.5
    bits = PackedBits(mem_bytes=16)
    bits.append(flags[:50_001])
    bits.append(flags[50_001:])
    bits.finish()
    assert np.array_equal(bits.get(7, 99_000), flags[7:99_007].astype(np.int8))


def test_the_closed_loops_shared_constants_do_not_outlive_the_run() -> None:
    """vLLM's per-request constants the replicas of a cluster share
    (``kvsim.engine.vllm_value._SHARED``) are freed with the run (main: the last run's
    hashes ``h0`` and its ``Q``/``QA`` columns stayed referenced by the module for good)."""
    import gc

    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.engine import vllm_value

    result = CliRunner().invoke(app, ["simulate", "--profile", "deadline_pressure",
                                      "--requests", "16", "--seed", "0", "--hbm-gb", "8",
                                      "--scheduler", "vllm", "--replicas", "2", "--json"])
    assert result.exit_code == 0, result.output
    gc.collect()
    assert vllm_value._SHARED == []


def test_an_error_in_the_prefault_thread_is_no_traceback(monkeypatch) -> None:
    """The lower tiers' prefault thread (kvsim.replay.lower_tiers.TierPrefault) only speeds
    the replay up: an exception in it ends it quietly (main: Python printed the thread's
    traceback on stderr in the middle of the run's output)."""
    import threading

    from kvsim.core import layout as L
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay import lower_tiers as lt

    def broken(addr, nbytes, advice):
        raise OSError("madvise went wrong")

    monkeypatch.setattr(lt, "_madvise", lambda: broken)
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args))
    slots = 1000
    T = lt._lower_tier(1, slots, resolve_policy("lru"), {}, slots, lt._lower_table(slots))
    T.Lm[L.LM_FREE_TOP] = slots - 10
    pf = lt.TierPrefault([T], [T.L_view])
    assert pf._thread is not None
    pf._thread.join(timeout=10)
    assert not pf._thread.is_alive()
    pf.stop()
    assert seen == []


def test_a_sweep_warns_about_a_degenerate_cell(tmp_path: Path) -> None:
    """A sweep whose warm-up leaves 1 request measured warns as compare does, on stderr
    and in ``--json`` (main: sweeps printed no warning at all)."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["sweep", "--trace", str(TRACES / "sample_chat.parquet"),
                                      "--policies", "lru", "--hbm-gb", "1",
                                      "--warmup-fraction", "0.99", "--out",
                                      str(tmp_path / "sw"), "--json"])
    assert result.exit_code == 0, result.output
    warned = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warned) == 1 and "only 1 of 32 requests measured" in warned[0], result.stderr
    codes = [w["code"] for w in json.loads(result.stdout)["warnings"]]
    assert codes == ["few_measured"]


@pytest.mark.parametrize("source", [
    ["--trace", "traces/sample_chat.parquet"],
    ["--request-trace", "traces/sample_mooncake.jsonl", "--model", "llama-3.1-8b"]])
def test_compare_forks_no_more_workers_than_policies(monkeypatch, source: list[str]) -> None:
    """``compare --jobs 100000`` with two policies forked 100,000 processes on main (the
    pool was sized by --jobs, not by the replays left); the spy refuses any pool larger
    than the replays, so this fails on main without forking."""

    import kvsim.core.workers as workers
    from kvsim.cli import app

    real, asked = workers.process_pool, []

    @contextlib.contextmanager
    def spy(jobs: int):
        asked.append(jobs)
        assert jobs <= 8, f"a pool of {jobs} workers for 3 policies and the bounds"
        with real(jobs) as ex:
            yield ex

    monkeypatch.setattr(workers, "process_pool", spy)
    args = [str(TRACES / a[7:]) if a.startswith("traces/") else a for a in source]
    result = CliRunner().invoke(app, ["compare", *args, "--policies", "lru,fifo,sieve",
                                      "--jobs", "100000", "--json"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert asked, "no process pool: the test no longer tests --jobs"


def test_a_full_disk_under_numbas_cache_is_one_warning(monkeypatch, capsys) -> None:
    """numba adds a compiled overload, then saves it to its disk cache; a cache folder on
    a full disk failed the run there (main: exit 1, "disk full (No space left on
    device)", no path named, after the compile had succeeded).  Now: one warning line
    naming the folder, the code kept in memory; an error before the overload exists
    still propagates."""
    import errno
    from types import SimpleNamespace

    from numba import types

    from kvsim.jit import disk_cache

    class Fake:
        def __init__(self, adds: bool) -> None:
            # no cache file: no entry lock (what a cache=False function gets)
            self.overloads, self._cache, self.adds = {}, SimpleNamespace(_cache_file=None), adds

        def compile(self, sig):
            if self.adds:
                self.overloads[tuple(sig)] = "entry"
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache._compile_unsaved, "warned", False, raising=False)
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/full/cache")
    for _ in range(2):
        disk_cache.compile_once(Fake(adds=True), (types.int64,))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: numba cache: cannot save"), err
    assert "/full/cache" in err[0] and "No space left on device" in err[0]
    with pytest.raises(OSError, match="No space"):
        disk_cache.compile_once(Fake(adds=False), (types.int64,))


def test_a_cache_folder_without_room_falls_back_with_one_warning(tmp_path: Path) -> None:
    """A numba cache folder on a full disk (KVSIM_CACHE_DIR on a full tmpfs): main failed
    the first compiled run with exit 1, "disk full", naming no path (numba saves a callee
    while compiling its caller); now the private temporary cache is used, one warning."""
    import os
    import subprocess
    import sys

    code = ("import os, kvsim.jit.cache_key as k\n"
            f"k._free_bytes = lambda f: 0 if f.startswith({str(tmp_path)!r}) else 1 << 40\n"
            "os.environ.pop('KVSIM_CACHE_FALLBACK', None)\n"
            "k.configure()\n"
            "print(os.environ['NUMBA_CACHE_DIR'])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KVSIM_CACHE_FALLBACK",
                                                             "NUMBA_CACHE_DIR")}
    env["KVSIM_CACHE_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not r.stdout.startswith(str(tmp_path)), r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "has 0.0 MiB free, under the 128 MiB" in lines[0], lines
