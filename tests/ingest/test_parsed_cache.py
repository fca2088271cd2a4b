"""The parsed-trace cache (issue 34, the per-process floor: the Mooncake conversation trace's
parse ~0.13 CPU-s, its cached columns ~0.01): a hit builds exactly the parsed table; an edited
file, another reader or limits never load an old parse; a damaged entry is one warning
line and a parse; small files, pipes and ``KVSIM_TRACE_CACHE=0`` leave nothing; at most
``MAX_ENTRIES`` entries stay (kvsim/core/parsed_cache.py)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvsim.core import parsed_cache
from kvsim.core.errors import KvsimInputError, KvsimWarning
from kvsim.ingest import mooncake


def _trace(path: Path, n: int = 4000, salt: int = 0) -> Path:
    """A plain Mooncake trace of ``n`` requests (> MIN_BYTES): a shared two-block prefix,
    then one block of its own."""
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"timestamp": 1000 + 7 * i + salt, "input_length": 1300 + i % 200,
                                 "output_length": 3 + i % 11,
                                 "hash_ids": [salt, salt + 1, 10_000 + i]}) + "\n")
    assert path.stat().st_size >= parsed_cache.MIN_BYTES
    return path


def _read(path, monkeypatch, cache: bool = True):
    """(table, warnings, whether the parse ran)."""
    parsed = []
    real = mooncake._plain_columns

    def spy(p, lim):
        parsed.append(1)
        return real(p, lim)

    monkeypatch.setattr(mooncake, "_plain_columns", spy)
    if not cache:
        monkeypatch.setenv(parsed_cache.ENV_OFF, "0")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        table = mooncake.read_mooncake(path)
    monkeypatch.setattr(mooncake, "_plain_columns", real)
    monkeypatch.delenv(parsed_cache.ENV_OFF, raising=False)
    return table, [str(w.message) for w in seen if issubclass(w.category, KvsimWarning)], \
        bool(parsed)


def _equal(a, b) -> None:
    assert (a.block_size_tokens, a.skipped, a.source) == (b.block_size_tokens, b.skipped,
                                                          b.source)
    for name in ("arrival_us", "prompt_tokens", "output_tokens", "hashed_tokens"):
        x, y = np.asarray(a.column(name)), np.asarray(b.column(name))
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    (ox, ix), (oy, iy) = a.flat_block_ids(), b.flat_block_ids()
    assert ox.dtype == oy.dtype and np.array_equal(ox, oy)
    assert ix.dtype == iy.dtype and np.array_equal(ix, iy)
    assert list(a.df.columns) == list(b.df.columns)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(parsed_cache.ENV_OFF, raising=False)
    return tmp_path / "cache" / "traces"


def test_a_hit_is_the_parsed_table(tmp_path, monkeypatch, cache_dir) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    first, w1, parsed1 = _read(trace, monkeypatch)
    second, w2, parsed2 = _read(trace, monkeypatch)
    plain, _, _ = _read(trace, monkeypatch, cache=False)
    assert (parsed1, parsed2) == (True, False) and w1 == w2 == []
    assert len(list(cache_dir.glob("*.npz"))) == 1
    _equal(second, plain)
    _equal(first, plain)


def test_an_edited_file_is_parsed_again(tmp_path, monkeypatch, cache_dir) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    _read(trace, monkeypatch)
    _trace(trace, n=4100, salt=5)  # same path, other content
    table, warned, parsed = _read(trace, monkeypatch)
    assert parsed and warned == [] and len(table) == 4100
    _equal(table, _read(trace, monkeypatch, cache=False)[0])
    assert len(list(cache_dir.glob("*.npz"))) == 1  # replaced, one entry per path


def test_another_reader_key_is_parsed_again(tmp_path, monkeypatch, cache_dir) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    _read(trace, monkeypatch)
    monkeypatch.setattr(mooncake, "_reader_key", lambda lim: "another kvsim")
    assert _read(trace, monkeypatch)[2]


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_a_damaged_entry_is_one_warning_and_a_parse(tmp_path, monkeypatch, cache_dir,
                                                    damage) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    _read(trace, monkeypatch)
    (entry,) = cache_dir.glob("*.npz")
    data = bytearray(entry.read_bytes())
    if damage == "flip":  # a byte inside the ids' array, CRC of the zip member aside
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "garbage":
        data = bytearray(b"not a numpy file at all" * 10)
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    table, warned, parsed = _read(trace, monkeypatch)
    assert parsed and len(warned) == 1 and "damaged parsed-trace cache entry" in warned[0]
    _equal(table, _read(trace, monkeypatch, cache=False)[0])
    again, warned2, parsed2 = _read(trace, monkeypatch)  # stored again, clean
    assert (warned2, parsed2) == ([], False)
    _equal(again, table)


def test_small_files_pipes_and_off_leave_nothing(tmp_path, monkeypatch, cache_dir) -> None:
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"timestamp": 1, "input_length": 10, "output_length": 2,
                                 "hash_ids": [1]}) + "\n")
    _read(small, monkeypatch)
    assert not cache_dir.exists() or not list(cache_dir.glob("*.npz"))
    big = _trace(tmp_path / "t.jsonl")
    _read(big, monkeypatch, cache=False)
    assert not cache_dir.exists() or not list(cache_dir.glob("*.npz"))
    assert parsed_cache.lookup("/dev/null", "k") == (None, None)


def test_at_most_max_entries_stay(tmp_path, monkeypatch, cache_dir) -> None:
    monkeypatch.setattr(parsed_cache, "MAX_ENTRIES", 2)
    traces = [_trace(tmp_path / f"t{i}.jsonl", n=3000 + i) for i in range(3)]
    for t in traces:
        _read(t, monkeypatch)
    assert len(list(cache_dir.glob("*.npz"))) == 2
    assert not _read(traces[2], monkeypatch)[2]  # the latest is kept
    assert _read(traces[0], monkeypatch)[2]  # the oldest was removed


def test_bounded_by_bytes_too(tmp_path, monkeypatch, cache_dir) -> None:
    """At most MAX_BYTES in all (session 21: the cache was bounded by 16 entries only, 16
    parses of 100x the Mooncake trace ~4.3 GB); a parse larger than that is not kept."""
    first = _trace(tmp_path / "t0.jsonl", n=3000)
    _read(first, monkeypatch)
    (entry,) = cache_dir.glob("*.npz")
    monkeypatch.setattr(parsed_cache, "MAX_BYTES", 2 * entry.stat().st_size + 100)
    for i in (1, 2):
        _read(_trace(tmp_path / f"t{i}.jsonl", n=3000, salt=i), monkeypatch)
    assert len(list(cache_dir.glob("*.npz"))) == 2  # the oldest went for room
    assert _read(first, monkeypatch)[2]
    monkeypatch.setattr(parsed_cache, "MAX_BYTES", 1000)  # smaller than any parse
    for f in cache_dir.glob("*.npz"):
        f.unlink()
    _read(first, monkeypatch)
    assert list(cache_dir.glob("*.npz")) == []


@pytest.mark.parametrize("value", ["off", "false", "yes", " 0"])
def test_a_switch_value_other_than_0_or_1_is_refused(monkeypatch, cache_dir, value) -> None:
    """``KVSIM_TRACE_CACHE=off`` left the cache on silently (main: only "0" was off)."""
    from typer.testing import CliRunner

    from kvsim.cli import app
    from tests.helpers import assert_one_line_error

    monkeypatch.setenv(parsed_cache.ENV_OFF, value)
    with pytest.raises(KvsimInputError, match="KVSIM_TRACE_CACHE"):
        parsed_cache.cache_root()
    out = cache_dir.parent.parent / "o.parquet"
    trace = Path(__file__).resolve().parents[2] / "traces" / "sample_mooncake.jsonl"
    result = CliRunner().invoke(app, ["import-request-trace", "--requests", str(trace),
                                      "--out", str(out)])
    assert_one_line_error(result, "field 'KVSIM_TRACE_CACHE'", "expected 0", f"got {value!r}")
    assert not out.exists()
    for on in ("1", ""):
        monkeypatch.setenv(parsed_cache.ENV_OFF, on)
        assert parsed_cache.cache_root() == cache_dir


def test_a_killed_writers_temporary_file_is_removed(tmp_path, monkeypatch, cache_dir) -> None:
    """A store SIGKILLed mid-write left ``.<entry>.npz.XXXX.tmp`` for good (main: the prune
    looked at ``*.npz`` only); a live writer's is kept."""
    cache_dir.mkdir(parents=True)
    dead = cache_dir / ".0123456789abcdef0123456789abcdef.npz.999999999.x1y2.tmp"
    live = cache_dir / f".0123456789abcdef0123456789abcdef.npz.{__import__('os').getpid()}.z.tmp"
    dead.write_bytes(b"partial")
    live.write_bytes(b"being written")
    _read(_trace(tmp_path / "t.jsonl"), monkeypatch)
    assert not dead.exists() and live.exists()


