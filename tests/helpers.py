"""Helpers shared by tests: ``from tests.helpers import assert_one_line_error``
(pytest's importlib mode makes ``tests`` importable from every test module).

``assert_one_line_error`` checks the error convention of docs/cli.md on the result of a
typer ``CliRunner.invoke`` or of ``subprocess.run(..., capture_output=True, text=True)``:
exit code 2 (bad input), exactly one line on stderr, starting with ``error:``, containing
every given fragment, and no traceback anywhere.
``small_closed_engine`` builds a small closed-loop Engine, compiled or interpreted.
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
from typing import Any

from kvsim.core.errors import EXIT_BAD_INPUT


def _parts(result: Any) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a CliRunner result or a CompletedProcess."""
    if isinstance(result, subprocess.CompletedProcess):
        return result.returncode, result.stdout or "", result.stderr or ""
    stderr = result.stderr if hasattr(result, "stderr") else ""
    return result.exit_code, result.stdout, stderr


def not_notes(stderr: str) -> list[str]:
    """stderr's lines but the ``note: ...`` lines (what a run serves how, one line each:
    information printed before any work, never part of an error or a warning) and the
    ``progress: ...`` lines (a non-terminal stderr's feedback, one per 10 s,
    kvsim/cli/meter.py: a loaded machine prints one before a late error)."""
    return [line for line in stderr.splitlines()
            if not line.startswith(("note: ", "progress: "))]


def assert_one_line_error(result: Any, *fragments: str, exit_code: int = EXIT_BAD_INPUT) -> str:
    """Assert ``result`` failed with one ``error: ...`` line holding every fragment.

    Returns the error line so a caller can check more.
    """
    code, stdout, stderr = _parts(result)
    lines = not_notes(stderr)
    context = f"\nexit={code}\nstdout={stdout!r}\nstderr={stderr!r}"
    exc = getattr(result, "exception", None)
    assert code == exit_code, f"expected exit code {exit_code}, got {code} " \
        f"(exception {exc!r}){context}"
    assert "Traceback" not in stderr and "Traceback" not in stdout, f"traceback{context}"
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}{context}"
    line = lines[0]
    assert line.startswith("error: "), f"stderr line must start with 'error: '{context}"
    for fragment in fragments:
        assert fragment in line, f"fragment {fragment!r} missing from {line!r}"
    return line


def run_kvsim(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m kvsim ARGS`` in a real subprocess (text mode, output captured)."""
    return subprocess.run([sys.executable, "-m", "kvsim", *args], capture_output=True,
                          text=True, timeout=timeout_s)


def small_closed_engine(engine: str, scheduler: str = "vllm"):
    """A closed-loop Engine (``scheduler``: vLLM's or kvsim's; lru, 64 HBM blocks) over four
    small requests sharing prefixes; ``engine``: ``compiled`` or ``interpreted``."""
    from kvsim.ingest.requests import build_request_table
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    ids = [[1, 2, 3, 4], [1, 2, 5, 6], [7, 8], [1, 2, 3, 9]]
    table = build_request_table({"arrival_us": [0, 1_000, 2_000, 3_000],
                                 "prompt_tokens": [64, 64, 32, 64],
                                 "output_tokens": [30, 12, 25, 8], "block_ids": ids,
                                 "hashed_tokens": [64, 64, 32, 64]}, block_size_tokens=16)
    config = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0,
                       engine=engine)
    opts = EngineOptions(scheduler=scheduler)
    cost, hbm_blocks, costs, block_bytes, off, ids, table2, _ = prepare(table, config, opts)
    e = Engine(table2, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks,
               costs, block_bytes)
    e.set_block_facts(block_facts(table2, off, ids, opts.block_size_tokens))
    return e


def shared_prefix_table(seed: int, n: int, gap_us: int, block_size_tokens: int = 16):
    """A small closed-loop Request table: ``n`` requests ``gap_us`` apart, request ``r``'s
    prompt four blocks shared with every third request (``100 * (r % 3)`` on) and one of
    its own, its last block partly filled; outputs of 1-39 tokens (``seed``)."""
    import numpy as np

    from kvsim.ingest.requests import build_request_table

    rng = np.random.default_rng(seed)
    B = block_size_tokens
    ids = [list(range(100 * (r % 3), 100 * (r % 3) + 4)) + [1000 + r] for r in range(n)]
    prompt = [len(x) * B - int(rng.integers(0, B)) for x in ids]
    return build_request_table({"arrival_us": [gap_us * i for i in range(n)],
                                "prompt_tokens": prompt,
                                "output_tokens": [int(x) for x in rng.integers(1, 40, n)],
                                "block_ids": ids, "hashed_tokens": prompt},
                               block_size_tokens=B)


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """``ulimit -f`` for this process while the body runs (a full disk without filling one:
    Python ignores SIGXFSZ, so the kernel refuses the write with EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
