"""The ``cuda`` backend: numba-cuda kernels over a device pool, a pinned host tier, one
stream, CUDA events for timing.

Importing this module imports ``numba.cuda``; nothing else in kvsim does unless the cuda
backend is asked for.  The same kernels run on a real GPU and under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``), which is how CI checks them byte for byte; simulator timings
are meaningless (:attr:`DeviceInfo.simulated` is True) and calibration refuses them.

Kernels: one launch per batch, grid ``(blocks in batch, 2 * layers)``, each thread block
copying one layer's K or V chunk of one block with a strided loop over words.  The host
tier is *mapped* pinned memory (``cuda.mapped_array``), so spill and promote are single
kernels that write/read host memory directly over the bus (zero-copy, the way LMCache's
multi-layer transfer kernel reaches pinned host buffers), with arbitrary host slots.
Block-id arrays are staged through pinned buffers and copied on the same stream inside the
timed region (a real batched operation ships its block table too).

Timing excludes the host: before each timed operation a one-thread kernel holds the stream
(:data:`HOLD_STREAM_NS`), so the start event, the copies, the kernel and the end event are
all queued before the GPU reaches them and the events time device work only.  Without it
the events also timed numba's Python launch path between ``start.record`` and the kernel:
on an H200 (2026-11-28, docs/benchmarks.md "On a real GPU") every
operation then showed ~590-640 us of "latency", and the quick calibration's small transfers
(64 KiB-1 MiB, 1-20 us of copying) fitted nothing.  The same "blocking kernel" technique is
NVIDIA nvbench's (its "blocking kernel", which ``state.set_disable_blocking_kernel`` turns off).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from numba import config as numba_config
from numba import cuda
from numba.core.errors import NumbaPerformanceWarning

from kvsim.backends.base import BlockLayout, DeviceInfo, KvBackend, check_ids, fill_random
from kvsim.backends.disk import DiskTier

#: Threads per CUDA block: a multiple of the 32-thread warp; 256 is a common copy-kernel
#: choice (enough warps per SM to hide memory latency; source: CUDA C++ Best Practices
#: Guide, "Thread and Block Heuristics").
THREADS_PER_BLOCK = 256

#: How long the hold kernel keeps the stream busy while the host queues one timed operation:
#: longer than the host's queueing of two id copies, one kernel launch and two event records
#: (about 0.6 ms through numba-cuda 0.30 on an H200 VM, measured 2026-11-28), with margin.
HOLD_STREAM_NS = 5_000_000


def _performance_warnings() -> tuple[type[Warning], ...]:
    """numba's performance-warning class, and numba-cuda's own where it has one (0.30 defines
    ``numba.cuda.core.errors.NumbaPerformanceWarning``, not a subclass of numba's)."""
    found = [NumbaPerformanceWarning]
    try:
        from numba.cuda.core.errors import NumbaPerformanceWarning as cuda_warning
    except ImportError:  # numba's bundled CUDA target, or an older numba-cuda
        return tuple(found)
    if cuda_warning is not NumbaPerformanceWarning:
        found.append(cuda_warning)
    return tuple(found)


_PERFORMANCE_WARNINGS = _performance_warnings()


@cuda.jit
def hold_stream_kernel(ns):  # pragma: no cover - device
    """One thread sleeps about ``ns`` nanoseconds (``nanosleep`` in 1 us steps, sm_70+)."""
    t = 0
    while t < ns:
        cuda.nanosleep(1000)
        t += 1000


@cuda.jit
def pool_to_store_kernel(pool, block_ids, store, store_slots):  # pragma: no cover - device
    """``store[store_slots[i], l, kv, :] = pool[l, kv, block_ids[i], :]``; grid (n, 2L)."""
    i = cuda.blockIdx.x
    lk = cuda.blockIdx.y
    layer = lk // 2
    kv = lk - 2 * layer
    b = block_ids[i]
    s = store_slots[i]
    words = pool.shape[3]
    w = cuda.threadIdx.x
    while w < words:
        store[s, layer, kv, w] = pool[layer, kv, b, w]
        w += cuda.blockDim.x


@cuda.jit
def store_to_pool_kernel(store, store_slots, pool, block_ids):  # pragma: no cover - device
    """``pool[l, kv, block_ids[i], :] = store[store_slots[i], l, kv, :]``; grid (n, 2L)."""
    i = cuda.blockIdx.x
    lk = cuda.blockIdx.y
    layer = lk // 2
    kv = lk - 2 * layer
    b = block_ids[i]
    s = store_slots[i]
    words = pool.shape[3]
    w = cuda.threadIdx.x
    while w < words:
        pool[layer, kv, b, w] = store[s, layer, kv, w]
        w += cuda.blockDim.x


def _threads(words: int) -> int:
    return min(THREADS_PER_BLOCK, max(32, -(-words // 32) * 32))


class CudaBackend(KvBackend):
    """Device pool and staging buffer in GPU memory, host tier in mapped pinned memory."""

    name = "cuda"

    def __init__(self, layout: BlockLayout, device_blocks: int, host_blocks: int,
                 staging_blocks: int, disk_blocks: int, disk_dir: str | Path | None = None,
                 seed: int = 0, direct_io: bool = True) -> None:
        self.layout = layout
        self.device_blocks = int(device_blocks)
        self.host_blocks = int(host_blocks)
        self.staging_blocks = int(staging_blocks)
        self.disk_blocks = int(disk_blocks)
        self.simulated = bool(numba_config.ENABLE_CUDASIM)
        word = layout.word_dtype
        self._stream = cuda.stream()
        self._pool = cuda.device_array(layout.pool_shape(self.device_blocks), dtype=word,
                                       stream=self._stream)
        self._staging = cuda.device_array(layout.blocks_shape(self.staging_blocks), dtype=word,
                                          stream=self._stream)
        self._host_mapped = cuda.mapped_array(layout.blocks_shape(self.host_blocks), dtype=word)
        self._host = np.asarray(self._host_mapped)  # host-side view of the same memory
        # Pre-touch every buffer with a known pattern, one layer / slot range at a time.
        for layer in range(layout.num_layers):
            part = np.empty(layout.pool_shape(self.device_blocks)[1:], dtype=word)
            fill_random(part, seed * 7919 + layer)
            self._pool[layer].copy_to_device(part, stream=self._stream)
            self._stream.synchronize()  # ``part`` is pageable and reused: finish first
        staging = np.empty(layout.blocks_shape(self.staging_blocks), dtype=word)
        fill_random(staging, seed + 1)
        self._staging.copy_to_device(staging, stream=self._stream)
        fill_random(self._host, seed + 2)
        self._stream.synchronize()
        self._ids_capacity = 0
        self._grow_ids(max(1, self.staging_blocks))
        self._disk = DiskTier(disk_dir, self.disk_blocks, layout.block_bytes,
                              self._host.reshape(self.host_blocks, -1).view(np.uint8),
                              direct=direct_io)

    # -- plumbing -------------------------------------------------------------------------
    def _grow_ids(self, n: int) -> None:
        if n <= self._ids_capacity:
            return
        self._ids_capacity = n
        self._pinned_a = cuda.pinned_array(n, dtype=np.int64)
        self._pinned_b = cuda.pinned_array(n, dtype=np.int64)
        self._dev_a = cuda.device_array(n, dtype=np.int64)
        self._dev_b = cuda.device_array(n, dtype=np.int64)

    def _launch(self, kernel, src, src_ids: np.ndarray, dst, dst_ids: np.ndarray) -> float:
        """Run ``kernel(src, src_ids, dst, dst_ids)`` for a batch; elapsed us (CUDA events)."""
        n = src_ids.size
        if n != dst_ids.size:
            raise ValueError("id arrays differ in length")
        if n == 0:
            return 0.0
        self._grow_ids(n)
        self._pinned_a[:n] = src_ids
        self._pinned_b[:n] = dst_ids
        start, end = cuda.event(), cuda.event()
        stream = self._stream
        with warnings.catch_warnings():
            # small grids are the point here (one thread holds the stream; a batch of a few
            # blocks is a few thread blocks): numba-cuda's low-occupancy performance warning
            # on every such launch would be noise in calibrate's output
            for category in _PERFORMANCE_WARNINGS:
                warnings.simplefilter("ignore", category)
            if not self.simulated:
                hold_stream_kernel[1, 1, stream](HOLD_STREAM_NS)
            start.record(stream)
            self._dev_a[:n].copy_to_device(self._pinned_a[:n], stream=stream)
            self._dev_b[:n].copy_to_device(self._pinned_b[:n], stream=stream)
            grid = (n, 2 * self.layout.num_layers)
            kernel[grid, _threads(self.layout.chunk_words), stream](
                src, self._dev_a[:n], dst, self._dev_b[:n])
            end.record(stream)
        end.synchronize()
        if self.simulated:
            # the simulator's events time nothing: numba's bundled simulator answers 0.0,
            # numba-cuda 0.30's (simulator/api.py, Event.elapsed_time) answers -1.0; a
            # simulated transfer takes 0 us, whichever simulator runs
            return 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            elapsed_ms = start.elapsed_time(end)
        return float(elapsed_ms) * 1e3

    # -- operations -----------------------------------------------------------------------
    def gather(self, block_ids: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("staging", np.arange(ids.size), self.staging_blocks)
        return self._launch(pool_to_store_kernel, self._pool, ids, self._staging, slots)

    def scatter(self, block_ids: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("staging", np.arange(ids.size), self.staging_blocks)
        return self._launch(store_to_pool_kernel, self._staging, slots, self._pool, ids)

    def spill(self, block_ids: np.ndarray, host_slots: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("host_slots", host_slots, self.host_blocks)
        return self._launch(pool_to_store_kernel, self._pool, ids, self._host_mapped, slots)

    def promote(self, host_slots: np.ndarray, block_ids: np.ndarray) -> float:
        ids = check_ids("block_ids", block_ids, self.device_blocks)
        slots = check_ids("host_slots", host_slots, self.host_blocks)
        return self._launch(store_to_pool_kernel, self._host_mapped, slots, self._pool, ids)

    # -- inspection -----------------------------------------------------------------------
    def pool_bytes(self) -> np.ndarray:
        host = self._pool.copy_to_host(stream=self._stream)
        self._stream.synchronize()
        shape = host.shape[:3] + (self.layout.chunk_bytes,)
        return np.ascontiguousarray(host).view(np.uint8).reshape(shape)

    def staging_bytes(self) -> np.ndarray:
        host = self._staging.copy_to_host(stream=self._stream)
        self._stream.synchronize()
        return np.ascontiguousarray(host).reshape(self.staging_blocks, -1).view(np.uint8)

    def _host_view(self) -> np.ndarray:
        return self._host

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(backend="cuda", device=gpu_name(), driver=driver_versions(),
                          timer="CUDA events on one stream (device ops); "
                                "time.perf_counter_ns (disk I/O)",
                          disk_io=self._disk.io_mode, simulated=self.simulated)


def gpu_name() -> str:
    """Name of the current GPU, or ``"CUDA simulator"``."""
    if numba_config.ENABLE_CUDASIM:
        return "CUDA simulator (numba)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def driver_versions() -> str:
    """``"driver X.Y; runtime X.Y"`` as reported by the CUDA driver and runtime."""
    if numba_config.ENABLE_CUDASIM:
        return "none (simulator)"
    parts = []
    try:
        from numba.cuda.cudadrv.driver import driver

        parts.append("driver " + ".".join(map(str, driver.get_version())))
    except Exception as exc:  # noqa: BLE001 - provenance only; say what failed
        parts.append(f"driver unknown ({type(exc).__name__})")
    try:
        parts.append("runtime " + ".".join(map(str, cuda.runtime.get_version())))
    except Exception as exc:  # noqa: BLE001
        parts.append(f"runtime unknown ({type(exc).__name__})")
    return "; ".join(parts)
