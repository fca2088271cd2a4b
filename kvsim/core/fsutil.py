"""File helpers shared by every reader and writer: atomic output and checked text input.

Output (:func:`atomic_output`): a file is written under a temporary name
``.<name>.<pid>.<random>.tmp`` beside the target and renamed onto it only when complete.
A failure, Ctrl-C or SIGTERM (the CLI turns it into an exception) removes the temporary
file; one left by a SIGKILLed run (its pid is no longer alive) is removed by the next run
writing the same target, and those of pool workers this process killed (Ctrl-C, SIGTERM,
an error) are removed by :func:`remove_temporaries_of` at once.  A full disk is one line
naming the target (:class:`~kvsim.core.errors.KvsimResourceError`, exit 1).  Errors
about the target (a directory, a parent that is a file, a read-only folder) name the
target, never the temporary file.

Input (:func:`open_text`): UTF-8 text, a leading byte-order mark skipped (Windows tools
write one), ``.gz`` / ``.zst`` decompressed transparently.  Undecodable bytes, a corrupt or
truncated compressed stream and an empty file become one-line
:class:`~kvsim.core.errors.KvsimInputError`\\ s naming the file and the line reached.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from kvsim.core.errors import KvsimInputError, KvsimResourceError


def read_utf8_text(path: str | Path, name: str | Path) -> str:
    """``path``'s text; a file that is not UTF-8 is a one-line error naming ``name`` and the
    first bad byte's offset (a hardware or workload profile TOML: issue 38)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise KvsimInputError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                              f"offset {exc.start})", name) from None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove ``.<name>.<pid>.*.tmp`` files beside ``path`` whose writer process is gone
    (a SIGKILLed run); returns what was removed.  Files of live processes are kept."""
    path = Path(path)
    removed = []
    pattern = re.compile(r"^\." + re.escape(path.name) + r"\.(\d+)\.[^/]*\.tmp$")
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m and not _pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(entry)
    return removed


#: Folders this process writes outputs into (registered by the output checks and by
#: :func:`atomic_output`): where a killed worker's temporary files are looked for
#: (:func:`remove_temporaries_of`).
OUTPUT_FOLDERS: set[Path] = set()

#: What a write refused for want of room means, by errno, in the words of the error line
#: (:func:`disk_full_cause`): a full disk, an exceeded quota, a file larger than the
#: process may write (``ulimit -f``: the kernel's EFBIG, "File too large") or than the file
#: system holds.  The strerror text is matched too (pyarrow's errors may carry no errno).
DISK_FULL_CAUSES = {
    errno.ENOSPC: ("No space left on device", "disk full (No space left on device)"),
    errno.EDQUOT: ("Disk quota exceeded", "disk quota exceeded (Disk quota exceeded)"),
    errno.EFBIG: ("File too large", "file size limit reached (File too large: the "
                  "process's file size limit, ulimit -f, or the file system's largest file)"),
}
DISK_FULL_ERRNOS = tuple(DISK_FULL_CAUSES)
#: errno values of a path no file can have (bad input, exit 2, like a missing file): a name
#: or component too long, a loop of symbolic links, a read-only file system.
PATH_ERRNOS = (errno.ENAMETOOLONG, errno.ELOOP, errno.EROFS)


def _disk_full_errno(exc: BaseException) -> int | None:
    if not isinstance(exc, OSError):
        return None
    if exc.errno in DISK_FULL_CAUSES:
        return exc.errno
    text = str(exc)
    return next((no for no, (strerror, _) in DISK_FULL_CAUSES.items() if strerror in text),
                None)


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` of a full disk, an exceeded quota or file size limit."""
    return _disk_full_errno(exc) is not None


def disk_full_cause(exc: BaseException) -> str:
    """The cause of a write refused for room, in words (:data:`DISK_FULL_CAUSES`): "disk
    full (No space left on device)" only when that is what the system said."""
    return DISK_FULL_CAUSES[_disk_full_errno(exc) or errno.ENOSPC][1]


def remove_temporaries_of(pids: set[int] | list[int]) -> list[Path]:
    """Remove the ``.<name>.<pid>.<random>.tmp`` files of processes ``pids`` (killed
    workers) in every registered output folder and the folders just below it."""
    pids = {int(p) for p in pids}
    removed: list[Path] = []
    pattern = re.compile(r"^\..+\.(\d+)\.[A-Za-z0-9_]+\.tmp$")
    folders = set()
    for folder in list(OUTPUT_FOLDERS):
        folders.add(folder)
        with contextlib.suppress(OSError):
            folders.update(p for p in folder.iterdir() if p.is_dir())
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            m = pattern.match(entry.name)
            if m and int(m.group(1)) in pids:
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed.append(entry)
    return removed


