"""`kvsim log ...` through typer's CliRunner: exact JSON/CSV output, the stories the issue
asks for in the text output, help for every command, one-line errors with exit 2."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.results.log_reader import DecisionLog
from kvsim.results.log_summary import summary
from tests.helpers import assert_one_line_error

COMMANDS = ["summary", "show", "explain", "diff", "timeline"]


def run(*args: str):
    return CliRunner().invoke(app, ["log", *args])


@pytest.mark.parametrize("command", COMMANDS)
def test_help(command):
    result = run(command, "--help")
    assert result.exit_code == 0, result.output
    assert "--json" in result.stdout
    assert "Usage:" in result.stdout


def test_summary_json_is_the_api_result(lru_path):
    result = run("summary", str(lru_path), "--json")
    assert result.exit_code == 0, result.output
    expected = json.loads(json.dumps(dataclasses.asdict(summary(DecisionLog(lru_path)))))
    assert json.loads(result.stdout) == expected
    assert json.loads(result.stdout)["regret"]["cost_us"] == 410.0


def test_summary_table(lru_path):
    result = run("summary", str(lru_path))
    assert result.exit_code == 0, result.output
    for fragment in ("policy lru", "29 / 8", "3 (60.0%)", "1 / 3 / 3", "costliest evictions",
                     "requests that paid the most stall"):
        assert fragment in result.stdout, fragment


def test_show_csv_exact(lru_path):
    result = run("show", str(lru_path), "--action", "evict,demote", "--step", "2:3", "--csv")
    assert result.exit_code == 0, result.output
    lru = "least recently used: idle for the longest time"
    assert result.stdout == (
        "seq,step,time_us,action,block,request_id,block_index,from_tier,to_tier,bytes,"
        "cost_us,decode_critical,reason,n_candidates\n"
        f"8,2,2000.0,DEMOTE,101,2,0,HBM,DRAM,32768,0.0,False,{lru},4\n"
        f"10,2,2000.0,EVICT,102,2,1,HBM,-,0,0.0,False,{lru},3\n"
        f"12,3,3000.0,EVICT,202,0,0,HBM,-,0,0.0,False,{lru},2\n"
        f"14,3,3000.0,EVICT,201,0,1,HBM,-,0,0.0,False,{lru},1\n")


def test_show_json_and_table(lru_path):
    result = run("show", str(lru_path), "--tier", "DRAM", "--json")
    assert [r["seq"] for r in json.loads(result.stdout)] == [8, 13]
    result = run("show", str(lru_path), "--request", "4", "--reason", "demand", "--limit", "1")
    assert result.exit_code == 0 and "1 rows (limit 1)" in result.stdout


def test_explain_names_the_decode_critical_stall(lru_path):
    result = run("explain", str(lru_path), "--step", "2")
    assert result.exit_code == 0, result.output
    assert "DEMOTE block 101 HBM -> DRAM on behalf of request 2" in result.stdout
    assert ("block 101 was needed again at step 3 (1 steps later) by request 0 via PROMOTE, "
            "costing 40.0 us on a decode-critical step; it MISSED the deadline.") in result.stdout
    assert "other decisions at step 2: EVICT 102 (seq 10)" in result.stdout
    data = json.loads(run("explain", str(lru_path), "--step", "2", "--json").stdout)
    assert data["next_need"]["cost_us"] == 40.0 and data["candidates"][0]["block"] == "101"


def test_diff_names_first_divergence_and_its_stall(lru_path, deadline_path):
    result = run("diff", str(lru_path), str(deadline_path))
    assert result.exit_code == 0, result.output
    assert "first divergence at step 2 (seq 8):" in result.stdout
    assert ("lru: DEMOTE block 101 HBM -> DRAM (least recently used: idle for the longest "
            "time) -> needed at step 3 by request 0 via PROMOTE: 40.0 us stall "
            "(decode-critical)") in result.stdout
    assert "deadline: DEMOTE block 202 HBM -> DRAM" in result.stdout
    assert "never needed again" in result.stdout
    data = json.loads(run("diff", str(lru_path), str(deadline_path), "--json").stdout)
    assert (data["regret_cost_a_us"], data["regret_cost_b_us"]) == (410.0, 120.0)


def test_timeline(lru_path):
    result = run("timeline", str(lru_path), "--block", "101")
    assert result.exit_code == 0, result.output
    assert "tiers visited: HBM -> DRAM -> HBM" in result.stdout
    rows = json.loads(run("timeline", str(lru_path), "--request", "4", "--json").stdout)
    assert [(r["seq"], r["action"], r["block"]) for r in rows] == [
        (23, "EVICT", "102"), (24, "RECOMPUTE", "201"), (25, "ALLOCATE", "201"),
        (26, "ALLOCATE", "4:1"), (27, "RELEASE", "201"), (28, "FREE", "4:1")]


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_logs_exit_2_with_one_line(command, tmp_path, lru_path, make_logs):
    not_parquet = tmp_path / "text.parquet"
    not_parquet.write_text("hello\n")
    truncated = tmp_path / "cut.parquet"
    truncated.write_bytes(lru_path.read_bytes()[:2000])
    wrong = make_logs.write(make_logs.table(make_logs.lru_rows(), "lru", version=7),
                            tmp_path / "v7.parquet")
    extra = {"explain": ["--step", "2"], "timeline": ["--block", "101"],
             "diff": [str(lru_path)]}.get(command, [])
    for path, fragment in ((not_parquet, "not a readable Parquet decision log"),
                           (truncated, "truncated"),
                           (wrong, "expected decision-log schema version 1, got 7")):
        result = run(command, str(path), *extra)
        assert result.stdout == ""
        assert_one_line_error(result, path.name, fragment)


def test_bad_options_exit_2(lru_path):
    assert_one_line_error(run("show", str(lru_path), "--action", "nope"), "field '--action'")
    assert_one_line_error(run("show", str(lru_path), "--step", "9:1"), "expected A <= B")
    assert_one_line_error(run("show", str(lru_path), "--block", "x"), "field '--block'")
    assert_one_line_error(run("show", str(lru_path), "--json", "--csv"), "at most one")
    assert_one_line_error(run("explain", str(lru_path), "--step", "1"),
                          "expected a decision at step 1")
    assert_one_line_error(run("timeline", str(lru_path)), "exactly one of --block or --request")


def test_summary_fits_100_columns(lru_path, monkeypatch, capsys):
    """Issue #33: the summary was 125 columns wide on a real log (19-digit content-hash
    block ids in the costliest evictions): every line now fits 100 columns."""
    from kvsim.cli.log import _render_summary

    monkeypatch.setenv("COLUMNS", "100")
    s = summary(DecisionLog(lru_path))
    big = [{**r, "block": 5650068118294559082 + k, "seq": 174_801 + k, "step": 6_524,
            "need_step": 7_120, "need_request_id": 30, "cost_us": 379.0}
           for k, r in enumerate(s.top_causes)]
    _render_summary(dataclasses.replace(s, top_causes=big))
    out = capsys.readouterr()
    assert "columns wide" not in out.err
    assert max(len(line) for line in out.out.splitlines()) <= 100
    assert "5650068118294559082" in out.out
