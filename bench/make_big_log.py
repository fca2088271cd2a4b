"""Write a synthetic decision log of N rows (default 10 M) to benchmark ``kvsim log``.

    python bench/make_big_log.py /tmp/big.log.parquet --rows 10000000 --seed 0

The log has the exact decision-log schema (version 1) and metadata, streamed out in row
groups of 262,144 rows, so the generator itself needs little memory.  It is not a replay:
rows are drawn per chunk of steps with a fixed action mix, block identities from a skewed
pool (so evicted blocks are needed again at realistic-looking distances), tiers consistent
with each action, and 4 candidates on every EVICT/DEMOTE row.  It exercises exactly what
the readers pay for: row count, decision density, distinct blocks, pending evictions and
the nested candidates column.  Deterministic for a given ``--seed``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.core.fsutil import atomic_output
from kvsim.results.log_schema import (
    CANDIDATE_TYPE,
    LOG_METADATA_KEY,
    LOG_SCHEMA_VERSION,
    Action,
    log_schema,
)

ROW_GROUP_ROWS = 262_144
ROWS_PER_STEP = 64
#: Action mix (fractions of rows), a plausible shape for a tiered replay under pressure.
MIX = {Action.ALLOCATE: 0.28, Action.HIT: 0.14, Action.RELEASE: 0.20, Action.REVIVE: 0.05,
       Action.FREE: 0.04, Action.EVICT: 0.12, Action.DEMOTE: 0.06, Action.PROMOTE: 0.05,
       Action.PREFETCH: 0.01, Action.RECOMPUTE: 0.04, Action.WRITE_THROUGH: 0.01}
REASONS = {Action.EVICT: ("least recently used: idle for the longest time",
                          "no deadline soon: needed furthest in the future"),
           Action.DEMOTE: ("spill: lower tier has room",),
           Action.PROMOTE: ("on demand: needed by this step",),
           Action.PREFETCH: ("ahead of a known decode step",),
           Action.RECOMPUTE: ("on demand: resident nowhere",),
           Action.WRITE_THROUGH: ("write-through on first hit",)}
BLOCK_BYTES = 262_144
POOL_BLOCKS = 2_000_000
NEVER = np.iinfo(np.int64).max


def _hash(ids: np.ndarray) -> np.ndarray:
    """Block pool id -> a non-zero 64-bit content hash (splitmix64 finaliser)."""
    x = ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    out = x.view(np.int64)
    out[out == 0] = 1
    return out


def _chunk(rng: np.random.Generator, first_seq: int, n: int) -> pa.Table:
    seq = np.arange(first_seq, first_seq + n, dtype=np.int64)
    step = seq // ROWS_PER_STEP
    codes = np.array([int(a) for a in MIX], np.int8)
    probs = np.array(list(MIX.values()))
    action = codes[rng.choice(codes.size, size=n, p=probs / probs.sum())]
    # skewed reuse: most rows touch recently created blocks, a tail touches old ones
    newest = np.maximum(1, (step * 3) % POOL_BLOCKS)
    back = np.minimum(rng.pareto(1.2, n) * 50, newest - 1).astype(np.int64)
    block = newest - back
    hashed = rng.random(n) > 0.08
    content_hash = np.where(hashed, _hash(block), 0)
    request_id = step * 4 + rng.integers(0, 8, n)
    block_index = rng.integers(0, 64, n).astype(np.int32)
    frm = np.full(n, -1, np.int8)
    to = np.full(n, -1, np.int8)
    lower = rng.choice(np.array([1, 2, 3], np.int8), size=n, p=[0.7, 0.2, 0.1])
    is_ = lambda a: action == int(a)  # noqa: E731
    to[is_(Action.ALLOCATE) | is_(Action.RECOMPUTE)] = 0
    frm[is_(Action.EVICT)] = np.where(rng.random(n) < 0.7, 0, lower)[is_(Action.EVICT)]
    frm[is_(Action.DEMOTE)] = 0
    to[is_(Action.DEMOTE)] = lower[is_(Action.DEMOTE)]
    for a in (Action.PROMOTE, Action.PREFETCH):
        frm[is_(a)] = lower[is_(a)]
        to[is_(a)] = 0
    frm[is_(Action.WRITE_THROUGH)] = 0
    to[is_(Action.WRITE_THROUGH)] = lower[is_(Action.WRITE_THROUGH)]
    moved = is_(Action.DEMOTE) | is_(Action.PROMOTE) | is_(Action.PREFETCH) | \
        is_(Action.WRITE_THROUGH)
    nbytes = np.where(moved, BLOCK_BYTES, 0).astype(np.int64)
    cost = np.zeros(n)
    cost[is_(Action.PROMOTE)] = rng.uniform(20, 200, int(is_(Action.PROMOTE).sum()))
    cost[is_(Action.RECOMPUTE)] = rng.uniform(100, 2000, int(is_(Action.RECOMPUTE).sum()))
    critical = rng.random(n) < 0.1
    reason_text = [""]
    reason_idx = np.zeros(n, np.int16)
    reason_code = np.full(n, -1, np.int16)
    for a, sentences in REASONS.items():
        mask = is_(a)
        pick = rng.integers(0, len(sentences), int(mask.sum()))
        base = len(reason_text)
        reason_text.extend(sentences)
        reason_idx[mask] = base + pick
        reason_code[mask] = pick
    reason = pa.DictionaryArray.from_arrays(pa.array(reason_idx, pa.int16()),
                                            pa.array(reason_text, pa.string()))
    decided = is_(Action.EVICT) | is_(Action.DEMOTE)
    k = 4
    m = int(decided.sum())
    victim_hash = content_hash[decided]
    others = _hash(np.maximum(1, block[decided][:, None] - rng.integers(1, 500, (m, k - 1))))
    cand_hash = np.concatenate([victim_hash[:, None], others], axis=1).ravel()
    score = np.sort(rng.uniform(0, 1e6, (m, k)), axis=1).ravel()
    fields = {
        "content_hash": cand_hash, "request_id": np.repeat(request_id[decided], k),
        "block_index": rng.integers(0, 64, m * k).astype(np.int32), "score": score,
        "last_access_us": score, "access_count": rng.integers(1, 20, m * k),
        "priority": rng.integers(0, 4, m * k).astype(np.int8),
        "request_priority": np.full(m * k, 50, np.int8),
        "deadline_us": np.where(rng.random(m * k) < 0.3, np.repeat(step[decided], k) * 20_000
                                + 50_000, -1),
        "slack_us": rng.integers(-1000, 100_000, m * k),
        "recompute_cost_us": rng.uniform(100, 2000, m * k),
        "next_use": np.full(m * k, NEVER, np.int64)}
    # drawn after the others (the fields added to the schema later), so that the rest of a
    # given --seed's log is what it was before they were
    fields["phase"] = rng.integers(0, 4, m * k).astype(np.int8)
    fields["pinned"] = fields["priority"] == 3  # DECODE_CRITICAL implies a pin
    structs = pa.StructArray.from_arrays([pa.array(fields[f.name], f.type) for f in CANDIDATE_TYPE],
                                         fields=list(CANDIDATE_TYPE))
    lengths = np.where(decided, k, 0)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    validity = pa.array(decided)
    candidates = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), structs,
                                          mask=pc_not(validity))
    cols = [seq, step, step * 20_000.0, action, content_hash, request_id, block_index, frm, to,
            nbytes, cost, critical, reason_code, reason, candidates]
    schema = log_schema()
    arrays = [c if isinstance(c, pa.Array) else pa.array(c, f.type) for c, f in zip(cols, schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


def pc_not(mask: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.invert(mask)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    meta = {"log_schema_version": LOG_SCHEMA_VERSION, "policy": "synthetic",
            "trace": "bench/make_big_log.py", "config": {"rows": args.rows, "seed": args.seed}}
    schema = log_schema().with_metadata({LOG_METADATA_KEY: json.dumps(meta).encode()})
    with atomic_output(args.out) as tmp:
        with pq.ParquetWriter(tmp, schema) as writer:
            done = 0
            while done < args.rows:
                n = min(ROW_GROUP_ROWS, args.rows - done)
                writer.write_table(_chunk(rng, done, n).replace_schema_metadata(
                    schema.metadata), row_group_size=ROW_GROUP_ROWS)
                done += n
    print(f"wrote {args.rows:,} rows to {args.out}")


if __name__ == "__main__":
    main()