def _not_writable(folder: Path) -> str | None:
    """None when an entry can be created in existing ``folder``, else why not (``""`` when
    only the permission bits say so).  The permission bits do not bind root, and some
    folders refuse every new entry whatever they say (``/proc``, ``/sys``): as root, a
    folder is probed by creating and removing an empty subfolder, so that an output there
    fails before any work, not after the run (issue #38)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return ""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        probe = tempfile.mkdtemp(prefix=".kvsim-probe-", dir=folder)
    except OSError as exc:
        return f": {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return None


def check_output_path(path: str | Path, option: str | None = None) -> Path:
    """Fail early (before any work) when ``path`` cannot be written: it is a directory,
    its parent is a regular file, or its folder is not writable.  The error names the
    target (and ``option`` when given) in one line."""
    path = Path(path)
    field = option
    try:
        _check_output_path(path, field)
    except OSError as exc:  # a name too long, a loop of links: what the system says
        raise KvsimInputError(f"cannot write the output ({exc.strerror or exc})", path, None,
                              field) from None
    OUTPUT_FOLDERS.add(Path(os.path.abspath(path.parent)))
    return path


def _check_output_path(path: Path, field: str | None) -> None:
    if path.is_dir():
        raise KvsimInputError("expected a file path to write, got a directory", path, None,
                              field)
    parent = path.parent
    for ancestor in [parent, *parent.parents]:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise KvsimInputError(f"cannot create the output: {ancestor} is a regular "
                                      "file, not a folder", path, None, field)
            why = _not_writable(ancestor)
            if why is not None:
                raise KvsimInputError(f"cannot write the output: folder {ancestor} is not "
                                      f"writable{why}", path, None, field)
            break


#: Output formats by file name ending (docs/cli.md, "Output names").
OUTPUT_SUFFIXES = {
    "parquet": (".parquet",),
    "events": (".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst"),
    "csv": (".csv",),
    "json": (".json",),
    "html": (".html", ".htm"),
    "png": (".png",),
    "toml": (".toml",),
}


def check_output_dir(path: str | Path, option: str | None = None) -> Path:
    """Fail early when folder ``path`` cannot be created or written (it is a regular
    file, a parent is a regular file, or the nearest existing folder is read-only)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise KvsimInputError("expected a folder, got a regular file", path, None, option)
    for ancestor in [path, *path.parents]:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise KvsimInputError(f"cannot create the folder: {ancestor} is a regular "
                                      "file", path, None, option)
            why = _not_writable(ancestor)
            if why is not None:
                raise KvsimInputError(f"cannot write into folder {ancestor} (not "
                                      f"writable{why})", path, None, option)
            break
    OUTPUT_FOLDERS.add(Path(os.path.abspath(path)))
    return path


def check_output_suffix(path: str | Path, kind: str, option: str | None = None) -> Path:
    """Refuse an output name whose ending does not match the format written (``--out
    x.csv`` for a Parquet file): kvsim never writes one format under another's name."""
    path = Path(path)
    allowed = OUTPUT_SUFFIXES[kind]
    if not path.name.lower().endswith(allowed):
        raise KvsimInputError(f"expected a name ending in {' or '.join(allowed)} (the format "
                              f"written), got {path.name!r}", path, None, option)
    return path


def _identity(path: Path) -> tuple[Path, tuple[int, int] | None]:
    """(resolved path, (st_dev, st_ino) when it exists): symlinks followed, hard links
    and bind mounts recognised by inode."""
    resolved = Path(os.path.realpath(path))
    try:
        st = os.stat(path)
    except OSError:
        return resolved, None
    return resolved, (st.st_dev, st.st_ino)


def _same(a: tuple[Path, tuple[int, int] | None],
          b: tuple[Path, tuple[int, int] | None]) -> bool:
    return a[0] == b[0] or (a[1] is not None and a[1] == b[1])


def check_inputs_outputs(inputs: list[tuple[str, str | Path]],
                         outputs: list[tuple[str, str | Path, bool]]) -> None:
    """Inputs are sacred: refuse, before any work, an output that would overwrite an
    input or another output.  ``inputs`` are ``(option, path)``; ``outputs`` are
    ``(option, path, is_dir)``.  Two paths collide when they resolve to the same file
    (symlinks followed) or name the same inode (hard links, ``st_dev`` + ``st_ino``);
    an input inside an output folder collides with the folder (kvsim writes files by
    name there).  Raises a one-line :class:`KvsimInputError` naming both options."""
    ins = [(opt, Path(p), _identity(Path(p))) for opt, p in inputs
           if p is not None and str(p) not in ("", "-")]
    outs = [(opt, Path(p), _identity(Path(p)), is_dir) for opt, p, is_dir in outputs
            if p is not None]
    for i, (oopt, opath, oid, is_dir) in enumerate(outs):
        for iopt, ipath, iid in ins:
            same = _same(oid, iid)
            if same or (is_dir and oid[0] in iid[0].parents):
                how = "is the same file as" if same else "is a folder holding"
                raise KvsimInputError(
                    f"{oopt} {opath} {how} the input {iopt} {ipath}: an output never "
                    "overwrites an input; write it elsewhere")
        for popt, ppath, pid, _ in outs[:i]:
            if _same(oid, pid):
                raise KvsimInputError(f"expected distinct outputs: {oopt} {opath} and "
                                      f"{popt} {ppath} are the same file")


