"""The ``cpu`` backend: the "device" pool is a numpy array in RAM, copies are numba loops,
the disk tier is file I/O (:mod:`kvsim.backends.disk`).

Timers (:data:`CPU_TIMERS`): memory copies are timed with ``time.thread_time_ns`` by
default, the CPU time of the copying thread, which is the copy's cost on a core of its own
and excludes the time the process was preempted (on a shared 2-core machine with a load of
15, wall-clock medians of 4 MiB+ copies were 7-9x their CPU time); ``timer="wall"`` uses
``time.perf_counter_ns`` instead.  Disk I/O is always wall-clock (``perf_counter_ns``): a
thread waiting for the device uses no CPU time.

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
from kvsim.backends.base import (
    BlockLayout,
    DeviceInfo,
    KvBackend,
    aligned_empty,
    check_ids,
    fill_random,
)
from kvsim.backends.disk import DiskTier
from kvsim.core.errors import KvsimInputError

#: Memory-copy timers: name -> (clock returning ns, description).
CPU_TIMERS = {
    "thread": (time.thread_time_ns, "time.thread_time_ns (CPU time of the copying thread)"),
    "wall": (time.perf_counter_ns, "time.perf_counter_ns (wall clock)"),
}


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
    deterministic pattern at construction (``seed``).  ``timer``: ``"thread"`` (CPU time of
    the copying thread, default) or ``"wall"`` for memory copies."""

    name = "cpu"

    def __init__(self, layout: BlockLayout, device_blocks: int, host_blocks: int,
                 staging_blocks: int, disk_blocks: int, disk_dir: str | Path | None = None,
                 seed: int = 0, direct_io: bool = True, timer: str = "thread") -> None:
        if timer not in CPU_TIMERS:
            raise KvsimInputError(f"expected one of {', '.join(CPU_TIMERS)}, got {timer!r}",
                                  field="cpu_timer")
        self.timer = timer
        self._clock = CPU_TIMERS[timer][0]
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
        t0 = self._clock()
        fn(*args)
        return (self._clock() - t0) / 1e3

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
            timer=f"{CPU_TIMERS[self.timer][1]} (memory copies); time.perf_counter_ns "
                  "(disk I/O, wall clock)",
            disk_io=self._disk.io_mode,
        )
