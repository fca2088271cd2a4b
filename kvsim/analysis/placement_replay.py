"""Placement replay: re-run a decision log's data movements on a real KV pool and compare
the measured time with what the simulator charged.

``kvsim replay --decision-log LOG --backend cpu|cuda`` = :func:`replay_decision_log`.

What is replayed (rows of :mod:`kvsim.results.log_schema`, in ``seq`` order):

=================  ==================  ============================================
action             path                backend operations (one batch each)
=================  ==================  ============================================
DEMOTE             HBM -> DRAM/CXL     spill (pool -> host tier)
DEMOTE             HBM -> NVME         spill, then disk write
DEMOTE             DRAM/CXL -> NVME    disk write
WRITE_THROUGH      same as DEMOTE      (the HBM copy stays; the bytes moved are equal)
PROMOTE, PREFETCH  DRAM/CXL -> HBM     promote (host tier -> pool)
PROMOTE, PREFETCH  NVME -> HBM         disk read, then promote
PROMOTE, PREFETCH  NVME -> DRAM/CXL    disk read
any of the above   DRAM <-> CXL        host copy (host slot -> host slot, by the CPU)
=================  ==================  ============================================

Other rows (evictions, recomputes, lifecycle facts) move no data and are not read;
movement rows on any other path are counted as skipped, by reason.  DRAM and CXL both live
in the backend's host tier (this machine has no CXL memory to time separately), each with
its own slot map, so a DRAM -> CXL move copies between two host slots.

Batching: the rows of one engine step with the same (action, from tier, to tier) are one
batch and one launch per operation, across all layers (a batch larger than a tier of the
real pool is split into pool-sized launches), as an engine submits a step's transfers
together.  A step's batches run in the order of their first row, so a block spilled to DRAM
and moved on to CXL in the same step is spilled first.  Blocks are mapped to slots of each real tier by
their identity (content hash, else request and block index) through a ring allocator per
tier (:class:`SlotRing`; DRAM and CXL have separate rings over the one host tier), so a
block spilled and later promoted is read from the host slot
it was written to, and consecutive new blocks get consecutive slots (one disk extent).

Predicted time is the sum of the rows' ``cost_us`` (what the simulator charged: 0 when it
hid a prefetch behind compute); measured time is the sum of the batches' timings.
``relative_error = (predicted - measured) / measured``: positive means the cost model
overestimates this machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from kvsim.backends import (
    BACKEND_NAMES,
    BlockLayout,
    DeviceInfo,
    KvBackend,
    open_backend,
    refuse_unmeasurable,
)
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import Tier
from kvsim.results.log_reader import DecisionLog, action_name, tier_name
from kvsim.results.log_schema import Action

MIB = 1 << 20

#: Actions whose rows move data.
MOVING_ACTIONS = (Action.DEMOTE, Action.WRITE_THROUGH, Action.PROMOTE, Action.PREFETCH)
_HOST_TIERS = (int(Tier.DRAM), int(Tier.CXL))
_HBM, _NVME = int(Tier.HBM), int(Tier.NVME)
_COLUMNS = ["seq", "step", "action", "content_hash", "request_id", "block_index",
            "from_tier", "to_tier", "bytes", "cost_us"]


def operations_for(action: int, from_tier: int, to_tier: int) -> tuple[str, ...] | None:
    """The backend operations replaying one movement, in order; None if not replayable."""
    down = action in (Action.DEMOTE, Action.WRITE_THROUGH)
    up = action in (Action.PROMOTE, Action.PREFETCH)
    if (down or up) and from_tier in _HOST_TIERS and to_tier in _HOST_TIERS \
            and from_tier != to_tier:
        return ("host_copy",)
    if down and from_tier == _HBM and to_tier in _HOST_TIERS:
        return ("spill",)
    if down and from_tier == _HBM and to_tier == _NVME:
        return ("spill", "disk_write")
    if down and from_tier in _HOST_TIERS and to_tier == _NVME:
        return ("disk_write",)
    if up and from_tier in _HOST_TIERS and to_tier == _HBM:
        return ("promote",)
    if up and from_tier == _NVME and to_tier == _HBM:
        return ("disk_read", "promote")
    if up and from_tier == _NVME and to_tier in _HOST_TIERS:
        return ("disk_read",)
    return None


class SlotRing:
    """Block identity -> slot of one real tier, ``capacity`` slots handed out round-robin.

    Invariant: a key keeps its slot until the ring comes round to that slot again and gives
    it to a new key (FIFO recycling; memory is bounded by ``capacity``, not by the log)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self._slot_of: dict[Hashable, int] = {}
        self._owner: list[Hashable | None] = [None] * self.capacity
        self._next = 0

    def slots(self, keys: list[Hashable]) -> np.ndarray:
        out = np.empty(len(keys), dtype=np.int64)
        for i, key in enumerate(keys):
            slot = self._slot_of.get(key)
            if slot is None:
                slot = self._next
                self._next = (self._next + 1) % self.capacity
                old = self._owner[slot]
                if old is not None:
                    del self._slot_of[old]
                self._owner[slot] = key
                self._slot_of[key] = slot
            out[i] = slot
        return out


