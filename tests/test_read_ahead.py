"""kvsim.events.read_ahead: the batches read in a thread are the batches read in line, in
order; an error reaches the consumer at its batch, after every batch before it; closing
(or leaving the reader's ``with``) stops the thread and closes the source first."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import EventHeader
from kvsim.events import EventWriter, open_events
from kvsim.events.read_ahead import ReadAhead

HEADER = EventHeader(block_size_tokens=16, kv_bytes_per_token=131072, model="m")


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kvsim-read-ahead"]


def _write(path: Path, steps) -> Path:
    with EventWriter(path, HEADER, row_group_rows=300) as w:
        w.write({"step": np.asarray(steps), "kind": "STEP"})
    return path


@pytest.mark.parametrize("name", ["t.parquet", "t.jsonl"])
def test_same_batches_in_the_same_order(tmp_path, name):
    path = _write(tmp_path / name, np.arange(1000))
    with open_events(path) as reader:
        plain = [b["step"] for b in reader.batches(128)]
        ahead = [b["step"] for b in reader.batches(128, read_ahead=True)]
    assert [len(b) for b in ahead] == [len(b) for b in plain]
    assert all(np.array_equal(a, b) for a, b in zip(ahead, plain))
    assert np.concatenate(ahead).tolist() == list(range(1000))
    assert not _threads()


def _with_bad_step(path: Path) -> Path:
    """A valid 1000-row file whose row 700 has step 3 (steps go backwards there)."""
    _write(path, np.arange(1000))
    if path.suffix == ".jsonl":
        lines = path.read_text().splitlines()
        assert '"step": 700' in lines[701]  # line 1 is the header
        lines[701] = lines[701].replace('"step": 700', '"step": 3')
        path.write_text("\n".join(lines) + "\n")
    else:
        table = pq.read_table(path)
        col = table.column("step").to_numpy().copy()
        col[700] = 3
        table = table.set_column(table.schema.get_field_index("step"), "step",
                                 pa.array(col, pa.int64()))
        pq.write_table(table, path, row_group_size=300)
    return path


@pytest.mark.parametrize("name, where", [("t.parquet", "row 700"), ("t.jsonl", "line 702")])
def test_error_after_the_batches_before_it(tmp_path, name, where):
    path = _with_bad_step(tmp_path / name)
    got, errors = {}, {}
    for mode in (False, True):
        seen = []
        with open_events(path) as reader:
            with pytest.raises(KvsimInputError) as exc:
                for b in reader.batches(128, read_ahead=mode):
                    seen.append(len(b["step"]))
        got[mode], errors[mode] = seen, str(exc.value)
    assert got[True] == got[False] and sum(got[True]) <= 700 < sum(got[True]) + 128
    assert errors[True] == errors[False] and where in errors[True] and "'step'" in errors[True]
    assert not _threads()


def test_close_stops_the_thread_and_closes_the_source():
    closed = []

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.append(threading.current_thread().name)

    ahead = ReadAhead(endless(), depth=2)
    assert [next(ahead) for _ in range(5)] == [0, 1, 2, 3, 4]
    ahead.close()
    assert closed == ["kvsim-read-ahead"]  # closed in the producer thread
    assert not _threads()
    with pytest.raises(StopIteration):
        next(ahead)


def test_leaving_the_reader_stops_its_read_ahead(tmp_path):
    path = _write(tmp_path / "t.parquet", np.arange(1000))
    with open_events(path) as reader:
        for b in reader.batches(10, read_ahead=True):
            break  # abandoned: the thread waits on a full queue
        assert _threads()
    assert not _threads()


def test_other_errors_pass_through_unchanged():
    def broken():
        yield 1
        raise RuntimeError("boom")

    ahead = ReadAhead(broken())
    assert next(ahead) == 1
    with pytest.raises(RuntimeError, match="boom"):
        next(ahead)
    assert not _threads()
    with pytest.raises(ValueError, match="depth: expected an integer >= 1, got 0"):
        ReadAhead(iter([]), depth=0)


def test_a_replay_reads_its_first_batch_while_it_is_set_up(tmp_path, monkeypatch):
    """The replay's pass starts its read-ahead thread before it builds the replay's state
    (``kvsim.replay.driver._execute``: the reader before ``_Run``), so the first batch is
    decoded during the set-up (docs/benchmarks.md, "16-token replay: the first batch read
    during the set-up"); before, the core's first batch waited for its decode."""
    from kvsim.api import SimConfig, simulate
    from kvsim.replay import driver
    from kvsim.workload.generator import generate

    trace = tmp_path / "t.parquet"
    generate("deadline_pressure", 8, 0, trace)
    seen = []
    init = driver._Run.__init__

    def spy(self, *args, **kwargs):
        seen.append(len(_threads()))
        init(self, *args, **kwargs)

    monkeypatch.setattr(driver._Run, "__init__", spy)
    simulate(trace, "lru", SimConfig(engine="interpreted"))
    assert seen == [1]  # the pass's reader was already running
    assert _threads() == []  # and stopped once the pass ended
