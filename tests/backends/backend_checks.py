"""Byte-exact checks of a backend's batched operations, shared by the cpu tests (in process)
and the CUDA-simulator test (run as ``python backend_checks.py cuda`` in a subprocess with
``NUMBA_ENABLE_CUDASIM=1``, so the simulator never leaks into the main test process).

Layout: 3 layers x K/V x 2 tokens x 1 head x 4 head dim, fp16 = 16-byte chunks, 96-byte
blocks; 6 pool blocks, 5 host slots, 3 staging slots, 4 disk slots (a few blocks: the CUDA
simulator runs every thread in Python)."""

from __future__ import annotations

import sys
import tempfile

import numpy as np

from kvsim.backends import BlockLayout, open_backend

LAYOUT = BlockLayout(num_layers=3, block_tokens=2, num_kv_heads=1, head_dim=4, dtype="fp16")


def pool_block(pool: np.ndarray, b: int) -> np.ndarray:
    """Block ``b`` of a pool snapshot as one contiguous run (layers, K/V, chunk bytes)."""
    return np.ascontiguousarray(pool[:, :, b, :]).reshape(-1)


def run_checks(backend_name: str, disk_dir: str) -> list[str]:
    """Run every check; returns the names of the checks that passed (raises on failure)."""
    done = []
    with open_backend(backend_name, LAYOUT, device_blocks=6, host_blocks=5, staging_blocks=3,
                      disk_blocks=4, disk_dir=disk_dir, seed=3) as be:
        assert LAYOUT.block_bytes == 96 and LAYOUT.chunk_bytes == 16
        pool0, host0, stage0 = be.pool_bytes(), be.host_bytes(), be.staging_bytes()
        assert pool0.shape == (3, 2, 6, 16) and host0.shape == (5, 96)
        assert stage0.shape == (3, 96)
        # Distinct content everywhere, so a wrong source block would be caught.
        blocks = {pool_block(pool0, b).tobytes() for b in range(6)}
        assert len(blocks) == 6

        # gather: pool blocks 4, 0 -> staging slots 0, 1; slot 2 untouched; pool unchanged.
        be.gather(np.array([4, 0]))
        stage = be.staging_bytes()
        assert stage[0].tobytes() == pool_block(pool0, 4).tobytes()
        assert stage[1].tobytes() == pool_block(pool0, 0).tobytes()
        assert stage[2].tobytes() == stage0[2].tobytes()
        assert np.array_equal(be.pool_bytes(), pool0)
        done.append("gather")

        # scatter: staging slots 0, 1 -> pool blocks 5, 2; other pool blocks untouched.
        be.scatter(np.array([5, 2]))
        pool1 = be.pool_bytes()
        assert pool_block(pool1, 5).tobytes() == pool_block(pool0, 4).tobytes()
        assert pool_block(pool1, 2).tobytes() == pool_block(pool0, 0).tobytes()
        for b in (0, 1, 3, 4):
            assert pool_block(pool1, b).tobytes() == pool_block(pool0, b).tobytes(), b
        done.append("scatter")

        # spill: pool blocks 1, 3 -> host slots 4, 0; host slots 1..3 untouched.
        be.spill(np.array([1, 3]), np.array([4, 0]))
        host1 = be.host_bytes()
        assert host1[4].tobytes() == pool_block(pool1, 1).tobytes()
        assert host1[0].tobytes() == pool_block(pool1, 3).tobytes()
        for s in (1, 2, 3):
            assert host1[s].tobytes() == host0[s].tobytes(), s
        assert np.array_equal(be.pool_bytes(), pool1)
        done.append("spill")

        # promote: host slot 2 -> pool block 0; everything else in the pool untouched.
        be.promote(np.array([2]), np.array([0]))
        pool2 = be.pool_bytes()
        assert pool_block(pool2, 0).tobytes() == host1[2].tobytes()
        for b in range(1, 6):
            assert pool_block(pool2, b).tobytes() == pool_block(pool1, b).tobytes(), b
        done.append("promote")

        # disk: host slots 4, 0, 1 -> disk slots 2, 3, 0 (runs [2,3] and [0]); slot 1 zero.
        be.write_disk(np.array([4, 0, 1]), np.array([2, 3, 0]))
        disk = be.disk_bytes()
        assert disk[2].tobytes() == host1[4].tobytes()
        assert disk[3].tobytes() == host1[0].tobytes()
        assert disk[0].tobytes() == host1[1].tobytes()
        assert not disk[1].any()
        # read back: disk slots 3, 2 -> host slots 1, 2; slots 0, 3, 4 untouched.
        be.read_disk(np.array([3, 2]), np.array([1, 2]))
        host2 = be.host_bytes()
        assert host2[1].tobytes() == host1[0].tobytes()
        assert host2[2].tobytes() == host1[4].tobytes()
        for s in (0, 3, 4):
            assert host2[s].tobytes() == host1[s].tobytes(), s
        done.append("disk")

        # copy_host: host slots 0, 1 -> 3, 4 (CPU copy on every backend); 0..2 untouched.
        be.copy_host(np.array([0, 1]), np.array([3, 4]))
        host3 = be.host_bytes()
        assert host3[3].tobytes() == host2[0].tobytes()
        assert host3[4].tobytes() == host2[1].tobytes()
        assert np.array_equal(host3[:3], host2[:3])
        done.append("copy_host")

        # A spilled block survives the round trip pool -> host -> disk -> host -> pool.
        be.promote(np.array([2]), np.array([3]))  # slot 2 was read back from disk
        assert pool_block(be.pool_bytes(), 3).tobytes() == pool_block(pool1, 1).tobytes()
        done.append("round_trip")

        # Timings are non-negative floats (zero under the simulator).
        t = be.spill(np.array([0]), np.array([0]))
        assert isinstance(t, float) and t >= 0.0
        info = be.device_info()
        assert info.backend == backend_name
        path = be._disk.path
    assert not path.exists(), "disk tier scratch file must be removed on close"
    done.append("closed")
    return done