def claim_output_dir(out_dir: str | Path, marker: str, what: str, force: bool = False,
                     legacy: str | None = None, option: str = "--out") -> Path:
    """Make ``out_dir`` a folder owned by kvsim (``what``, e.g. "kvsim sweep folder"):
    new or empty folders get the ``marker`` file; a folder holding ``marker`` (or the
    ``legacy`` entry of folders written before markers) is accepted; any other non-empty
    folder is refused in one line (the user's own files would be replaced) unless
    ``force``."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise KvsimInputError("expected a folder, got a regular file", out_dir, None, option)
    if out_dir.is_dir() and not force:
        entries = sorted(p.name for p in out_dir.iterdir())
        ours = marker in entries or (legacy is not None and (out_dir / legacy).is_dir())
        if entries and not ours:
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise KvsimInputError(f"expected an empty folder or a {what}, got a folder "
                                  f"holding {len(entries)} other entries ({shown}); give "
                                  "--force to write there anyway", out_dir, None, option)
    OUTPUT_FOLDERS.add(Path(os.path.abspath(out_dir)))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not (out_dir / marker).exists():
            (out_dir / marker).write_text(f"{what}\n", encoding="utf-8")
    except OSError as exc:
        raise KvsimInputError(f"cannot write the folder ({exc.strerror})", out_dir, None,
                              option) from None
    return out_dir


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    If the body raises (or the run is interrupted: KeyboardInterrupt, the CLI's SIGTERM
    exception), the temporary file is removed and ``path`` is left untouched, so a failed
    command never leaves a partial output file behind.  Stale temporaries of ``path``
    from dead processes are removed first.
    """
    path = Path(path)
    check_output_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvsimInputError(f"cannot create the output folder ({exc.strerror})", path) \
            from None
    remove_stale_temporaries(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                   dir=path.parent)
    except OSError as exc:
        raise KvsimInputError(f"cannot write the output ({exc.strerror})", path) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp creates 0600; give the file the umask's usual mode
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_path, 0o666 & ~umask)
        try:
            os.replace(tmp_path, path)
        except OSError as exc:
            raise KvsimInputError(f"cannot write the output ({exc.strerror})", path) \
                from None
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if is_disk_full(exc):
            raise KvsimResourceError(f"{path}: cannot write the output: "
                                     f"{disk_full_cause(exc)}; partial output removed") \
                from None
        raise


class CheckedText(io.TextIOBase):
    """A read-only text stream whose decoding and decompression errors are one-line
    :class:`KvsimInputError` s naming the file and the last line read, and which refuses a
    file with no content (0 bytes, or an empty compressed stream) as ``empty file``."""

    def __init__(self, raw: IO[str], path: Path, kind: str) -> None:
        self._raw = raw
        self._path = path
        self._kind = kind  # "gzip", "zstandard" or ""
        self._lines = 0
        self._chars = 0
        from kvsim.core.limits import get_limits

        self._max_line = get_limits().max_line_chars

    def _fail(self, exc: BaseException) -> KvsimInputError:
        where = f"after line {self._lines}" if self._lines else "line 1"
        if isinstance(exc, UnicodeDecodeError):
            return KvsimInputError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})",
                                   self._path, f"line {self._lines + 1}")
        if self._kind:
            return KvsimInputError(f"not a readable {self._kind} stream (corrupt or "
                                   f"truncated: {type(exc).__name__}: {exc})",
                                   self._path, where)
        return KvsimInputError(f"cannot read the file ({exc})", self._path, where)

    def _checked(self, fn, *args):
        try:
            out = fn(*args)
        except KvsimInputError:
            raise
        except (UnicodeDecodeError, EOFError, OSError, ValueError) as exc:
            raise self._fail(exc) from None
        except Exception as exc:  # zstandard.ZstdError and friends
            if type(exc).__module__.startswith(("zstandard", "gzip", "zlib")):
                raise self._fail(exc) from None
            raise
        if out:
            self._chars += len(out)
            self._lines += out.count("\n") if isinstance(out, str) else 0
        elif not self._chars:
            raise KvsimInputError("empty file (no content)" + (
                f" after {self._kind} decompression" if self._kind else ""), self._path,
                "line 1")
        return out

    def readline(self, size: int = -1) -> str:  # type: ignore[override]
        """One line, never more than the ``max_line_chars`` limit held in memory."""
        cap = self._max_line if size is None or size < 0 else min(size, self._max_line)
        line = self._checked(self._raw.readline, cap + 1)
        if len(line) > cap and (size is None or size < 0 or size > cap):
            raise KvsimInputError(
                f"line longer than {self._max_line:,} characters (kvsim limit max_line_chars; "
                "raise it with KVSIM_LIMIT_MAX_LINE_CHARS)", self._path,
                f"line {self._lines + 1 - line.count(chr(10))}")
        return line

    def read(self, size: int | None = -1) -> str:  # type: ignore[override]
        """``size`` characters; the rest of the file (a JSON document read whole: an
        agentic conversation) never more than the ``max_line_chars`` limit."""
        if size is not None and size >= 0:
            return self._checked(self._raw.read, size)
        text = self._checked(self._raw.read, self._max_line + 1)
        if len(text) > self._max_line:
            raise KvsimInputError(
                f"document longer than {self._max_line:,} characters (kvsim limit "
                "max_line_chars; raise it with KVSIM_LIMIT_MAX_LINE_CHARS)", self._path)
        return text

    def __iter__(self) -> Iterator[str]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def __next__(self) -> str:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._raw.close()
        super().close()


