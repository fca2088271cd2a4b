"""The real KV block pool every backend implements: layout, tiers and batched operations.

Pool layout (the "combined K/V pool"): ONE array of shape
``(num_layers, 2, num_blocks, chunk_words)`` holds K and V of every layer, so a single kernel
launch moves a batch of blocks across all layers (as LMCache's multi-layer transfer kernel
and vLLM's cross-layer copies do), never one launch per layer.  ``chunk`` is one layer's K
(or V) of one block: ``block_tokens * num_kv_heads * head_dim`` elements.

Below the pool, a block is stored in ONE contiguous run of ``block_bytes`` bytes, shaped
``(num_layers, 2, chunk_words)``: the host tier is an array ``(host_blocks, num_layers, 2,
chunk_words)``, the staging buffer (target of gathers) has the same shape, and the disk tier
is a file of ``disk_blocks`` such runs (see :mod:`kvsim.backends.disk`).

A copy moves bytes; the element type only fixes the element width (fp16/bf16: 2 bytes, fp8:
1 byte, fp32: 4).  Arrays are therefore stored as the widest unsigned integer word that
divides a chunk (uint64 for any real model), which keeps kernels simple and exact.

Operations: gather/scatter (pool <-> staging), spill/promote (pool <-> host tier), copy_host
(host slot -> host slot), write_disk/read_disk (host tier <-> disk tier).  Every batched
operation returns the elapsed time of the whole batch in microseconds,
measured with the backend's timer (:attr:`DeviceInfo.timer`).  Invariant: an operation
touches exactly the named blocks/slots (tests check neighbours byte for byte).
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass

import numpy as np

from kvsim.core.errors import KvsimInputError

#: Bytes per element of each KV dtype (fp8 = e4m3/e5m2, 1 byte).
DTYPE_BYTES: dict[str, int] = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4}

#: Alignment of host buffers and disk I/O: one 4 KiB page (O_DIRECT needs logical-block
#: alignment, 512 B or 4 KiB on current Linux block devices; a page satisfies both).
PAGE_BYTES = 4096


@dataclass(frozen=True)
class BlockLayout:
    """Shape of one KV block: layers x {K, V} x block tokens x KV heads x head dim."""

    num_layers: int
    block_tokens: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "fp16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "block_tokens", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise KvsimInputError(f"expected a positive integer, got {value!r}",
                                      field=name)
        if self.dtype not in DTYPE_BYTES:
            raise KvsimInputError(f"expected one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}",
                                  field="dtype")

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one layer's K (or V) of one block."""
        return self.block_tokens * self.num_kv_heads * self.head_dim * self.element_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return self.num_layers * 2 * self.chunk_bytes

    @property
    def word_dtype(self) -> np.dtype:
        """Widest unsigned word dividing a chunk: the storage type of every array."""
        for dtype in (np.uint64, np.uint32, np.uint16):
            if self.chunk_bytes % np.dtype(dtype).itemsize == 0:
                return np.dtype(dtype)
        return np.dtype(np.uint8)

    @property
    def chunk_words(self) -> int:
        return self.chunk_bytes // self.word_dtype.itemsize

    def pool_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        return (self.num_layers, 2, num_blocks, self.chunk_words)

    def blocks_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        return (num_blocks, self.num_layers, 2, self.chunk_words)

    def describe(self) -> str:
        return (f"{self.num_layers} layers x K/V x {self.block_tokens} tokens x "
                f"{self.num_kv_heads} KV heads x {self.head_dim} head dim, {self.dtype} "
                f"= {self.block_bytes} bytes/block")

    def to_dict(self) -> dict:
        return asdict(self) | {"block_bytes": self.block_bytes}

    @classmethod
    def from_block_bytes(cls, block_bytes: int, num_layers: int = 32) -> BlockLayout:
        """A layout with exactly ``block_bytes`` per block, for replaying a decision log that
        records bytes but not the model's shape.  Uses ``num_layers`` layers when it divides
        the block evenly, else the largest layer count not above it that does; one chunk is
        then ``block_bytes / (2 * layers)`` bytes (expressed as 1 token x 1 head)."""
        if block_bytes < 2:
            raise KvsimInputError(f"expected a block of at least 2 bytes, got {block_bytes}",
                                  field="bytes")
        layers = next(n for n in range(max(1, min(num_layers, block_bytes // 2)), 0, -1)
                      if block_bytes % (2 * n) == 0)
        chunk = block_bytes // (2 * layers)
        dtype = "fp16" if chunk % 2 == 0 else "fp8"
        return cls(layers, 1, 1, chunk // DTYPE_BYTES[dtype], dtype)


#: Layout used by ``kvsim calibrate`` by default: 8 layers x K/V x 16 tokens x 1 KV head x
#: 128 head dim, fp16 = 4 KiB chunks (one page, the O_DIRECT unit) and 64 KiB blocks, so the
#: smallest calibrated transfer (64 KiB) is exactly one block.
CALIBRATION_LAYOUT = BlockLayout(num_layers=8, block_tokens=16, num_kv_heads=1, head_dim=128,
                                 dtype="fp16")


@dataclass(frozen=True)
class DeviceInfo:
    """Provenance of measurements taken by a backend."""

    backend: str  # "cpu" | "cuda"
    device: str  # CPU model or GPU name
    driver: str  # OS kernel / CUDA driver and runtime versions
    timer: str  # what timed the operations
    disk_io: str  # "O_DIRECT" or "buffered (page cache dropped before reads)"
    simulated: bool = False  # True under the numba CUDA simulator: timings are meaningless


def aligned_empty(shape: tuple[int, ...], dtype, alignment: int = PAGE_BYTES) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``alignment`` boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def check_ids(name: str, ids: np.ndarray, limit: int) -> np.ndarray:
    """``ids`` as a contiguous int64 array, every value in ``[0, limit)`` (a bug otherwise)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"{name}: expected a 1-d array of ids")
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        raise ValueError(f"{name}: ids must lie in [0, {limit}), got {ids.min()}..{ids.max()}")
    return ids


class KvBackend(abc.ABC):
    """A real KV block pool (device), a host tier, a staging buffer and a disk tier.

    Sizes are fixed at construction.  Each operation takes equally long arrays of ids and
    moves whole blocks; it returns the batch's elapsed microseconds.  A backend owns a
    scratch file for its disk tier: use it as a context manager (or call :meth:`close`).
    """

    name: str
    layout: BlockLayout
    device_blocks: int
    host_blocks: int
    staging_blocks: int
    disk_blocks: int

    # --- batched operations (one launch per batch, across all layers) ------------------
    @abc.abstractmethod
    def gather(self, block_ids: np.ndarray) -> float:
        """Copy pool blocks ``block_ids`` into staging slots ``0..n-1`` (contiguous)."""

    @abc.abstractmethod
    def scatter(self, block_ids: np.ndarray) -> float:
        """Copy staging slots ``0..n-1`` into pool blocks ``block_ids``."""

    @abc.abstractmethod
    def spill(self, block_ids: np.ndarray, host_slots: np.ndarray) -> float:
        """Copy pool blocks to host-tier slots (device to host)."""

    @abc.abstractmethod
    def promote(self, host_slots: np.ndarray, block_ids: np.ndarray) -> float:
        """Copy host-tier slots to pool blocks (host to device)."""

    def copy_host(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> float:
        """Copy host-tier slots to other host-tier slots (a move between two host memories,
        e.g. DRAM to CXL; the CPU copies, on every backend), timed with the backend's
        host clock (``_clock``; ``perf_counter_ns`` unless the backend sets one)."""
        import time

        from kvsim.backends.kernels import store_to_store

        src = check_ids("src_slots", src_slots, self.host_blocks)
        dst = check_ids("dst_slots", dst_slots, self.host_blocks)
        if src.size != dst.size:
            raise ValueError("src_slots and dst_slots differ in length")
        host = self._host_view()
        clock = getattr(self, "_clock", time.perf_counter_ns)
        t0 = clock()
        store_to_store(host, src, host, dst)
        return (clock() - t0) / 1e3

    def write_disk(self, host_slots: np.ndarray, disk_slots: np.ndarray) -> float:
        """Write host-tier slots to disk-tier slots (durable: includes one fdatasync)."""
        return self._disk.write(check_ids("host_slots", host_slots, self.host_blocks),
                                check_ids("disk_slots", disk_slots, self.disk_blocks))

    def read_disk(self, disk_slots: np.ndarray, host_slots: np.ndarray) -> float:
        """Read disk-tier slots into host-tier slots (from the device, not the page cache)."""
        return self._disk.read(check_ids("disk_slots", disk_slots, self.disk_blocks),
                               check_ids("host_slots", host_slots, self.host_blocks))

    # --- inspection (tests, debugging): host copies of whole tiers as bytes -------------
    @abc.abstractmethod
    def pool_bytes(self) -> np.ndarray:
        """A host copy of the pool as uint8, shape ``(layers, 2, device_blocks, chunk_bytes)``."""

    @abc.abstractmethod
    def staging_bytes(self) -> np.ndarray:
        """A host copy of the staging buffer, uint8 ``(staging_blocks, block_bytes)``."""

    def host_bytes(self) -> np.ndarray:
        """A copy of the host tier, uint8 ``(host_blocks, block_bytes)``."""
        return self._host_view().reshape(self.host_blocks, -1).view(np.uint8).copy()

    def disk_bytes(self) -> np.ndarray:
        """The disk tier's content, uint8 ``(disk_blocks, block_bytes)``."""
        return self._disk.snapshot()

    @abc.abstractmethod
    def device_info(self) -> DeviceInfo:
        """Where and how this backend measures."""

    @abc.abstractmethod
    def _host_view(self) -> np.ndarray:
        """The host tier as a numpy array (shape ``layout.blocks_shape(host_blocks)``)."""

    _disk: object

    def close(self) -> None:
        """Release the disk tier's scratch file (idempotent)."""
        disk = getattr(self, "_disk", None)
        if disk is not None:
            disk.close()

    def __enter__(self) -> KvBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fill_random(array: np.ndarray, seed: int) -> None:
    """Fill ``array`` (unsigned words, C-contiguous) in place with a deterministic
    pseudo-random pattern (splitmix64 of the word index and ``seed``), so a copy can be
    checked byte for byte and every page is touched before any timing."""
    from kvsim.backends.kernels import fill_splitmix

    flat = array.reshape(-1)
    if flat.size and not np.shares_memory(flat, array):
        raise ValueError("fill_random needs a C-contiguous array")
    fill_splitmix(flat, np.uint64(seed))
