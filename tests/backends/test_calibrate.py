"""``kvsim calibrate --backend cpu`` end to end: measurements, fit, profile and provenance,
and the profile's effect on simulated transfer latencies."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
from typer.testing import CliRunner

from kvsim.analysis.calibrate import (
    KIB,
    MIB,
    OPERATIONS,
    CalibrationSettings,
    LinearFit,
    calibrate,
    calibrated_profile,
    write_calibration,
)
from kvsim.backends import CALIBRATION_LAYOUT, BlockLayout
from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.engine import cost_model
from kvsim.spec.hardware import load_hardware

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick cpu calibration shared by the tests of this module (~3 s)."""
    disk = tmp_path_factory.mktemp("disk")
    return calibrate(CalibrationSettings.quick(disk_dir=str(disk)), now=NOW)


def test_settings_sizes_are_whole_blocks_64kib_to_64mib():
    s = CalibrationSettings()
    assert CALIBRATION_LAYOUT.block_bytes == 64 * KIB
    assert s.block_counts() == [2**k for k in range(11)]  # 64 KiB .. 64 MiB
    big = CalibrationSettings(layout=BlockLayout(32, 16, 8, 128, "bf16"))  # 2 MiB blocks
    assert big.block_counts() == [1, 2, 4, 8, 16, 32]
    assert CalibrationSettings.quick().block_counts() == [1, 2, 4, 8, 16]
    with pytest.raises(KvsimInputError, match="repeats"):
        CalibrationSettings(repeats=0)
    with pytest.raises(KvsimInputError, match="two distinct batch sizes"):
        CalibrationSettings(layout=BlockLayout(32, 16, 8, 128, "bf16"),
                            max_bytes=MIB).block_counts()


def test_quick_calibration_measures_every_operation(quick):
    assert [o.operation for o in quick.operations] == list(OPERATIONS)
    for o in quick.operations:
        assert o.sizes_bytes == tuple(64 * KIB * 2**k for k in range(5))
        assert len(o.median_us) == 5 and all(t > 0 for t in o.median_us)
        assert all(lo <= m <= hi for lo, m, hi in zip(o.min_us, o.median_us, o.max_us))
        # On a noisy machine a quick run's medians may admit no fit (disk writes are all
        # fdatasync at 64 KiB..1 MiB); then the reason is kept and the profile keeps base.
        if o.fit is None:
            assert o.fit_error.startswith("calibration fit failed")
        else:
            assert o.fit.bandwidth_bytes_per_s > 0 and o.fit.latency_us >= 0
    frame = quick.to_frame()
    assert list(frame["operation"]) == list(OPERATIONS)
    assert len(quick.samples_frame()) == 6 * 5


def _fit(latency_us: float, bandwidth: float) -> LinearFit:
    return LinearFit(latency_us, bandwidth, 0.99, (0.0,), 0.01)


FITS = {"gather": _fit(1.0, 9e9), "scatter": _fit(1.0, 8e9), "spill": _fit(3.0, 6e9),
        "promote": _fit(2.0, 7e9), "disk_write": _fit(900.0, 1e9),
        "disk_read": _fit(150.0, 2e9)}


def test_profile_mapping_is_exact(quick):
    base = load_hardware("h100-sxm")
    p = calibrated_profile(base, FITS, quick.device, "D", quick.settings)
    dram, nvme = p.tiers["dram"], p.tiers["nvme"]
    assert (dram.read_bandwidth_bytes_per_s, dram.write_bandwidth_bytes_per_s,
            dram.link_bandwidth_bytes_per_s) == (7e9, 6e9, 7e9)
    assert dram.path_bandwidth_bytes_per_s(True) == 7e9  # promote
    assert dram.path_bandwidth_bytes_per_s(False) == 6e9  # spill
    assert (dram.latency_us, dram.link_latency_us) == (0.0, 2.0)
    assert dram.transfer_us(7_000_000, to_gpu=True) == pytest.approx(2.0 + 1000.0)
    assert (nvme.read_bandwidth_bytes_per_s, nvme.write_bandwidth_bytes_per_s,
            nvme.link_bandwidth_bytes_per_s) == (2e9, 1e9, 2e9)
    assert (nvme.latency_us, nvme.link_latency_us) == (150.0, 0.0)
    # Everything not measured is the base profile's.
    assert p.tiers["hbm"] == base.tiers["hbm"] and p.tiers["cxl"] == base.tiers["cxl"]
    assert p.peak_dense_bf16_flops_per_s == base.peak_dense_bf16_flops_per_s
    assert dram.capacity_bytes == base.tiers["dram"].capacity_bytes
    assert dram.link == base.tiers["dram"].link
    assert p.provenance["fit_spill"].startswith("latency 3.000 us, bandwidth 6e+09 B/s")


def test_failed_fit_keeps_the_base_numbers(quick):
    base = load_hardware("h100-sxm")
    fits = {k: v for k, v in FITS.items() if k not in ("disk_write", "promote")}
    p = calibrated_profile(base, fits, quick.device, "D", quick.settings)
    b_dram, b_nvme = base.tiers["dram"], base.tiers["nvme"]
    dram, nvme = p.tiers["dram"], p.tiers["nvme"]
    assert dram.path_bandwidth_bytes_per_s(True) == b_dram.path_bandwidth_bytes_per_s(True)
    assert dram.path_bandwidth_bytes_per_s(False) == 6e9
    assert dram.latency_us + dram.link_latency_us == b_dram.latency_us + b_dram.link_latency_us
    assert nvme.path_bandwidth_bytes_per_s(False) == b_nvme.path_bandwidth_bytes_per_s(False)
    assert nvme.path_bandwidth_bytes_per_s(True) == 2e9
    assert p.provenance["fit_disk_write"].startswith("failed")
    assert "fit failed, base profile path value kept" in \
        p.sources["tiers.nvme.write_bandwidth_bytes_per_s"]