def test_an_edit_keeping_size_and_times_is_parsed_again(tmp_path, monkeypatch,
                                                        cache_dir) -> None:
    """Keyed on the bytes, not the stamp: an edit of the same size, with the old
    modification time put back, is parsed again (no stale table)."""
    import os

    trace = _trace(tmp_path / "t.jsonl")
    st = trace.stat()
    _read(trace, monkeypatch)
    text = trace.read_text()
    edited = text.replace('"output_length": 3,', '"output_length": 4,', 1)
    assert edited != text and len(edited) == len(text)
    trace.write_text(edited)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    table, warned, parsed = _read(trace, monkeypatch)
    assert parsed and warned == []
    _equal(table, _read(trace, monkeypatch, cache=False)[0])


def test_an_entry_that_cannot_be_removed_is_not_said_removed(tmp_path, monkeypatch,
                                                             cache_dir) -> None:
    """A damaged entry in a folder kvsim cannot write (a read-only cache shared by a
    team): the warning says it was ignored, not removed (main: "removed", and it stayed)."""
    import os

    trace = _trace(tmp_path / "t.jsonl")
    _read(trace, monkeypatch)
    (entry,) = cache_dir.glob("*.npz")
    entry.write_bytes(b"garbage" * 10)
    real = os.unlink

    def refuse(path, *a, **k):
        if str(path) == str(entry):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "unlink", refuse)
    table, warned, parsed = _read(trace, monkeypatch)
    monkeypatch.setattr(os, "unlink", real)
    assert parsed and len(warned) == 1
    assert "entry ignored (cannot remove it: Permission denied)" in warned[0], warned
    assert "removed" not in warned[0].split(";")[0]


