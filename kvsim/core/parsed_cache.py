"""A parsed request trace kept on disk, keyed on the file's bytes (issue 34: the per-process
floor of a warm run).

Parsing the Mooncake conversation trace's 3 MB of JSON Lines costs ~0.13 CPU-s, a seventh of
what a warm 1-replica closed loop pays besides the engine; loading its parsed columns back
costs ~0.01.  A reader (:func:`kvsim.ingest.mooncake.read_mooncake`) asks :func:`lookup` for
the arrays it parsed from the same bytes before, and hands what it parsed to :func:`store`.

* **Keyed on content**: the SHA-256 of the file's bytes (read in 1 MiB chunks: ~3 ms for 3 MB), plus a
  reader key (the reader's own source text and the limits it checked against): an edited
  trace, another kvsim or other limits never load an old parse.  One entry per trace path
  (the file's name is a hash of its absolute path), replaced when the content changes, so
  the cache holds one entry per trace a user replays.
* **Checked**: the entry records the SHA-256 of its arrays; an entry that does not match
  (truncated, bit-flipped, not an ``.npz``) is removed with ONE warning line and the trace is
  parsed as if there were no entry.  ``np.load(allow_pickle=False)``: nothing is executed.
* **Bounded**: only files of at least :data:`MIN_BYTES`, at most :data:`MAX_ENTRIES` entries
  and :data:`MAX_BYTES` bytes in all (the least recently used removed first; a parse larger
  than that is not kept).  A temporary file a killed writer left is removed by the next
  store (its name holds the writer's pid).
* **Only regular files** (not ``/dev/stdin``, a pipe), and only a parse of the whole file
  that the stamp (size, modification and change time) says did not change while it was read.
* **Where**: ``$KVSIM_CACHE_DIR/traces``, else ``$XDG_CACHE_HOME/kvsim/traces`` (default
  ``~/.cache/kvsim/traces``); nothing is cached when that folder cannot be written.
  ``KVSIM_TRACE_CACHE=0`` turns the cache off, ``1`` (or unset) on; any other value is
  a one-line error, exit 2 (``off`` or ``false`` would otherwise leave it on silently).
  Writes are atomic (a temporary file renamed): processes storing the same entry at once
  each rename a whole file, the last one stays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat as stat_mod
import tempfile
import warnings
from pathlib import Path

import numpy as np

from kvsim.core.errors import KvsimWarning
from kvsim.core.options import TRACE_CACHE_ENV, trace_cache_on

ENV_OFF = TRACE_CACHE_ENV
#: Files smaller than this are parsed every time (a 256 KiB Mooncake file parses in ~12 ms;
#: test fixtures and samples leave no entries behind).
MIN_BYTES = 256 * 1024
#: The most entries kept; storing one more removes the least recently used (modification
#: time, refreshed at each hit).
MAX_ENTRIES = 16
#: The most bytes the entries take in all (1 GiB): an entry of the Mooncake conversation
#: trace is 2.7 MB, of 10x that trace 27 MB (measured, session 21), so 100x (~270 MB)
#: still fits three times; a parse larger than this is not kept.
MAX_BYTES = 1 << 30
_META = "__kvsim_meta__"
_FORMAT = 1


def cache_root() -> Path | None:
    """The folder of the parsed traces; None when the cache is off."""
    if not trace_cache_on():
        return None
    base = os.environ.get("KVSIM_CACHE_DIR", "")
    if base:
        return Path(base) / "traces"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    try:
        return (Path(xdg) if xdg else Path.home() / ".cache") / "kvsim" / "traces"
    except RuntimeError:  # no home directory: no cache
        return None


def _stamp(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class Entry:
    """One trace's place in the cache: its content digest, reader key and file stamp."""

    def __init__(self, path: Path, digest: str, reader: str, stamp: tuple, file: Path):
        self.path, self.digest, self.reader, self.stamp, self.file = (path, digest, reader,
                                                                      stamp, file)

    def meta(self, names: list[str], payload: str) -> dict:
        return {"format": _FORMAT, "content": self.digest, "reader": self.reader,
                "names": names, "payload": payload}


