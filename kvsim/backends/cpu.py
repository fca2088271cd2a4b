"""The ``cpu`` backend: the "device" pool is a numpy array in RAM, copies are numba loops,
the disk tier is file I/O (:mod:`kvsim.backends.disk`), timed with ``time.perf_counter_ns``.

What it stands for: spill/promote are RAM-to-RAM copies, the stand-in for the HBM<->DRAM
link (a CPU cannot measure PCIe); gather/scatter are RAM copies between the pool and a
contiguous buffer; disk reads/writes measure the machine's real storage.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numba
import numpy as np

from kvsim.backends import kernels
from kvsim.backends.base import (BlockLayout, DeviceInfo, KvBackend, aligned_empty, check_ids,
                                 fill_random)
from kvsim.backends.disk import DiskTier


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuBackend(KvBackend):
    """Pool, staging buffer and host tier are page-aligned numpy arrays, pre-touched with a
    deterministic pattern at construction (``seed``)."""

    name = "cpu"

    def __init__(self, layout: BlockLayout, device_blocks: int, host_blocks: int,
                 staging_blocks: int, disk_blocks: int, disk_dir: str | Path | None = None,
                 seed: int = 0, direct_io: bool = True) -> None:
        self.layout = layout
        self.device_blocks = int(device_blocks)
        self.host_blocks = int(host_blocks)
        self.staging_blocks = int(staging_blocks)
        self.disk_blocks = int(disk_blocks)
        word = layout.word_dtype
        self._pool = aligned_empty(layout.pool_shape(self.device_blocks), word)
        self._staging = aligned_empty(layout.blocks_shape(self.staging_blocks), word)
        self._host = aligned_empty(layout.blocks_shape(self.host_blocks), word)
        fill_random(self._pool, seed)
        fill_random(self._staging, seed + 1)
        fill_random(self._host, seed + 2)
        self._disk = DiskTier(disk_dir, self.disk_blocks, layout.block_bytes,
                              self._host.reshape(self.host_blocks, -1).view(np.uint8),
                              direct=direct_io)

    def _timed(self, fn, *args) -> float:
        t0 = time.perf_counter_ns()
        fn(*args)
        return (time.perf_counter_ns() - t0) / 1e3

    def gather(self, block_ids: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("staging", np.arange(ids.size), self.staging_blocks)
        return self._timed(kernels.pool_to_store, self._pool, ids, self._staging, slots)

    def scatter(self, block_ids: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("staging", np.arange(ids.size), self.staging_blocks)
        return self._timed(kernels.store_to_pool, self._staging, slots, self._pool, ids)

    def spill(self, block_ids: np.ndarray, host_slots: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("host_slots", host_slots, self.host_blocks)
        if ids.size != slots.size:
            raise ValueError("block_ids and host_slots differ in length")
        return self._timed(kernels.pool_to_store, self._pool, ids, self._host, slots)

    def promote(self, host_slots: np.ndarray, block_ids: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("host_slots", host_slots, self.host_blocks)
        if ids.size != slots.size:
            raise ValueError("block_ids and host_slots differ in length")
        return self._timed(kernels.store_to_pool, self._host, slots, self._pool, ids)

    def pool_bytes(self) -> np.ndarray:
        shape = self._pool.shape[:3] + (self.layout.chunk_bytes,)
        return self._pool.view(np.uint8).reshape(shape).copy()

    def staging_bytes(self) -> np.ndarray:
        return self._staging.reshape(self.staging_blocks, -1).view(np.uint8).copy()

    def _host_view(self) -> np.ndarray:
        return self._host

    def device_info(self) -> DeviceInfo:
        uname = os.uname()
        return DeviceInfo(
            backend="cpu",
            device=cpu_model(),
            driver=f"{uname.sysname} {uname.release}; numba {numba.__version__}; "
                   f"numpy {np.__version__}",
            timer="time.perf_counter_ns (host wall clock, monotonic)",
            disk_io=self._disk.io_mode,
        )
