"""The Mooncake read in bounded memory (issue 38, "Memory"): both readers (the fast path and
the line-by-line one) append a batch of rows at a time to growing numpy columns
(:class:`kvsim.core.heap.GrowingArray`), and the table build gathers a batch of rows at a
time, so what the read allocates beyond the table it returns does not grow with the trace;
and a bad line is still named by its line number wherever the batches are cut."""

from __future__ import annotations

import json
import tracemalloc
import warnings

import numpy as np
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.ingest import mooncake, requests


def _rows(copies: int, n: int = 500, seed: int = 5, shuffle: bool = False) -> list[dict]:
    """``n`` requests on a prefix tree (16 shared first blocks, then ~24 own blocks each,
    as the Mooncake conversation trace), repeated ``copies`` times back to back in time
    (request_scale.py's copies: the same ids, only the length grows)."""
    rng = np.random.default_rng(seed)
    one = []
    for r in range(n):
        own = int(rng.integers(1, 48))
        ids = [r % 16] + [16 + 64 * r + k for k in range(own)]
        one.append({"timestamp": int(rng.integers(0, 10**6)),
                    "input_length": 512 * len(ids) - int(rng.integers(0, 512)),
                    "output_length": int(rng.integers(1, 400)), "hash_ids": ids})
    if not shuffle:
        one.sort(key=lambda d: d["timestamp"])
    return [{**d, "timestamp": d["timestamp"] + k * 10**6} for k in range(copies) for d in one]


