"""The Mooncake reader's fast path (a batch of lines parsed, then checked with numpy; issue
34: 0.47 s for the conversation trace's 12,031 lines) builds exactly the table of the
line-by-line reader, and leaves every other file to it: same warnings, same one-line
errors."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.ingest import mooncake

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample_mooncake.jsonl"
REAL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake"


def _read(path, fast: bool, monkeypatch, **kw):
    """(table or error text, warnings, whether the fast path built it)."""
    used = []
    real = mooncake._plain_columns

    def spy(p, lim):
        out = real(p, lim) if fast else None
        used.append(out is not None)
        return out

    monkeypatch.setattr(mooncake, "_plain_columns", spy)
    monkeypatch.setenv("KVSIM_TRACE_CACHE", "0")  # every read parses (kvsim.core.parsed_cache)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            out = mooncake.read_mooncake(path, **kw)
        except KvsimInputError as exc:
            out = f"error: {exc}"
    monkeypatch.setattr(mooncake, "_plain_columns", real)
    return out, [str(w.message) for w in seen], used == [True]


def _same(path, monkeypatch, expect_fast: bool, **kw) -> None:
    fast, fast_warn, used = _read(path, True, monkeypatch, **kw)
    slow, slow_warn, _ = _read(path, False, monkeypatch, **kw)
    assert used == expect_fast
    assert fast_warn == slow_warn
    if isinstance(slow, str):
        assert fast == slow
        return
    assert list(fast.df.columns) == list(slow.df.columns)
    for col in fast.df.columns:
        a, b = fast.df[col], slow.df[col]
        assert a.dtype == b.dtype, col
        if col == "block_ids":
            assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))
        else:
            assert a.equals(b), col
    assert (fast.block_size_tokens, fast.skipped, fast.source) == \
        (slow.block_size_tokens, slow.skipped, slow.source)


def _write(tmp_path, rows, name="t.jsonl", sep="\n", raw=None) -> Path:
    p = tmp_path / name
    text = raw if raw is not None else sep.join(
        r if isinstance(r, str) else json.dumps(r) for r in rows) + sep
    if name.endswith(".gz"):
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_bytes(text.encode())
    return p


ROWS = [{"timestamp": 27482, "input_length": 6955, "output_length": 52,
         "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]},
        {"timestamp": 30535.5, "input_length": 6472, "output_length": 1, "tool": "x",
         "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]},
        {"timestamp": 28000.0005, "input_length": 512, "output_length": 3, "hash_ids": [46]},
        {"timestamp": 0.0025, "input_length": 1, "output_length": 1, "hash_ids": [-1]}]


def test_sample_and_plain_files_take_the_fast_path(tmp_path, monkeypatch) -> None:
    _same(SAMPLE, monkeypatch, True)
    _same(_write(tmp_path, ROWS), monkeypatch, True)
    _same(_write(tmp_path, ROWS, sep="\r\n"), monkeypatch, True)  # CRLF
    _same(_write(tmp_path, ROWS, name="t.jsonl.gz"), monkeypatch, True)
    blank = _write(tmp_path, [], raw="\n  \n" + json.dumps(ROWS[0]) + "\n\n"
                   + json.dumps(ROWS[1]))  # blank lines, no final newline
    _same(blank, monkeypatch, True)


def test_small_batches_split_lines_alike(tmp_path, monkeypatch) -> None:
    longest = max(map(len, SAMPLE.read_text().splitlines()))
    for chars in (longest + 2, longest + 3, 3 * longest + 1):  # lines cut across batches
        monkeypatch.setattr(mooncake, "_CHUNK_CHARS", chars)
        _same(SAMPLE, monkeypatch, True)
    monkeypatch.setattr(mooncake, "_CHUNK_CHARS", longest // 3)  # a batch inside a line
    _same(SAMPLE, monkeypatch, False)


@pytest.mark.parametrize("row", [
    {"timestamp": "27482", "input_length": 512, "output_length": 3, "hash_ids": [1]},
    {"timestamp": 1, "input_length": 512.0, "output_length": 3, "hash_ids": [1]},
    {"timestamp": 1, "input_length": "512", "output_length": 3, "hash_ids": [1]},
    {"timestamp": True, "input_length": 512, "output_length": 3, "hash_ids": [1]},
    {"timestamp": -1, "input_length": 512, "output_length": 3, "hash_ids": [1]},
    {"timestamp": 1e300, "input_length": 512, "output_length": 3, "hash_ids": [1]},
    {"timestamp": 1, "input_length": 0, "output_length": 3, "hash_ids": []},
    {"timestamp": 1, "input_length": 512, "output_length": 3, "hash_ids": [1, 2]},
    {"timestamp": 1, "input_length": 512, "output_length": 3, "hash_ids": [2**64]},
    {"timestamp": 1, "input_length": 512, "output_length": 3, "hash_ids": [True]},
    {"timestamp": 1, "input_length": 512, "output_length": 10**30, "hash_ids": [1]},
    {"timestamp": 1, "input_length": 512, "hash_ids": [1]},
    [1, 2, 3], "not json", '{"timestamp": 1} {"x": 2}', "NaN",
    '{"timestamp": NaN, "input_length": 512, "output_length": 3, "hash_ids": [1]}',
])
def test_any_other_line_is_read_line_by_line(tmp_path, monkeypatch, row) -> None:
    p = _write(tmp_path, [ROWS[0], row, ROWS[2]])
    _same(p, monkeypatch, False)
    _same(p, monkeypatch, False, skip_bad_rows=True)


def test_ids_off_the_prefix_tree_warn_or_refuse_as_before(tmp_path, monkeypatch) -> None:
    off = {"timestamp": 5, "input_length": 1024, "output_length": 3, "hash_ids": [9, 47]}
    p = _write(tmp_path, [*ROWS, off])
    _same(p, monkeypatch, False)
    _same(p, monkeypatch, False, strict=True)


def test_empty_and_undecodable_files(tmp_path, monkeypatch) -> None:
    _same(_write(tmp_path, [], raw=""), monkeypatch, False)
    _same(_write(tmp_path, [], raw="\n\n"), monkeypatch, False)
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(json.dumps(ROWS[0]).encode() + b"\n\xff\xfe\n")
    _same(bad, monkeypatch, False)


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/traces/mooncake is absent")
def test_real_conversation_trace(monkeypatch) -> None:
    _same(REAL / "conversation_trace.jsonl", monkeypatch, True)
