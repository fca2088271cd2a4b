"""The CUDA kernels, checked byte for byte under numba's CUDA simulator (a subprocess with
NUMBA_ENABLE_CUDASIM=1 running the same code path a GPU runs), the refusal of simulator
timings, and a real-GPU test that skips cleanly without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def simulator_run(run_python, tmp_path_factory, write_log, log_rows):
    """One subprocess under NUMBA_ENABLE_CUDASIM=1: the byte checks on the cuda backend,
    detect(), and what calibrate/replay answer (the simulator is slow to start: once)."""
    log = write_log(log_rows(), tmp_path_factory.mktemp("log") / "handmade.log.parquet")
    proc = run_python([str(HERE / "backend_checks.py"), "cuda", str(log)], cudasim=True,
                      timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_cuda_kernels_move_exact_bytes_under_the_simulator(simulator_run):
    assert simulator_run["detect"] == "cudasim"
    assert simulator_run["checks"] == ["gather", "scatter", "spill", "promote", "disk",
                                       "copy_host", "round_trip", "closed"]


def test_simulator_timings_are_refused_as_calibration_and_replay(simulator_run):
    for name in ("calibrate", "replay"):
        message = simulator_run["refusals"][name]
        assert message.startswith("field 'backend': refusing to time under the numba CUDA "
                                  "simulator"), message


def test_cli_refuses_simulator_calibration_with_exit_2(simulator_run):
    cli = simulator_run["cli"]
    assert cli["exit_code"] == 2, cli["output"]
    # the API names the field (above), the command line the option
    assert cli["output"].startswith("error: field '--backend': refusing to time under the "
                                    "numba CUDA simulator")
    assert "Traceback" not in cli["output"]
    assert not cli["wrote"]


def _gpu_present() -> bool:
    from kvsim.backends import detect

    return detect() == "gpu"


@pytest.mark.gpu
def test_real_gpu_moves_exact_bytes_and_calibrates(backend_checks, tmp_path):
    if not _gpu_present():
        pytest.skip("no CUDA GPU here (kvsim.backends.detect() != 'gpu'); this test runs the "
                    "kernels and a quick calibration on a real GPU")
    assert backend_checks.run_checks("cuda", str(tmp_path))[-1] == "closed"
    from kvsim.analysis.calibrate import CalibrationSettings, calibrate

    result = calibrate(CalibrationSettings.quick(backend="cuda", disk_dir=str(tmp_path)))
    assert result.device.backend == "cuda" and not result.device.simulated
    assert result.profile.provenance["timer"].startswith("CUDA events")
    for op in ("spill", "promote"):
        assert result.fit(op).bandwidth_bytes_per_s > 1e9  # any PCIe link beats 1 GB/s


def test_a_gpu_whose_numba_cuda_cannot_compile_is_one_clear_error(monkeypatch, tmp_path):
    """numba-cuda 0.30.4 under numpy 2.5 (seen on an H200, 2026-11-30) fails at the first
    kernel compile, deep in numba, with a traceback; kvsim asks first and refuses in one
    line, exit 2, nothing written."""
    from typer.testing import CliRunner

    import kvsim.backends as backends
    import kvsim.backends.detection as detection
    from kvsim.cli import app

    broken = "AttributeError: module 'numpy' has no attribute 'row_stack'"
    monkeypatch.setattr(detection, "detect", lambda: "gpu")
    monkeypatch.setattr(backends, "detect", lambda: "gpu")
    monkeypatch.setattr(backends, "kernel_compiler_problem", lambda: broken)
    out = tmp_path / "cal.toml"
    res = CliRunner().invoke(app, ["calibrate", "--backend", "cuda", "--quick", "--out",
                                   str(out)])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: field '--backend': expected numba-cuda able to compile "
                               "kernels for --backend cuda, got " + broken), lines[0]
    assert "Traceback" not in res.output and not out.exists()
