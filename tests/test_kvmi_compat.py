"""kv_deadline_scheduler (kvmi) spellings: mapped where kvsim has the concept, one line on
stderr naming kvsim's equivalent where it does not (docs/migrating-from-kvmi.md)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli import app
from tests.helpers import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _json(args):
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def test_estimate_kv_model_option_equals_positional_name():
    args = ["--prompt-tokens", "128000", "--generated-tokens", "1000"]
    by_opt, _ = _json(["estimate-kv", "--model", "llama-3-8b"] + args)
    by_arg, _ = _json(["estimate-kv", "llama-3-8b"] + args)
    assert by_opt == by_arg
    assert by_opt["exact_bytes"] == 129_000 * 32 * 2 * 8 * 128 * 2
    res = runner.invoke(app, ["estimate-kv", "llama-3-8b", "--model", "qwen3-8b"])
    assert_one_line_error(res, "--model")


def test_estimate_kv_kvmi_geometry_dtype_bytes_and_batch_size():
    doc, _ = _json(["estimate-kv", "--num-layers", "32", "--hidden-size", "4096",
                    "--num-attention-heads", "32", "--num-kv-heads", "8", "--prompt-tokens",
                    "1000", "--generated-tokens", "0", "--dtype-bytes", "1", "--batch-size",
                    "4"])
    assert doc["bytes_per_token"] == 32 * 2 * 8 * 128 * 1  # fp8: one byte per value
    assert doc["kv_dtype"] == "fp8" and doc["concurrency"] == 4
    bad = runner.invoke(app, ["estimate-kv", "--num-layers", "2", "--num-attention-heads",
                              "4", "--hidden-size", "64", "--dtype-bytes", "3"])
    assert_one_line_error(bad, "--dtype-bytes")


def test_mb_capacities_are_mebibytes(builder_free_trace=ROOT / "traces" / "sample_fork.jsonl"):
    doc, _ = _json(["simulate", "--trace", str(builder_free_trace), "--hbm-mb", "4096",
                    "--dram-mb", "65536", "--cxl-mb", "0"])
    cfg = doc["config"]
    assert cfg["hbm_gb"] == 4096 * 1024 * 1024 / 1e9 and cfg["dram_gb"] == 65536 * 2**20 / 1e9
    assert cfg["cxl_gb"] == 0.0
    res = runner.invoke(app, ["compare", "--trace", str(builder_free_trace), "--hbm-mb", "1",
                              "--hbm-gb", "1"])
    assert_one_line_error(res, "--hbm-mb", "got both")


def test_compare_profile_with_kvmi_capacities():
    """The issue's must-show, with two policies (the test suite's budget)."""
    doc, _ = _json(["compare", "--profile", "deadline_pressure", "--hbm-mb", "4096",
                    "--dram-mb", "65536", "--requests", "16", "--policies", "lru,deadline"])
    assert [p["policy"] for p in doc["policies"] if not p["offline"]] == ["lru", "deadline"]
    assert doc["policies"][0]["hbm_capacity_blocks"] == 4096 * 2**20 // (16 * 131_072)


def test_kvmi_only_flags_say_what_kvsim_does_instead(tmp_path):
    out = tmp_path / "g.parquet"
    res = runner.invoke(app, ["generate", "--profile", "deadline_pressure", "--requests", "2",
                              "--out", str(out), "--decode-steps", "1000", "--block-kb", "16"])
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("note:")]
    assert len(notes) == 2 and "--decode-steps" in notes[0] and "profile" in notes[0]
    reqs = tmp_path / "requests.jsonl"
    reqs.write_text(
        '{"request_id":"interactive-1","arrival_ms":0,"start_ms":5,"end_ms":3000,'
        '"prompt_tokens":4096,"generated_tokens":512,"request_priority":90,'
        '"deadline_ms":2500,"model_name":"llama-3-8b","status":"completed"}\n'
        '{"request_id":"batch-1","arrival_ms":10,"prompt_tokens":1024,"generated_tokens":128,'
        '"request_priority":10,"model_name":"llama-3-8b","status":"completed"}\n')
    imported = tmp_path / "imported_trace.jsonl"
    res = runner.invoke(app, ["import-request-trace", "--requests", str(reqs), "--model",
                              "llama-3-8b", "--out", str(imported), "--logical-block-mb", "1",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["num_requests"] == 2 and "--logical-block-mb" in res.stderr
    head = runner.invoke(app, ["inspect", "--trace", str(imported), "--head", "5"])
    assert head.exit_code == 0 and "first 5 events" in head.stdout
    demo = runner.invoke(app, ["demo", "--profile", "deadline_pressure"])
    assert_one_line_error(demo, "kvsim compare --profile deadline_pressure")