def test_profile_carries_the_measurement_and_provenance(quick, tmp_path):
    p = quick.profile
    for op, tier, to_gpu in (("promote", "dram", True), ("spill", "dram", False),
                             ("disk_read", "nvme", True), ("disk_write", "nvme", False)):
        fit = quick.fit(op)
        if fit is not None:
            assert p.tiers[tier].path_bandwidth_bytes_per_s(to_gpu) == \
                fit.bandwidth_bytes_per_s
    prov = p.provenance
    assert prov["kind"] == "calibrated" and prov["backend"] == "cpu"
    assert prov["date"] == "2026-01-02T03:04:05Z"
    for key in ("device", "driver", "timer", "disk_io"):
        assert prov[key]
    assert "PCIe" in prov["not_measured"]
    assert p.name == "h100-sxm-calibrated-cpu"
    assert "calibrated" in p.sources["tiers.dram.read_bandwidth_bytes_per_s"]
    # Round trip through TOML.
    path = write_calibration(quick, tmp_path / "hw.toml")
    assert load_hardware(path) == p


def _scaled(fit: LinearFit, factor: float) -> LinearFit:
    return dataclasses.replace(fit, bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s * factor)


def test_slower_measured_bandwidth_makes_transfers_slower(quick):
    """The profile moves simulated latencies in the direction its numbers say: the same
    measurement with half the bandwidth gives slower promotions and spills, through the
    cost model's own formula (kvsim.engine.cost_model)."""
    base = load_hardware("h100-sxm")
    fits = dict(FITS)
    slow_fits = {op: _scaled(f, 0.5) for op, f in fits.items()}
    fast = calibrated_profile(base, fits, quick.device, quick.date, quick.settings)
    slow = calibrated_profile(base, slow_fits, quick.device, quick.date, quick.settings)
    block = 2 * MIB
    for tier in ("dram", "nvme"):
        for to_gpu in (True, False):
            assert slow.tiers[tier].transfer_us(block, to_gpu) > \
                fast.tiers[tier].transfer_us(block, to_gpu)
    promote = {name: {c.name: c for c in cost_model.tier_costs(p, block, 100)}
               for name, p in (("fast", fast), ("slow", slow), ("base", base))}
    for tier in ("dram", "nvme"):
        assert promote["slow"][tier].promote_us(block) > promote["fast"][tier].promote_us(block)
    # The cost model charges exactly the calibrated path: 2 us + 2 MiB / 7 GB/s, which is
    # slower than the datasheet's 5.1 us + 2 MiB / 55 GB/s.
    assert promote["fast"]["dram"].promote_us(block) == pytest.approx(2.0 + block / 7e9 * 1e6)
    assert promote["fast"]["nvme"].promote_us(block) == \
        pytest.approx(150.0 + block / 2e9 * 1e6)
    assert promote["base"]["dram"].promote_us(block) == pytest.approx(5.1 + block / 55e9 * 1e6)
    assert promote["fast"]["dram"].promote_us(block) > promote["base"]["dram"].promote_us(block)


def test_unknown_base_fails_before_measuring():
    with pytest.raises(KvsimInputError, match="unknown hardware profile 'nope'"):
        calibrate(CalibrationSettings.quick(base="nope"))


def test_cli_calibrate_cpu_quick_json(tmp_path):
    out = tmp_path / "hw.toml"
    result = CliRunner().invoke(app, ["calibrate", "--backend", "cpu", "--quick", "--out",
                                      str(out), "--max-mib", "0.5", "--disk-dir",
                                      str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["profile_path"] == str(out)
    assert [o["operation"] for o in data["operations"]] == list(OPERATIONS)
    assert [s["bytes"] for s in data["operations"][0]["samples"]] == [65536, 131072, 262144,
                                                                       524288]
    assert data["provenance"]["backend"] == "cpu"
    assert data["layout"]["block_bytes"] == 65536
    assert load_hardware(out).provenance["kind"] == "calibrated"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw.toml"]  # scratch file gone


def test_cli_bad_base_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "hw.toml"
    result = CliRunner().invoke(app, ["calibrate", "--quick", "--out", str(out), "--base",
                                      "nope"])
    assert result.exit_code == 2
    assert "unknown hardware profile 'nope'" in result.output
    assert not out.exists()


def test_cli_bad_layout_and_sizes_exit_2(tmp_path):
    out = tmp_path / "hw.toml"
    runner = CliRunner()
    bad = runner.invoke(app, ["calibrate", "--out", str(out), "--dtype", "int3"])
    assert bad.exit_code == 2
    assert "field '--dtype': expected one of ['bf16', 'fp16', 'fp32', 'fp8'], got 'int3'" \
        in bad.output
    small = runner.invoke(app, ["calibrate", "--out", str(out), "--max-mib", "0.01"])
    assert small.exit_code == 2
    assert "expected 0 < min size < max size, got 65536 and 10485 bytes" in small.output
    assert not out.exists()
