"""The MemoryIntent data model: enums, the event table's Arrow schema, the file header.

An *event file* is the contract between import (``kvsim import-request-trace``,
``kvsim generate``) and replay (``kvsim simulate`` / ``compare``).  It is one table, one row
per event, sorted by ``step`` (never decreasing).  It is written as Parquet (enums stored as
small integers, streamed by row group) or JSONL (one event per line, enums by name, the
first line a header object).  ``docs/trace-format.md`` documents every column.

Granularity (DESIGN.md §1): an ``ACCESS`` event names a *request step*, not a block: "request
r is in this engine step's batch and reads every block of its block table".  Blocks appear
one row each only when they are allocated (``ALLOCATE``), when their intent changes
(``INTENT`` with a ``block_index``) or when they are released one by one (``FREE`` with a
``block_index``).  So a decode step costs one row per running request, never one per block.

Ordering inside a step: the ``STEP`` row first, then ``ARRIVE`` rows, then for each
scheduled request its ``FORK``/``ALLOCATE``/``INTENT``/``COMMIT`` rows followed by its
``ACCESS`` row, then ``FREE`` rows of requests that finished in this step.  Speculative
decoding is the one exception: acceptance is known only after the verify step ran, so a
request's ``COMMIT`` rows and block-level ``FREE`` rows of rejected drafts follow its
``ACCESS`` row in the same step.

Lowering rules (every importer and generator follows them; the replay relies on them):

1. ``ARRIVE`` comes before any other row of its request; a request-level ``FREE`` is its last.
2. All of a request's *prompt* blocks are ``ALLOCATE``d, in block order, in the step where
   the request is first scheduled (admission), before its first ``ACCESS``.  The replay
   does the prefix-cache lookup over exactly these rows, vLLM-style: walk the hash chain,
   stop at the first miss, hit at most ``prompt_tokens - 1`` tokens.  Chunked prefill then
   spreads the *compute* over several ``ACCESS`` rows (``num_tokens`` each).
3. A decode block is ``ALLOCATE``d in the step whose token starts it.
4. ``content_hash`` is the chain hash the importer computed (parent hash, the block's
   tokens, extra keys such as a LoRA id or cache salt).  It is ``NO_HASH`` for a block whose
   content the trace does not identify.  Two blocks with the same non-zero hash have the
   same content *and the same prefix*.  A partial block (``num_tokens`` below the block
   size) may carry a hash when the trace identifies its content (Mooncake's last hash id);
   the replay never shares a partial block (vLLM hashes only full blocks), but
   ``kvsim inspect`` counts it in the infinite-cache reuse fraction.
5. ``STEP.duration_us`` is the step's compute time with no prefix caching (every scheduled
   token computed).  The replay subtracts the ``recompute_cost_us`` of blocks it finds
   cached and adds transfer stalls and recomputation of blocks resident nowhere.
6. ``deadline_us`` on ``ARRIVE`` is the absolute TTFT deadline; on ``ACCESS`` rows in
   DECODE it is the absolute deadline of that token (TPOT).  ``-1`` = no deadline.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

#: Version of the event-file schema.  Bump on any incompatible change and say what changed
#: in docs/trace-format.md.  Readers refuse files of another major version.
SCHEMA_VERSION = 1

#: Value of ``content_hash`` for a block with no content identity (a partial block, or a
#: block whose tokens are unknown): such a block is never shared through the prefix cache.
NO_HASH = 0
#: Value of integer "optional" fields (``deadline_us``, ``target_decode_step``,
#: ``parent_request_id``, ``block_index`` on request-level events) meaning "not set".
UNSET = -1


# The enums live in kvsim.core.codes (with the plain-int constants compiled code uses);
# re-exported here, where the schema names them.
from kvsim.core.codes import EventKind, Phase, Priority, Tier  # noqa: E402,F401

#: Every column of an event file: (name, Arrow type, meaning).  Parquet stores exactly these
#: types; JSONL stores enum columns by name and the rest as JSON numbers / booleans.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("step", pa.int64(), "engine step index, >= 0, never decreasing"),
    ("time_us", pa.int64(), "engine clock at the step's scheduled start (microseconds)"),
    ("kind", pa.int8(), "EventKind"),
    ("request_id", pa.int64(), "dense request id, >= 0 (-1 on STEP rows)"),
    ("block_index", pa.int32(), "position in the request's block table; -1 = request-level"),
    ("content_hash", pa.int64(), "prefix-chain hash of a FULL block (0 = none: not shareable)"),
    ("parent_request_id", pa.int64(), "FORK: the request forked from; otherwise -1"),
    ("num_tokens", pa.int32(), "ALLOCATE: tokens in the block; ACCESS: tokens computed this "
     "step; ARRIVE: prompt tokens; STEP: tokens in the batch"),
    ("duration_us", pa.float64(), "STEP: compute time of the step with no prefix caching"),
    ("phase", pa.int8(), "Phase"),
    ("priority", pa.int8(), "Priority"),
    ("request_priority", pa.int8(), "0 (lowest) .. 100 (highest), from the serving layer"),
    ("deadline_us", pa.int64(), "absolute engine-clock deadline of the next use; -1 = none"),
    ("slack_us", pa.int64(), "deadline_us - expected completion time at emission; may be < 0"),
    ("recompute_cost_us", pa.float64(), "prefill time to recompute this block's tokens"),
    ("target_decode_step", pa.int64(), "engine step at which the block is next needed; -1"),
    ("pin_requested", pa.bool_(), "keep in HBM (implied by DECODE_CRITICAL)"),
    ("compression_ok", pa.bool_(), "the block may be stored compressed in a lower tier"),
    ("recompute_ok", pa.bool_(), "the block may be dropped and recomputed"),
    ("prefetch_ok", pa.bool_(), "the block may be fetched ahead of its use"),
    ("size_bytes", pa.int64(), "bytes of the block in HBM (all layers, K and V)"),
    ("tenant", pa.int32(), "tenant / session group id for per-tenant accounting (0 default)"),
)

#: Column name -> enum class, for the enum-coded columns.
ENUM_COLUMNS: dict[str, type[enum.IntEnum]] = {
    "kind": EventKind,
    "phase": Phase,
    "priority": Priority,
}

#: Default value of each column, used by builders so an importer sets only what it knows.
DEFAULTS: dict[str, Any] = {
    "step": 0,
    "time_us": 0,
    "kind": int(EventKind.STEP),
    "request_id": UNSET,
    "block_index": UNSET,
    "content_hash": NO_HASH,
    "parent_request_id": UNSET,
    "num_tokens": 0,
    "duration_us": 0.0,
    "phase": int(Phase.PREFILL),
    "priority": int(Priority.WARM),
    "request_priority": 50,
    "deadline_us": UNSET,
    "slack_us": 0,
    "recompute_cost_us": 0.0,
    "target_decode_step": UNSET,
    "pin_requested": False,
    "compression_ok": True,
    "recompute_ok": True,
    "prefetch_ok": True,
    "size_bytes": 0,
    "tenant": 0,
}

COLUMN_NAMES: tuple[str, ...] = tuple(name for name, _, _ in COLUMNS)

#: Key under which the JSON-encoded :class:`EventHeader` is stored in Parquet metadata.
HEADER_METADATA_KEY = b"kvsim.header"


def event_schema(header: EventHeader | None = None) -> pa.Schema:
    """The Arrow schema of an event file, with the header in its metadata when given."""
    schema = pa.schema([pa.field(name, typ, nullable=False) for name, typ, _ in COLUMNS])
    if header is not None:
        schema = schema.with_metadata({HEADER_METADATA_KEY: header.to_json().encode()})
    return schema


@dataclass(frozen=True)
class EventHeader:
    """File-level facts every consumer needs, stored once per event file.

    ``source`` records how the file was made (importer or profile, with its arguments) so a
    result can always be traced back to its input; it never holds a wall-clock time, so the
    same inputs give byte-identical files.
    """

    block_size_tokens: int = 16
    kv_bytes_per_token: int = 0
    model: str = ""
    hardware: str = ""
    source: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        import json

        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EventHeader:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
