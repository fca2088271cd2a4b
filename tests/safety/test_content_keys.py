"""Caches keyed by content (issue 38): a sweep re-run after editing the --hardware TOML or
a policy file recomputes its cells; a sweep folder belongs to one trace (another is
refused, --force resets it and no stale curves survive); `log diff` knows a trace by its
bytes, not its file name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.analysis.sweep import SweepSpec, run_sweep
from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.spec.sim_config import SimConfig
from tests.helpers import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "sample_chat.parquet"
HW = REPO / "profiles" / "hardware" / "h100-sxm.toml"
FORK = REPO / "traces" / "sample_fork.jsonl"  # another event file
BASE = SimConfig(engine="interpreted")


def _spec(trace, hardware=None, policies=("lru",)) -> SweepSpec:
    base = BASE if hardware is None else SimConfig(engine="interpreted", hardware=str(hardware))
    return SweepSpec(str(trace), tuple(policies), (0.06,), (None,), base, False)


def test_edited_hardware_toml_recomputes_cells(tmp_path: Path) -> None:
    hw = tmp_path / "hw.toml"
    shutil.copyfile(HW, hw)
    first = run_sweep(_spec(SAMPLE, hw), tmp_path / "sw", jobs=1)
    assert (first.computed, first.cached) == (1, 0)
    again = run_sweep(_spec(SAMPLE, hw), tmp_path / "sw", jobs=1)
    assert (again.computed, again.cached) == (0, 1)
    hw.write_text(hw.read_text().replace("read_bandwidth_bytes_per_s = 3.35e12",
                                         "read_bandwidth_bytes_per_s = 1.0e9"))
    edited = run_sweep(_spec(SAMPLE, hw), tmp_path / "sw", jobs=1)
    assert (edited.computed, edited.cached) == (1, 0)


POLICY = '''NAME = "mine_fifo"
DESCRIPTION = "fifo"
REASONS = ("first in",)


def init(capacity_blocks, num_slots, params):
    return ([],)


def on_insert(state, view, b, now_us):
    state[0].append(b)


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    return (state[0][{i}], 0, 0) if state[0] else (-1, 0, 0)
'''


def test_policy_registered_from_a_file_is_keyed_by_its_bytes(tmp_path: Path) -> None:
    from kvsim.analysis.sweep_keys import _policy_identity
    from kvsim.policy.registry import load_policy_file

    path = tmp_path / "mine_fifo.py"
    path.write_text(POLICY.format(i=0))
    load_policy_file(path)
    before = _policy_identity("mine_fifo")
    path.write_text(POLICY.format(i=-1))
    assert _policy_identity("mine_fifo") != before


def test_sweep_folder_belongs_to_one_trace(tmp_path: Path) -> None:
    other = tmp_path / "other.jsonl"
    shutil.copyfile(FORK, other)
    out = tmp_path / "sw"
    run_sweep(_spec(SAMPLE), out, jobs=1, curves=True)
    assert (out / "curves.parquet").is_file()
    with pytest.raises(KvsimInputError, match="sweep folder of this trace"):
        run_sweep(_spec(other), out, jobs=1)
    res = run_sweep(_spec(other), out, jobs=1, force=True)
    assert (res.computed, res.cached) == (1, 0)
    assert not (out / "curves.parquet").exists()  # the first trace's curves are gone
    assert set(res.table["trace"]) == {"other.jsonl"}


def test_log_diff_knows_traces_by_content(tmp_path: Path, monkeypatch) -> None:
    """Two different traces both named t.jsonl (in two folders) are two traces."""
    logs = []
    for d, src in (("a", REPO / "traces" / "sample_chat.jsonl"), ("b", FORK)):
        (tmp_path / d).mkdir()
        shutil.copyfile(src, tmp_path / d / "t.jsonl")
        log = tmp_path / f"{d}.log.parquet"
        monkeypatch.chdir(tmp_path / d)
        r = CliRunner().invoke(app, ["simulate", "--trace", "t.jsonl", "--hbm-gb", "0.06",
                                     "--engine", "interpreted", "--decision-log", str(log)])
        assert r.exit_code == 0, (r.stderr, r.exception)
        logs.append(str(log))
    result = CliRunner().invoke(app, ["log", "diff", *logs])
    assert_one_line_error(result, "same trace", "by content")


@pytest.mark.parametrize("damage", ["corrupt", "incomplete"])
def test_report_with_a_damaged_curves_file_is_one_line(tmp_path: Path, damage: str) -> None:
    import pandas as pd

    out = tmp_path / "sw"
    run_sweep(_spec(SAMPLE), out, jobs=1, curves=True)
    curves = out / "curves.parquet"
    if damage == "corrupt":
        curves.write_bytes(curves.read_bytes()[:100])
    else:
        pd.read_parquet(curves).drop(columns=["hit_rate"]).to_parquet(curves)
    result = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "r.html")])
    assert_one_line_error(result, "curves.parquet", "curves table", "--curves")
    assert not (tmp_path / "r.html").exists()
