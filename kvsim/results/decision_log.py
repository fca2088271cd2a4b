"""Decision-log writer: the replay's decision buffers -> Parquet (schema in log_schema.py).

The compiled core fills preallocated numpy buffers (layout ``kvsim.core.layout.GI_*`` etc.);
:class:`DecisionLogWriter` turns each full buffer into one or more Parquet row groups.  The
file is written atomically (:func:`kvsim.core.fsutil.atomic_output`): a failed replay leaves no
partial log.  Rows are in decision order (``seq`` = 0, 1, 2, ...); the same replay gives a
byte-identical file.

Reason sentences: a row decided by a policy (``reason_code >= 0``) gets that tier's policy
``REASONS[reason_code]`` (the tier is ``from_tier``: the tier that had to make room); a row
the replay itself decided gets the replay's sentence (``kvsim.replay.kernel.core.WHY``); an HBM
eviction of a block already backed up below gets both, joined by "; ".
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.core.fsutil import atomic_output, file_digest, shown_path
from kvsim.core.layout import (
    CF_LAST,
    CF_RECOMP,
    CF_SCORE,
    CI_BI,
    CI_COUNT,
    CI_DEADLINE,
    CI_HASH,
    CI_NEXT,
    CI_PHASE,
    CI_PINNED,
    CI_PRIO,
    CI_REQ,
    CI_RPRIO,
    CI_SLACK,
    GF_COST,
    GF_TIME,
    GI_ACTION,
    GI_BI,
    GI_BYTES,
    GI_DC,
    GI_FROM,
    GI_HASH,
    GI_NCAND,
    GI_REASON,
    GI_REQ,
    GI_SEQ,
    GI_STEP,
    GI_TO,
    GI_WHY,
)
from kvsim.results.log_schema import (
    CANDIDATE_TYPE,
    LOG_METADATA_KEY,
    LOG_SCHEMA_VERSION,
    log_schema,
)

#: Rows per Parquet row group (the reader pushes filters down to row groups).
ROW_GROUP_ROWS = 1 << 16


class DecisionLogWriter:
    """Context manager writing a decision log.

    ``reasons_by_tier[t]`` are the REASONS of tier ``t``'s policy (0 = HBM, 1 = DRAM, 2 =
    CXL, 3 = NVMe); ``why`` the replay's own sentences.  ``config`` and ``trace`` go into
    the file metadata (no wall-clock time: same inputs, same bytes), with the trace file's
    SHA-256 (``trace_sha256``) so that ``kvsim log diff`` knows a trace by its content.
    """

    def __init__(self, path: str | Path, *, policy: str, trace: str, config: dict,
                 reasons_by_tier: Sequence[Sequence[str]], why: Sequence[str]):
        self.path = Path(path)
        self.reasons = [tuple(r) for r in reasons_by_tier]
        self.why = tuple(why)
        meta = {"log_schema_version": LOG_SCHEMA_VERSION, "policy": policy,
                "trace": shown_path(trace) if trace else trace,  # a pipe's name, not its copy
                "config": config}
        if trace and Path(trace).is_file():  # the trace by content (kvsim log diff)
            meta["trace_sha256"] = file_digest(trace)
        self.schema = log_schema().with_metadata(
            {LOG_METADATA_KEY: json.dumps(meta, sort_keys=True, default=str).encode()})
        self._stack: contextlib.ExitStack | None = None
        self._writer: pa.parquet.ParquetWriter | None = None
        self.rows = 0

    def __enter__(self) -> DecisionLogWriter:
        self._stack = contextlib.ExitStack()
        import pyarrow.parquet as pq  # pyarrow.parquet (with pyarrow.fs, ssl) only where Parquet is read or written

        tmp = self._stack.enter_context(atomic_output(self.path))
        self._writer = pq.ParquetWriter(tmp, self.schema)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        stack = self._stack
        self._stack = None
        try:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        finally:
            if stack is not None:
                stack.__exit__(exc_type, exc, tb)
        return False

    def _sentence(self, tier: int, code: int, why: int) -> str:
        parts = []
        if code >= 0:
            reasons = self.reasons[tier] if 0 <= tier < len(self.reasons) else ()
            parts.append(reasons[code] if code < len(reasons) else f"reason code {code}")
        if why >= 0:
            parts.append(self.why[why])
        return "; ".join(parts)

    def write_buffer(self, G, n: int) -> None:
        """Write the first ``n`` rows of the core's buffers ``G = (G_i, G_f, GC_i, GC_f)``."""
        G_i, G_f, GC_i, GC_f = G
        for lo in range(0, n, ROW_GROUP_ROWS):
            hi = min(n, lo + ROW_GROUP_ROWS)
            self._writer.write_table(self._table(G_i[lo:hi], G_f[lo:hi], GC_i[lo:hi],
                                                 GC_f[lo:hi]))
            self.rows += hi - lo

    def _table(self, gi, gf, gci, gcf) -> pa.Table:
        n = len(gi)
        keys = list(zip(gi[:, GI_FROM].tolist(), gi[:, GI_REASON].tolist(),
                        gi[:, GI_WHY].tolist()))
        # one dictionary entry per distinct sentence (keys that read the same, e.g. lru's
        # reason on two tiers, share it): pyarrow 26 writes a dictionary holding a value
        # twice in a varying order, run to run (tests/results/test_log_bytes.py)
        sentences: dict[str, int] = {}
        index = {k: sentences.setdefault(self._sentence(*k), len(sentences))
                 for k in sorted(set(keys))}
        codes = np.array([index[k] for k in keys], dtype=np.int16)
        reason = pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int16()), pa.array(list(sentences), pa.string()))
        ncand = gi[:, GI_NCAND]
        offsets = np.concatenate(([0], np.cumsum(ncand))).astype(np.int32)
        mask = np.zeros(n, dtype=bool)
        sel = np.concatenate([np.arange(k) + j * gci.shape[1] for j, k in enumerate(ncand)]
                             ) if n else np.zeros(0, dtype=np.int64)
        sel = sel.astype(np.int64)
        ci = gci.reshape(-1, gci.shape[2])[sel]
        cf = gcf.reshape(-1, gcf.shape[2])[sel]
        values = pa.StructArray.from_arrays([
            pa.array(ci[:, CI_HASH], pa.int64()),
            pa.array(ci[:, CI_REQ], pa.int64()),
            pa.array(ci[:, CI_BI].astype(np.int32), pa.int32()),
            pa.array(cf[:, CF_SCORE], pa.float64()),
            pa.array(cf[:, CF_LAST], pa.float64()),
            pa.array(ci[:, CI_COUNT], pa.int64()),
            pa.array(ci[:, CI_PRIO].astype(np.int8), pa.int8()),
            pa.array(ci[:, CI_RPRIO].astype(np.int8), pa.int8()),
            pa.array(ci[:, CI_DEADLINE], pa.int64()),
            pa.array(ci[:, CI_SLACK], pa.int64()),
            pa.array(cf[:, CF_RECOMP], pa.float64()),
            pa.array(ci[:, CI_NEXT], pa.int64()),
            pa.array(ci[:, CI_PHASE].astype(np.int8), pa.int8()),
            pa.array(ci[:, CI_PINNED] != 0, pa.bool_()),
        ], fields=list(CANDIDATE_TYPE))
        mask = ncand == 0
        candidates = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values,
                                              mask=pa.array(mask))
        cols = [
            pa.array(gi[:, GI_SEQ], pa.int64()),
            pa.array(gi[:, GI_STEP], pa.int64()),
            pa.array(gf[:, GF_TIME], pa.float64()),
            pa.array(gi[:, GI_ACTION].astype(np.int8), pa.int8()),
            pa.array(gi[:, GI_HASH], pa.int64()),
            pa.array(gi[:, GI_REQ], pa.int64()),
            pa.array(gi[:, GI_BI].astype(np.int32), pa.int32()),
            pa.array(gi[:, GI_FROM].astype(np.int8), pa.int8()),
            pa.array(gi[:, GI_TO].astype(np.int8), pa.int8()),
            pa.array(gi[:, GI_BYTES], pa.int64()),
            pa.array(gf[:, GF_COST], pa.float64()),
            pa.array(gi[:, GI_DC] != 0, pa.bool_()),
            pa.array(gi[:, GI_REASON].astype(np.int16), pa.int16()),
            reason,
            candidates,
        ]
        return pa.Table.from_arrays(cols, schema=self.schema)
