"""numba's disk cache checked before numba reads it: a damaged file is discarded, never
loaded (a truncated or garbage index was an ``UnpicklingError`` traceback, a zero-length
one was reported as Ctrl-C, and flipped bytes in a cached core's ``.nbc`` crashed the
process with a segmentation fault).

A manifest (``kvsim-manifest.json`` in the keyed cache directory, :mod:`kvsim.jit.cache_key`)
records each cache file's size, modification time and CRC-32.  It is written when a kvsim
process exits (``atexit``: files this process or its workers compiled are added) and read
by :func:`validate` when kvsim is imported, before any compiled function can load:

* a file whose size and time match its entry but whose CRC-32 does not: damaged (bit rot,
  flipped bytes) -> removed;
* a file that is new or rewritten since (another process, or numba adding a signature):
  its pickle framing is walked (``pickletools``, nothing is executed) -> removed when it
  is truncated, empty or not a pickle.

numba recompiles what was removed (it handles a data file missing behind its index).
Each removal is reported as ONE warning line on stderr.  Files are removed only inside
kvsim's keyed directory; when that directory cannot be written, kvsim uses a private
temporary cache instead (:func:`kvsim.jit.cache_key.configure`).  No numba import, no
numba internals: files only.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickletools
import sys
import zlib
from pathlib import Path

MANIFEST = "kvsim-manifest.json"
#: numba's cache files: index (``.nbi``) and data (``.nbc``).
SUFFIXES = (".nbi", ".nbc")
_REGISTERED: set[str] = set()


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(root: Path) -> list[Path]:
    out = []
    for folder, _dirs, names in os.walk(root):
        out.extend(Path(folder) / n for n in names if n.endswith(SUFFIXES))
    return sorted(out)


def _read_manifest(root: Path) -> dict[str, list[int]]:
    try:
        data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        return {str(k): [int(x) for x in v] for k, v in data.get("files", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _framing_ok(path: Path) -> bool:
    """True when the file is one or more complete pickles (numba's index: a version
    pickle then the data pickle; a data file: one pickle); nothing is unpickled."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if not data:
        return False
    pos = 0
    try:
        while pos < len(data):
            end = None
            for _op, _arg, at in pickletools.genops(data[pos:]):
                end = at
            if end is None:
                return False
            pos += end + 1  # genops stops at STOP; the next pickle (if any) follows
    except Exception:  # noqa: BLE001 - any framing error: truncated or not a pickle
        return False
    return True


def validate(root: str | Path) -> list[str]:
    """Remove the damaged cache files under ``root`` (module docstring); returns what was
    removed (relative names) and prints one warning line when anything was."""
    root = Path(root)
    if not root.is_dir():
        return []
    manifest = _read_manifest(root)
    removed: list[str] = []
    why = ""
    for path in _files(root):
        name = str(path.relative_to(root))
        try:
            st = path.stat()
        except OSError:
            continue
        entry = manifest.get(name)
        if entry is not None and entry[0] == st.st_size and entry[1] == st.st_mtime_ns:
            bad = _crc(path) != entry[2]
            reason = "checksum mismatch"
        else:
            bad = not _framing_ok(path)
            reason = "truncated or not numba's format" if st.st_size else "empty"
        if bad:
            try:
                path.unlink()
            except OSError as exc:
                raise PermissionError(f"cannot remove damaged cache file {path} "
                                      f"({exc.strerror})") from None
            removed.append(name)
            why = why or f"{name}: {reason}"
    if removed:
        sys.stderr.write(f"warning: numba cache {root}: {len(removed)} damaged file(s) "
                         f"discarded ({why}); that code compiles afresh\n")
    return removed


def write_manifest(root: str | Path) -> None:
    """Record every cache file under ``root`` (size, time, CRC-32; entries kept when the
    file is unchanged), merged with what other processes recorded; written atomically."""
    root = Path(root)
    if not root.is_dir():
        return
    old = _read_manifest(root)
    files: dict[str, list[int]] = {}
    for path in _files(root):
        name = str(path.relative_to(root))
        try:
            st = path.stat()
            entry = old.get(name)
            if entry is None or entry[0] != st.st_size or entry[1] != st.st_mtime_ns:
                entry = [st.st_size, st.st_mtime_ns, _crc(path)]
        except OSError:
            continue
        files[name] = entry
    tmp = root / f".{MANIFEST}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"files": files}, sort_keys=True), encoding="utf-8")
        os.replace(tmp, root / MANIFEST)
    with contextlib.suppress(OSError):
        tmp.unlink()


def guard(root: str | Path) -> None:
    """:func:`validate` now, :func:`write_manifest` at this process's exit (once per
    directory)."""
    root = str(root)
    validate(root)
    if root not in _REGISTERED:
        _REGISTERED.add(root)
        pid = os.getpid()

        def at_exit() -> None:
            if os.getpid() == pid:  # not in a forked worker
                write_manifest(root)

        atexit.register(at_exit)
