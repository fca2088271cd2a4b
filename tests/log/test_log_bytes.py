"""The decision log is byte-deterministic (issue 38): the same replay gives the same file.

pyarrow (26) writes a dictionary column whose dictionary holds one value twice in an order
that varies run to run (the rows read back equal).  A log's ``reason`` dictionary met this
whenever two (tier, reason code, replay reason) keys read the same: lru's reason on HBM and
on DRAM, a replay sentence with two ``from_tier`` values.  Small logs had no such pair, the
full Mooncake trace with a DRAM tier had."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from kvsim.core import layout as L
from kvsim.results.decision_log import DecisionLogWriter

REASONS = ("least recently used", "coldest block")
WHY = ("replay: prompt block", "replay: backed up below")


def _buffers(n: int) -> tuple:
    """``n`` log rows whose keys repeat sentences: (tier 0 | 1, code 0 | 1, why -1) share
    the tier's policy reasons (the same policy on both tiers), (tier 0 | 1, -1, why) the
    replay's."""
    rng = np.random.default_rng(7)
    G_i = np.zeros((n, L.NGI), dtype=np.int64)
    G_i[:, L.GI_SEQ] = np.arange(n)
    G_i[:, L.GI_STEP] = np.arange(n) // 16
    G_i[:, L.GI_FROM] = rng.integers(0, 2, n)
    G_i[:, L.GI_TO] = G_i[:, L.GI_FROM] + 1
    policy = rng.integers(0, 2, n) == 1
    G_i[:, L.GI_REASON] = np.where(policy, rng.integers(0, 2, n), -1)
    G_i[:, L.GI_WHY] = np.where(policy, -1, rng.integers(0, 2, n))
    G_i[:, L.GI_HASH] = rng.integers(1, 1 << 40, n)
    G_i[:, L.GI_REQ] = rng.integers(0, 100, n)
    G_f = np.zeros((n, L.NGF))
    return G_i, G_f, np.zeros((n, 1, L.NCI), dtype=np.int64), np.zeros((n, 1, L.NCF))


def _write(path: Path, G: tuple) -> bytes:
    with DecisionLogWriter(path, policy="lru", trace="", config={},
                           reasons_by_tier=[REASONS, REASONS], why=WHY) as w:
        w.write_buffer(G, len(G[0]))
    return path.read_bytes()


def test_reason_dictionary_holds_each_sentence_once() -> None:
    G = _buffers(4096)
    w = DecisionLogWriter("unused.parquet", policy="lru", trace="", config={},
                          reasons_by_tier=[REASONS, REASONS], why=WHY)
    reason = w._table(*G).column("reason").chunk(0)
    values = reason.dictionary.to_pylist()
    assert sorted(values) == sorted(REASONS + WHY)  # once each
    assert reason.to_pylist() == [
        REASONS[c] if c >= 0 else WHY[y]
        for c, y in zip(G[0][:, L.GI_REASON].tolist(), G[0][:, L.GI_WHY].tolist())]


def test_same_buffers_same_bytes(tmp_path: Path) -> None:
    """The same buffers written ten times in one process: one file, byte for byte (before:
    2 to 4 different files out of 6 writes, at 4,096 to 65,536 rows)."""
    G = _buffers(4096)
    digests = {hashlib.sha256(_write(tmp_path / f"log{k}.parquet", G)).hexdigest()
               for k in range(10)}
    assert len(digests) == 1
    t = pq.read_table(tmp_path / "log0.parquet", columns=["reason"])
    assert t.num_rows == 4096
