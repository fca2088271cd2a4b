"""kvsim sweep / kvsim report through the CLI (typer CliRunner)."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from kvsim.cli import app

from .conftest import SAMPLE

runner = CliRunner()


def test_sweep_cli_resumes_from_cache_and_report_cli(small_sweep, tmp_path):
    out = tmp_path / "sw"
    shutil.copytree(small_sweep.out_dir / "cells", out / "cells")
    res = runner.invoke(app, ["sweep", "--trace", str(SAMPLE), "--policies", "lru",
                              "--hbm-gb", "0.06,0.2", "--out", str(out), "--jobs", "1",
                              "--engine", "interpreted", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["cells"], data["computed"], data["cached"]) == (4, 0, 4)
    for name in ("results.parquet", "occupancy.parquet"):  # from the cached cells alone
        assert (out / name).read_bytes() == (small_sweep.out_dir / name).read_bytes()
    res = runner.invoke(app, ["report", str(out), "--out", str(tmp_path / "r.html"),
                              "--png", str(tmp_path / "png"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["cells"] == 4 and len(data["png"]) == 6
    assert data["figures"][-1] == "occupancy_time"
    assert data["png"][-1].endswith("occupancy_time.png")
    assert data["policies"] == ["lru", "belady"]


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    cases = [
        ["sweep", "--trace", str(SAMPLE), "--policies", "lru", "--hbm-gb", "1,abc",
         "--out", str(tmp_path)],
        ["sweep", "--trace", str(SAMPLE), "--policies", "nosuch", "--hbm-gb", "1",
         "--out", str(tmp_path)],
        ["sweep", "--trace", str(tmp_path / "missing.parquet"), "--policies", "lru",
         "--hbm-gb", "1", "--out", str(tmp_path)],
        ["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r.html")],
    ]
    for args in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        err = res.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), (args, res.stderr)
    assert not (tmp_path / "r.html").exists()


def test_help_texts():
    for cmd in ("sweep", "report"):
        res = runner.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0
        assert "--out" in res.stdout
