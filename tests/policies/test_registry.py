"""Registry: discovery, validation with one-line errors, duplicates, user files, and the
import boundary (a policy imports only kvsim.policy.api, numpy and numba)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import kvsim.policies
from kvsim.cachesim.simulator import simulate_cache
from kvsim.core.errors import KvsimInputError
from kvsim.policy.registry import get_policy, list_policies, load_policy_file
from tests.policies.harness import USER_POLICY_FILE

BUILTINS = {"arc", "belady", "deadline", "fifo", "hotcold", "intent", "lfu", "lru",
            "predictive", "quota_lru", "s3fifo", "sieve", "vllm"}
GOOD = '''
NAME = "{name}"
DESCRIPTION = "test policy"
REASONS = ("only reason",)
def init(capacity_blocks, num_slots, params): return ([],)
def on_insert(state, view, b, now_us): state[0].append(b)
def on_hit(state, view, b, now_us): pass
def on_remove(state, view, b): state[0].remove(b)
def victim(state, view, now_us, alt_blocks, alt_scores):
    return (state[0][0], 0, 0) if state[0] else (-1, 0, 0)
'''


def test_builtins_are_registered_and_compiled():
    names = {p.name for p in list_policies()}
    assert BUILTINS <= names
    for name in BUILTINS:
        p = get_policy(name)
        assert p.compiled and p.source == "builtin" and p.description and p.reasons
    assert get_policy("belady").offline and not get_policy("lru").offline
    for name in ("deadline", "predictive", "intent", "hotcold"):
        assert get_policy(name).explain is not None


def test_unknown_name_is_a_one_line_input_error():
    with pytest.raises(KvsimInputError, match="unknown policy 'nope'; known: arc, belady"):
        get_policy("nope")


def test_user_file_loads_and_matches_its_compiled_twin(tmp_path):
    # The same FIFO logic as plain Python runs through the interpreted loop and gives the
    # compiled FIFO's exact victims.
    path = tmp_path / "pyfifo.py"
    path.write_text(GOOD.format(name="pyfifo_test"))
    pol = load_policy_file(path)
    assert load_policy_file(path) is pol  # loading twice is idempotent
    assert not pol.compiled and pol.source == str(path.resolve())
    keys = (np.random.default_rng(5).zipf(1.2, 3000) % 200).astype(np.int64)
    ours = simulate_cache(keys, 25, pol, record_victims=True)
    ref = simulate_cache(keys, 25, "fifo", record_victims=True)
    assert ours.misses == ref.misses
    np.testing.assert_array_equal(ours.victims, ref.victims)


def test_duplicate_name_raises(tmp_path):
    path = tmp_path / "dup.py"
    path.write_text(GOOD.format(name="lru"))
    with pytest.raises(KvsimInputError, match="duplicate policy name 'lru': already "
                       "registered from builtin"):
        load_policy_file(path)


@pytest.mark.parametrize("mutate, field, expected", [
    (lambda s: s.replace('REASONS = ("only reason",)', ""), "REASONS", "non-empty tuple"),
    (lambda s: s.replace("def on_remove(state, view, b)", "def on_remove(state, b)"),
     "on_remove", "3 positional parameters, got 2"),
    (lambda s: s.replace("def victim(", "def not_victim("), "victim", "a function with 5"),
    (lambda s: s.replace('NAME = "{name}"', 'NAME = "bad name"'), "NAME", "identifier"),
    (lambda s: s.replace("def init(capacity_blocks, num_slots, params)",
                         "def init(capacity_blocks)"), "init", "init(capacity_blocks, num"),
])
def test_invalid_module_errors_name_file_and_field(tmp_path, mutate, field, expected):
    path = tmp_path / f"bad_{field}.py"
    path.write_text(mutate(GOOD).format(name=f"bad_{field.lower()}"))
    with pytest.raises(KvsimInputError) as info:
        load_policy_file(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and f"field '{field}'" in msg
    assert expected in msg


def test_unimportable_file_is_an_input_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("NAME = (\n")
    with pytest.raises(KvsimInputError, match="could not import policy file: SyntaxError"):
        load_policy_file(path)
    with pytest.raises(KvsimInputError, match="expected an existing Python file"):
        load_policy_file(tmp_path / "missing.py")


def test_policies_import_only_the_policy_api():
    allowed = {"numpy", "numba", "kvsim.policy.api"}
    files = sorted(Path(kvsim.policies.__file__).parent.glob("*.py")) + [USER_POLICY_FILE]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod in allowed, f"{path.name} imports {mod}"


def test_entry_point_policies_are_discovered(monkeypatch, tmp_path):
    # A third-party package exposes a policy module through the `kvsim.policies` entry-point
    # group; a clean registry picks it up after the built-ins.
    import importlib.metadata as md
    import sys

    import kvsim.policy.registry as reg

    pkg = tmp_path / "thirdparty_policy_pkg.py"
    pkg.write_text(GOOD.format(name="thirdparty_fifo"))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = md.EntryPoint(name="thirdparty_fifo", value="thirdparty_policy_pkg",
                       group="kvsim.policies")
    monkeypatch.setattr(reg, "entry_points",
                        lambda group: [ep] if group == "kvsim.policies" else [])
    monkeypatch.setattr(reg, "_REGISTRY", {})
    monkeypatch.setattr(reg, "_LOADED", False)
    pol = reg.get_policy("thirdparty_fifo")
    assert pol.source == "entry point thirdparty_fifo = thirdparty_policy_pkg"
    assert {p.name for p in reg.list_policies()} == BUILTINS | {"thirdparty_fifo"}
    sys.modules.pop("thirdparty_policy_pkg", None)


def test_quota_lru_is_not_in_compares_default_list():
    from kvsim.modes.comparison import default_policies

    names = default_policies()
    assert "quota_lru" not in names and sorted(names) == sorted(BUILTINS - {"quota_lru"})
