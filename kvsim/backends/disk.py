"""The disk tier: a scratch file of fixed-size block slots, read and written with
``os.preadv`` / ``os.pwritev`` from the host tier.

Slot ``k`` occupies bytes ``[k * block_bytes, (k + 1) * block_bytes)`` of the file.  A batch
is issued as one vectored call per run of consecutive disk slots (at most ``IOV_MAX`` blocks
per call), never one call per layer.

I/O mode: the file is opened with ``O_DIRECT`` (bypassing the page cache) when the platform
has it, the block size and the host buffer are page aligned and the filesystem accepts it;
otherwise it falls back to buffered I/O.  :attr:`DiskTier.io_mode` says which.

The fsync rule: a write batch is timed up to and including ONE ``os.fdatasync`` of the file,
so a measured write is data on the device, not in the page cache (with or without
``O_DIRECT``, which does not flush the device's write cache).  In buffered mode the file's
pages are dropped (``posix_fadvise(DONTNEED)``, untimed) before every read batch, so a
measured read comes from the device, not from memory.  The file is pre-written in full at
creation so no measured write pays for allocating file extents.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from kvsim.backends.base import PAGE_BYTES

#: Most iovecs one preadv/pwritev call accepts (POSIX IOV_MAX; 1024 on Linux).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
#: Bytes written per call while pre-writing the file at creation.
_PREWRITE_CHUNK_BYTES = 8 << 20


class DiskTier:
    """``num_blocks`` slots of ``block_bytes`` in a scratch file under ``directory``.

    ``host`` is the host tier as a uint8 array ``(host_blocks, block_bytes)``; reads land in
    it and writes come from it (rows must be C-contiguous).  The file is removed by
    :meth:`close`.
    """

    def __init__(self, directory: str | Path | None, num_blocks: int, block_bytes: int,
                 host: np.ndarray, direct: bool = True) -> None:
        self.num_blocks = int(num_blocks)
        self.block_bytes = int(block_bytes)
        self._host = host
        directory = Path(directory) if directory is not None else Path(tempfile.gettempdir())
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="kvsim-disk-tier-", suffix=".bin", dir=directory)
        os.close(fd)
        self.path = Path(name)
        self._fd = -1
        try:
            self._open(direct and self._direct_possible())
            self._prewrite()
        except BaseException:
            self.close()
            raise

    # -- setup ----------------------------------------------------------------------------
    def _direct_possible(self) -> bool:
        return (hasattr(os, "O_DIRECT") and self.block_bytes % PAGE_BYTES == 0
                and self._host.ctypes.data % PAGE_BYTES == 0)

    def _open(self, direct: bool) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        flags = os.O_RDWR
        if direct:
            try:
                self._fd = os.open(self.path, flags | os.O_DIRECT)
                self.io_mode = "O_DIRECT"
                return
            except OSError:
                pass  # filesystem refuses O_DIRECT (tmpfs, some overlays): buffered
        self._fd = os.open(self.path, flags)
        self.io_mode = "buffered (page cache dropped before reads)"

    def _prewrite(self) -> None:
        total = self.num_blocks * self.block_bytes
        chunk = np.zeros(min(_PREWRITE_CHUNK_BYTES, max(total, 1)) + PAGE_BYTES, dtype=np.uint8)
        offset_in = (-chunk.ctypes.data) % PAGE_BYTES
        buf = memoryview(chunk[offset_in:offset_in + min(_PREWRITE_CHUNK_BYTES, total)])
        done = 0
        while done < total:
            n = min(len(buf), total - done)
            try:
                os.pwrite(self._fd, buf[:n], done)
            except OSError:
                if self.io_mode != "O_DIRECT":
                    raise
                self._open(False)  # O_DIRECT accepted at open but not for I/O: fall back
                continue
            done += n
        os.fsync(self._fd)

    # -- batched I/O ------------------------------------------------------------------------
    def _runs(self, disk_slots: np.ndarray):
        """Yield (start index, end index) of runs of consecutive disk slots (<= IOV_MAX)."""
        n = disk_slots.size
        start = 0
        for i in range(1, n + 1):
            if (i == n or disk_slots[i] != disk_slots[i - 1] + 1 or i - start >= IOV_MAX):
                yield start, i
                start = i

    def _vectors(self, host_slots: np.ndarray, a: int, b: int) -> list[memoryview]:
        return [memoryview(self._host[s]) for s in host_slots[a:b].tolist()]

    def write(self, host_slots: np.ndarray, disk_slots: np.ndarray) -> float:
        """Write host rows ``host_slots`` to disk slots; returns elapsed us incl. fdatasync."""
        if host_slots.size != disk_slots.size:
            raise ValueError("host_slots and disk_slots differ in length")
        t0 = time.perf_counter_ns()
        for a, b in self._runs(disk_slots):
            os.pwritev(self._fd, self._vectors(host_slots, a, b),
                       int(disk_slots[a]) * self.block_bytes)
        os.fdatasync(self._fd)
        return (time.perf_counter_ns() - t0) / 1e3

    def read(self, disk_slots: np.ndarray, host_slots: np.ndarray) -> float:
        """Read disk slots into host rows ``host_slots``; returns elapsed us."""
        if host_slots.size != disk_slots.size:
            raise ValueError("host_slots and disk_slots differ in length")
        if self.io_mode != "O_DIRECT" and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter_ns()
        for a, b in self._runs(disk_slots):
            os.preadv(self._fd, self._vectors(host_slots, a, b),
                      int(disk_slots[a]) * self.block_bytes)
        return (time.perf_counter_ns() - t0) / 1e3

    def snapshot(self) -> np.ndarray:
        """The whole file as uint8 ``(num_blocks, block_bytes)`` (read buffered, untimed)."""
        with open(self.path, "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
        return data.reshape(self.num_blocks, self.block_bytes).copy()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
