"""Issue #33, feedback: the cold-compile notice before the wait, progress counted in events
(requests served in the closed loop) with an ETA, also on a stderr that is not a terminal,
and ``--policy-file`` policies joining ``compare``."""

from __future__ import annotations

import io
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.cli.meter import LineProgress, _Task, line
from kvsim.jit import disk_cache

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_compile_notice_from_an_empty_cache(tmp_path):
    """A fresh numba cache directory: the notice is on stderr before the compile (the
    process is stopped once it appears: nothing compiles to completion here).  On today's
    main the first run says nothing while it compiles (issue #33: 80 s at "0/12")."""
    env = {k: v for k, v in os.environ.items() if k != "KVSIM_CACHE_DIR"}  # it would win
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba"), COLUMNS="200")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsim", "simulate", "--profile", "multi_turn_chat",
         "--requests", "16", "--seed", "1", "--hbm-gb", "2", "--engine", "compiled"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    seen = []
    deadline = time.monotonic() + 120  # imports and the profile's generation, on 2 cores
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=1):
                continue
            text = proc.stderr.readline()
            if not text:
                break
            seen.append(text)
            if "compiling the replay core" in text:
                break
    finally:
        proc.kill()
        proc.wait()
    assert any(disk_cache.cold_compile_message() in s for s in seen), seen
    assert disk_cache.cold_compile_message() == (
        f"compiling the replay core (first run, about {disk_cache.COLD_COMPILE_S} s on 2 "
        "cores; cached on disk for later runs)")


def test_compile_notice_is_said_once(monkeypatch):
    said = []
    monkeypatch.setattr(disk_cache, "_ANNOUNCED", False)
    disk_cache.on_cold_compile(said.append)
    try:
        disk_cache.announce_cold_compile()
        disk_cache.announce_cold_compile()
    finally:
        disk_cache.on_cold_compile(None)
    assert said == [disk_cache.cold_compile_message()]


def test_progress_line_has_counts_and_eta():
    t = _Task("replay lru", 4_000_000, "events")
    t.start = 100.0
    t.completed = 500_000
    t.note(106.0)
    t.completed = 1_000_000
    t.note(112.0)  # 500,000 events in 6 s: 3,000,000 left take 36 s
    assert line(t, 112.0) == ("progress: replay lru: 1,000,000/4,000,000 events (25 %), "
                              "12 s elapsed, about 36 s left")
    t.completed, t.first, t.last = 0, None, None
    assert line(t, 112.0) == "progress: replay lru: 0/4,000,000 events (0 %), 12 s elapsed"
    t.total = None
    assert line(t, 7300.0) == "progress: replay lru: 0 events, 2 h 00 min elapsed"


def test_line_progress_writes_at_its_rate():
    buf = io.StringIO()
    with LineProgress(buf, interval=3600) as bar:
        task = bar.add_task("x", total=10, unit="events")
        for _ in range(10):
            bar.update(task, advance=1)
    assert buf.getvalue() == ""  # faster than the interval: no line
    buf = io.StringIO()
    with LineProgress(buf, interval=0) as bar:
        task = bar.add_task("x", total=10, unit="events")
        bar.update(task, completed=2)
        time.sleep(0.01)
        bar.update(task, completed=5)
    assert buf.getvalue().splitlines()[-1].startswith("progress: x: 5/10 events (50 %), ")
    assert "left" in buf.getvalue()


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _lines_at(monkeypatch, steps):
    """Progress lines of a task fed ``steps`` ((time, completed, compile start/end/None)),
    on a fake clock, a line at every report."""
    from kvsim.cli import meter

    clock = _Clock()
    monkeypatch.setattr(meter.time, "monotonic", clock)
    monkeypatch.setattr(meter, "COMPILES", meter._Compiles())
    buf = io.StringIO()
    with LineProgress(buf, interval=0) as bar:
        task = bar.add_task("9 policies", total=2304, unit="requests served")
        for now, done, compile_event in steps:
            clock.now = now
            if compile_event == "start":
                meter.COMPILES.start(now)
            elif compile_event == "end":
                meter.COMPILES.end(now)
            bar.update(task, completed=done)
    return buf.getvalue().splitlines()


def test_eta_ignores_the_cold_compile_before_the_first_report(monkeypatch):
    """A cold README job: 45 s of compile, then the replay reports 64 requests served and 1 s
    later 1,216.  The ETA is the replay's pace (1,152 requests a second: 1 s left); main
    extrapolated the compile (46 s for 1,216: "about 41 s left"; the s17 note saw "about 7
    min 50 s left" for a run that ended 4 s later)."""
    lines = _lines_at(monkeypatch, [(0.0, 0, "start"), (45.0, 0, "end"), (45.0, 64, None),
                                   (46.0, 1216, None)])
    assert lines[-1] == ("progress: 9 policies: 1,216/2,304 requests served (53 %), 46 s "
                         "elapsed, about 1 s left")
    assert not any("left" in s for s in lines[:-1])  # no pace before two reports of work


