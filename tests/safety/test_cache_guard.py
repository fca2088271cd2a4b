"""The compile-cache guard's rules on plain files (no numba, no compile): a cache file is
trusted only when recorded with a matching CRC-32; a stamp (size, modification time,
inode, change time) recorded at least 2 s after the file's last change vouches for it
without reading it; records from several processes merge (kvsim/jit/cache_guard.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import time
from pathlib import Path

import pytest

from kvsim.jit import cache_guard
from kvsim.jit.cache_guard import MANIFEST, RACY_NS, record, validate


def _cache_file(folder: Path, name: str, payload: bytes = b"x" * 4096) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(pickle.dumps(("numba-like", payload), protocol=4))
    return path


def _flip_keep_time(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the bytes payload: still a valid pickle
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())["files"]


def _settle(folder: Path) -> None:
    """Make every record non-racy (as if it were taken 3 s after the file's change)."""
    files = _manifest(folder)
    for entry in files.values():
        entry[5] = entry[4] + RACY_NS + 1_000_000_000
    (folder / MANIFEST).write_text(json.dumps({"files": files}))


def test_recorded_file_is_trusted(tmp_path: Path, capsys) -> None:
    path = _cache_file(tmp_path / "sub", "m.f-1.py311.1.nbc")
    record(path.parent)
    assert validate(tmp_path) == [] and path.exists()
    assert capsys.readouterr().err == ""


def test_flip_with_size_and_time_kept_is_removed_with_one_warning(tmp_path, capsys) -> None:
    path = _cache_file(tmp_path / "sub", "m.f-1.py311.1.nbc")
    record(path.parent)
    _settle(path.parent)
    _flip_keep_time(path)  # the change time moves: the stamp differs, the CRC is read
    assert validate(tmp_path) == ["sub/m.f-1.py311.1.nbc"] and not path.exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "1 damaged file(s)" in err[0] and "checksum mismatch" in err[0]
    assert "m.f-1.py311.1.nbc" not in _manifest(path.parent)


def test_unrecorded_file_is_removed_silently(tmp_path: Path, capsys) -> None:
    """No file is trusted on sight (a writer killed between numba's write and its record,
    a lost manifest): removed, numba recompiles; not known damaged, so no warning."""
    path = _cache_file(tmp_path / "sub", "m.f-1.py311.1.nbc")
    assert validate(tmp_path) == ["sub/m.f-1.py311.1.nbc"] and not path.exists()
    assert capsys.readouterr().err == ""


def test_rewritten_garbage_warns(tmp_path: Path, capsys) -> None:
    path = _cache_file(tmp_path / "sub", "m.f-1.py311.nbi")
    record(path.parent)
    path.write_bytes(path.read_bytes()[:20])
    assert validate(tmp_path) == ["sub/m.f-1.py311.nbi"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated or not numba's format" in err


def test_settled_stamp_is_trusted_without_reading(tmp_path, monkeypatch) -> None:
    """The cost: a file whose stamp equals a settled record is not read (no CRC)."""
    paths = [_cache_file(tmp_path / f"d{i}", f"m.f-{j}.py311.1.nbc")
             for i in range(3) for j in range(4)]
    for folder in {p.parent for p in paths}:
        record(folder)
        _settle(folder)

    def no_read(path):
        raise AssertionError(f"read {path}")

    monkeypatch.setattr(cache_guard, "_crc", no_read)
    monkeypatch.setattr(cache_guard, "_framing_ok", no_read)
    assert validate(tmp_path) == []


def test_racy_record_is_read_again(tmp_path: Path, capsys) -> None:
    """A record taken within 2 s of the file's last change does not vouch for the stamp (a
    write in the same clock tick could keep the change time): the CRC is read, here a wrong
    one (as if the bytes changed in that tick), and the file is removed."""
    path = _cache_file(tmp_path / "sub", "m.f-1.py311.1.nbc")
    record(path.parent)
    files = _manifest(path.parent)
    files[path.name][0] ^= 1  # the CRC of other bytes, same stamp
    files[path.name][5] = files[path.name][4] + RACY_NS // 2
    (path.parent / MANIFEST).write_text(json.dumps({"files": files}))
    assert validate(tmp_path) == ["sub/m.f-1.py311.1.nbc"]
    assert "checksum mismatch" in capsys.readouterr().err


def test_full_check_reads_every_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """``KVSIM_CACHE_CHECK=full``: bit rot below the file system (no stamp changes) is
    found too: a settled record whose CRC no longer matches."""
    path = _cache_file(tmp_path / "sub", "m.f-1.py311.1.nbc")
    record(path.parent)
    _settle(path.parent)
    files = _manifest(path.parent)
    files[path.name][0] ^= 1
    (path.parent / MANIFEST).write_text(json.dumps({"files": files}))
    assert validate(tmp_path) == []  # the settled stamp vouches
    monkeypatch.setenv("KVSIM_CACHE_CHECK", "full")
    assert validate(tmp_path) == ["sub/m.f-1.py311.1.nbc"]
    assert "checksum mismatch" in capsys.readouterr().err


def test_record_leaves_older_unrecorded_files_to_validate(tmp_path: Path) -> None:
    """A process records only what was written since its compile began: an older
    unrecorded file (perhaps flipped since) is not blessed."""
    old = _cache_file(tmp_path / "sub", "m.old-1.py311.1.nbc")
    os.utime(old, ns=(time.time_ns() - 60 * 10**9,) * 2)
    since = time.time_ns()
    new = _cache_file(tmp_path / "sub", "m.new-1.py311.1.nbc")
    record(tmp_path / "sub", since)
    assert sorted(_manifest(tmp_path / "sub")) == [new.name]


def _writer(folder: str, i: int, rounds: int) -> None:
    for r in range(rounds):
        path = _cache_file(Path(folder), f"m.f{i}-{r}.py311.1.nbc")
        since = time.time_ns() - 10**9
        os.utime(path, ns=(since, since))
        record(folder, since)  # (others' files written before are not this one's)


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_records_of_concurrent_processes_merge(tmp_path: Path) -> None:
    """Four processes recording into one folder at once: every file is recorded (the
    manifest is read, merged and replaced under a lock; no update is lost)."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), i, 15)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(_manifest(tmp_path)) == 60
    assert validate(tmp_path) == []


@pytest.mark.parametrize("garbage", [b"\x00\xff garbage", b"[1, 2]", b'{"files": {"a": "b"}}'])
def test_garbage_manifest_is_damage_with_one_warning(tmp_path: Path, capsys, garbage) -> None:
    """A manifest that is not one kvsim wrote vouches for nothing: its folder's files are
    removed (numba recompiles them) with the one warning line, not silently as merely
    unrecorded (session-18 main: a full recompile and no word)."""
    paths = [_cache_file(tmp_path / "sub", f"m.f-{j}.py311.1.nbc") for j in range(2)]
    record(paths[0].parent)
    (paths[0].parent / MANIFEST).write_bytes(garbage)
    assert sorted(validate(tmp_path)) == [f"sub/{p.name}" for p in paths]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "2 damaged file(s)" in err[0] and MANIFEST in err[0]
    assert validate(tmp_path) == [] and capsys.readouterr().err == ""  # recovered
