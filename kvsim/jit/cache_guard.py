"""numba's disk cache checked before numba reads it: no damaged file is ever loaded (a
truncated or garbage index was an ``UnpicklingError`` traceback, a zero-length one was
reported as Ctrl-C, and flipped bytes in a cached core's ``.nbc`` crashed the process or
returned wrong numbers).

**Unrecorded = untrusted.**  Each folder of the keyed cache directory
(:mod:`kvsim.jit.cache_key`; numba makes one per source folder) holds a manifest,
``kvsim-manifest.json``: for each cache file (``.nbi`` index, ``.nbc`` data) its CRC-32 and
the stamp it had when the CRC was taken (size, modification time, inode, change time).

* **Recorded by the process that wrote it, right after numba wrote it**: a listener on
  numba's public event API (:func:`listen`, ``numba.core.event``; registered at ``import
  kvsim`` when numba is loaded, else as numba loads) hears numba release its compiler lock
  after an outermost compile (numba saves to disk before it releases) and records the
  files of the folders compiled into that were written since that compile began.  Under a
  lock (``flock``), merged with what other processes recorded, written atomically: several
  processes (xdist workers, sweep workers, many checkouts) can share one directory.
* **Checked by every process at import** (:func:`validate`, before any compiled function
  can load), file by file:

  - stamp equal to the recorded one (and the CRC taken at least :data:`RACY_NS` after the
    file's last change): trusted without reading it.  Every write through the file system
    changes the change time (``ctime``), which no one can set back (``os.utime`` sets it to
    now), so a flip with size and modification time restored is seen here;
  - stamp changed: the file's CRC-32 is computed; equal to the recorded one: trusted (and
    the stamp refreshed); else the file is removed;
  - no entry (a writer killed between numba's write and its record, or files of an older
    kvsim): removed.  No file is ever trusted on sight.

numba recompiles what was removed (it handles a data file missing behind its index).  A
removal reports ONE warning line on stderr when the file is certainly damaged (its CRC
differs at an unchanged size and modification time, or it is empty, truncated or not a
pickle: its framing is walked with ``pickletools``, nothing executed; or its folder's
manifest exists but is not one kvsim wrote); a file that is only
unrecorded, or rewritten by a process that has not recorded it yet, is removed silently.
``KVSIM_CACHE_CHECK=full`` computes every CRC at every import (bit rot below the file
system, which changes no stamp).  Files are removed only inside kvsim's keyed directory;
when it cannot be written or cleaned, kvsim uses a private temporary cache instead
(:func:`kvsim.jit.cache_key.configure`).  No numba import at module level, nothing written
into numba: files and numba's documented event API only.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickletools
import sys
import threading
import time
import zlib
from pathlib import Path

MANIFEST = "kvsim-manifest.json"
LOCK = ".kvsim-manifest.lock"
#: numba's cache files: index (``.nbi``) and data (``.nbc``).
SUFFIXES = (".nbi", ".nbc")
#: A CRC taken within this long of the file's last change does not vouch for the stamp: a
#: write in the same tick of the file system's coarse clock (Linux: one jiffy, 1-10 ms)
#: could leave the change time equal (git's "racily clean" problem); such a file is read
#: again at the next import.  2 s covers the coarsest common clock (FAT's 2 s).
RACY_NS = 2_000_000_000
#: slack when comparing a file's modification time (the kernel's coarse clock) with
#: ``time.time_ns()`` taken as a compile began (the coarse clock may lag by one tick)
CLOCK_SLACK_NS = 50_000_000
ENV_CHECK = "KVSIM_CACHE_CHECK"
#: during a long outer compile, what its callees saved is recorded at most this often
INTERIM_NS = 1_000_000_000


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _folders(root: Path) -> dict[Path, list[str]]:
    """Each folder under ``root`` holding cache files -> their names."""
    out: dict[Path, list[str]] = {}
    for folder, _dirs, names in os.walk(root):
        found = sorted(n for n in names if n.endswith(SUFFIXES))
        if found:
            out[Path(folder)] = found
    return out


def _read_manifest(folder: Path) -> dict[str, list[int]]:
    """name -> [crc, size, mtime_ns, ino, ctime_ns, verified_ns]; {} when absent or
    unreadable (then every file of the folder is unrecorded)."""
    try:
        with open(os.path.join(folder, MANIFEST), "rb") as fh:
            files = json.loads(fh.read()).get("files", {})
        return {k: v for k, v in files.items()
                if isinstance(v, list) and len(v) == 6 and all(type(x) is int for x in v)}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _manifest_damaged(folder: Path) -> bool:
    """True when ``folder``'s manifest exists but is not one kvsim wrote (not JSON, no
    ``files`` table, or an entry not six integers): the files it no longer vouches for are
    then removed as damaged, with the warning line, not silently as unrecorded."""
    try:
        with open(os.path.join(folder, MANIFEST), "rb") as fh:
            files = json.loads(fh.read())["files"]
        return not all(isinstance(v, list) and len(v) == 6 and all(type(x) is int for x in v)
                       for v in files.values())
    except FileNotFoundError:
        return False
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return True


def _write_manifest(folder: Path, files: dict[str, list[int]]) -> None:
    tmp = folder / f".{MANIFEST}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(json.dumps({"files": files}, sort_keys=True), encoding="utf-8")
        os.replace(tmp, folder / MANIFEST)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on ``folder``'s manifest (``flock``; none where unavailable)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic replace only
        yield
        return
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


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


def _verdict(path: Path, st: os.stat_result, entry: list[int] | None,
             full: bool) -> tuple[str, list[int] | None]:
    """("ok" | "refresh" | "drop" | "damaged: <why>", new entry for "refresh")."""
    stamp = _stamp(st)
    if entry is not None and not full and entry[1:5] == stamp \
            and entry[5] - stamp[3] >= RACY_NS:
        return "ok", None
    if entry is not None and entry[1] == st.st_size:
        crc = _crc(path)
        if crc == entry[0]:
            if entry[1:5] == stamp and entry[5] - stamp[3] >= RACY_NS:
                return "ok", None  # (full check)
            return "refresh", [crc, *stamp, time.time_ns()]
        if entry[2] == st.st_mtime_ns:
            return "damaged: checksum mismatch", None
    if not st.st_size:
        return "damaged: empty", None
    if not _framing_ok(path):
        return "damaged: truncated or not numba's format", None
    return "drop", None  # unrecorded, or rewritten by a process that has not recorded it


def _check_folder(folder: Path, names: list[str], full: bool) -> list[tuple[str, str]]:
    """Verdicts for one folder; removes what is not trusted, refreshes stamps.  Returns
    (name, why) of the removed files."""
    manifest = _read_manifest(folder)
    base = str(folder)
    todo = []
    for name in names:  # the fast path: one stat per file, no Path objects
        entry = manifest.get(name)
        try:
            st = os.stat(os.path.join(base, name))
        except OSError:
            continue
        if full or entry is None or entry[1] != st.st_size or entry[2] != st.st_mtime_ns \
                or entry[3] != st.st_ino or entry[4] != st.st_ctime_ns \
                or entry[5] - st.st_ctime_ns < RACY_NS:
            todo.append(name)
    if not todo:
        return []
    removed: list[tuple[str, str]] = []
    with _locked(folder):  # again under the lock: a writer may have just recorded
        manifest = _read_manifest(folder)
        unreadable = _manifest_damaged(folder)
        changed = False
        for name in todo:
            path = folder / name
            try:
                st = os.stat(path)
            except OSError:
                continue
            verdict, entry = _verdict(path, st, manifest.get(name), full)
            if verdict == "ok":
                continue
            if verdict == "refresh":
                if entry[5] - entry[4] >= RACY_NS:  # else it stays racy: no write
                    manifest[name] = entry
                    changed = True
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise PermissionError(f"cannot remove untrusted cache file {path} "
                                      f"({exc.strerror})") from None
            manifest.pop(name, None)
            changed = True
            if verdict == "drop" and unreadable:
                verdict = f"damaged: its folder's {MANIFEST} is unreadable"
            removed.append((name, verdict))
        if changed:
            _write_manifest(folder, manifest)
    return removed


def validate(root: str | Path) -> list[str]:
    """Remove every cache file under ``root`` that is not recorded with a matching CRC
    (module docstring); returns the removed files (relative names) and prints one warning
    line when any of them was certainly damaged."""
    root = Path(root)
    if not root.is_dir():
        return []
    full = os.environ.get(ENV_CHECK, "") == "full"
    removed: list[str] = []
    why = ""
    damaged = 0
    for folder, names in _folders(root).items():
        for name, verdict in _check_folder(folder, names, full):
            rel = str((folder / name).relative_to(root))
            removed.append(rel)
            if verdict.startswith("damaged"):
                damaged += 1
                why = why or f"{rel}: {verdict.split(': ', 1)[1]}"
    if damaged:
        sys.stderr.write(f"warning: numba cache {root}: {damaged} damaged file(s) "
                         f"discarded ({why}); that code compiles afresh\n")
    return removed


def record(folder: str | Path, since_ns: int = 0) -> None:
    """Record (CRC-32 and stamp) the cache files of ``folder`` written at or after
    ``since_ns`` (wall clock) that are not recorded with their current stamp: what this
    process's compile just wrote.  Older unrecorded files are left to :func:`validate`."""
    folder = Path(folder)
    with contextlib.suppress(OSError), _locked(folder):
        names = sorted(n for n in os.listdir(folder) if n.endswith(SUFFIXES))
        manifest = _read_manifest(folder)
        changed = False
        for name in names:
            try:
                st = os.stat(folder / name)
                entry = manifest.get(name)
                if (entry is not None and entry[1:5] == _stamp(st)) or \
                        st.st_mtime_ns < since_ns - CLOCK_SLACK_NS:
                    continue
                manifest[name] = [_crc(folder / name), *_stamp(st), time.time_ns()]
                changed = True
            except OSError:
                continue
        for name in [n for n in manifest if n not in names]:
            del manifest[name]
            changed = True
        if changed:
            _write_manifest(folder, manifest)