@dataclass(frozen=True)
class ReplaySettings:
    """How to replay.  Pool sizes bound memory: each real tier holds ``pool_bytes``."""

    backend: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    block_bytes: int | None = field(default=None, metadata={
        "help": "bytes per block; default: the first movement row's bytes"})
    num_layers: int = field(default=32, metadata={
        "help": "layers of the inferred block layout (shapes the gather, not the bytes)"})
    pool_bytes: int = field(default=256 * MIB, metadata={
        "help": "bytes of each real tier (pool, host, disk file)"})
    max_rows: int | None = field(default=None, metadata={
        "help": "replay at most this many movement rows (None: all)"})
    disk_dir: str | None = field(default=None, metadata={"help": "disk tier scratch dir"})
    seed: int = field(default=0, metadata={"help": "seed of the pool's fill pattern"})
    cpu_timer: str = field(default="thread", metadata={
        "help": "cpu backend memory-copy clock: thread (CPU time) or wall"})

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_NAMES:
            raise KvsimInputError(f"expected one of {', '.join(BACKEND_NAMES)}, got "
                                  f"{self.backend!r}", field="backend")
        if self.pool_bytes <= 0:
            raise KvsimInputError(f"expected a positive size, got {self.pool_bytes}",
                                  field="pool_bytes")
        if self.max_rows is not None and self.max_rows < 1:
            raise KvsimInputError(f"expected at least 1, got {self.max_rows}", field="max_rows")
        if self.block_bytes is not None and self.block_bytes < 2:
            raise KvsimInputError(f"expected at least 2 bytes, got {self.block_bytes}",
                                  field="block_bytes")


