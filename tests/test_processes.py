"""Processes and files: pool workers die with their parent, SIGTERM / Ctrl-C remove the
run's temporary file, stale temporaries of SIGKILLed runs are cleaned by the next run,
and `sweep` refuses a foreign non-empty --out (docs/cli.md, "Processes and files")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import atomic_output, remove_stale_temporaries
from tests.helpers import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "sample_chat.jsonl"


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead


def _wait_for(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_sigkill_of_a_jobs2_sweep_leaves_no_worker(tmp_path: Path) -> None:
    """SIGKILL the parent of `sweep --jobs 2` while both workers run cells: within 5 s no
    process of that run is alive (PR_SET_PDEATHSIG), and no cell was half-written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsim", "sweep", "--trace", str(SAMPLE), "--policies",
         "lru,fifo", "--hbm-gb", "0.02,0.03,0.05,0.07,0.1,0.2", "--out", str(tmp_path / "sw"),
         "--jobs", "2", "--engine", "interpreted", "--no-bound"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert _wait_for(lambda: len(_children(proc.pid)) >= 2, 60), "workers never started"
        workers = _children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _wait_for(lambda: not any(_alive(w) for w in workers), 5.0), \
            f"workers {[w for w in workers if _alive(w)]} outlived their parent by 5 s"
    finally:
        with_pgid = proc.pid
        try:
            os.killpg(with_pgid, signal.SIGKILL)  # clean up whatever the test failed on
        except ProcessLookupError:
            pass


def test_stale_temporary_of_a_dead_run_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "out.parquet"
    # pid 2**22 + 1 is above Linux's pid_max ceiling (4194304): never a live process
    stale = tmp_path / f".out.parquet.{2**22 + 1}.abcd.tmp"
    stale.write_bytes(b"half")
    live = tmp_path / f".out.parquet.{os.getpid()}.efgh.tmp"  # ours: alive, kept
    live.write_bytes(b"busy")
    other = tmp_path / f".other.parquet.{2**22 + 1}.ijkl.tmp"  # another target: kept
    other.write_bytes(b"x")
    with atomic_output(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert not stale.exists() and live.exists() and other.exists()
    assert remove_stale_temporaries(target) == []


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_interrupt_removes_the_temporary(tmp_path: Path, exc) -> None:
    target = tmp_path / "out.parquet"
    with pytest.raises(exc):
        with atomic_output(target) as tmp:
            tmp.write_bytes(b"partial")
            raise exc()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_sigterm_removes_the_temporary_and_exits_143(tmp_path: Path) -> None:
    """A real `kvsim import-request-trace` stopped by SIGTERM while its output is being
    written (the .tmp exists): exit 143, one line, no .tmp and no output left."""
    code = (
        "import sys, time\n"
        "from kvsim.cli import app\n"
        "import kvsim.engine.lowering as ing\n"
        "real = ing.lower_requests\n"
        "def slow(table, out_path, **kw):\n"
        "    from kvsim.core.fsutil import atomic_output\n"
        "    with atomic_output(out_path) as tmp:\n"
        "        tmp.write_bytes(b'partial')\n"
        "        print('writing', flush=True)\n"
        "        time.sleep(60)\n"
        "ing.lower_requests = slow\n"
        "sys.argv = ['kvsim'] + sys.argv[1:]\n"
        "app()\n")
    src = tmp_path / "mc.jsonl"
    src.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, '
                   '"hash_ids": [1]}\n')
    out = tmp_path / "out" / "events.parquet"
    proc = subprocess.Popen([sys.executable, "-c", code, "import-request-trace", "--requests",
                             str(src), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert [p.name for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert_one_line_error(result, "terminated", exit_code=143)
    assert list(out.parent.iterdir()) == []


def test_sweep_refuses_a_foreign_folder(tmp_path: Path) -> None:
    from functools import partial

    from kvsim.analysis.sweep import SWEEP_MARKER
    from kvsim.core.fsutil import claim_output_dir

    claim_sweep_dir = partial(claim_output_dir, marker=SWEEP_MARKER,
                              what="kvsim sweep folder", legacy="cells")

    (tmp_path / "summary.json").write_text("{\"mine\": 1}")
    with pytest.raises(KvsimInputError, match="--force") as info:
        claim_sweep_dir(tmp_path)
    assert "summary.json" in str(info.value)
    claim_sweep_dir(tmp_path, force=True)
    assert (tmp_path / SWEEP_MARKER).exists()
    claim_sweep_dir(tmp_path)  # now a sweep folder: accepted
    empty = tmp_path / "new"
    claim_sweep_dir(empty)
    assert (empty / SWEEP_MARKER).exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_names_the_target(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(KvsimInputError) as info:
            with atomic_output(folder / "out.parquet") as tmp:
                tmp.write_bytes(b"x")
        msg = str(info.value)
        assert "ro/out.parquet" in msg and "not writable" in msg and ".tmp" not in msg
    finally:
        folder.chmod(0o700)


def test_directory_and_file_parent_targets_name_the_target(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    for target, fragment in [(tmp_path / "adir", "got a directory"),
                             (tmp_path / "afile" / "o.parquet", "is a regular file")]:
        with pytest.raises(KvsimInputError) as info:
            with atomic_output(target):
                pass
        msg = str(info.value)
        assert str(target) in msg and fragment in msg and ".tmp" not in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


_MAIN = ("import atexit, sys\n"
         "from pathlib import Path\n"
         "flag = Path(sys.argv.pop(1))\n"
         "atexit.register(lambda: flag.write_text('ran'))\n"
         "from kvsim.cli import main\n"
         "main()\n")


@pytest.mark.parametrize("args, code", [(["--version"], 0), (["simulate", "--bogus"], 2),
                                        (["inspect", "/nonexistent/trace.parquet"], 2)])
def test_main_ends_fast_but_keeps_code_output_and_exit_handlers(tmp_path: Path, args,
                                                                code) -> None:
    """``kvsim.cli.main`` skips the interpreter's teardown (os._exit) after the command:
    the exit code, everything written to stdout / stderr (pipes, block-buffered) and the
    atexit handlers registered before it are kept."""
    flag = tmp_path / "atexit_ran"
    res = subprocess.run([sys.executable, "-c", _MAIN, str(flag), *args], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == code, res.stderr
    assert flag.read_text() == "ran"
    if code == 0:
        from kvsim import __version__
        assert res.stdout == f"kvsim {__version__}\n"
    else:
        assert res.stderr.strip(), "the error is on stderr"
        assert "Traceback" not in res.stderr


def test_main_passes_a_big_output_through_a_pipe(tmp_path: Path) -> None:
    """A JSON report far larger than a pipe's buffer arrives whole before the fast exit."""
    res = subprocess.run([sys.executable, "-m", "kvsim", "inspect", str(SAMPLE), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    import json
    assert json.loads(res.stdout)  # complete: it parses
