"""The replay's pre-pass facts kept on disk, keyed on the event file's bytes (issue 34: the
16-token replay's end-to-end rate).

:func:`kvsim.replay.prepass.scan_trace` reads a whole event file once before a replay (the
core's buffer sizes, the requests' arrival order, one ``seen`` bit per ALLOCATE row): 0.84 s
of a 7.0-s replay of the Mooncake 16-token import (13.6 M rows).  What it learns depends only
on the file's bytes, the pass's own code and which columns it checked, so a second replay of
the same file (another policy, another tier size) loads it back instead: SHA-256 of the file
(0.12 s for its 102 MB) and a ~1.2 MB load.

Kept with :mod:`kvsim.core.parsed_cache` (same folder, switch, checks and bounds; one entry per
trace path, kind ``facts``), only when the facts take at most :data:`MAX_FACTS_BYTES`.  The key
(:func:`pass_key`) is the source of the pass, of the event readers and of the event schema
(``kvsim/core/schema.py``: the columns and the event kinds' codes), the columns the pass
checked (a pass that checked every column is not answered by one that checked 8) and the
block size: an edited kvsim, reader or trace never loads old facts.  A loaded entry gives
the same :class:`~kvsim.replay.prepass.TraceFacts` as the pass, in the same representation
(arrival arrays int32 when they fit and in a temporary file past ``arrivals_mem``, the bits in
a temporary file past ``bits_mem_bytes``), so the replay cannot tell them apart
(``tests/sim/test_facts_cache.py``).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from kvsim.core import parsed_cache
from kvsim.core.spill import PackedBits

#: Entries larger than this are not kept (the seen bits of ~500 M ALLOCATE rows): loading
#: them back would hold them in memory at once, where the pass spills them as it goes.
MAX_FACTS_BYTES = 64 << 20
_FORMAT = 1
_SCALARS = ("num_rows", "first_step", "last_step", "max_request_id", "max_blocks_per_request",
            "max_concurrent_requests", "max_size_bytes", "num_allocs", "ids_final")


@functools.cache
def _sources_digest() -> str:
    """The source of the pass, of the event readers and of the event schema (read once a
    process: a replay calls :func:`pass_key` for every pass)."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for src in (here / "prepass.py", here.parent / "core" / "schema.py",
                *sorted((here.parent / "events").glob("*.py"))):
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return h.hexdigest()


def pass_key(block_size_tokens: int, columns) -> str:
    """What the pass's facts depend on besides the file's bytes."""
    what = (_FORMAT, int(block_size_tokens), None if columns is None else tuple(columns),
            _sources_digest())
    return hashlib.sha256(repr(what).encode()).hexdigest()


def lookup(path, block_size_tokens: int, columns, bits_mem_bytes, arrivals_mem, narrow):
    """``(entry, fields)``: the fields of the facts a pass over the same bytes stored, rebuilt
    as the pass makes them (``narrow``: its arrival-array representation; the bits in memory
    up to ``bits_mem_bytes``), for :class:`~kvsim.replay.prepass.TraceFacts`; or None
    (``entry`` is then what :func:`store` takes)."""
    entry, arrays = parsed_cache.lookup(path, pass_key(block_size_tokens, columns), "facts")
    if arrays is None:
        return entry, None
    fields = dict(zip(_SCALARS, (int(x) for x in arrays["scalars"]), strict=True))
    fields["ids_final"] = bool(fields["ids_final"])
    fields["seen_bits"] = PackedBits.from_array(arrays["seen_bits"],
                                                int(arrays["seen_count"][0]), bits_mem_bytes)
    order, step = arrays["arrival_order"], arrays["arrival_step"]
    if len(order):
        order, step = narrow(order, arrivals_mem), narrow(step, arrivals_mem)
    else:
        order = step = np.zeros(0, np.int64)
    fields["arrival_order"], fields["arrival_step"] = order, step
    return entry, fields


def store(entry, facts) -> None:
    """Keep ``facts`` (a whole pass over ``entry``'s content) for the next replay."""
    if entry is None or facts.seen_bits is None:
        return
    order, step = facts.arrival_order, facts.arrival_step
    if (len(facts.seen_bits) + 16 * len(order)) > MAX_FACTS_BYTES:
        return
    scalars = np.array([int(getattr(facts, k)) for k in _SCALARS], dtype=np.int64)
    parsed_cache.store(entry, {
        "scalars": scalars,
        "arrival_order": np.asarray(order[0:len(order)]),
        "arrival_step": np.asarray(step[0:len(step)]),
        "seen_bits": facts.seen_bits.to_array(),
        "seen_count": np.array([facts.seen_bits.n], dtype=np.int64)})