def test_a_digest_started_ahead_is_the_lookups_own(tmp_path, monkeypatch, cache_dir) -> None:
    """``digest_ahead`` (the command line starts it before its imports): the lookup takes
    the digest the thread computed for the same stamp instead of reading the file again;
    after an edit (another stamp) the lookup hashes the new bytes itself."""
    import threading

    trace = _trace(tmp_path / "t.jsonl")
    plain, _ = parsed_cache.lookup(trace, "k")
    reads = []
    real = parsed_cache._sha256_file

    def spy(p):
        reads.append(threading.current_thread().name)
        return real(p)

    monkeypatch.setattr(parsed_cache, "_sha256_file", spy)
    parsed_cache.digest_ahead(trace)
    entry, _ = parsed_cache.lookup(trace, "k")
    assert entry.digest == plain.digest and reads == ["kvsim-digest-ahead"]
    parsed_cache.digest_ahead(trace)
    for thread, _ in list(parsed_cache._AHEAD.values()):
        thread.join()
    _trace(trace, n=4100, salt=5)  # edited after its digest ahead was taken
    edited, _ = parsed_cache.lookup(trace, "k")
    assert edited.digest == real(trace) != plain.digest
    assert reads[-1] == "MainThread"
    monkeypatch.setenv(parsed_cache.ENV_OFF, "0")  # the cache off: nothing started
    n = len(reads)
    parsed_cache.digest_ahead(trace)
    assert len(reads) == n and not any(t.is_alive() for t, _ in parsed_cache._AHEAD.values())
