"""Event files: write and read MemoryIntent event tables as Parquet or JSONL, with validation.

An event file (schema in :mod:`kvsim.core.schema`, documented in ``docs/trace-format.md``) is the
contract between import/generation and replay.  This package is the only code that touches
the bytes of such a file (``columns.py``: dtypes and the validation both sides share;
``writer.py``; ``reader.py``):

- :class:`EventWriter` writes column batches through :func:`kvsim.core.fsutil.atomic_output`, so
  nothing appears at ``path`` unless the ``with`` block exits cleanly.  Parquet row groups
  hold exactly ``row_group_rows`` rows (the last one fewer), whatever batch sizes the caller
  passes, so the same rows always give the same bytes.
- :class:`EventReader` streams a file in batches of numpy columns (Parquet one row group at
  a time, JSONL ``batch_rows`` lines at a time), never the whole file, and validates every
  batch.  Bad input raises :class:`kvsim.core.errors.KvsimInputError` naming the file, the
  location (``line N``, 1-based, for JSONL, where line 1 is the header; ``row N``, 0-based
  over the whole file, for Parquet), the field and what was expected.

Invariants of every batch a reader yields (and of everything a writer accepts):

- every column of :data:`kvsim.core.schema.COLUMNS` is present with exactly its numpy dtype
  (enums as ``int8``), no nulls;
- ``step >= 0`` and never decreasing, across batches too;
- enum columns hold valid values; block-level kinds (``ALLOCATE``, ``COMMIT``) have
  ``block_index >= 0``; request-level kinds (``STEP``, ``ARRIVE``, ``ACCESS``, ``FORK``) have
  ``block_index == -1``; non-``STEP`` rows have ``request_id >= 0``; ``FORK`` rows have
  ``parent_request_id >= 0``;
- ``num_tokens``, ``size_bytes``, ``time_us``, ``tenant`` >= 0; ``deadline_us``,
  ``target_decode_step``, ``parent_request_id``, ``block_index``, ``request_id`` >= -1;
  ``request_priority`` in 0..100; float columns finite and >= 0.

The writer raises ``ValueError`` (a programming error in the producer) where the reader
raises ``KvsimInputError`` (bad input from a user).
"""

from kvsim.events.columns import DTYPES, JSONL_HEADER_KEY, REQUIRED_JSONL_FIELDS, event_format
from kvsim.events.reader import EventReader, header_dict, open_events, read_events
from kvsim.events.writer import EventWriter, write_events

__all__ = [
    "EventWriter",
    "EventReader",
    "open_events",
    "read_events",
    "write_events",
    "event_format",
    "header_dict",
    "JSONL_HEADER_KEY",
    "REQUIRED_JSONL_FIELDS",
    "DTYPES",
]
