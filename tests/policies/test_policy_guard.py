"""The guard around user policies (kvsim.policy.guard): read-only views of the core's own
buffers, checked returns, one-line errors naming the file and the hook; and a
well-behaved policy gives exactly the results it gives unguarded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvsim.cachesim.simulator import simulate_cache
from kvsim.core.errors import KvsimInputError
from kvsim.policy.api import new_block_view
from kvsim.policy.guard import _Guard
from kvsim.policy.registry import get_policy, load_policy_file

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "traces" / "sample_chat.jsonl"
CORPUS = ROOT / "tests" / "bad_inputs" / "cli"


def _user_copy(tmp_path: Path, builtin: str, name: str) -> Path:
    """A --policy-file that is the built-in policy's source under another NAME."""
    src = (ROOT / "policies" / f"{builtin}.py").read_text()
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace(f'NAME = "{builtin}"', f'NAME = "{name}"'))
    return path


def test_read_only_view_shares_the_core_buffers() -> None:
    pol = get_policy("lru")
    guard = _Guard(pol)
    view = new_block_view(8)
    ro = guard.read_only(view)
    assert guard.read_only(view) is ro  # one read-only view per view object, no copy
    for name in view._fields:
        a, b = getattr(view, name), getattr(ro, name)
        assert np.shares_memory(a, b) and not b.flags.writeable and a.flags.writeable
    view.last_access_us[3] = 42.0  # the core writes: the policy sees it
    assert ro.last_access_us[3] == 42.0
    with pytest.raises(ValueError, match="read-only"):
        ro.size_bytes[0] = 1


@pytest.mark.parametrize("builtin", [
    "lru", pytest.param("arc", marks=pytest.mark.slow),
    pytest.param("s3fifo", marks=pytest.mark.slow)])
def test_guarded_copy_of_a_builtin_gives_its_exact_victims(tmp_path: Path, builtin) -> None:
    """A user file holding a built-in policy's source (njit hooks, run as Python behind
    the guard) evicts exactly what the compiled built-in evicts."""
    pol = load_policy_file(_user_copy(tmp_path, builtin, f"guarded_{builtin}_copy"))
    assert not pol.compiled and pol.source.endswith(f"guarded_{builtin}_copy.py")
    keys = (np.random.default_rng(7).zipf(1.2, 800) % 150).astype(np.int64)
    ours = simulate_cache(keys, 20, pol, record_victims=True)
    ref = simulate_cache(keys, 20, builtin, record_victims=True)
    assert ours.misses == ref.misses
    np.testing.assert_array_equal(ours.victims, ref.victims)


@pytest.mark.slow
def test_guarded_hold_hooks_in_the_tiered_replay(tmp_path: Path) -> None:
    """lru's source as a user file (on_hold / on_release included) through the tiered
    replay: the same metrics as the built-in, both interpreted."""
    from kvsim.api import simulate
    from kvsim.spec.sim_config import SimConfig

    pol = load_policy_file(_user_copy(tmp_path, "lru", "guarded_lru_replay"))
    cfg = SimConfig(hbm_gb=0.05, engine="interpreted")
    ours = simulate(SAMPLE, pol, cfg).summary
    ref = simulate(SAMPLE, "lru", cfg).summary
    ours.pop("policy"), ref.pop("policy")
    assert ours == ref


def test_view_write_in_the_replay_names_file_and_hook() -> None:
    from kvsim.api import simulate
    from kvsim.spec.sim_config import SimConfig

    pol = load_policy_file(CORPUS / "pol_writes_view.py")
    with pytest.raises(KvsimInputError) as info:
        simulate(SAMPLE, pol, SimConfig(hbm_gb=0.05))
    msg = str(info.value)
    assert "pol_writes_view.py" in msg and "field 'on_insert'" in msg and "read-only" in msg


POLICY = '''
NAME = "{name}"
DESCRIPTION = "guard test"
REASONS = ("a", "b")


def init(c, n, p):
    return ([],)


def on_insert(s, v, b, t):
    s[0].append(b)


def on_hit(s, v, b, t):
    pass


def on_remove(s, v, b):
    s[0].remove(b)


def victim(s, v, t, ab, asc):
    if not s[0]:
        return -1, 0, 0
    return {ret}
'''


@pytest.mark.parametrize("ret, fragment", [
    ("s[0][0], 1, 0", None),  # fine: reason 1 exists
    ("s[0][0], 2, 0", "reason_code 2, expected 0..1"),
    ("s[0][0], -1, 0", "reason_code -1"),
    ("s[0][0], 0, -1", "n_alt -1, expected 0..8"),
    ("s[0][0], 0, 9", "n_alt 9, expected 0..8"),
    ("s[0][0] + 1000, 0, 0", "returned block"),
    ("-1, 0, 0", "returned -1 (no victim) while"),
    ("float(s[0][0]), 0, 0", "expected an integer"),
    ("s[0][0], 0.5, 0", "returned reason_code 0.5"),
    ("(s[0][0], 0)", "expected a tuple (block, reason_code, n_alt)"),
    ("None", "returned None"),
])
def test_victim_returns_are_checked(tmp_path: Path, ret: str, fragment) -> None:
    name = f"guard_ret_{abs(hash(ret)) % 10**8}"
    path = tmp_path / f"{name}.py"
    path.write_text(POLICY.format(name=name, ret=ret))
    pol = load_policy_file(path)
    keys = np.array([1, 2, 3, 1, 4, 5, 2, 6], dtype=np.int64)
    if fragment is None:
        res = simulate_cache(keys, 2, pol, n_alt=8, record_victims=True)
        # FIFO, capacity 2: victims keys 1, 2, 3, 1, 4, 5, recorded as dense key ids in order
        # of first appearance (1 -> 0, 2 -> 1, 3 -> 2, 4 -> 3, 5 -> 4)
        assert [int(v) for v in res.victims] == [0, 1, 2, 0, 3, 4]
        return
    with pytest.raises(KvsimInputError) as info:
        simulate_cache(keys, 2, pol, n_alt=8)
    msg = str(info.value)
    assert str(path) in msg and "field 'victim'" in msg and fragment in msg, msg
    assert "\n" not in msg
