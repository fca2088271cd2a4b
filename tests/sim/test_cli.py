"""`kvsim simulate` / `kvsim compare` through typer's CliRunner (interpreted engine: no
compile time; the compiled engine is covered by tests/sim/test_compiled.py)."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.core.schema import Phase

runner = CliRunner()


def _trace(builder, path):
    tb = builder()
    tb.STEP(0, 1000); tb.ARRIVE(0, 8); tb.prompt(0, [11, 12]); tb.ACCESS(0, 8)
    tb.STEP(1000, 500); tb.ACCESS(0, 1, Phase.DECODE); tb.FREE(0)
    tb.STEP(2000, 1000); tb.ARRIVE(1, 9); tb.prompt(1, [11, 12, 13], last_tokens=1)
    tb.ACCESS(1, 9)
    tb.STEP(3000, 500); tb.ACCESS(1, 1, Phase.DECODE); tb.FREE(1)
    return tb.write(path)


def test_a_cold_small_compare_replays_its_policies_in_parallel(builder, tiny_hw, tmp_path,
                                                               monkeypatch):
    """``compare`` on ``--engine auto`` that picks the interpreted engine (small work, the
    compiled core cold) replays its policies in one forked process per core
    (kvsim.replay.precompile.replay_jobs), with the same rows as one process; ``--engine
    interpreted`` keeps ``--jobs`` (1)."""
    from kvsim.core import workers
    from kvsim.replay import precompile, variants

    trace = _trace(builder, tmp_path / "t.parquet")
    pools = []
    real = workers.process_pool

    def spy(jobs):
        pools.append(jobs)
        return real(jobs)

    monkeypatch.setattr(workers, "process_pool", spy)
    monkeypatch.setattr(variants, "core_is_cold", lambda closed=False: True)
    monkeypatch.setattr(precompile.os, "cpu_count", lambda: 2)
    monkeypatch.delenv("KVSIM_COMPILE_WORKERS", raising=False)
    args = ["compare", "--trace", str(trace), "--policies", "lru,fifo", "--hardware",
            tiny_hw, "--hbm-blocks", "4", "--json"]
    auto = runner.invoke(app, args + ["--engine", "auto"])
    assert auto.exit_code == 0, auto.output
    assert pools == [2]
    one = runner.invoke(app, args + ["--engine", "interpreted"])
    assert one.exit_code == 0, one.output
    assert pools == [2]  # no pool: --jobs 1 obeyed
    rows = [{k: v for k, v in p.items() if k != "engine"}
            for p in json.loads(auto.stdout)["policies"]]
    assert rows == [{k: v for k, v in p.items() if k != "engine"}
                    for p in json.loads(one.stdout)["policies"]]


def test_simulate_json_and_outputs(builder, tiny_hw, tmp_path):
    trace = _trace(builder, tmp_path / "t.parquet")
    csv = tmp_path / "out.csv"
    log = tmp_path / "log.parquet"
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--policy", "lru",
                              "--hardware", tiny_hw, "--hbm-blocks", "4", "--engine",
                              "interpreted", "--csv", str(csv), "--decision-log", str(log),
                              "--log-lifecycle", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    row = doc["policies"][0]
    assert row["policy"] == "lru" and abs(row["hbm_hit_rate"] - 8 / 17) < 1e-12
    assert doc["config"]["hbm_capacity_blocks"] == 4
    assert pd.read_csv(csv)["p50_step_us"].iloc[0] == 650.0
    actions = pd.read_parquet(log)["action"].tolist()
    assert actions.count(10) == 3 and actions.count(11) + actions.count(13) == 2


def test_compare_json_keys_and_table(builder, tiny_hw, tmp_path):
    trace = _trace(builder, tmp_path / "t.parquet")
    args = ["compare", "--trace", str(trace), "--policies", "lru,fifo", "--hardware",
            tiny_hw, "--hbm-blocks", "4", "--engine", "interpreted"]
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    # the offline references compare adds are always shown, labelled (issue #33)
    assert [p["policy"] for p in doc["policies"]] == ["lru", "fifo", "optimal", "belady"]
    assert [p["bound_claim"] for p in doc["policies"]][2:] in (["bound", "heuristic"],
                                                              ["heuristic", "heuristic"])
    assert set(doc["verdict"]) >= {"text", "best", "meaningful", "tied", "threshold_pp"}
    assert isinstance(doc["warnings"], list)
    for key in ("policy", "p50_step_us", "p99_step_us", "hbm_hit_rate", "prefix_hit_rate",
                "block_hit_rate", "deadline_misses", "decode_critical_misses", "bytes_moved",
                "recompute_tokens", "gap_hbm_hit_rate_to_belady", "gap_p99_step_us_to_belady",
                "p99_step_us_vs_lru", "p99_step_pct_vs_lru", "decode_critical_misses_vs_lru"):
        assert key in doc["policies"][0], key
    assert doc["policies"][0]["gap_hbm_hit_rate_to_belady"] == 0.0
    assert doc["policies"][0]["p99_step_us_vs_lru"] == 0.0  # lru against itself
    assert doc["policies"][1]["decode_critical_misses_vs_lru"] == (
        doc["policies"][1]["decode_critical_misses"] - doc["policies"][0]["decode_critical_misses"])
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "lru" in table.stdout and "fifo" in table.stdout


def test_bad_trace_is_one_line_exit_2_and_no_output(tiny_hw, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a header"}\n')
    out = tmp_path / "rows.csv"
    res = runner.invoke(app, ["simulate", "--trace", str(bad), "--hardware", tiny_hw,
                              "--hbm-blocks", "4", "--engine", "interpreted", "--csv",
                              str(out)])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]


def test_unknown_policy_and_missing_trace(tiny_hw, tmp_path, builder):
    trace = _trace(builder, tmp_path / "t.parquet")
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--policy", "nope",
                              "--hardware", tiny_hw])
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.stderr
    res = runner.invoke(app, ["compare", "--hardware", tiny_hw])
    assert res.exit_code == 2 and "--trace" in res.stderr


def test_help_texts():
    for cmd in ("simulate", "compare"):
        res = runner.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0
        for opt in ("--trace", "--hardware", "--hbm-gb", "--hbm-blocks", "--dram-gb",
                    "--tier-policy", "--write-policy", "--preemption", "--warmup-fraction",
                    "--json", "--csv", "--parquet"):
            assert opt in res.stdout, (cmd, opt)


def test_cache_mode_and_warmup_options(builder, tiny_hw, tmp_path):
    """--mode cache: the JSON says so, latency keys are absent, gap to optimal is there;
    the table title names the mode; bad --mode / --cache-variant / both warm-ups exit 2."""
    trace = _trace(builder, tmp_path / "t.parquet")
    base = ["--trace", str(trace), "--hardware", tiny_hw, "--hbm-blocks", "4",
            "--engine", "interpreted", "--mode", "cache"]
    res = runner.invoke(app, ["compare", *base, "--policies", "lru,optimal", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["mode"] == "cache"
    lru, opt = doc["policies"]
    assert lru["mode"] == "cache" and "p99_step_us" not in lru and "ttft_p50_us" not in lru
    # cache mode: r1 hits 11 and 12 (8 of its 9 tokens; no last-token rule), r0 nothing
    assert (lru["hit_tokens"], lru["lookup_tokens"]) == (8, 17)
    assert opt["offline"] and lru["gap_hbm_hit_rate_to_optimal"] == 0.0
    res = runner.invoke(app, ["simulate", *base, "--warmup-requests", "1"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())  # the title may wrap at the terminal width
    assert "cache mode (prefix lookups, no timing)" in text
    assert "after 1 warm-up" in text
    for extra in (["--mode", "batch"], ["--cache-variant", "tokens"],
                  ["--warmup-requests", "1", "--warmup-fraction", "0.5"]):
        res = runner.invoke(app, ["simulate", *base, *extra])
        assert res.exit_code == 2, (extra, res.output)


def test_schedule_recorded_lowers_a_profile_then_replays_it(tmp_path):
    """`--schedule recorded` on a Request table lowers it (scheduler budget = the replayed
    pool) and replays the fixed schedule; the closed loop (default) serves the same table.
    Same table, same policy: both see the same requests and lookups of the same prompts."""
    base = ["--profile", "multi_turn_chat", "--requests", "6", "--seed", "1", "--hbm-gb",
            "2", "--engine", "interpreted", "--json"]
    out = {}
    for sched in ("recorded", "closed"):
        res = runner.invoke(app, ["simulate", "--policy", "lru", "--schedule", sched] + base)
        assert res.exit_code == 0, res.output
        out[sched] = json.loads(res.stdout)["policies"][0]
        assert out[sched]["schedule"] == sched
        assert out[sched]["requests"] == 6
    res = runner.invoke(app, ["compare", "--policies", "lru,fifo", "--schedule", "recorded"]
                        + base)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["policies"]
    assert [r["policy"] for r in rows][:2] == ["lru", "fifo"]
    assert rows[0]["schedule"] == "recorded"
    assert rows[0]["hbm_hit_rate"] == out["recorded"]["hbm_hit_rate"]


def test_engine_options_with_an_event_file_are_one_line_errors(builder, tiny_hw, tmp_path):
    """An event file's block size and steps are fixed when it is written: --block-size,
    --max-num-seqs and --max-num-batched-tokens with --trace are refused (they used to be
    ignored silently), on simulate and on compare, with no output file left behind."""
    trace = _trace(builder, tmp_path / "t.parquet")
    for command, opt, value in (("simulate", "--block-size", "256"),
                                ("compare", "--max-num-seqs", "8"),
                                ("simulate", "--max-num-batched-tokens", "16")):
        out = tmp_path / f"{command}{opt}.csv"
        args = [command, "--trace", str(trace), "--hardware", tiny_hw, "--hbm-blocks", "4",
                "--engine", "interpreted", "--csv", str(out), opt, value]
        if command == "simulate":
            args += ["--policy", "lru"]
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and opt in lines[0] and "--trace" in lines[0], lines
        assert not out.exists()
