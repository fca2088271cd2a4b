"""Signals and resources (issue 38): Ctrl-C at any moment is one line and exit 130 with no
partial output; SIGTERM likewise (143); a closed stdout pipe exits 0 quietly; a full disk
is one line naming the path, exit 1; a killed pool worker's temporary files are removed
and a killed sweep worker is one line naming the cell, the sweep resumable."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from tests.helpers import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"
# ~19 M event rows (640 a request), 19 compiled chunks of 1 M rows after the first progress
# line: the signal lands mid-run; 300,000 requests held 2.4 GB for no gain
LONG = ["generate", "--profile", "multi_turn_chat", "--requests", "30000"]


def _kvsim(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvsim", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _sigint_default() -> None:
    """In the child before exec: SIGINT's default action.  A background job (``cmd &`` in
    a script, ``nohup``) starts with SIGINT ignored and its children inherit that; Python
    then installs no KeyboardInterrupt handler, so the child ignores Ctrl-C, as Unix wants
    of a background job (this test, run from one, waited in vain: the session-16 timeout).
    The test is about a terminal's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Stderr:
    """The child's stderr, drained by a thread (lines kept); :meth:`working` waits for the
    first progress line that counts work done: the compiled code is running (a cold compile,
    or the workload built in Python before it, can take minutes on a loaded machine; the
    wait is not what is tested)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.seen = threading.Event()
        self.thread = threading.Thread(target=self._drain, args=(proc,), daemon=True)
        self.thread.start()

    def _drain(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.lines.append(line)
            m = re.match(r"progress: .*?: ([0-9,]+)/", line)
            if m and int(m.group(1).replace(",", "")) > 0:
                self.seen.set()
        self.seen.set()  # ended: the caller finds the process gone

    def working(self, proc: subprocess.Popen, timeout_s: float = 900) -> None:
        assert self.seen.wait(timeout_s), "no progress line"
        assert proc.poll() is None, ("the run ended before the signal", self.lines[-3:])


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
def test_signal_mid_run_one_line_no_partial_output(tmp_path: Path, sig, code, word) -> None:
    """The signal lands in the lowering's compiled steps (a progress line at every chunk:
    ``KVSIM_PROGRESS_INTERVAL_S=0``); kvsim ends within the compiled call's bound
    (bench/signals/ctrl_c_latency.py), well inside the 120 s allowed here; past them
    the child's stacks are the failure message."""
    # -X faulthandler: a child still running long after the signal is aborted with every
    # thread's Python stack on stderr, shown in the failure (where the signal waited)
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "kvsim", *LONG,
                             "--out", str(tmp_path / "big.parquet")], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, KVSIM_PROGRESS_INTERVAL_S="0"),
                            preexec_fn=_sigint_default)
    err = _Stderr(proc)
    err.working(proc)
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # mid-write
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(30)
        err.thread.join(10)
        raise AssertionError("still running 120 s after the signal:\n"
                             + "".join(err.lines[-60:])) from None
    finally:
        proc.kill()
    latency_s = time.monotonic() - t0
    err.thread.join(10)
    print(f"signal served after {latency_s:.2f} s")  # shown with -s / in the log
    stdout = proc.stdout.read()
    # progress lines are feedback, not the error: the error is one line
    stderr = "".join(line for line in err.lines if not line.startswith("progress: "))
    assert_one_line_error(subprocess.CompletedProcess([], proc.returncode, stdout, stderr),
                          word, "partial outputs removed", exit_code=code)
    assert list(tmp_path.iterdir()) == []


def _interrupt_at_import(module: str) -> str:
    """Python source that makes importing ``module`` raise KeyboardInterrupt (an import
    hook: a deterministic Ctrl-C at that moment of start-up)."""
    return ("import sys\n"
            "class Stop:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name == {module!r}:\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Stop())\n")


