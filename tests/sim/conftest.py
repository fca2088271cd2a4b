"""Builders for tiny hand-made event traces and a tiny hardware profile with round numbers.

Blocks are 4 tokens of 25 bytes each (100 bytes per block).  The ``tiny`` profile's DRAM
tier: 2000 bytes (20 blocks), medium 1 GB/s and 1 us, link 0.1 GB/s (100 bytes/us) and
4 us, so promoting n blocks costs 5 us + n x 1 us; CXL and NVMe are disabled.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvsim.core.schema import COLUMN_NAMES, DEFAULTS, EventHeader, EventKind, Phase
from kvsim.events import write_events

TINY_PROFILE = """\
name = "tiny"
description = "test profile with round numbers"

[compute]
peak_dense_bf16_flops_per_s = 1.0e15  # source: test value
achievable_flops_fraction = 0.5  # source: test value
hbm_bandwidth_bytes_per_s = 1.0e12  # source: test value
achievable_bandwidth_fraction = 0.8  # source: test value
gpu_memory_bytes = 80_000_000_000  # source: test value

[tiers.hbm]
read_bandwidth_bytes_per_s = 1.0e12  # source: test value
write_bandwidth_bytes_per_s = 1.0e12  # source: test value
latency_us = 0.0  # source: test value

[tiers.dram]
capacity_bytes = 2000  # source: test value (20 blocks of 100 bytes)
read_bandwidth_bytes_per_s = 1.0e9  # source: test value
write_bandwidth_bytes_per_s = 1.0e9  # source: test value
latency_us = 1.0  # source: test value
link = "test"  # source: test value
link_bandwidth_bytes_per_s = 1.0e8  # source: test value (100 bytes per us)
link_latency_us = 4.0  # source: test value

[tiers.cxl]
capacity_bytes = 0  # source: test value (disabled)
read_bandwidth_bytes_per_s = 1.0e8  # source: test value
write_bandwidth_bytes_per_s = 1.0e8  # source: test value
latency_us = 2.0  # source: test value
link = "test"  # source: test value
link_bandwidth_bytes_per_s = 5.0e7  # source: test value (50 bytes per us)
link_latency_us = 8.0  # source: test value

[tiers.nvme]
capacity_bytes = 0  # source: test value (disabled)
read_bandwidth_bytes_per_s = 1.0e7  # source: test value
write_bandwidth_bytes_per_s = 1.0e7  # source: test value
latency_us = 50.0  # source: test value
link = "test"  # source: test value
link_bandwidth_bytes_per_s = 1.0e8  # source: test value
link_latency_us = 10.0  # source: test value

[provenance]
kind = "datasheet"  # source: test values, not a device
"""

BLOCK_TOKENS = 4
BYTES_PER_TOKEN = 25


class TraceBuilder:
    """Append event rows step by step; ``write(path)`` makes a valid event file."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS, bytes_per_token: int = BYTES_PER_TOKEN):
        self.rows: list[dict] = []
        self.bs = block_tokens
        self.bpt = bytes_per_token
        self.step = -1
        self.t = 0

    def add(self, **kw) -> None:
        row = dict(DEFAULTS)
        row["step"] = self.step
        row["time_us"] = self.t
        row.update({k: (int(v) if k in ("kind", "phase", "priority") else v)
                    for k, v in kw.items()})
        self.rows.append(row)

    def STEP(self, t: int, dur: float) -> None:
        self.step += 1
        self.t = t
        self.add(kind=EventKind.STEP, duration_us=float(dur))

    def ARRIVE(self, r: int, prompt: int, deadline: int = -1, **kw) -> None:
        self.add(kind=EventKind.ARRIVE, request_id=r, num_tokens=prompt, deadline_us=deadline,
                 **kw)

    def ALLOC(self, r: int, bi: int, h: int, ntok: int | None = None, rcost: float = 100.0,
              **kw) -> None:
        ntok = self.bs if ntok is None else ntok
        self.add(kind=EventKind.ALLOCATE, request_id=r, block_index=bi, content_hash=h,
                 num_tokens=ntok, recompute_cost_us=rcost, size_bytes=self.bs * self.bpt, **kw)

    def prompt(self, r: int, hashes, last_tokens: int | None = None, rcost: float = 100.0,
               **kw) -> None:
        for i, h in enumerate(hashes):
            nt = self.bs if (last_tokens is None or i < len(hashes) - 1) else last_tokens
            self.ALLOC(r, i, h, nt, rcost, **kw)

    def ACCESS(self, r: int, ntok: int, phase: Phase = Phase.PREFILL, **kw) -> None:
        self.add(kind=EventKind.ACCESS, request_id=r, num_tokens=ntok, phase=phase, **kw)

    def FREE(self, r: int) -> None:
        self.add(kind=EventKind.FREE, request_id=r)

    def write(self, path: Path, model: str = "") -> Path:
        df = pd.DataFrame(self.rows, columns=list(COLUMN_NAMES))
        write_events(path, EventHeader(block_size_tokens=self.bs,
                                       kv_bytes_per_token=self.bpt, model=model), df)
        return path


@pytest.fixture(scope="session")
def tiny_hw(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("hw") / "tiny.toml"
    path.write_text(TINY_PROFILE)
    return str(path)


@pytest.fixture
def builder():
    """The :class:`TraceBuilder` class (tests build several traces)."""
    return TraceBuilder


def random_trace(builder_cls, seed: int, n_requests: int = 40, deadlines: bool = True):
    """A seeded trace with real pressure: requests of 4 sessions share prefix chains of up to
    6 blocks, add 1-3 private blocks and a partial block, run a 1-step prefill and 1-3
    decode steps; up to 3 run at once.  Every 4th request has a TTFT deadline."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tb = builder_cls()
    t = 0
    pending = []  # (request, decode steps left)
    nxt = 0
    while nxt < n_requests or pending:
        tb.STEP(t, 200.0 + 50.0 * len(pending))
        if nxt < n_requests and len(pending) < 3:
            r = nxt
            nxt += 1
            s = int(rng.integers(0, 4))
            k = int(rng.integers(1, 7))
            own = int(rng.integers(1, 4))
            hashes = [s * 100 + j + 1 for j in range(k)] + \
                [10_000 + r * 10 + j for j in range(own)] + [0]
            prompt = 4 * (k + own) + 2
            dl = t + 1500 if (deadlines and r % 4 == 0) else -1
            tb.ARRIVE(r, prompt, dl, request_priority=int(rng.integers(0, 101)))
            tb.prompt(r, hashes, last_tokens=2)
            tb.ACCESS(r, prompt)
            pending.append([r, int(rng.integers(1, 4))])
        else:
            for item in pending:
                tb.ACCESS(item[0], 1, Phase.DECODE)
                item[1] -= 1
            for item in [p for p in pending if p[1] <= 0]:
                tb.FREE(item[0])
            pending = [p for p in pending if p[1] > 0]
        t += 1000
    return tb