def _payload_digest(arrays: dict[str, np.ndarray], names: list[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(memoryview(a).cast("B"))  # the array's bytes, not a copy
    return h.hexdigest()


def entry_file(root: Path, resolved: Path, kind: str = "") -> Path:
    """Where ``root`` keeps the entry of kind ``kind`` (:func:`lookup`) of the file at the
    ``resolved`` path: one per path and kind, named by a hash of the path."""
    name = hashlib.sha256(str(resolved).encode()).hexdigest()[:32]
    return root / (name + (f".{kind}" if kind else "") + ".npz")


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as fh:  # a chunk at a time: memory does not grow with the file
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


#: Digests started by :func:`digest_ahead`: (resolved path, stamp) -> (thread, its result
#: list, empty until the thread has the digest).
_AHEAD: dict[tuple, tuple] = {}


def digest_ahead(path: str | Path) -> None:
    """Start the SHA-256 of the file at ``path`` in a daemon thread, for a :func:`lookup` of
    it later in this process.  The command line starts it for its trace before it imports
    the engine (numba, the replay: ~0.5 s), which the hash then overlaps (file reads and
    hashlib's updates release the GIL): the 102 MB 16-token Mooncake event file's hash is
    ~0.12 s of every replay's set-up otherwise.  Nothing when the cache is off or ``path``
    is not a regular file of at least :data:`MIN_BYTES`; an error reading it is left to the
    lookup, which hashes the file itself unless the digest ahead finished for the same stamp
    (size, times, inode) the lookup finds."""
    if cache_root() is None:
        return
    try:
        found = _cacheable(path)
    except (OSError, RuntimeError, ValueError):
        return
    if found is None:
        return
    p, st = found
    key = (str(p), _stamp(st))
    if key in _AHEAD:
        return
    import threading

    out: list[str] = []

    def work() -> None:
        with contextlib.suppress(OSError):
            out.append(_sha256_file(p))

    thread = threading.Thread(target=work, name="kvsim-digest-ahead", daemon=True)
    _AHEAD[key] = (thread, out)
    thread.start()


def _cacheable(path: str | Path) -> tuple[Path, os.stat_result] | None:
    """``path`` resolved and its stat when its content can be cached (a regular file of at
    least :data:`MIN_BYTES`), else None; OSError when it cannot be read."""
    p = Path(path).resolve()
    st = os.stat(p)
    if not stat_mod.S_ISREG(st.st_mode) or st.st_size < MIN_BYTES:
        return None
    return p, st


def _digest(p: Path, st: os.stat_result) -> str:
    """The SHA-256 of the file ``p`` whose stat is ``st``: from :func:`digest_ahead` when it
    was started for the same stamp and succeeded, else read here."""
    ahead = _AHEAD.pop((str(p), _stamp(st)), None)
    if ahead is not None:
        ahead[0].join()
        if ahead[1]:
            return ahead[1][0]
    return _sha256_file(p)


def lookup(path: str | Path, reader: str,
           kind: str = "") -> tuple[Entry | None, dict[str, np.ndarray] | None]:
    """``(entry, arrays)``: the arrays stored for this content and ``reader`` key, or None
    (then ``entry`` is what :func:`store` takes; ``entry`` None: nothing is cached for this
    input, e.g. not a regular file or the cache is off).  ``kind`` names what is kept
    (``""``: a reader's parse; ``"facts"``: the replay's pre-pass,
    :mod:`kvsim.replay.facts_cache`): one entry per path and kind."""
    root = cache_root()
    if root is None:
        return None, None
    try:
        found = _cacheable(path)
        if found is None:
            return None, None
        p, st = found
        digest = _digest(p, st)
    except OSError:
        return None, None
    entry = Entry(p, digest, reader, _stamp(st), entry_file(root, p, kind))
    return entry, _load(entry)


def _load(entry: Entry) -> dict[str, np.ndarray] | None:
    try:
        fh = open(entry.file, "rb")
    except OSError:
        return None  # no entry yet
    try:
        with fh, np.load(fh, allow_pickle=False) as z:
            meta = json.loads(bytes(z[_META]).decode())
            if meta.get("format") != _FORMAT or meta.get("content") != entry.digest \
                    or meta.get("reader") != entry.reader:
                return None  # another content or reader: store() replaces it
            names = list(meta["names"])
            arrays = {n: z[n] for n in names}
            ok = _payload_digest(arrays, names) == meta["payload"]
    except Exception:  # noqa: BLE001 - any unreadable entry is damage, handled below
        ok = False
    if ok:
        with contextlib.suppress(OSError):
            os.utime(entry.file)  # recently used: kept by _prune
        return arrays
    try:
        os.unlink(entry.file)
        done = "removed"
    except OSError as exc:  # a read-only cache folder: said, not claimed
        done = f"ignored (cannot remove it: {exc.strerror})"
    what, again = (("pre-pass", "read") if entry.file.name.endswith(".facts.npz") else
                   ("parsed-trace", "parsed"))
    warnings.warn(KvsimWarning(
        f"{entry.file}: damaged {what} cache entry {done}; {entry.path} is {again} "
        "again (docs/importers.md, \"Parsed-trace cache\")"), stacklevel=3)
    return None


def store(entry: Entry | None, arrays: dict[str, np.ndarray]) -> None:
    """Keep ``arrays`` (what the reader parsed from ``entry``'s content) for the next run;
    silently nothing when the file changed since :func:`lookup` or the folder cannot be
    written."""
    if entry is None:
        return
    try:
        if _stamp(os.stat(entry.path)) != entry.stamp:
            return  # changed while it was parsed: the parse may not be of that content
        if sum(int(np.asarray(a).nbytes) for a in arrays.values()) > MAX_BYTES:
            return  # larger than the whole cache may be
        names = sorted(arrays)
        meta = entry.meta(names, _payload_digest(arrays, names))
        entry.file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{entry.file.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=entry.file.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **{_META: np.frombuffer(json.dumps(meta).encode(), np.uint8)},
                         **arrays)
            os.replace(tmp, entry.file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _prune(entry.file.parent)
    except OSError:
        return


def _prune(folder: Path) -> None:
    """Keep the most recently used entries of ``folder``: at most :data:`MAX_ENTRIES`, of
    at most :data:`MAX_BYTES` in all (the newest always); remove the temporary files of
    writers that are gone (SIGKILL, a power cut)."""
    from kvsim.core.fsutil import remove_stale_temporaries

    for name in {t.name[1:].partition(".npz.")[0] for t in folder.glob(".*.npz.*.tmp")}:
        remove_stale_temporaries(folder / f"{name}.npz")  # those of dead pids
    entries = []
    for f in folder.glob("*.npz"):
        with contextlib.suppress(OSError):
            st = f.stat()
            entries.append((st.st_mtime_ns, f.name, st.st_size, f))
    total = 0
    for k, (_t, _n, size, f) in enumerate(sorted(entries, reverse=True)):
        total += size
        if k and (k >= MAX_ENTRIES or total > MAX_BYTES):
            with contextlib.suppress(OSError):
                f.unlink()


__all__ = ["ENV_OFF", "MAX_BYTES", "MAX_ENTRIES", "MIN_BYTES", "Entry", "cache_root", "lookup", "store"]
