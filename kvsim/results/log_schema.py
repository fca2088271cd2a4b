"""Schema of the decision log (version 1): one row per decision or block-lifecycle event.

Written by the replay (``kvsim simulate --decision-log``, ``kvsim compare
--decision-log-dir``) as Parquet, read by ``kvsim log ...`` with filters pushed down to row
groups.  ``docs/decision-log.md`` documents every column with a worked example.

A block is identified across tiers by ``content_hash`` when it has one; a block without
content identity is identified by (``request_id``, ``block_index``) of the request that
allocated it.  ``request_id`` is the request on whose behalf the action happened (the one
that paid for a stall or a recompute, or whose allocation forced an eviction).
"""

from __future__ import annotations

import pyarrow as pa

from kvsim.core.codes import Action  # re-exported: the log's action codes

LOG_SCHEMA_VERSION = 1
#: Parquet metadata key holding JSON: {"log_schema_version", "policy", "trace", "config"}.
LOG_METADATA_KEY = b"kvsim.decision_log"


#: Actions that are policy decisions (the rest are lifecycle facts).
DECISIONS = frozenset({Action.EVICT, Action.DEMOTE, Action.PROMOTE, Action.PREFETCH,
                       Action.RECOMPUTE, Action.WRITE_THROUGH, Action.PREEMPT})

#: Intent snapshot of one candidate at decision time (victim first, then runners-up).
CANDIDATE_TYPE = pa.struct([
    ("content_hash", pa.int64()),
    ("request_id", pa.int64()),
    ("block_index", pa.int32()),
    ("score", pa.float64()),
    ("last_access_us", pa.float64()),
    ("access_count", pa.int64()),
    ("priority", pa.int8()),
    ("request_priority", pa.int8()),
    ("deadline_us", pa.int64()),
    ("slack_us", pa.int64()),
    ("recompute_cost_us", pa.float64()),
    ("next_use", pa.int64()),
    ("phase", pa.int8()),  # Phase of the request that last touched it
    ("pinned", pa.bool_()),  # pin requested (DECODE_CRITICAL implies it)
])
#: Candidate fields every version-1 file has; ``phase`` and ``pinned`` were added later
#: (a compatible change: readers fill them with null for older files).
REQUIRED_CANDIDATE_FIELDS = frozenset(f.name for f in CANDIDATE_TYPE) - {"phase", "pinned"}

LOG_COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("seq", pa.int64(), "ordinal of the row in the log (0, 1, 2, ...)"),
    ("step", pa.int64(), "engine step"),
    ("time_us", pa.float64(), "simulated clock when it happened"),
    ("action", pa.int8(), "Action"),
    ("content_hash", pa.int64(), "content identity of the block (0 = none)"),
    ("request_id", pa.int64(), "request on whose behalf it happened (-1 = none)"),
    ("block_index", pa.int32(), "block's position in that request's table (-1 = n/a)"),
    ("from_tier", pa.int8(), "Tier it left (-1 = none / new)"),
    ("to_tier", pa.int8(), "Tier it went to (-1 = none / dropped)"),
    ("bytes", pa.int64(), "bytes moved by this action (0 if none)"),
    ("cost_us", pa.float64(), "time charged: stall, transfer or recompute (0 if hidden)"),
    ("decode_critical", pa.bool_(), "the block was DECODE_CRITICAL when this happened"),
    ("reason_code", pa.int16(), "index into the policy's REASONS (-1 for lifecycle rows)"),
    ("reason", pa.dictionary(pa.int16(), pa.string()), "the reason as a sentence"),
    ("candidates", pa.list_(CANDIDATE_TYPE), "victim and top runners-up with scores"),
)


def log_schema() -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=(n == "candidates")) for n, t, _ in LOG_COLUMNS])
