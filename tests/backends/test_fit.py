"""The latency + bytes / bandwidth fit recovers known parameters from synthetic samples."""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.analysis.calibrate import KIB, MIB, fit_latency_bandwidth
from kvsim.core.errors import KvsimError

SIZES = np.array([64 * KIB * 2**k for k in range(11)])  # 64 KiB .. 64 MiB


def synthetic(latency_us: float, bandwidth: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    exact = latency_us + SIZES / bandwidth * 1e6
    return exact * (1.0 + noise * rng.standard_normal(SIZES.size))


def test_exact_samples_are_recovered_exactly():
    fit = fit_latency_bandwidth(SIZES, synthetic(20.0, 12e9, 0.0, 0))
    assert fit.latency_us == pytest.approx(20.0, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(12e9, rel=1e-9)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-12)
    assert max(abs(r) for r in fit.residuals_us) < 1e-6
    assert not fit.latency_clamped


@pytest.mark.parametrize("latency_us, bandwidth", [
    (20.0, 12e9),    # a PCIe Gen4-class link
    (5.0, 55e9),     # PCIe Gen5 x16: latency ~ the 64 KiB transfer time
    (80.0, 3.8e9),   # an NVMe write
    (300.0, 0.5e9),  # a slow virtual disk, like this machine's
])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noisy_samples_recover_latency_and_bandwidth_within_5_percent(latency_us, bandwidth,
                                                                      seed):
    times = synthetic(latency_us, bandwidth, noise=0.01, seed=seed)  # 1% timing jitter
    fit = fit_latency_bandwidth(SIZES, times)
    assert fit.latency_us == pytest.approx(latency_us, rel=0.05)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=0.05)
    assert fit.r_squared > 0.999
    assert len(fit.residuals_us) == SIZES.size
    np.testing.assert_allclose(np.array(fit.residuals_us), times - fit.predict_us(SIZES))


def test_negative_intercept_is_clamped_to_zero_latency():
    # Pure bandwidth with the smallest sizes a little fast: the free fit goes below zero.
    times = SIZES / 10e9 * 1e6
    times[:2] *= 0.9
    fit = fit_latency_bandwidth(SIZES, times)
    assert fit.latency_clamped and fit.latency_us == 0.0
    assert fit.bandwidth_bytes_per_s == pytest.approx(10e9, rel=0.05)


def test_unusable_samples_raise():
    with pytest.raises(KvsimError, match="two distinct transfer sizes"):
        fit_latency_bandwidth([MIB, MIB], [1.0, 2.0])
    with pytest.raises(KvsimError, match="do not grow with transfer size"):
        fit_latency_bandwidth(SIZES, SIZES[::-1] / 1e3)
    with pytest.raises(KvsimError, match="positive, finite times"):
        fit_latency_bandwidth(SIZES, np.zeros(SIZES.size))
