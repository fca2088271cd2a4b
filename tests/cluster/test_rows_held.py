"""The closed loop's per-request arrays are not held for the whole run (issue 38,
"Memory"): the block facts, vLLM's request constants, the slot map, the hit tokens, the
queue and the columns of a table handed over are made in the run's row store
(kvsim.core.row_store), whose pages below the oldest request the run still reads are given
back as it goes.  What the run holds in the middle of the trace does not grow with the
trace's length.  The results are the same."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import pytest

from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.cluster import serve
from tests.cluster.test_held_block_ids import CONFIG, _long_table

OPTS = EngineOptions(max_num_seqs=8)  # what is sized by the running set stays small


def _rows_file_resident() -> int:
    """Resident bytes of this process's shared mappings of unlinked files (the row store's:
    ``Rss`` in /proc/self/smaps; tracemalloc does not see a mapping)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            ours = head[1] == "rw-s" and line.endswith("(deleted)")  # an unlinked file
        elif ours and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


@pytest.fixture
def rows_in_files(monkeypatch):
    """Every per-request array in a file, however small (the trace is small here), and a
    progress report (and release) every 256 steps."""
    import kvsim.modes.closed.closed_loop as cl

    monkeypatch.setattr(cl, "YIELD_STEPS", 256)
    try:
        import kvsim.core.row_store as rs
    except ImportError:  # main: no row store
        return
    monkeypatch.setattr(rs, "MIN_BYTES", 0)


def _held_mid_run(monkey, copies: int, **kw) -> tuple[tuple[int, int], int, dict]:
    """((bytes traced, bytes of the row store's files resident) at the first progress
    report, requests, summary), the table made under tracemalloc and handed over.  The first report comes after 256 engine steps (YIELD_STEPS): the same
    requests are done then whatever the copies (the trace repeats itself), so what differs
    is what the set-up keeps for the requests to come."""
    import kvsim.modes.closed.closed_loop as cl

    got: list = []

    def probe(*_):
        if not got:
            gc.collect()
            got.append((tracemalloc.get_traced_memory()[0], _rows_file_resident()))

    real = cl.Engine.finish

    def finish(self):  # no report before the end (main: reports every 4,096 steps)
        probe()
        return real(self)

    monkey.setattr(cl.Engine, "finish", finish)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t = _long_table(copies)
    n = len(t)
    s = serve(t, "lru", CONFIG, engine=OPTS, release_block_ids=True, on_progress=probe,
              **kw).summary
    tracemalloc.stop()
    return (got[0][0] - base, got[0][1]), n, s


def test_bytes_held_mid_run_do_not_grow_with_the_trace(rows_in_files, monkeypatch):
    """24 copies of a trace against 8 (320 requests: the core's first 256 request rows
    are taken in both), one replica, at the first progress report: the
    bytes held per added request.  Main (no row store) fails: 673 bytes a request,
    measured at its end (it reports every 4,096 steps; ~165 of them its set-up's arrays:
    the table's columns the run reads, vLLM's request constants, the block facts, the slot
    map, queue and hit tokens, all held to the end); here < 16 in memory, and the row
    store's files resident no more than where the run is (a page of each array at most:
    the files' pages are 4 KiB, 512 rows of 8 bytes, more than this trace adds)."""
    try:
        from kvsim.core import row_store
    except ImportError:  # main: no row store (what it holds is all in memory)
        row_store = None
    serve(_long_table(1), "lru", CONFIG, engine=OPTS)  # imports, compiled code loaded
    stores = []
    if row_store is not None:
        real = row_store.RowStore.release_all
        monkeypatch.setattr(row_store.RowStore, "release_all",
                            lambda self: stores.append(self) or real(self))
    ((m1, f1), n1, s1), ((m2, f2), n2, s2) = (_held_mid_run(monkeypatch, 8),
                                              _held_mid_run(monkeypatch, 24))
    per_request = (m2 - m1) / (n2 - n1)
    assert per_request < 16, per_request
    if row_store is not None:
        assert f2 - f1 <= len(stores[-1]) * row_store.PAGE, (f1, f2, len(stores[-1]))
    assert s1["requests"] == n1 and s2["requests"] == n2


def test_results_in_files_are_the_same(rows_in_files):
    """The row store changes where the arrays live, never a result: 1 and 3 replicas,
    every per-request array in a file and released as the run goes, against the same run
    with the arrays in memory (the table kept by the caller: nothing in files but what
    the engines make)."""
    for replicas in (1, 3):
        a = serve(_long_table(4), "lru", CONFIG, engine=OPTS, replicas=replicas,
                  router="prefix", release_block_ids=True)
        b = serve(_long_table(4), "lru", CONFIG, engine=OPTS, replicas=replicas,
                  router="prefix")
        assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
        assert a.requests.equals(b.requests)
