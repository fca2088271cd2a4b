"""Progress for a stderr that is not a terminal (a log file, a CI job, ``2> run.log``):
one plain line at a low rate instead of rich's live bar, which would print nothing there.

:class:`LineProgress` takes the calls :class:`rich.progress.Progress` takes from kvsim's
commands (``add_task``, ``update``, ``advance``; a context manager) and writes, at most
every :data:`INTERVAL_S` seconds (``$KVSIM_PROGRESS_INTERVAL_S`` overrides it), a line::

    progress: replay lru: 1,234,567/4,000,000 events (31 %), 12 s elapsed, about 27 s left

The ETA comes from the replay's own pace: the work done from the first report of work to the
latest report that moved the count, over the time between the two less the time numba spent
compiling in this process meanwhile (a straight line from that rate).  A cold run compiles
for tens of seconds before its first report; an estimate from the elapsed time would
extrapolate the compile over the whole run (it said "about 7 min 50 s left" for a run that
ended 4 s later).  While numba compiles, the line says so and gives no estimate; before two
reports of work there is none either.  Nothing is written when no line fell due (a run
shorter than the interval prints no progress at all). """

from __future__ import annotations

import os
import sys
import time

#: Seconds between two progress lines on a non-terminal stderr: a log stays readable
#: (one line per 10 s is 360 lines for an hour's run) and a stalled run is visible.
INTERVAL_S = 10.0


def interval_s() -> float:
    raw = os.environ.get("KVSIM_PROGRESS_INTERVAL_S", "").strip()
    try:
        return max(float(raw), 0.0) if raw else INTERVAL_S
    except ValueError:
        return INTERVAL_S


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


#: Slots of the page a command's forked workers (``compare --jobs``, ``sweep --jobs``, the
#: cold compile's split) mark their compiles in: a worker writes its pid into slot ``pid %
#: _SLOTS`` while it compiles, 0 after (two workers sharing a slot can hide one's compile
#: for a while: a display hint, never a figure).
_SLOTS = 512


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie not yet reaped has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:  # no /proc (not Linux): it exists
        return True


class _Compiles:
    """numba's compiles, seen through its public event API (``numba.core.event``, the
    ``numba:compiler_lock`` event: held for every compile): whether one is under way in
    this process or in a worker it forked (the listener, installed before the fork, runs
    in the workers too and marks their compiles in a shared page), and the seconds this
    process spent compiling so far."""

    def __init__(self) -> None:
        self.local_depth = 0
        self.since = 0.0
        self.total_s = 0.0
        self.installed = False
        self.owner = os.getpid()
        self._page = None  # the shared page, made on install (anonymous, MAP_SHARED)

    @property
    def depth(self) -> int:
        """Compiles under way: this process's, and one per forked worker compiling."""
        return self.local_depth + self.workers()

    def workers(self) -> int:
        """Forked workers compiling now (0 in a worker, and before :meth:`install`)."""
        if self._page is None or os.getpid() != self.owner:
            return 0
        import struct

        n = 0
        for k, (pid,) in enumerate(struct.iter_unpack("q", self._page)):
            if pid and _running(pid):
                n += 1
            elif pid:  # a worker killed while it compiled (OOM, Ctrl-C): its slot freed
                struct.pack_into("q", self._page, 8 * k, 0)
        return n

    def _mark(self, compiling: bool) -> None:
        """In a forked worker: its slot of the shared page."""
        if self._page is None or os.getpid() == self.owner:
            return
        import struct

        pid = os.getpid()
        struct.pack_into("q", self._page, 8 * (pid % _SLOTS), pid if compiling else 0)

    def install(self) -> None:
        """Listen once numba is imported (kvsim imports it only for compiled work; a compile
        under way when the listener is installed is not seen)."""
        if self.installed or "numba.core.event" not in sys.modules:
            return
        import mmap

        from numba.core import event

        self.owner = os.getpid()
        self._page = mmap.mmap(-1, 8 * _SLOTS)  # shared with the workers forked later

        compiles = self

        class _Listener(event.Listener):
            def on_start(self, ev) -> None:
                compiles.start(time.monotonic())

            def on_end(self, ev) -> None:
                compiles.end(time.monotonic())

        event.register("numba:compiler_lock", _Listener())
        self.installed = True

    def start(self, now: float) -> None:
        if self.local_depth == 0:
            self.since = now
            self._mark(True)
        self.local_depth += 1

    def end(self, now: float) -> None:
        if self.local_depth == 0:  # a compile that began before the listener was installed
            return
        self.local_depth -= 1
        if self.local_depth == 0:
            self.total_s += now - self.since
            self._mark(False)

    def spent_s(self, now: float) -> float:
        """Seconds this process compiled so far, the compile under way included."""
        return self.total_s + (now - self.since if self.local_depth else 0.0)


