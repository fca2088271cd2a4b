"""The compile cache is safe (issue 38): every module with compiled code is part of the
cache key; a damaged numba cache file (bit-flipped, truncated, empty, garbage) is found
before numba loads it, discarded with ONE warning line and recompiled, and the results
are the same; an unwritable cache location falls back to a private temporary cache;
``kvsim --version`` compiles nothing."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.jit.cache_key import SOURCES

PKG = Path(__file__).resolve().parents[2] / "kvsim"
#: ``chain_hash``'s ``last`` is inclusive: ids[0..4] of 5.  (Until session 17 this probe
#: passed ``last = 5`` and hashed one int64 read past the array, whatever the heap held:
#: the "different hash output" of the bit_flip_nbc failure under load was that read, not a
#: flip let through; :func:`test_probe_reads_only_its_array`.)
PROBE = ("from kvsim.ingest.hashing import chain_hash, partial_hash\n"
         "import numpy as np\n"
         "print(chain_hash(7, np.arange(5, dtype=np.int64), 0, 4, 0), partial_hash(11, 3))\n")
#: what the probe prints (the interpreted functions' numbers)
PROBE_OUT = "7783154887805759658 4118458948169242653\n"


def _compiles(path: Path) -> bool:
    """True when the module decorates a function with njit / numba.njit / jit."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = target.attr if isinstance(target, ast.Attribute) else \
                    getattr(target, "id", "")
                if name in ("njit", "jit"):
                    return True
    return False


def test_every_compiled_module_is_in_the_cache_key() -> None:
    compiled = {".".join(("kvsim", *p.relative_to(PKG).with_suffix("").parts))
                for p in PKG.rglob("*.py") if _compiles(p)}
    assert compiled, "no compiled module found: the scan is broken"
    assert sorted(compiled - set(SOURCES)) == []


def _run(cache: Path, code: str = PROBE, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",
                                                              "KVSIM_CACHE_FALLBACK")}
    full.update({"KVSIM_CACHE_DIR": str(cache), "NUMBA_CACHE_DIR": str(cache), **env})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full, timeout=600)


def _data_files(cache: Path, suffix: str) -> list[Path]:
    return sorted(p for p in cache.rglob(f"hashing.*{suffix}"))


def _all_recorded(cache: Path) -> None:
    """Every cache file is recorded, with its size, by the run that wrote it (else the next
    run would remove and recompile it, silently)."""
    import json

    files = [p for p in cache.rglob("*") if p.suffix in (".nbi", ".nbc")]
    assert files
    for path in files:
        manifest = json.loads((path.parent / "kvsim-manifest.json").read_text())["files"]
        assert manifest.get(path.name, [None, None])[1] == path.stat().st_size, path


@pytest.fixture
def warm_cache(tmp_path: Path) -> tuple[Path, str]:
    first = _run(tmp_path)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert first.stdout == PROBE_OUT  # compiled = interpreted
    assert _data_files(tmp_path, ".nbc")
    _all_recorded(tmp_path)
    return tmp_path, first.stdout


