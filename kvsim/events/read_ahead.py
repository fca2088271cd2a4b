"""Read the next batch of an event file while the caller works on this one.

:class:`ReadAhead` runs an iterator of batches (:meth:`kvsim.events.EventReader.batches`)
in one daemon thread, ``depth`` batches ahead of its consumer.  Decoding a Parquet row
group (Arrow, no GIL), converting and validating its columns overlap the caller's own
work on the batch before: the compiled replay core runs without the GIL
(``njit(nogil=True)``), so on two cores the reads leave the critical path
(docs/benchmarks.md, "Speed: tiered replay of 16-token traces").

Nothing else changes: the batches are the same objects in the same order, and an error
the source raises (a :class:`kvsim.core.errors.KvsimInputError` naming the file, row and
field) is raised to the consumer at the batch where it occurred, after every batch
before it.  Memory: ``depth`` batches more than reading in line.  :meth:`ReadAhead.close`
(also on ``with`` exit, and from :meth:`EventReader.close`) stops the thread and closes
the source in that thread before returning, so the file is never closed under a read.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

_ITEM, _END, _ERROR = 0, 1, 2
#: How often a producer blocked on a full queue checks for :meth:`ReadAhead.close` (s).
_POLL_S = 0.05


class ReadAhead:
    """Iterate ``source`` with up to ``depth`` items produced ahead in a daemon thread."""

    def __init__(self, source: Iterator[Any], depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth: expected an integer >= 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._produce, args=(source,),
                                        name="kvsim-read-ahead", daemon=True)
        self._thread.start()

    # -- producer (its own thread) --------------------------------------------------------
    def _produce(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                if not self._put((_ITEM, item)):
                    return  # closed by the consumer
            self._put((_END, None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put((_ERROR, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, message: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    # -- consumer ---------------------------------------------------------------------------
    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        tag, value = self._queue.get()
        if tag == _ITEM:
            return value
        self._finished = True
        self._thread.join()
        if tag == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the producer and wait for it (it finishes the batch it is reading)."""
        self._finished = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # free a slot so a producer blocked in put() sees the stop at once
                self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(_POLL_S)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False