#: this process's compiles (one listener, whatever the number of progress lines)
COMPILES = _Compiles()


class _Task:
    def __init__(self, description: str, total: float | None, unit: str):
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0.0
        self.start = time.monotonic()
        self.first = None  # (time, completed, compile s) of the first report of work
        self.last = None  # (time, completed, compile s) of the latest report of work

    def note(self, now: float) -> None:
        """A report of work: the ETA's pace is measured from the first report to the latest
        that moved the count (a report that repeats the count is no pace: a pause)."""
        mark = (now, self.completed, COMPILES.spent_s(now))
        if self.first is None:
            self.first = mark
        elif self.completed > (self.last or self.first)[1]:
            self.last = mark

    def left_s(self) -> float | None:
        """Seconds left at the replay's pace (module docstring), None when unknown."""
        if self.first is None or self.last is None or not self.total:
            return None
        work = self.last[1] - self.first[1]
        spent = (self.last[0] - self.first[0]) - (self.last[2] - self.first[2])
        if work <= 0 or spent <= 0:
            return None
        return spent * max(self.total - self.completed, 0.0) / work


class LineProgress:
    """A rich-Progress stand-in writing a line every :func:`interval_s` seconds."""

    def __init__(self, stream=None, interval: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval_s() if interval is None else interval
        self.tasks: list[_Task] = []
        self._last = time.monotonic()
        self._stop = None

    def __enter__(self) -> LineProgress:
        import threading

        self._last = time.monotonic()
        self._stop = threading.Event()
        if self.interval > 0:
            # a line falls due also while nothing reports (a replay that reports only at
            # its end, a compile): a daemon thread writes it
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        return None

    def _tick(self) -> None:
        while not self._stop.wait(self.interval / 4):
            COMPILES.install()  # numba may have been imported since the last report
            self._maybe_write(time.monotonic())

    def _maybe_write(self, now: float) -> None:
        if self.tasks and now - self._last >= self.interval and not (
                self._stop is not None and self._stop.is_set()):
            self._last = now
            self.stream.write(line(self.tasks[-1], now) + "\n")
            self.stream.flush()

    def add_task(self, description: str, total: float | None = None, unit: str = "",
                 **_fields) -> int:
        self.tasks.append(_Task(description, total, unit))
        return len(self.tasks) - 1

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def update(self, task: int, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, description: str | None = None,
               **_fields) -> None:
        t = self.tasks[task]
        if total is not None:
            t.total = total
        if completed is not None:
            t.completed = completed
        if advance is not None:
            t.completed += advance
        if description is not None:
            t.description = description
        now = time.monotonic()
        COMPILES.install()
        if completed is not None or advance is not None:
            t.note(now)
        self._maybe_write(now)


class SilentProgress:
    """A rich-Progress stand-in that shows nothing (``--json`` into a pipe or a file)."""

    disable = True  # as rich's Progress(disable=True), which it replaces

    def __enter__(self) -> SilentProgress:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_fields) -> int:
        return 0

    def advance(self, task: int, advance: float = 1) -> None:
        pass

    def update(self, task: int, **_fields) -> None:
        pass


def rich_progress(console, transient: bool):
    """rich's bar on ``console`` (a terminal): description, bar, done/total, elapsed, and
    rich's estimate of the time left (its pace over the last 30 s of reports), but none
    while numba compiles (a cold compile is no pace of the replay)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    class _TimeRemaining(TimeRemainingColumn):
        def render(self, task):
            COMPILES.install()
            if COMPILES.depth:
                from rich.text import Text

                return Text("compiling", style="progress.remaining")
            return super().render(task)

    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), _TimeRemaining(),
                    console=console, transient=transient)


def line(t: _Task, now: float) -> str:
    """One progress line of task ``t`` at ``now`` (module docstring)."""
    elapsed = now - t.start
    unit = f" {t.unit}" if t.unit else ""
    if t.total:
        frac = min(t.completed / t.total, 1.0)
        text = (f"progress: {t.description}: {t.completed:,.0f}/{t.total:,.0f}{unit} "
                f"({100 * frac:.0f} %), {_duration(elapsed)} elapsed")
        if COMPILES.depth:
            return text + ", compiling (no estimate while numba compiles)"
        left = t.left_s() if t.completed < t.total else None
        if left is not None:
            text += f", about {_duration(left)} left"
        return text
    text = f"progress: {t.description}: {t.completed:,.0f}{unit}, {_duration(elapsed)} elapsed"
    return text + (", compiling" if COMPILES.depth else "")


__all__ = ["COMPILES", "INTERVAL_S", "LineProgress", "SilentProgress", "interval_s", "line",
           "rich_progress"]
