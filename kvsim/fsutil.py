"""File helpers shared by every writer: atomic output and transparent decompression."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    If the body raises, the temporary file is removed and ``path`` is left untouched, so a
    failed command never leaves a partial output file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp creates 0600; give the file the umask's usual mode
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def open_text(path: str | Path) -> IO[str]:
    """Open a text file for reading, decompressing ``.gz`` and ``.zst`` transparently."""
    path = Path(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    if path.suffix == ".zst":
        import zstandard

        raw = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.TextIOWrapper(reader, encoding="utf-8")
    return open(path, encoding="utf-8")


def strip_compression_suffix(path: str | Path) -> str:
    """``trace.jsonl.gz`` -> ``trace.jsonl`` (for format detection by name)."""
    name = Path(path).name
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
