"""Calibration: time the backend's block operations and fit ``latency + bytes / bandwidth``.

``kvsim calibrate`` = :func:`calibrate` + :func:`kvsim.spec.hardware.save_hardware`.  For every
operation (gather, scatter, spill, promote, disk write, disk read) and every transfer size
from 64 KiB to 64 MiB (powers of two, whole blocks of the layout), it runs ``warmup``
untimed batches and then ``repeats`` timed batches on buffers pre-touched at construction,
with fresh random block ids each time (explicit ``numpy.random.Generator``), and keeps the
median.  :func:`fit_latency_bandwidth` then fits ``t = latency_us + bytes / bandwidth``.

Which profile numbers a measurement replaces (both backends; :data:`PROFILE_MAPPING`):

- ``promote`` (host -> pool) and ``spill`` (pool -> host) set the ``dram`` tier's path:
  ``read_bandwidth`` = promote bandwidth, ``write_bandwidth`` = spill bandwidth,
  ``link_bandwidth`` = the larger of the two (so the slowest-hop rule returns the measured
  number in each direction), ``link_latency_us`` = promote latency (the one a stall pays),
  ``latency_us`` = 0 (included: the copy is timed end to end).  On ``cuda`` this is the
  real PCIe (or NVLink-C2C) path.  On ``cpu`` it is a RAM-to-RAM copy: the stand-in for the
  host link; a CPU cannot measure PCIe.
- ``disk_read`` / ``disk_write`` set the ``nvme`` tier: read/write bandwidth, ``latency_us``
  = disk-read latency, ``link_bandwidth`` = the larger of the two, ``link_latency_us`` = 0
  (file-system and driver overheads are inside the measurement).  The hop from host memory
  to the GPU is not part of it.
- ``gather`` / ``scatter`` are reported, not written: a copy inside one memory is not a
  tier transfer (on ``cuda`` it reads and writes HBM, on ``cpu`` RAM).
- ``hbm``, ``cxl`` and all compute numbers stay those of the base profile.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.backends import (
    BACKEND_NAMES,
    CALIBRATION_LAYOUT,
    BlockLayout,
    DeviceInfo,
    open_backend,
    refuse_unmeasurable,
)
from kvsim.core.errors import KvsimError, KvsimInputError

KIB = 1024
MIB = 1024 * KIB

#: Operations timed, in order.
OPERATIONS = ("gather", "scatter", "spill", "promote", "disk_write", "disk_read")

#: What each operation stands for in the hardware profile ("" = reported only).
PROFILE_MAPPING = {
    "gather": "",
    "scatter": "",
    "spill": "dram write",  # device -> host
    "promote": "dram read",  # host -> device
    "disk_write": "nvme write",
    "disk_read": "nvme read",
}


@dataclass(frozen=True)
class LinearFit:
    """``time_us = latency_us + bytes / bandwidth_bytes_per_s * 1e6``, fitted by least
    squares on relative residuals (each size weighs alike, so the latency is not drowned by
    the largest transfers).  ``latency_clamped``: the free fit gave a negative latency and
    the fit was redone through the origin.  ``r_squared`` is the plain coefficient of
    determination of the fitted times; ``residuals_us`` = measured - fitted, per size."""

    latency_us: float
    bandwidth_bytes_per_s: float
    r_squared: float
    residuals_us: tuple[float, ...]
    max_abs_relative_residual: float
    latency_clamped: bool = False

    def predict_us(self, nbytes) -> np.ndarray:
        return self.latency_us + np.asarray(nbytes, dtype=float) / self.bandwidth_bytes_per_s * 1e6


def fit_latency_bandwidth(sizes_bytes, times_us) -> LinearFit:
    """Fit latency and bandwidth to (size, time) samples; needs >= 2 distinct sizes and times
    that grow with size (else :class:`KvsimError`: the measurement is unusable)."""
    s = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_us, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or np.unique(s).size < 2:
        raise KvsimError("calibration fit needs at least two distinct transfer sizes")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise KvsimError("calibration fit needs positive, finite times "
                         f"(got {t.tolist()}); the timer did not measure anything")
    w = 1.0 / t
    design = np.column_stack([w, w * s])
    (latency, slope), *_ = np.linalg.lstsq(design, w * t, rcond=None)
    clamped = False
    if latency < 0:  # noise at small sizes: fit through the origin instead
        latency = 0.0
        slope = float(np.sum(w * w * s * t) / np.sum(w * w * s * s))
        clamped = True
    if slope <= 0:
        raise KvsimError("calibration fit failed: times do not grow with transfer size "
                         f"(sizes {s.tolist()}, medians {t.tolist()} us)")
    fitted = latency + slope * s
    residuals = t - fitted
    total = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residuals ** 2)) / total if total > 0 else 1.0
    return LinearFit(latency_us=float(latency), bandwidth_bytes_per_s=float(1e6 / slope),
                     r_squared=r2, residuals_us=tuple(float(r) for r in residuals),
                     max_abs_relative_residual=float(np.max(np.abs(residuals) / t)),
                     latency_clamped=clamped)


@dataclass(frozen=True)
class CalibrationSettings:
    """How to calibrate.  ``quick()`` is a seconds-long variant for tests and smoke runs."""

    backend: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    layout: BlockLayout = field(default=CALIBRATION_LAYOUT,
                                metadata={"help": "block shape of the real pool"})
    min_bytes: int = field(default=64 * KIB, metadata={"help": "smallest transfer"})
    max_bytes: int = field(default=64 * MIB, metadata={"help": "largest transfer"})
    repeats: int = field(default=9, metadata={"help": "timed batches per size (median)"})
    warmup: int = field(default=2, metadata={"help": "untimed batches per size first"})
    seed: int = field(default=0, metadata={"help": "seed of block-id choice and fill"})
    disk_dir: str | None = field(default=None, metadata={"help": "where the disk tier's "
                                                          "scratch file lives"})
    base: str = field(default="h100-sxm", metadata={"help": "profile the measured tiers "
                                                     "replace numbers of"})
    name: str = field(default="", metadata={"help": "name of the calibrated profile"})
    cpu_timer: str = field(default="thread", metadata={
        "help": "cpu backend memory-copy clock: thread (CPU time) or wall"})

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_NAMES:
            raise KvsimInputError(f"expected one of {', '.join(BACKEND_NAMES)}, got "
                                  f"{self.backend!r}", field="backend")
        if self.repeats < 1 or self.warmup < 0:
            raise KvsimInputError(f"expected repeats >= 1 and warmup >= 0, got "
                                  f"{self.repeats} and {self.warmup}", field="repeats")
        if not 0 < self.min_bytes < self.max_bytes:
            raise KvsimInputError(f"expected 0 < min size < max size, got {self.min_bytes} "
                                  f"and {self.max_bytes} bytes", field="sizes")

    @classmethod
    def quick(cls, **overrides) -> CalibrationSettings:
        """64 KiB .. 1 MiB, 3 repeats, 1 warm-up: a few seconds, for tests."""
        return cls(**{"max_bytes": 1 * MIB, "repeats": 3, "warmup": 1, **overrides})

    def block_counts(self) -> list[int]:
        """Batch sizes in blocks: powers of two of bytes in [min, max], at least 1 block,
        deduplicated (a layout with blocks above 64 KiB starts at one block)."""
        counts: list[int] = []
        size = self.min_bytes
        while size <= self.max_bytes:
            n = max(1, size // self.layout.block_bytes)
            if n not in counts:
                counts.append(n)
            size *= 2
        if len(counts) < 2:
            raise KvsimInputError(f"expected at least two distinct batch sizes between "
                                  f"{self.min_bytes} and {self.max_bytes} bytes with "
                                  f"{self.layout.block_bytes}-byte blocks", field="sizes")
        return counts


@dataclass(frozen=True)
class OperationCalibration:
    """One operation's medians per size and their fit.  ``fit`` is None when the medians
    admit no fit (``fit_error`` says why, e.g. disk writes whose time is all fdatasync at
    small sizes); the profile then keeps the base profile's numbers for that operation."""

    operation: str
    stands_for: str
    sizes_bytes: tuple[int, ...]
    median_us: tuple[float, ...]
    min_us: tuple[float, ...]
    max_us: tuple[float, ...]
    fit: LinearFit | None
    fit_error: str = ""


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate`: provenance, per-operation fits, the calibrated profile."""

    device: DeviceInfo
    date: str  # UTC time of the measurement (provenance)
    settings: CalibrationSettings
    operations: tuple[OperationCalibration, ...]
    profile: object  # kvsim.spec.hardware.HardwareProfile

    def fit(self, operation: str) -> LinearFit | None:
        """The fit of ``operation`` (None if its medians admitted none)."""
        return next(o.fit for o in self.operations if o.operation == operation)

    def to_frame(self) -> pd.DataFrame:
        """One row per operation: fitted latency, bandwidth and fit quality."""
        nan = float("nan")
        return pd.DataFrame([{
            "operation": o.operation,
            "stands_for": o.stands_for or "-",
            "latency_us": o.fit.latency_us if o.fit else nan,
            "bandwidth_gb_per_s": o.fit.bandwidth_bytes_per_s / 1e9 if o.fit else nan,
            "r_squared": o.fit.r_squared if o.fit else nan,
            "max_abs_residual_pct": 100 * o.fit.max_abs_relative_residual if o.fit else nan,
            "sizes": len(o.sizes_bytes),
            "fit_error": o.fit_error,
        } for o in self.operations])

    def samples_frame(self) -> pd.DataFrame:
        """One row per (operation, size): median/min/max time, fitted time, residual."""
        rows = []
        for o in self.operations:
            for i, size in enumerate(o.sizes_bytes):
                rows.append({"operation": o.operation, "bytes": size,
                             "median_us": o.median_us[i], "min_us": o.min_us[i],
                             "max_us": o.max_us[i],
                             "fitted_us": float(o.fit.predict_us(size)) if o.fit
                             else float("nan"),
                             "residual_us": o.fit.residuals_us[i] if o.fit
                             else float("nan")})
        return pd.DataFrame(rows)


def calibrate(settings: CalibrationSettings = CalibrationSettings(),
              on_progress: Callable[[int, int], None] | None = None,
              now: _dt.datetime | None = None) -> Calibration:
    """Measure every operation of :data:`OPERATIONS` on the backend and build a calibrated
    profile from ``settings.base``.  ``on_progress(done, total)`` is called after each
    (operation, size).  ``now`` overrides the measurement date (tests)."""
    from kvsim.spec.hardware import load_hardware

    refuse_unmeasurable(settings.backend)
    base = load_hardware(settings.base)  # fail on a bad --base before measuring anything
    counts = settings.block_counts()
    largest = max(counts)
    pool_blocks = 2 * largest  # random ids from twice the batch: not all cache-resident
    rng = np.random.default_rng(settings.seed)
    total = len(OPERATIONS) * len(counts)
    results: list[OperationCalibration] = []
    date = (now or _dt.datetime.now(_dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open_backend(settings.backend, settings.layout, device_blocks=pool_blocks,
                      host_blocks=pool_blocks, staging_blocks=largest, disk_blocks=pool_blocks,
                      disk_dir=settings.disk_dir, seed=settings.seed,
                      cpu_timer=settings.cpu_timer) as backend:
        info = backend.device_info()
        if info.simulated:  # belt and braces: never record simulator timings
            refuse_unmeasurable("cuda")
        done = 0
        for op in OPERATIONS:
            # Warm up every size, then time in rounds over all sizes, so a burst of
            # interference (another process, a page-cache flush) spreads over sizes
            # instead of inflating every sample of one size.
            for n in counts:
                for _ in range(settings.warmup):
                    _run(backend, op, n, pool_blocks, rng)
            samples = {n: [] for n in counts}
            for _ in range(settings.repeats):
                for n in counts:
                    samples[n].append(_run(backend, op, n, pool_blocks, rng))
            medians = [float(np.median(samples[n])) for n in counts]
            mins = [float(np.min(samples[n])) for n in counts]
            maxs = [float(np.max(samples[n])) for n in counts]
            done += len(counts)
            if on_progress is not None:
                on_progress(done, total)
            sizes = tuple(n * settings.layout.block_bytes for n in counts)
            try:
                fit, error = fit_latency_bandwidth(sizes, medians), ""
            except KvsimError as exc:
                fit, error = None, str(exc)
            results.append(OperationCalibration(op, PROFILE_MAPPING[op], sizes, tuple(medians),
                                                tuple(mins), tuple(maxs), fit, error))
    fits = {r.operation: r.fit for r in results if r.fit is not None}
    profile = calibrated_profile(base, fits, info, date, settings)
    return Calibration(info, date, settings, tuple(results), profile)


def _run(backend, op: str, n: int, pool_blocks: int, rng: np.random.Generator) -> float:
    """One batch of ``n`` blocks of operation ``op``; elapsed microseconds."""
    ids = rng.choice(pool_blocks, size=n, replace=False)
    slots = rng.choice(pool_blocks, size=n, replace=False)
    if op == "gather":
        return backend.gather(ids)
    if op == "scatter":
        return backend.scatter(ids)
    if op == "spill":
        return backend.spill(ids, slots)
    if op == "promote":
        return backend.promote(slots, ids)
    # Disk: one contiguous extent at a random offset (a batch is written as one run).
    start = int(rng.integers(0, pool_blocks - n + 1))
    extent = np.arange(start, start + n)
    if op == "disk_write":
        return backend.write_disk(slots, extent)
    return backend.read_disk(extent, slots)


def _tier_path(base_tier, up: LinearFit | None, down: LinearFit | None):
    """(read, write, link) bandwidths giving ``up``/``down`` as the slowest-hop path in each
    direction; a missing fit keeps that direction's base path bandwidth."""
    up_bw = up.bandwidth_bytes_per_s if up else base_tier.path_bandwidth_bytes_per_s(True)
    down_bw = down.bandwidth_bytes_per_s if down else base_tier.path_bandwidth_bytes_per_s(False)
    return up_bw, down_bw, max(up_bw, down_bw)


def calibrated_profile(base, fits: dict[str, LinearFit], info: DeviceInfo, date: str,
                       settings: CalibrationSettings):
    """``base`` with the dram and nvme tiers' transfer numbers replaced by the fits (see
    the module docstring for the mapping) and calibrated provenance.  An operation missing
    from ``fits`` (its fit failed) leaves the base numbers it would have replaced."""
    how = f"calibrated: kvsim calibrate --backend {info.backend} on {info.device}, {date}"
    sources = dict(base.sources)
    tiers = dict(base.tiers)

    def said(op: str, what: str) -> str:
        fit = fits.get(op)
        if fit is None:
            return f"{how}: {op} fit failed, base profile path value kept"
        return (f"{how}: {what} {fit.bandwidth_bytes_per_s / 1e9:.3f} GB/s, "
                f"{fit.latency_us:.1f} us, R^2 {fit.r_squared:.4f}")

    promote, spill = fits.get("promote"), fits.get("spill")
    stand_in = (" (cpu backend: RAM-to-RAM copy standing in for the host link; PCIe not "
                "measured)" if info.backend == "cpu" else "")
    dram = tiers["dram"]
    read_bw, write_bw, link_bw = _tier_path(dram, promote, spill)
    tiers["dram"] = dataclasses.replace(
        dram, read_bandwidth_bytes_per_s=read_bw, write_bandwidth_bytes_per_s=write_bw,
        link_bandwidth_bytes_per_s=link_bw, latency_us=0.0,
        link_latency_us=promote.latency_us if promote else dram.latency_us + dram.link_latency_us)
    sources.update({
        "tiers.dram.read_bandwidth_bytes_per_s": said("promote", "promote (host -> pool)")
        + stand_in,
        "tiers.dram.write_bandwidth_bytes_per_s": said("spill", "spill (pool -> host)")
        + stand_in,
        "tiers.dram.link_bandwidth_bytes_per_s": f"{how}: max of promote and spill, so the "
                                                 "slowest hop is the measured direction",
        "tiers.dram.latency_us": f"{how}: included in link_latency_us (timed end to end)",
        "tiers.dram.link_latency_us": f"{how}: fitted latency of promote" if promote
        else f"{how}: promote fit failed, base latency_us + link_latency_us kept",
    })
    read, write = fits.get("disk_read"), fits.get("disk_write")
    nvme = tiers["nvme"]
    read_bw, write_bw, link_bw = _tier_path(nvme, read, write)
    tiers["nvme"] = dataclasses.replace(
        nvme, read_bandwidth_bytes_per_s=read_bw, write_bandwidth_bytes_per_s=write_bw,
        link_bandwidth_bytes_per_s=link_bw, link_latency_us=0.0,
        latency_us=read.latency_us if read else nvme.latency_us + nvme.link_latency_us)
    sources.update({
        "tiers.nvme.read_bandwidth_bytes_per_s": said("disk_read", "disk read")
        + f" ({info.disk_io})",
        "tiers.nvme.write_bandwidth_bytes_per_s": said("disk_write", "disk write incl. "
                                                       "fdatasync") + f" ({info.disk_io})",
        "tiers.nvme.latency_us": f"{how}: fitted latency of disk read" if read
        else f"{how}: disk read fit failed, base latency_us + link_latency_us kept",
        "tiers.nvme.link_bandwidth_bytes_per_s": f"{how}: max of disk read and write (disk "
                                                 "to host measured end to end; host to GPU "
                                                 "hop not measured)",
        "tiers.nvme.link_latency_us": f"{how}: driver and file-system overhead is inside "
                                      "latency_us",
    })
    for key in list(sources):
        if key.startswith("provenance."):
            del sources[key]
    layout = settings.layout
    provenance = {
        "kind": "calibrated",
        "backend": info.backend,
        "device": info.device,
        "driver": info.driver,
        "date": date,
        "timer": info.timer,
        "disk_io": info.disk_io,
        "base_profile": base.name,
        "measured": "tiers.dram (promote, spill), tiers.nvme (disk read, write)",
        "not_measured": "compute, tiers.hbm, tiers.cxl" + (
            ", PCIe (cpu backend: host memcpy stands in for the DRAM link)"
            if info.backend == "cpu" else ""),
        "layout": layout.describe(),
        "sizes_bytes": f"{settings.min_bytes}..{settings.max_bytes} (powers of two, whole "
                       "blocks)",
        "repeats": settings.repeats,
        "warmup": settings.warmup,
        "seed": settings.seed,
    }
    for op in OPERATIONS:
        fit = fits.get(op)
        provenance[f"fit_{op}"] = (
            f"latency {fit.latency_us:.3f} us, bandwidth {fit.bandwidth_bytes_per_s:.6g} B/s, "
            f"R^2 {fit.r_squared:.5f}, max |residual| "
            f"{100 * fit.max_abs_relative_residual:.1f}%" if fit
            else "failed: the medians admit no latency + bytes/bandwidth fit")
    name = settings.name or f"{base.name}-calibrated-{info.backend}"
    description = (f"{base.description}; dram and nvme tiers calibrated with --backend "
                   f"{info.backend} on {info.device}")
    return dataclasses.replace(base, name=name, description=description, tiers=tiers,
                               provenance=provenance, sources=sources)


def write_calibration(calibration: Calibration, path: str | Path) -> Path:
    """Write the calibrated profile as TOML (atomically, via :func:`save_hardware`)."""
    from kvsim.spec.hardware import save_hardware

    save_hardware(calibration.profile, path)
    return Path(path)
