"""``kvsim warm`` (kvsim.modes.warm.warm): fills numba's disk cache with what a default
compiled run loads (docs/jit.md, "Compiling ahead: kvsim warm")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.core.errors import KvsimInputError

ROOT = Path(__file__).resolve().parents[2]


def test_warm_refuses_an_unknown_scheduler_before_compiling() -> None:
    from kvsim.modes.warm import warm

    with pytest.raises(KvsimInputError) as e:
        warm(("vllm", "sglang"))
    assert e.value.field == "--scheduler"
    assert "sglang" in str(e.value)


def test_warm_command_bad_scheduler_is_one_line_exit_2() -> None:
    p = subprocess.run([sys.executable, "-m", "kvsim", "warm", "--scheduler", "sglang"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--scheduler" in lines[0] and "sglang" in lines[0], p.stderr


CMDS = (["simulate", "--profile", "deadline_pressure", "--requests", "16", "--seed", "1",
         "--hbm-gb", "0.5", "--policy", "fifo", "--engine", "compiled", "--json"],
        ["simulate", "--profile", "deadline_pressure", "--requests", "16", "--seed", "1",
         "--hbm-gb", "0.5", "--policy", "lru", "--engine", "compiled", "--json",
         "--replicas", "2", "--router", "prefix"],
        ["simulate", "--profile", "deadline_pressure", "--requests", "16", "--seed", "1",
         "--hbm-gb", "0.5", "--policy", "lru", "--engine", "compiled", "--json",
         "--replicas", "8", "--router", "prefix"])


@pytest.fixture(scope="module")
def warmed():
    from kvsim.modes.warm import warm

    return warm(("vllm",))


def _compiled(cmd) -> str:
    """What a fresh process running ``kvsim CMD`` compiled (bench/warm_check.py's line:
    numba's count of signatures compiled rather than loaded, per dispatcher)."""
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "warm_check.py"), "--", *cmd],
                       capture_output=True, text=True, timeout=600)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("warm_check:"))
    return line.split("compiled here ", 1)[1]


def test_warm_leaves_every_default_run_cached(warmed) -> None:
    """After warm(): the compiled core, vLLM's ``advance`` and every policy's hooks load
    from the cache (the probes a run asks before it decides to compile), and a fresh
    process running a default 1-, 2- or 8-replica simulate compiles nothing (before warm()
    compiled vLLM's block order, kvsim.memory.fifo_order, as values in a fresh process,
    the first run compiled ``fifo_order.on_remove``'s value entry: warm had cached it only
    as ``on_hold``'s callee, under its argument types)."""
    from kvsim.modes.comparison import default_policies
    from kvsim.policy.hooks import hooks_are_cached
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.variants import core_is_cold

    assert set(warmed.cold) == {"vllm"}
    assert not core_is_cold("vllm")
    for name in default_policies():
        pol = resolve_policy(name)
        if pol.compiled:
            assert hooks_are_cached(pol), name
    for cmd in CMDS:
        got = _compiled(cmd)
        assert got == "0: -", got


def test_warm_leaves_the_lowerings_scheduler_cached(warmed, tmp_path) -> None:
    """After warm(): kvsim's scheduler, which a lowering runs (a small one as Python while
    it is cold, kvsim.engine.lowering._small_and_cold), loads from the cache, and a fresh
    process running the README's generate or import compiles nothing."""
    from kvsim.engine import scheduler as S
    from kvsim.jit.disk_cache import cold

    assert not cold(S.run_steps)
    for cmd in (["generate", "--profile", "multi_turn_chat", "--requests", "16", "--seed", "7",
                 "--out", str(tmp_path / "g.parquet")],
                ["import-request-trace", "--requests",
                 str(ROOT / "traces" / "sample_mooncake.jsonl"), "--model", "llama-3.1-8b",
                 "--out", str(tmp_path / "m.parquet")]):
        got = _compiled(cmd)
        assert got == "0: -", (cmd[0], got)


def test_warm_command_unknown_policy_is_one_line_exit_2() -> None:
    p = subprocess.run([sys.executable, "-m", "kvsim", "warm", "--policies", "lru,nope"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0], p.stderr