def refusals(log_path: str) -> dict[str, str]:
    """What calibration and placement replay say when asked to time on this backend."""
    from kvsim.analysis.calibrate import CalibrationSettings, calibrate
    from kvsim.analysis.placement_replay import ReplaySettings, replay_decision_log
    from kvsim.core.errors import KvsimInputError

    out = {}
    for name, call in (
            ("calibrate", lambda: calibrate(CalibrationSettings.quick(backend="cuda"))),
            ("replay", lambda: replay_decision_log(log_path, ReplaySettings(backend="cuda")))):
        try:
            call()
            out[name] = "accepted"
        except KvsimInputError as exc:
            out[name] = str(exc)
    return out


def cli_refusal(out_dir: str) -> dict:
    """``kvsim calibrate --backend cuda`` through the CLI (exit code, output, file)."""
    from pathlib import Path

    from typer.testing import CliRunner

    from kvsim.cli import app

    target = Path(out_dir) / "hw.toml"
    res = CliRunner().invoke(app, ["calibrate", "--backend", "cuda", "--quick", "--out",
                                   str(target)])
    return {"exit_code": res.exit_code, "output": res.output, "wrote": target.exists()}


if __name__ == "__main__":
    # python backend_checks.py BACKEND [DECISION_LOG]: prints one JSON object.
    import json

    from kvsim.backends import detect

    with tempfile.TemporaryDirectory() as tmp:
        report = {"detect": detect(), "checks": run_checks(sys.argv[1], tmp)}
    if len(sys.argv) > 2:
        report["refusals"] = refusals(sys.argv[2])
        with tempfile.TemporaryDirectory() as tmp:
            report["cli"] = cli_refusal(tmp)
    print(json.dumps(report))