def test_no_eta_while_compiling_and_compile_time_left_out(monkeypatch):
    """A policy's hooks compile between two reports: the line says so, with no estimate;
    afterwards the 20 s of compile are not counted as replay time."""
    lines = _lines_at(monkeypatch, [(0.0, 100, None), (1.0, 200, None), (1.0, 200, "start"),
                                   (21.0, 200, "end"), (22.0, 300, None), (30.0, 300, None)])
    assert lines[2].endswith("compiling (no estimate while numba compiles)")
    from kvsim.cli import meter

    t = _Task("12 policies", None, "requests served")  # total not known yet
    t.start = 0.0
    meter.COMPILES.start(0.0)
    assert line(t, 2.0) == "progress: 12 policies: 0 requests served, 2 s elapsed, compiling"
    meter.COMPILES.end(1.0)
    assert "left" not in lines[2]
    # 200 requests in 2 s of replay (22 s less 20 s of compile): 2,004 left take 20 s; a
    # report repeating the count 8 s later (a pause, a worker compiling) changes nothing
    assert lines[-2].endswith("about 20 s left")
    assert lines[-1].endswith("about 20 s left")


def test_compiles_are_seen_through_numbas_event_api():
    """The listener on numba's public event API counts a real compile."""
    import numba

    from kvsim.cli import meter

    meter.COMPILES.install()
    before = meter.COMPILES.total_s

    @numba.njit
    def _add_one(x):
        return x + 1

    assert _add_one(1) == 2
    assert meter.COMPILES.installed and meter.COMPILES.depth == 0
    assert meter.COMPILES.total_s > before


def _policy_copy(tmp_path: Path, builtin: str, name: str) -> Path:
    src = (ROOT / "policies" / f"{builtin}.py").read_text()
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace(f'NAME = "{builtin}"', f'NAME = "{name}"'))
    return path


@pytest.mark.parametrize("extra", [[], ["--policies", "lru"]])
def test_compare_progress_on_a_non_terminal_stderr_and_policy_file_joins(
        tmp_path, monkeypatch, extra):
    """CliRunner's stderr is not a terminal: progress lines (rate 0 s here) count requests
    served with an ETA; the --policy-file policy gets its row without being named in
    --policies (on today's main it is left out)."""
    monkeypatch.setenv("KVSIM_PROGRESS_INTERVAL_S", "0")
    name = f"myfifo{len(extra)}"
    pol = _policy_copy(tmp_path, "fifo", name)
    res = runner.invoke(app, ["compare", "--profile", "multi_turn_chat", "--requests", "8",
                              "--seed", "3", "--hbm-gb", "2", "--engine", "interpreted",
                              "--policy-file", str(pol), *extra, "--parquet",
                              str(tmp_path / "rows.parquet")])
    assert res.exit_code == 0, res.output
    names = list(pd.read_parquet(tmp_path / "rows.parquet")["policy"])
    assert name in names
    if extra:
        assert names == ["lru", name, "belady"]
    lines = [s for s in res.stderr.splitlines() if s.startswith("progress: ")]
    assert lines, res.stderr
    assert any("requests served" in s and "left" in s for s in lines), lines


def test_line_progress_writes_while_nothing_reports():
    """A replay that reports only at its end (a cold compile's first policy): the line
    still falls due (on today's main a non-terminal stderr got nothing at all)."""
    buf = io.StringIO()
    with LineProgress(buf, interval=0.2) as bar:
        bar.add_task("12 policies", total=None, unit="requests served")
        time.sleep(0.7)
    lines = buf.getvalue().splitlines()
    assert lines and all(s.startswith("progress: 12 policies: 0 requests served, ")
                         for s in lines)


def test_a_forked_workers_compile_shows_in_the_parent() -> None:
    """compare --jobs / sweep --jobs: a worker's compile is seen by the parent's progress
    line (main: only this process's compiles were seen); the worker's own view is its own."""
    import mmap

    from kvsim.cli import meter

    c = meter._Compiles()
    c.owner, c._page = os.getpid(), mmap.mmap(-1, 8 * meter._SLOTS)  # what install() makes
    started, go = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            c.start(0.0)
            os.write(started[1], b"s" if c.depth == 1 else b"?")
            os.read(go[0], 1)
            c.end(1.0)
            os.write(started[1], b"e")
        finally:
            os._exit(0)
    assert os.read(started[0], 1) == b"s"
    assert (c.depth, c.local_depth, c.workers()) == (1, 0, 1)
    os.write(go[1], b"x")
    assert os.read(started[0], 1) == b"e"
    os.waitpid(pid, 0)
    assert (c.depth, c.workers()) == (0, 0)
    assert meter.line(meter._Task("compare", 10, "events"), 1.0).endswith("elapsed")


def test_a_worker_killed_while_it_compiles_is_not_seen_compiling() -> None:
    """A forked worker killed mid-compile (OOM killer, Ctrl-C) leaves its slot of the shared
    page set; the parent's progress line must not say "compiling" for ever after (seen as 6
    failures of this file in a full cold-cache run, session 20)."""
    import mmap
    import signal

    from kvsim.cli import meter

    c = meter._Compiles()
    c.owner, c._page = os.getpid(), mmap.mmap(-1, 8 * meter._SLOTS)
    started = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: starts a compile and never ends it
        try:
            c.start(0.0)
            os.write(started[1], b"s")
            time.sleep(60)
        finally:
            os._exit(0)
    assert os.read(started[0], 1) == b"s"
    assert c.workers() == 1
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert (c.depth, c.workers()) == (0, 0)
