"""What a request trace holds before any engine sees it (``kvsim inspect`` given a request
trace instead of an event file): requests, sessions, tenants, tokens and the prefix reuse
an infinite cache would find at the trace's own block size.

Infinite-cache reuse: every identified block of every prompt, in arrival order, is one
access; it is a reuse when the same block (same content id after the same prefix) was
accessed before.  Blocks are the trace's native blocks (``block_size_tokens``: 512 for
Mooncake, 64 for Weka, 16 for ServeGen): a full block is keyed by (its prefix, its id); an
identified partial last block (``hashed_tokens`` ending inside it, Mooncake's last id) by
(its prefix, its id, its token count), so it matches only the same partial block, as the
lowering hashes it (:func:`kvsim.ingest.hashing.partial_hash`).  Tokens past
``hashed_tokens`` are not identified and are not counted.  ``kvsim inspect`` of the
imported event file gives the same figure at the engine's block size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from kvsim.ingest.requests import RequestTable


@dataclass
class RequestFacts:
    """The ``--json`` keys of ``kvsim inspect REQUEST_TRACE`` (docs/cli.md)."""

    format: str
    requests: int
    #: distinct sessions (-1, no session, not counted) and requests that have one
    sessions: int
    requests_in_sessions: int
    #: distinct tenants (0, the default tenant, counted when used)
    tenants: int
    models: list[str]
    prompt_tokens: int
    output_tokens: int
    block_size_tokens: int
    #: identified prompt blocks (accesses) and those seen before (infinite cache)
    prompt_blocks: int
    reused_blocks: int
    prefix_reuse_fraction: float
    #: token-weighted: reused blocks' tokens over identified prompt tokens
    reused_tokens: int
    #: last arrival minus first (s); a batch job (every arrival 0) has 0
    arrival_span_s: float
    batch_job: bool
    skipped_rows: int = 0
    source: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def request_facts(table: RequestTable) -> RequestFacts:
    """The facts of ``table`` (module docstring)."""
    df = table.df
    T = table.block_size_tokens
    seen: dict[tuple, int] = {}
    blocks = reused = reused_tokens = 0
    for ids, hashed in zip(df["block_ids"], df["hashed_tokens"].to_numpy()):
        parent = -1
        for j, b in enumerate(np.asarray(ids, dtype=np.int64).tolist()):
            start = j * T
            if start >= hashed:
                break
            n = min(T, int(hashed) - start)
            key = (parent, b) if n == T else (parent, b, n)
            blocks += 1
            if key in seen:
                reused += 1
                reused_tokens += n
            else:
                seen[key] = len(seen)
            parent = seen[key]
    sess = df["session"].to_numpy()
    arrivals = df["arrival_us"].to_numpy()
    span = float(arrivals.max() - arrivals.min()) / 1e6 if len(df) else 0.0
    models = sorted({m for m in df["model"] if m})
    return RequestFacts(
        format=str(table.source.get("format", "")), requests=len(df),
        sessions=int(len(np.unique(sess[sess >= 0]))),
        requests_in_sessions=int((sess >= 0).sum()),
        tenants=int(df["tenant"].nunique()), models=models,
        prompt_tokens=int(df["prompt_tokens"].sum()),
        output_tokens=int(df["output_tokens"].sum()), block_size_tokens=int(T),
        prompt_blocks=blocks, reused_blocks=reused,
        prefix_reuse_fraction=reused / blocks if blocks else 0.0,
        reused_tokens=reused_tokens, arrival_span_s=span,
        batch_job=bool(len(df) > 1 and span == 0.0), skipped_rows=int(table.skipped),
        source=dict(table.source))