@dataclass(frozen=True)
class ActionReplay:
    """Predicted vs measured time of one action type along one tier path."""

    action: str
    path: str  # "HBM->DRAM"
    operations: str  # "spill" or "disk_read+promote"
    rows: int
    blocks: int
    bytes: int
    batches: int
    predicted_us: float
    measured_us: float

    @property
    def predicted_mean_us(self) -> float:
        return self.predicted_us / self.rows

    @property
    def measured_mean_us(self) -> float:
        return self.measured_us / self.rows

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured; NaN if nothing was measured."""
        return (self.predicted_us - self.measured_us) / self.measured_us \
            if self.measured_us > 0 else math.nan


@dataclass(frozen=True)
class PlacementReplay:
    """Result of :func:`replay_decision_log`."""

    log_path: str
    policy: str
    device: DeviceInfo
    layout: BlockLayout
    pool_blocks: int
    rows_scanned: int  # movement rows read (DEMOTE, WRITE_THROUGH, PROMOTE, PREFETCH)
    rows_replayed: int
    skipped: dict[str, int]  # reason -> rows
    truncated: bool  # stopped at max_rows
    actions: tuple[ActionReplay, ...]

    def to_frame(self) -> pd.DataFrame:
        """One row per (action, path), then a TOTAL row."""
        rows = [self._row(a) for a in self.actions]
        if self.actions:
            total = ActionReplay("TOTAL", "", "", sum(a.rows for a in self.actions),
                                 sum(a.blocks for a in self.actions),
                                 sum(a.bytes for a in self.actions),
                                 sum(a.batches for a in self.actions),
                                 sum(a.predicted_us for a in self.actions),
                                 sum(a.measured_us for a in self.actions))
            rows.append(self._row(total))
        return pd.DataFrame(rows, columns=["action", "path", "operations", "rows", "blocks",
                                           "bytes", "batches", "predicted_us", "measured_us",
                                           "predicted_mean_us", "measured_mean_us",
                                           "relative_error"])

    @staticmethod
    def _row(a: ActionReplay) -> dict:
        return {"action": a.action, "path": a.path, "operations": a.operations,
                "rows": a.rows, "blocks": a.blocks, "bytes": a.bytes, "batches": a.batches,
                "predicted_us": a.predicted_us, "measured_us": a.measured_us,
                "predicted_mean_us": a.predicted_mean_us,
                "measured_mean_us": a.measured_mean_us, "relative_error": a.relative_error}


@dataclass
class _Tally:
    rows: int = 0
    blocks: int = 0
    bytes: int = 0
    batches: int = 0
    predicted_us: float = 0.0
    measured_us: float = 0.0


def _movement_filter() -> ds.Expression:
    return ds.field("action").isin([int(a) for a in MOVING_ACTIONS])


def first_block_bytes(log: DecisionLog) -> int:
    """Bytes of the first replayable movement row (the block size of the log)."""
    for batch in log.scan(_COLUMNS, _movement_filter()):
        cols = {name: batch.column(name).to_numpy() for name in _COLUMNS}
        for i in range(batch.num_rows):
            if operations_for(int(cols["action"][i]), int(cols["from_tier"][i]),
                              int(cols["to_tier"][i])) is not None:
                nbytes = int(cols["bytes"][i])
                if nbytes <= 0:
                    raise KvsimInputError(f"expected bytes > 0 on a data movement, got "
                                          f"{nbytes}", log.path, f"seq {cols['seq'][i]}",
                                          "bytes")
                return nbytes
    raise KvsimInputError("expected at least one DEMOTE, WRITE_THROUGH, PROMOTE or PREFETCH "
                          "row between HBM, DRAM, CXL and NVME, found none (was the "
                          "simulation run with lower tiers?)", log.path, None, "action")


class _Replayer:
    """Runs batches on the backend and tallies them per (action, path)."""

    def __init__(self, backend: KvBackend) -> None:
        self.backend = backend
        self.rings = {int(Tier.HBM): SlotRing(backend.device_blocks),
                      int(Tier.DRAM): SlotRing(backend.host_blocks),
                      int(Tier.CXL): SlotRing(backend.host_blocks),
                      int(Tier.NVME): SlotRing(backend.disk_blocks)}
        self.chunk = min(backend.device_blocks, backend.host_blocks, backend.disk_blocks)
        self.tallies: dict[tuple[int, int, int], _Tally] = {}

    def run(self, action: int, frm: int, to: int, keys: list[Hashable], rows: int,
            nbytes: int, predicted_us: float) -> None:
        ops = operations_for(action, frm, to)
        measured = 0.0
        # The host tier a movement passes through: the host end of the path (DRAM or
        # CXL), or DRAM for HBM <-> NVME (staged through host memory).
        host_tier = next((t for t in (to, frm) if t in _HOST_TIERS), int(Tier.DRAM))
        for start in range(0, len(keys), self.chunk):
            part = keys[start:start + self.chunk]
            slots = {t: self.rings[t].slots(part) for t in {frm, to, host_tier}}
            dev, host = slots.get(_HBM), slots[host_tier]
            for op in ops:
                if op == "spill":
                    measured += self.backend.spill(dev, host)
                elif op == "promote":
                    measured += self.backend.promote(host, dev)
                elif op == "disk_write":
                    measured += self.backend.write_disk(host, slots[_NVME])
                elif op == "disk_read":
                    measured += self.backend.read_disk(slots[_NVME], host)
                else:  # host_copy between two host tiers
                    measured += self.backend.copy_host(slots[frm], slots[to])
        tally = self.tallies.setdefault((action, frm, to), _Tally())
        tally.rows += rows
        tally.blocks += len(keys)
        tally.bytes += nbytes
        tally.batches += 1
        tally.predicted_us += predicted_us
        tally.measured_us += measured

    def warm_up(self) -> None:
        """One untimed block through every operation (loads compiled kernels, faults in
        page tables), so the first timed batch is not charged for it."""
        one = np.zeros(1, dtype=np.int64)
        self.backend.copy_host(one, one)
        self.backend.spill(one, one)
        self.backend.promote(one, one)
        self.backend.write_disk(one, one)
        self.backend.read_disk(one, one)

    def results(self) -> tuple[ActionReplay, ...]:
        out = []
        for (action, frm, to), t in sorted(self.tallies.items()):
            out.append(ActionReplay(action_name(action), f"{tier_name(frm)}->{tier_name(to)}",
                                    "+".join(operations_for(action, frm, to)), t.rows,
                                    t.blocks, t.bytes, t.batches, t.predicted_us,
                                    t.measured_us))
        return tuple(out)


def replay_decision_log(log_path: str | Path, settings: ReplaySettings = ReplaySettings(),
                        on_progress: Callable[[int, int], None] | None = None
                        ) -> PlacementReplay:
    """Replay the data movements of a decision log on a real pool (see module docstring).

    ``on_progress(rows_scanned, total_rows_in_log)`` is called after each scanned batch.
    Raises :class:`KvsimInputError` for a log that is not a kvsim decision log, a movement
    row with ``bytes <= 0`` or a negative/NaN ``cost_us`` (naming its ``seq``), or a log
    with no replayable movement.
    """
    refuse_unmeasurable(settings.backend)
    log = DecisionLog(log_path)
    block_bytes = settings.block_bytes or first_block_bytes(log)
    layout = BlockLayout.from_block_bytes(block_bytes, settings.num_layers)
    pool_blocks = max(1, settings.pool_bytes // block_bytes)
    skipped: dict[str, int] = {}
    scanned = replayed = 0
    truncated = False
    with open_backend(settings.backend, layout, device_blocks=pool_blocks,
                      host_blocks=pool_blocks, staging_blocks=1, disk_blocks=pool_blocks,
                      disk_dir=settings.disk_dir, seed=settings.seed,
                      cpu_timer=settings.cpu_timer) as backend:
        info = backend.device_info()
        if info.simulated:
            refuse_unmeasurable("cuda")
        replayer = _Replayer(backend)
        replayer.warm_up()
        step_now: int | None = None
        # (action, from, to) -> [keys, rows, bytes, predicted_us]; insertion order = the
        # order of each batch's first row in the step.
        groups: dict[tuple[int, int, int], list] = {}

        def flush() -> None:
            for (action, frm, to), (keys, rows, nbytes, predicted) in groups.items():
                replayer.run(action, frm, to, keys, rows, nbytes, predicted)
            groups.clear()

        for batch in log.scan(_COLUMNS, _movement_filter()):
            c = {name: batch.column(name).to_numpy() for name in _COLUMNS}
            for i in range(batch.num_rows):
                scanned += 1
                action, frm, to = int(c["action"][i]), int(c["from_tier"][i]), int(c["to_tier"][i])
                if operations_for(action, frm, to) is None:
                    reason = (f"{action_name(action)} {tier_name(frm)}->{tier_name(to)}: no "
                              "backend operation")
                    skipped[reason] = skipped.get(reason, 0) + 1
                    continue
                if settings.max_rows is not None and replayed >= settings.max_rows:
                    truncated = True
                    break
                size = int(c["bytes"][i])
                cost = float(c["cost_us"][i])
                where = f"seq {c['seq'][i]}"
                if size <= 0:
                    raise KvsimInputError(f"expected bytes > 0 on a data movement, got {size}",
                                          log.path, where, "bytes")
                if not cost >= 0:
                    raise KvsimInputError(f"expected cost_us >= 0, got {cost}", log.path, where,
                                          "cost_us")
                step = int(c["step"][i])
                if step != step_now:
                    flush()
                    step_now = step
                group = groups.setdefault((action, frm, to), [[], 0, 0, 0.0])
                h = int(c["content_hash"][i])
                base = h if h != 0 else (int(c["request_id"][i]), int(c["block_index"][i]))
                n = -(-size // block_bytes)
                group[0].extend([base] if n == 1 else [(base, k) for k in range(n)])
                group[1] += 1
                group[2] += size
                group[3] += cost
                replayed += 1
            if on_progress is not None:
                on_progress(scanned, log.num_rows)
            if truncated:
                break
        flush()
        actions = replayer.results()
    return PlacementReplay(str(log.path), log.policy, info, layout, pool_blocks, scanned,
                           replayed, dict(sorted(skipped.items())), truncated, actions)