def test_ctrl_c_during_imports_is_one_line() -> None:
    """A KeyboardInterrupt raised while the command line is imported (deterministic: an
    import hook raises it when typer is imported)."""
    code = (_interrupt_at_import("typer") +
            "sys.argv = ['kvsim', '--version']\n"
            "from kvsim.__main__ import main\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert_one_line_error(result, "interrupted", exit_code=130)


@pytest.mark.parametrize("argv0", ["/venv/bin/kvsim", "-m"])
def test_ctrl_c_while_the_package_starts_is_one_line(argv0: str) -> None:
    """A KeyboardInterrupt raised while ``kvsim/__init__`` sets numba's cache up (before
    :mod:`kvsim.__main__` runs), for the console script and ``python -m kvsim``: one line,
    exit 130 (main: a 20-line traceback for Ctrl-C in the first ~0.4 s of every run)."""
    code = (_interrupt_at_import("kvsim.jit.cache_guard") +
            f"sys.argv = [{argv0!r}, '--version']\n"
            f"sys.orig_argv = [sys.executable, *(['-m', 'kvsim'] if {argv0!r} == '-m' else [])]\n"
            "from kvsim.__main__ import main\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert_one_line_error(result, "interrupted", "while starting", exit_code=130)


def test_ctrl_c_while_a_program_imports_kvsim_is_its_own() -> None:
    """A program that imports kvsim (not the command) gets its KeyboardInterrupt."""
    code = (_interrupt_at_import("kvsim.jit.cache_guard") +
            "try:\n"
            "    import kvsim\n"
            "except KeyboardInterrupt:\n"
            "    print('caught')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (0, "caught\n", "")


@pytest.mark.parametrize(("where", "argv"), [
    ("TyperGroup.parse_args", ["--version"]),  # the root's options (typer's silent window)
    ("TyperCommand.parse_args", ["inspect", "x.parquet"]),  # a command's options
    ("Context._close_with_exception_info", ["estimate-kv", "--model", "llama-3.1-8b"]),  # closing after the command
])
def test_ctrl_c_during_option_parsing_is_one_line(where: str, argv: list[str]) -> None:
    """A KeyboardInterrupt raised while typer parses the options or closes the context
    (deterministic: the method raises it) is one line and exit 130, not typer's silent
    exit 130."""
    owner, method = where.split(".")
    module = "typer._click.core" if owner == "Context" else "typer.core"
    code = ("import sys\n"
            f"import {module} as m\n"
            f"real = m.{owner}.{method}\n"
            "def stop(self, *a, **k):\n"
            "    if getattr(self, 'parent', None) is None:\n"  # parsing; the root's close
            "        raise KeyboardInterrupt\n"
            "    return real(self, *a, **k)\n"
            f"m.{owner}.{method} = stop\n"
            f"sys.argv = ['kvsim', *{argv!r}]\n"
            "from kvsim.__main__ import main\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert_one_line_error(result, "interrupted", exit_code=130)


#: Every way a command prints to stdout: JSON, a rich table (rich's own exit on a closed
#: pipe was 1), typer's help and --version (typer's was 1), CSV, plain lines.
PIPED = {
    "inspect_json": ["inspect", "{traces}/sample_chat.parquet", "--json"],
    "inspect_table": ["inspect", "{traces}/sample_chat.parquet"],
    "version": ["--version"],
    "help": ["--help"],
    "command_help": ["simulate", "--help"],
    "estimate_table": ["estimate-kv", "llama-3-8b"],
    "list_models": ["estimate-kv", "--list-models"],
    "import_summary": ["import-request-trace", "--requests", "{traces}/sample_mooncake.jsonl",
                       "--out", "{tmp}/o.parquet"],
    "generate_summary": ["generate", "--profile", "balanced", "--requests", "5", "--out",
                         "{tmp}/g.parquet"],
    "reorder_table": ["reorder", "--request-trace", "{traces}/sample_mooncake.jsonl",
                      "--model", "llama-3.1-8b", "--orders", "submission"],
    "log_show_table": ["log", "show", "{tmp}/log.parquet"],
    "log_show_csv": ["log", "show", "{tmp}/log.parquet", "--csv"],
    "log_diff_table": ["log", "diff", "{tmp}/log.parquet", "{tmp}/log.parquet"],
}


@pytest.mark.parametrize("name", sorted(PIPED))
def test_closed_pipe_exits_zero_quietly(name: str, tmp_path: Path) -> None:
    """`kvsim ... | head -0`: the reader is gone before kvsim writes; every command exits 0
    with nothing on stderr (main: exit 1, silently, for every rich table, --help and
    --version; only --json and CSV exited 0)."""
    if name.startswith("log_"):
        CliRunner().invoke(app, ["simulate", "--trace", str(TRACES / "sample_chat.parquet"),
                                 "--hbm-gb", "0.05", "--decision-log",
                                 str(tmp_path / "log.parquet"), "--json"])
    args = [a.format(traces=TRACES, tmp=tmp_path) for a in PIPED[name]]
    r, w = os.pipe()
    os.close(r)
    result = subprocess.run([sys.executable, "-m", "kvsim", *args], stdout=w,
                            stderr=subprocess.PIPE, text=True, timeout=600)
    os.close(w)
    lines = [x for x in result.stderr.splitlines() if not x.startswith(("note:", "progress:"))]
    assert (result.returncode, lines) == (0, [])


def test_disk_full_is_one_line_naming_the_path(tmp_path: Path, monkeypatch) -> None:
    import pyarrow.parquet as pq

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    out = tmp_path / "o.parquet"
    result = CliRunner().invoke(app, ["import-request-trace", "--requests",
                                      str(TRACES / "sample_mooncake.jsonl"), "--out", str(out)])
    assert_one_line_error(result, str(out), "disk full", "partial output", exit_code=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("code", "text", "cause"), [
    (errno.ENOSPC, "No space left on device", "disk full (No space left on device)"),
    (errno.EFBIG, "File too large", "file size limit reached (File too large"),
    (errno.EDQUOT, "Disk quota exceeded", "disk quota exceeded (Disk quota exceeded)"),
    (None, "Error writing bytes to file. Detail: [errno 27] File too large",
     "file size limit reached (File too large")])
def test_disk_full_names_the_real_cause(tmp_path: Path, monkeypatch, code, text,
                                        cause) -> None:
    """ENOSPC, EDQUOT and EFBIG (``ulimit -f``) are each named as what they are, the errno
    or (pyarrow) only the text (main: every one was "No space left on device")."""
    import pyarrow.parquet as pq

    def full(self, *args, **kwargs):
        raise OSError(text) if code is None else OSError(code, text)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    out = tmp_path / "o.parquet"
    result = CliRunner().invoke(app, ["import-request-trace", "--requests",
                                      str(TRACES / "sample_mooncake.jsonl"), "--out", str(out)])
    assert_one_line_error(result, str(out), cause, "partial output", exit_code=1)
    if code != errno.ENOSPC:
        assert "No space left" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_file_size_limit_is_named_under_ulimit_f(tmp_path: Path) -> None:
    """A real ``ulimit -f``: the kernel refuses the write with EFBIG (Python ignores
    SIGXFSZ); the line says "File too large", not "No space left on device" (main)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    out = tmp_path / "o.parquet"
    result = subprocess.run([sys.executable, "-m", "kvsim", "import-request-trace",
                             "--requests", str(TRACES / "sample_mooncake.jsonl"), "--out",
                             str(out)], capture_output=True, text=True, timeout=120,
                            preexec_fn=limit)
    assert_one_line_error(result, str(out), "File too large", "ulimit -f", exit_code=1)
    assert "No space left" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def _write_forever(path: str) -> None:
    from kvsim.core.fsutil import atomic_output

    with atomic_output(path) as tmp:
        tmp.write_text("partial")
        time.sleep(60)


def test_killed_workers_leave_no_temporaries(tmp_path: Path) -> None:
    from kvsim.core.fsutil import check_output_dir
    from kvsim.core.workers import process_pool

    check_output_dir(tmp_path, "--decision-log-dir")  # the parent's output folder
    with pytest.raises(KeyboardInterrupt):
        with process_pool(2) as ex:
            ex.submit(_write_forever, str(tmp_path / "lru.parquet"))
            ex.submit(_write_forever, str(tmp_path / "fifo.parquet"))
            t0 = time.monotonic()
            while len(list(tmp_path.iterdir())) < 2 and time.monotonic() - t0 < 30:
                time.sleep(0.05)
            assert len(list(tmp_path.iterdir())) == 2
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def _die(index: int):
    os.kill(os.getpid(), signal.SIGKILL)


def test_killed_sweep_worker_names_the_cell_and_resumes(tmp_path: Path, monkeypatch) -> None:
    import kvsim.analysis.sweep as sweep

    args = ["sweep", "--trace", str(TRACES / "sample_chat.parquet"), "--policies", "lru,fifo",
            "--hbm-gb", "0.05", "--out", str(tmp_path / "sw"), "--jobs", "2", "--json"]
    monkeypatch.setattr(sweep, "_pool_cell", _die)
    result = CliRunner().invoke(app, args)
    assert_one_line_error(result, "sweep worker died", "cell policy", "HBM 0.05 GB",
                          "run the same command again", exit_code=1)
    monkeypatch.undo()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.stderr, result.exception)
