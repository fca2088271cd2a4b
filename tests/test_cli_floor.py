"""A `--json` run of `kvsim simulate` imports neither rich nor multiprocessing (issue 34, the
per-process floor: ~0.04 and ~0.025 CPU-s of imports a process did not use), and what it
prints on stderr without rich is byte for byte what rich printed.  On main `kvsim.cli`
imported both at start-up (`kvsim.cli.common`'s consoles, progress columns and
`BrokenProcessPool`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

NOT_ON_THE_JSON_PATH = ("rich", "rich.console", "rich.progress", "multiprocessing",
                        "concurrent.futures.process")


def test_the_simulate_command_path_imports_no_rich_or_process_pool() -> None:
    """The modules a `simulate --json` run imports (the command's, its sizing, warnings,
    the closed loop's options, the renderer), its quiet progress bar, a warning and a note
    line: none of them imports rich or a process pool."""
    code = (
        "import sys, json\n"
        "import kvsim.cli, kvsim.cli.simulate, kvsim.cli.sizing, kvsim.cli.render\n"
        "from kvsim.cli import common\n"
        "with common.progress(quiet=True) as bar:\n"
        "    bar.update(bar.add_task('replay lru', total=None), completed=1, total=2)\n"
        f"print(json.dumps([m for m in {NOT_ON_THE_JSON_PATH!r} if m in sys.modules]))\n"
        "sys.stdout.flush()\n"
        "from kvsim.cli.sizing import stderr_line\n"
        "stderr_line('warning: overloaded: the run took 92 s (lru); add replicas')\n"
        f"print(json.dumps([m for m in {NOT_ON_THE_JSON_PATH!r} if m in sys.modules]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, stdin=subprocess.DEVNULL, timeout=120)
    lines = p.stdout.strip().splitlines()
    assert lines and json.loads(lines[0]) == []  # main: ["rich", "rich.console", ...]
    assert p.returncode == 0, p.stderr
    assert json.loads(lines[1]) == []
    assert p.stderr == "warning: overloaded: the run took 92 s (lru); add replicas\n"


@pytest.mark.parametrize("text", [
    "warning: overloaded: the run took 7,780 s to serve a trace spanning 3,537 s (lru); "
    "TTFT measures the queue, not the cache (add replicas: --replicas auto)",
    "note: 100 requests from /tmp/x.jsonl, closed schedule, scheduler vllm, timing "
    "measured:aiconfigurator-0.12.0/vllm-0.24.0, scheduler budget 900 blocks = the HBM pool",
    "warning: [bold]not markup[/bold] " + "x" * 300,
    "warning: an emoji code :smile: and a tab\there",  # rich changes these: printed by rich
    "note: non-ASCII path /tmp/é.jsonl",
])
def test_a_line_written_without_rich_is_what_rich_printed(monkeypatch, text) -> None:
    from rich.console import Console

    from kvsim.cli import common
    from kvsim.cli.sizing import stderr_line

    ref = io.StringIO()
    Console(file=ref, stderr=True).print(text, markup=False, soft_wrap=True)
    got = io.StringIO()
    monkeypatch.setattr(sys, "stderr", got)
    monkeypatch.delitem(vars(common), "err_console", raising=False)
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)
    stderr_line(text)
    if "err_console" in vars(common):  # rich would change the line: rich printed it
        assert any(c in text for c in ":\t") or not text.isascii()
    else:
        assert got.getvalue() == ref.getvalue() == text + "\n"


def test_consoles_are_made_once_at_first_use() -> None:
    from kvsim.cli import common

    first = common.err_console
    assert common.err_console is first and common.out_console is common.out_console
    assert first.stderr and common.out_console.soft_wrap
    with pytest.raises(AttributeError):
        common.no_such_console  # noqa: B018 - the attribute access is the test


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, madvise")
def test_libc_is_found_without_a_child_process() -> None:
    """``kvsim.core.heap`` (imported by every trace reader) and the tiers' prefault thread
    take glibc's functions from the process's own symbols: ``ctypes.util.find_library``
    ran ``ldconfig -p`` in a child process, ~15 ms a process (here: no process may start)."""
    code = ("import subprocess\n"
            "def refuse(*a, **k):\n"
            "    raise RuntimeError('a child process was started')\n"
            "subprocess.Popen.__init__ = refuse\n"
            "from kvsim.core import heap\n"
            "from kvsim.replay import lower_tiers\n"
            "print(heap._LIBC is not None, lower_tiers._madvise() is not None)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    import platform

    if platform.libc_ver()[0] == "glibc":
        assert p.stdout.split() == ["True", "True"]