def _flip(path: Path, n: int = 20) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    for i in range(n):
        at = (len(data) // 2 + 37 * i) % len(data)
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: same size and time


def _flip_inside_frame(path: Path) -> None:
    """Flip 20 bytes inside the largest bytes value of the pickle (numba's compiled code),
    so the file still frames as a complete pickle; size and time kept."""
    import pickletools

    data = bytearray(path.read_bytes())
    ops = [(pos, arg) for _op, arg, pos in pickletools.genops(bytes(data))
           if isinstance(arg, bytes)]
    pos, arg = max(ops, key=lambda o: len(o[1]))
    start = pos + 5 + len(arg) // 2  # opcode + 4-byte length, then the payload's middle
    st = path.stat()
    for i in range(20):
        data[start + 7 * i] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_probe_reads_only_its_array(tmp_path: Path) -> None:
    """The probe's numbers are those of the interpreted functions (an out-of-bounds read
    raises there): its output cannot depend on what lies past its array."""
    result = _run(tmp_path, NUMBA_DISABLE_JIT="1")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == PROBE_OUT


@pytest.mark.parametrize("damage", ["bit_flip_nbc", "truncated_nbi", "empty_nbi",
                                    "garbage_nbc"])
def test_damaged_cache_one_warning_same_result(warm_cache, damage: str) -> None:
    cache, expected = warm_cache
    if damage == "bit_flip_nbc":
        _flip(_data_files(cache, ".nbc")[0])
    elif damage == "truncated_nbi":
        p = _data_files(cache, ".nbi")[0]
        p.write_bytes(p.read_bytes()[:40])
    elif damage == "empty_nbi":
        _data_files(cache, ".nbi")[0].write_bytes(b"")
    else:
        _data_files(cache, ".nbc")[0].write_bytes(bytes(range(256)) * 8)
    again = _run(cache)
    assert again.returncode == 0, again.stderr
    assert again.stdout == expected
    lines = again.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: numba cache"), again.stderr
    assert "damaged" in lines[0] and "Traceback" not in again.stderr
    third = _run(cache)  # rebuilt: silent again
    assert (third.stdout, third.stderr) == (expected, "")


def test_flip_in_a_file_whose_writer_died_one_warning_same_result(tmp_path: Path) -> None:
    """The writer ends with ``os._exit`` (killed, or a multiprocessing worker: no atexit):
    its files are recorded anyway, as numba writes them, so a flip inside a valid pickle
    frame is found by its CRC.  Failed before session 17 (recorded at exit only: the
    unrecorded file was only framing-checked, loaded, and LLVM failed on it)."""
    first = _run(tmp_path, PROBE + "import os, sys; sys.stdout.flush(); os._exit(0)\n")
    assert first.returncode == 0 and first.stderr == "", first.stderr
    assert first.stdout == PROBE_OUT
    _all_recorded(tmp_path)  # as numba wrote them: no atexit ran
    _flip_inside_frame(_data_files(tmp_path, ".nbc")[0])
    again = _run(tmp_path)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert again.stdout == first.stdout
    lines = again.stderr.splitlines()
    assert len(lines) == 1 and "damaged" in lines[0] and "checksum" in lines[0], again.stderr
    third = _run(tmp_path)
    assert (third.stdout, third.stderr) == (first.stdout, "")


def test_unrecorded_files_are_never_loaded(warm_cache) -> None:
    """A cache file with no record (its writer killed between numba's write and its
    record; a manifest lost) is not trusted on sight: removed and recompiled, even when it
    frames as a valid pickle.  Failed before session 17 (framing-checked only: loaded)."""
    cache, expected = warm_cache
    for manifest in cache.rglob("kvsim-manifest.json"):
        manifest.unlink()
    _flip_inside_frame(_data_files(cache, ".nbc")[0])
    again = _run(cache)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert again.stdout == expected
    third = _run(cache)
    assert (third.stdout, third.stderr) == (expected, "")


def test_unwritable_cache_falls_back_to_a_private_one(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    (tmp_path / "tmp").mkdir()
    result = _run(blocker / "cache", TMPDIR=str(tmp_path / "tmp"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "private temporary cache" in lines[0], result.stderr
    assert list((tmp_path / "tmp").rglob("*.nbi"))


def test_version_compiles_nothing(tmp_path: Path) -> None:
    result = _run(tmp_path, "import sys; sys.argv = ['kvsim', '--version']\n"
                            "from kvsim.__main__ import main; main()")
    assert result.returncode == 0 and result.stdout.startswith("kvsim "), result.stderr
    assert not list(tmp_path.rglob("*.nbi")) and not list(tmp_path.rglob("*.nbc"))


def test_bit_flipped_replay_core_one_warning_same_result(tmp_path: Path) -> None:
    """The issue's segfault: 20 flipped bytes in the cached replay core's largest ``.nbc``
    (size and time kept, as bit rot leaves them).  Slow: two compiles of the core."""
    code = ("import sys; sys.argv = ['kvsim', 'simulate', '--trace', "
            f"{str(PKG.parent / 'traces' / 'sample_chat.parquet')!r}, '--hbm-gb', '0.06', "
            "'--engine', 'compiled', "
            "'--json']\nfrom kvsim.__main__ import main; main()")
    first = _run(tmp_path, code)
    assert first.returncode == 0, first.stderr
    _all_recorded(tmp_path)
    biggest = max(tmp_path.rglob("*.nbc"), key=lambda p: p.stat().st_size)
    _flip(biggest)
    again = _run(tmp_path, code)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert "Traceback" not in again.stderr
    lines = [line for line in again.stderr.splitlines() if "numba cache" in line]
    assert len(lines) == 1 and "damaged" in lines[0] and biggest.name in lines[0], again.stderr