_LISTENER = None


def _install(event) -> None:
    """Register the recorder on numba's event module ``event`` (once per process; forked
    workers inherit it)."""
    global _LISTENER
    if _LISTENER is not None:
        return

    class _Recorder(event.Listener):
        """Notes the cache folder of each function numba compiles (``numba:compile``) and
        records those folders when numba releases its outermost compiler lock, which it
        holds until its ``save_overload`` has written the files."""

        def __init__(self) -> None:
            self.local = threading.local()

        def _state(self):
            loc = self.local
            if not hasattr(loc, "depth"):
                loc.depth, loc.since, loc.folders, loc.last = 0, 0, set(), 0
            return loc

        def on_start(self, ev) -> None:
            loc = self._state()
            if ev.kind == "numba:compiler_lock":
                if loc.depth == 0:
                    loc.since, loc.folders = time.time_ns(), set()
                loc.depth += 1
            else:  # numba:compile: compiled (not loaded from disk), saved before unlock
                cache = getattr((ev.data or {}).get("dispatcher"), "_cache", None)
                path = getattr(cache, "_cache_path", None)  # read only
                if isinstance(path, str):
                    loc.folders.add(path)

        def _record(self, loc) -> None:
            loc.last = time.monotonic_ns()
            for folder in sorted(loc.folders):
                with contextlib.suppress(Exception):  # never into numba's compile
                    record(folder, loc.since)

        def on_end(self, ev) -> None:
            loc = self._state()
            if ev.kind == "numba:compile":
                # the callees compiled inside a long outer compile (the replay core: tens
                # of seconds) are saved already: record them at most once a second, so
                # another process starting meanwhile finds them recorded
                if loc.folders and time.monotonic_ns() - loc.last >= INTERIM_NS:
                    self._record(loc)
                return
            loc.depth = max(loc.depth - 1, 0)
            if loc.depth == 0 and loc.folders:
                self._record(loc)
                loc.folders = set()

    _LISTENER = _Recorder()
    event.register("numba:compiler_lock", _LISTENER)
    event.register("numba:compile", _LISTENER)


class _WhenNumbaLoads:
    """A finder on ``sys.meta_path`` that lets Python import ``numba.core.event`` as usual
    and then registers the recorder on it (a post-import hook: kvsim imports no numba at
    ``import kvsim``, and many modules import numba directly).  Removes itself once done."""

    def find_spec(self, name, path, target=None):
        if name != "numba.core.event":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        inner = spec.loader

        class _Loader:
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(_HOOK)
                _install(module)

        spec.loader = _Loader()
        return spec


_HOOK = _WhenNumbaLoads()


def listen() -> None:
    """Record what numba writes, as it writes it (module docstring): now when numba is
    imported, else as soon as it is."""
    event = sys.modules.get("numba.core.event")
    if event is not None:
        _install(event)
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def guard(root: str | Path) -> None:
    """:func:`validate` now; :func:`listen` for what this process compiles."""
    validate(root)
    listen()