def open_text(path: str | Path) -> IO[str]:
    """Open a text file for reading: UTF-8 (a leading byte-order mark is skipped),
    ``.gz`` and ``.zst`` decompressed transparently, errors as one-line
    :class:`KvsimInputError` (see :class:`CheckedText`)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory (expected a file)", str(path))
    if path.suffix == ".gz":
        raw: IO[str] = io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig")
        kind = "gzip"
    elif path.suffix == ".zst":
        import zstandard

        fh = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(fh, closefd=True)
        raw = io.TextIOWrapper(reader, encoding="utf-8-sig")
        kind = "zstandard"
    else:
        raw = open(path, encoding="utf-8-sig")
        kind = ""
    return CheckedText(raw, path, kind)


def strip_compression_suffix(path: str | Path) -> str:
    """``trace.jsonl.gz`` -> ``trace.jsonl`` (for format detection by name)."""
    name = Path(path).name
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@contextlib.contextmanager
def spooled_input(path: str | Path) -> Iterator[Path]:
    """A pipe or character device (``--requests /dev/stdin``, ``<(zcat ...)``) copied to
    a private temporary file first, so format detection and reading each see the stream
    from its first byte (detection would otherwise consume the start of the pipe); a
    regular file or folder is yielded as it is.  An input error about the copy names the
    original path."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        yield path
        return
    import shutil
    import stat

    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="kvsim-spool-") as folder:
        copy = Path(folder) / (path.name or "stdin")
        with open(path, "rb") as src, open(copy, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        SPOOLED[str(copy)] = str(path)
        try:
            yield copy
        except KvsimInputError as exc:
            if str(copy) in exc.message or (exc.path is not None and Path(exc.path) == copy):
                raise KvsimInputError(exc.message.replace(str(copy), str(path)),
                                      path if exc.path is not None and Path(exc.path) == copy
                                      else exc.path, exc.location, exc.field) from None
            raise
        finally:
            SPOOLED.pop(str(copy), None)


#: The private copies of piped inputs in use (:func:`spooled_input`): copy -> the path given.
SPOOLED: dict[str, str] = {}


def shown_path(path: str | Path) -> str:
    """The path a user gave for ``path`` (``/dev/stdin`` for its private copy): what an
    output names, so that it is the same for a pipe as for a file."""
    return SPOOLED.get(str(path), str(path))


@contextlib.contextmanager
def spooled_params(params: dict, outputs: set[str]) -> Iterator[dict]:
    """``params`` (a command's options) with every input naming a pipe or character device
    (``--trace /dev/stdin``, ``<(zcat ...)``) replaced by its private copy
    (:func:`spooled_input`): format detection, content digests and the reader each see the
    stream from its first byte.  ``outputs``: the option names that are outputs."""
    import stat

    with contextlib.ExitStack() as stack:
        out = dict(params)
        for name, value in params.items():
            if name in outputs or not isinstance(value, (str, Path)) or not str(value):
                continue
            try:
                mode = os.stat(value).st_mode
            except (OSError, ValueError):
                continue
            if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
                out[name] = type(value)(stack.enter_context(spooled_input(value)))
        yield out


def file_digest(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    """SHA-256 (hex) of a file's bytes, read in chunks (constant memory): how kvsim
    identifies an input by content (sweep cells, decision logs)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            buf = fh.read(chunk_bytes)
            if not buf:
                break
            h.update(buf)
    return h.hexdigest()

