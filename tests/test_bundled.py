"""Every bundled trace (traces/) and workload profile (profiles/workloads/) names a catalog
model and replays through ``kvsim compare`` (small sizes; interpreted engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.events import open_events
from kvsim.spec.models import list_models
from kvsim.workload import list_profiles

ROOT = Path(__file__).resolve().parents[1]
#: Bundled event traces (sample_mooncake.jsonl is a request trace: the README imports it).
TRACES = sorted(p for p in (ROOT / "traces").iterdir()
                if p.name.endswith((".parquet", ".jsonl")) and "mooncake" not in p.name)
runner = CliRunner()


def test_there_are_bundled_traces_and_profiles():
    assert {p.name for p in TRACES} >= {"sample_chat.parquet", "sample_chat.jsonl",
                                        "sample_fork.jsonl"}
    assert len(list_profiles()) >= 8


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_bundled_trace_names_a_catalog_model_and_replays(trace):
    with open_events(trace) as reader:
        assert reader.header.model in list_models(), reader.header.model
    res = runner.invoke(app, ["compare", "--trace", str(trace), "--policies", "lru,deadline",
                              "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["policies"]
    # the offline reference rows are always shown (docs/simulate.md, "Bounds")
    assert [r["policy"] for r in rows if not r["offline"]] == ["lru", "deadline"]
    assert {r["policy"] for r in rows if r["offline"]} == {"optimal", "belady"}
    assert all(r["requests"] > 0 and r["events"] > 0 for r in rows if not r["offline"])


def test_sample_chat_compares_with_no_other_option(monkeypatch):
    """The issue's must-show: `kvsim compare --trace traces/sample_chat.parquet`."""
    monkeypatch.chdir(ROOT)
    res = runner.invoke(app, ["compare", "--trace", "traces/sample_chat.parquet"])
    assert res.exit_code == 0, res.output
    assert "32 requests" in res.stdout and "optimal (bound)" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 120


@pytest.mark.parametrize("profile", list_profiles())
def test_every_profile_generates_a_catalog_model_trace_and_replays(profile, tmp_path):
    pq = tmp_path / "rows.parquet"
    res = runner.invoke(app, ["compare", "--profile", profile, "--requests", "6",
                              "--policies", "lru", "--parquet", str(pq)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "w.parquet"
    gen = runner.invoke(app, ["generate", "--profile", profile, "--requests", "2", "--out",
                              str(out), "--json"])
    assert gen.exit_code == 0, gen.output
    with open_events(out) as reader:
        assert reader.header.model in list_models()


def test_sample_mooncake_regenerates_byte_identically(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_mooncake_sample",
                                                  ROOT / "traces" / "make_mooncake_sample.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = module.main(tmp_path)
    assert made.read_bytes() == (ROOT / "traces" / "sample_mooncake.jsonl").read_bytes()
    rows = [json.loads(line) for line in made.read_text().splitlines()]
    assert len(rows) == 65 and all(len(r["hash_ids"]) * 512 >= r["input_length"] for r in rows)