def _write(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _small_batches(monkeypatch) -> None:
    """Batches small against the traces here, as 4 MiB, 16 Ki rows and 2^20 ids are against
    100x the conversation trace."""
    monkeypatch.setattr(mooncake, "_CHUNK_CHARS", 1 << 14)
    monkeypatch.setattr(mooncake, "_TREE_BATCH_IDS", 1024)
    monkeypatch.setattr(mooncake, "_ROWS_BATCH", 64, raising=False)
    monkeypatch.setattr(requests, "_GATHER_ROWS", 64, raising=False)
    monkeypatch.setenv("KVSIM_TRACE_CACHE", "0")


def _transient_bytes(path) -> tuple[int, int, int]:
    """(peak traced bytes of the read beyond what it keeps, the table's id bytes, the
    table's other column bytes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mooncake.read_mooncake(path)  # untraced first: lazy imports, caches
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            table = mooncake.read_mooncake(path)
            kept, peak = (v - base for v in tracemalloc.get_traced_memory())
        finally:
            tracemalloc.stop()
    off, ids = table.flat_block_ids()
    cols = sum(v.nbytes for v in table.columns().values()) + off.nbytes
    return peak - kept, ids.nbytes, cols


@pytest.mark.parametrize("kind", ["plain", "off_tree", "unsorted"])
def test_read_beyond_the_table_does_not_grow_with_the_trace(tmp_path, monkeypatch,
                                                            kind) -> None:
    """1x and 8x a trace: what the read holds at its peak beyond the table it returns.
    plain: the fast path; off_tree (one id moved under another parent): the line-by-line
    reader; unsorted: the table build's sort, which holds the reader's columns and ids
    while it gathers the sorted ones (one copy of each, the ids a batch of rows at a
    time).  What may grow besides: a few temporaries of one request column (the checks'
    and the offsets', 8 bytes a request each).  Main held every id twice at the fast
    path's end (8 bytes an id), the line-by-line reader's Python lists (~36 bytes an id)
    and the sort's source positions of every id (3 more arrays of the ids)."""
    _small_batches(monkeypatch)
    out = {}
    for copies in (1, 8):
        rows = _rows(copies, shuffle=kind == "unsorted")
        if kind == "off_tree":
            rows[3] = {**rows[3], "hash_ids": [rows[4]["hash_ids"][1]] + rows[3]["hash_ids"][1:]}
        _write(tmp_path / f"x{copies}.jsonl", rows)
        out[copies] = _transient_bytes(tmp_path / f"x{copies}.jsonl")
    (t1, ids1, cols1), (t8, ids8, cols8) = out[1], out[8]
    requests_added = 7 * 500
    assert ids8 == 8 * ids1 > 0 and cols8 > 7 * cols1  # the table grows with the trace
    allowed = 4 * 8 * requests_added
    if kind == "unsorted":
        allowed += (ids8 - ids1) + (cols8 - cols1)
    assert t8 - t1 <= allowed, (out, kind, allowed)


@pytest.mark.parametrize("path_kind", ["plain", "line_by_line"])
def test_a_bad_line_is_named_at_every_batch_boundary(tmp_path, monkeypatch,
                                                     path_kind) -> None:
    """A bad line at each position of a trace cut into batches of 64 rows and 16 KiB of
    text (either side of every cut): the error names its line (blank lines counted);
    skipped, the table is the table of the file without it."""
    _small_batches(monkeypatch)
    rows: list = _rows(1, n=200)
    rows.insert(1, "")  # a blank line: counted in the line numbers, not a row
    if path_kind == "line_by_line":  # a float length: only the line-by-line reader takes it
        rows[0] = {**rows[0], "input_length": float(rows[0]["input_length"])}
    good = tmp_path / "good.jsonl"
    _write(good, [r for r in rows if r != ""])
    want = mooncake.read_mooncake(good)
    want_ids = want.flat_block_ids()
    cuts = sorted({64 * k + d for k in range(1, 4) for d in (-1, 0, 1)}
                  | {i for i in range(2, len(rows)) if i % 50 in (0, 1)})
    for at in cuts:
        bad = rows[:at] + ['{"timestamp": 1, "input_length": 512, "output_length": 1, '
                           '"hash_ids": [1, 2]}'] + rows[at:]
        _write(tmp_path / "bad.jsonl", bad)
        with pytest.raises(KvsimInputError) as exc:
            mooncake.read_mooncake(tmp_path / "bad.jsonl")
        assert str(exc.value) == (f"{tmp_path / 'bad.jsonl'}: line {at + 1}: field "
                                  "'hash_ids': expected ceil(input_length/512) = 1 ids, got 2")
        got = mooncake.read_mooncake(tmp_path / "bad.jsonl", skip_bad_rows=True)
        assert got.skipped == 1 and len(got) == len(want)
        for name in want.columns():
            assert np.array_equal(got.column(name), want.column(name)), (at, name)
        assert all(np.array_equal(a, b) for a, b in zip(got.flat_block_ids(), want_ids))


def test_gather_in_batches_is_the_whole_gather(monkeypatch) -> None:
    """Rows taken in any order, empty rows included, batches of 1 to 5 rows: the ids of
    the one-shot gather (every source position at once)."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        lens = rng.integers(0, 5, size=int(rng.integers(1, 30)))
        off = np.zeros(lens.size + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        ids = rng.integers(-10**12, 10**12, size=int(off[-1]))
        rows = rng.permutation(lens.size)[: int(rng.integers(0, lens.size + 1))]
        want = [x for r in rows for x in ids[off[r]:off[r + 1]]]
        monkeypatch.setattr(requests, "_GATHER_ROWS", int(rng.integers(1, 6)), raising=False)
        noff, nids = requests._gather(off, ids, rows)
        assert nids.tolist() == want and nids.dtype == np.int64
        assert noff.tolist() == [0, *np.cumsum(lens[rows]).tolist()]


def test_growing_array_is_the_concatenation() -> None:
    """Batches of 0 to 5,000 values (past the first capacity and many growth steps): the
    concatenation, exact size, dtype kept; a value beyond int64 raises OverflowError and
    leaves what was appended."""
    from kvsim.core.heap import GrowingArray

    rng = np.random.default_rng(1)
    parts = [rng.integers(-2**62, 2**62, size=int(rng.integers(0, 5000))) for _ in range(60)]
    g = GrowingArray(np.int64)
    for p in parts:
        g.append(p if len(p) % 2 else p.tolist())  # arrays and lists alike
    assert len(g) == sum(map(len, parts))
    out = g.take()
    assert out.dtype == np.int64 and np.array_equal(out, np.concatenate(parts))
    g = GrowingArray(np.int64)
    g.append([1, 2])
    with pytest.raises(OverflowError):
        g.append([3, 2**63])
    assert g.take().tolist() == [1, 2]
    assert GrowingArray(np.float64).take().shape == (0,)
