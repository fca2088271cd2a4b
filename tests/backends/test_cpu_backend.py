"""The cpu backend moves exactly the named blocks (shared checks), and importing the
backends touches nothing CUDA."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsim.backends import BlockLayout, open_backend
from kvsim.core.errors import KvsimInputError


def test_cpu_backend_moves_exact_bytes(backend_checks, tmp_path):
    done = backend_checks.run_checks("cpu", str(tmp_path))
    assert done == ["gather", "scatter", "spill", "promote", "disk", "copy_host",
                                       "round_trip", "closed"]
    assert list(tmp_path.iterdir()) == []  # scratch file removed


def test_cpu_backend_reports_provenance(tmp_path):
    layout = BlockLayout(2, 16, 1, 128, "fp16")  # 4 KiB chunks: O_DIRECT possible
    with open_backend("cpu", layout, device_blocks=4, host_blocks=4, staging_blocks=2,
                      disk_blocks=4, disk_dir=tmp_path) as be:
        info = be.device_info()
        assert info.backend == "cpu" and not info.simulated
        assert info.timer.startswith("time.thread_time_ns")  # default: CPU time of copies
        assert "perf_counter_ns (disk I/O" in info.timer
        assert info.disk_io in ("O_DIRECT", "buffered (page cache dropped before reads)")
        t = be.write_disk(np.array([0, 1]), np.array([2, 3]))
        assert t > 0


def test_out_of_range_ids_are_refused(tmp_path):
    layout = BlockLayout(1, 1, 1, 8, "fp16")
    with open_backend("cpu", layout, device_blocks=2, host_blocks=2, staging_blocks=1,
                      disk_blocks=2, disk_dir=tmp_path) as be:
        with pytest.raises(ValueError, match=r"\[0, 2\)"):
            be.spill(np.array([2]), np.array([0]))
        with pytest.raises(ValueError, match="staging"):
            be.gather(np.array([0, 1]))  # 2 blocks > 1 staging slot


def test_unknown_backend_is_input_error():
    with pytest.raises(KvsimInputError, match="expected one of cpu, cuda, got 'tpu'"):
        open_backend("tpu", BlockLayout(1, 1, 1, 8), device_blocks=1, host_blocks=1,
                     staging_blocks=1, disk_blocks=1)


def test_import_and_cpu_use_import_nothing_cuda_and_detect_never_raises(run_python):
    code = ("import json, sys, numpy as np, tempfile\n"
            "import kvsim.backends as kb, kvsim.analysis.calibrate, kvsim.analysis.placement_replay\n"
            "import kvsim.cli\n"
            "with tempfile.TemporaryDirectory() as d:\n"
            "    with kb.open_backend('cpu', kb.BlockLayout(1, 1, 1, 8), device_blocks=2,\n"
            "                         host_blocks=2, staging_blocks=1, disk_blocks=2,\n"
            "                         disk_dir=d) as be:\n"
            "        be.spill(np.array([0]), np.array([1]))\n"
            "cuda = sorted(m for m in sys.modules if 'cuda' in m)\n"
            "print(json.dumps({'cuda_modules': cuda, 'detect': kb.detect()}))\n")
    proc = run_python(["-c", code], cudasim=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["cuda_modules"] == []
    assert out["detect"] in ("gpu", "none")  # "cudasim" only with NUMBA_ENABLE_CUDASIM=1


def test_wall_clock_timer_option(tmp_path):
    with open_backend("cpu", BlockLayout(1, 1, 1, 8), device_blocks=2, host_blocks=2,
                      staging_blocks=1, disk_blocks=2, disk_dir=tmp_path,
                      cpu_timer="wall") as be:
        assert be.device_info().timer.startswith("time.perf_counter_ns (wall clock)")
        assert be.spill(np.array([0]), np.array([1])) > 0
    with pytest.raises(KvsimInputError, match="field 'cpu_timer': expected one of thread, "
                                              "wall, got 'cpu'"):
        open_backend("cpu", BlockLayout(1, 1, 1, 8), device_blocks=1, host_blocks=1,
                     staging_blocks=1, disk_blocks=1, cpu_timer="cpu")
