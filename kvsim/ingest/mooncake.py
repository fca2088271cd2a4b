"""Reader for Mooncake traces (kvcache-ai/Mooncake, FAST'25 release).

JSONL, one request per line: ``{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [...]}``.  ``hash_ids`` holds one id per 512-token block of the prompt
(``ceil(input_length / 512)`` ids, the last block possibly partial); ids are remapped
prefix hashes, so equal ids mean equal prefixes.  The last id identifies the partial
block's content too, hence ``hashed_tokens = input_length``.  No sessions, priorities or
SLOs are recorded: those columns keep their defaults.

All three traces of the FAST'25 release (conversation, synthetic, tool&agent) use this
format, and the reader assumes nothing about which one it reads: arrivals are made
relative to the earliest timestamp (a trace need not start at 0 nor be sorted) and extra
keys are ignored.

Prefix tree.  Because ids are prefix hashes, an id must always follow the same id (or
always start the list).  A trace that breaks this (ids re-used after a different prefix)
is read, with ONE warning line saying how many requests do it: the lowering chains ids by
prefix, so those blocks are not shared where the trace's ids alone would say they are.
``strict=True`` (``--strict``) refuses such a trace, naming the first offending line.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from itertools import chain
from operator import itemgetter
from pathlib import Path

import numpy as np

from kvsim.core import parsed_cache
from kvsim.core.errors import KvsimInputError, KvsimWarning
from kvsim.core.fsutil import open_text
from kvsim.core.heap import GrowingArray
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import CsrIds, RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_int, as_int_list, as_time_us, json_lines, parse_json

#: Tokens per hash id (Mooncake README / FAST'25 artifact: "block size 512").
MOONCAKE_BLOCK_TOKENS = 512
#: Characters of text parsed per batch by the fast path (:func:`_plain_columns`).
_CHUNK_CHARS = 1 << 22
#: Keys every record needs, in the order the line-by-line reader checks them.
_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def read_mooncake(path: str | Path, *, skip_bad_rows: bool = False,
                  strict: bool = False) -> RequestTable:
    """Read a Mooncake JSONL trace into the canonical Request table.  Ids that do not form
    a prefix tree: a :class:`~kvsim.core.errors.KvsimWarning` (``strict``: an error)."""
    lim = get_limits()
    entry, cached = parsed_cache.lookup(path, _reader_key(lim))
    if cached is not None:  # parsed from the same bytes by an earlier run
        return _table(path, _from_arrays(cached), 0)
    columns = _plain_columns(path, lim)
    if columns is not None:
        parsed_cache.store(entry, _to_arrays(columns))
        return _table(path, columns, 0)
    # some line is not the plain case (or the file is bad): line by line, every error named;
    # a batch of rows at a time into numpy columns (no Python object per row or id kept
    # for the whole trace: ~36 bytes an id as a Python int in a list, 8 as int64)
    bad = BadRows(skip_bad_rows)
    rows = _Rows()
    parent: dict[int, int] = {}  # id -> the id before it (-1: first of its list)
    off_tree = 0
    first_off: str | None = None
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in rec:
                    raise KvsimInputError("missing required field", path, loc, key)
            t_us = as_time_us(rec["timestamp"], 1000.0, path, loc, "timestamp",
                              limits=lim)
            n_in = as_int(rec["input_length"], path, loc, "input_length", 1,
                          lim.max_prompt_tokens)
            n_out = as_int(rec["output_length"], path, loc, "output_length", 1,
                           lim.max_output_tokens)
            h = as_int_list(rec["hash_ids"], path, loc, "hash_ids")
            need = -(-n_in // MOONCAKE_BLOCK_TOKENS)
            if len(h) != need:
                raise KvsimInputError(
                    f"expected ceil(input_length/512) = {need} ids, got {len(h)}",
                    path, loc, "hash_ids")
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        prev = -1
        broken = False
        for j, hid in enumerate(h):
            seen = parent.setdefault(hid, prev)
            if seen != prev and not broken:
                broken = True
                if first_off is None:
                    first_off = (f"{loc}: id {hid} at position {j} follows "
                                 f"{'nothing' if prev == -1 else prev}, elsewhere "
                                 f"{'nothing' if seen == -1 else seen}")
            prev = hid
        if broken:
            if strict:
                raise KvsimInputError(
                    f"expected prefix-hash ids (each id always after the same id); id "
                    f"reused after a different prefix ({first_off.split(': ', 1)[1]})",
                    path, loc, "hash_ids")
            off_tree += 1
        rows.add(t_us, n_in, n_out, h)
    columns = rows.columns()
    del rows, parent
    if off_tree:
        warnings.warn(KvsimWarning(
            f"{path}: {off_tree:,} of {len(columns['arrival_us']):,} requests have hash_ids "
            f"that do not form a prefix tree (first: {first_off}); kvsim chains ids by prefix, "
            "so those blocks are shared only after an identical prefix (less sharing than the "
            "raw ids suggest); --strict refuses such a trace"), stacklevel=2)
    return _table(path, columns, bad.count)


#: Rows the line-by-line reader holds as Python objects before it moves them into its
#: numpy columns (16 Ki rows: ~15 MiB of Python ints and lists at the ~24 ids a row of the
#: Mooncake conversation trace, ~36 bytes an id, whatever the trace's length).
_ROWS_BATCH = 1 << 14


class _Rows:
    """The line-by-line reader's rows, a batch of :data:`_ROWS_BATCH` at a time into
    growing numpy columns (:class:`~kvsim.core.heap.GrowingArray`).  Every value fits int64:
    the times and lengths are checked against limits of at most 2**62
    (:mod:`kvsim.core.limits`), the ids by ``as_int_list``."""

    def __init__(self) -> None:
        self._batch: tuple[list, list, list, list, list] = ([], [], [], [], [])
        self._cols = tuple(GrowingArray(np.int64) for _ in range(5))  # t, in, out, ids, lens

    def add(self, t_us: int, n_in: int, n_out: int, ids: list[int]) -> None:
        t, a, b, flat, lens = self._batch
        t.append(t_us)
        a.append(n_in)
        b.append(n_out)
        flat.extend(ids)
        lens.append(len(ids))
        if len(t) >= _ROWS_BATCH:
            self._flush()

    def _flush(self) -> None:
        for col, values in zip(self._cols, self._batch):
            col.append(values)
            values.clear()

    def columns(self) -> dict:
        self._flush()
        arrival, n_in, n_out, flat, lens = (c.take() for c in self._cols)
        if arrival.size:
            arrival -= arrival.min()
        off = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        return {"arrival_us": arrival, "prompt_tokens": n_in, "output_tokens": n_out,
                "block_ids": CsrIds(off, flat), "hashed_tokens": n_in}


def _reader_key(lim) -> str:
    """What a parse of the plain case depends on besides the file's bytes: this reader's
    source and the limits :func:`_plain_columns` checks against (the parsed-trace cache,
    :mod:`kvsim.core.parsed_cache`, keys on it)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(repr((lim.max_line_chars, lim.max_epoch_us, lim.max_prompt_tokens,
                   lim.max_output_tokens, _CHUNK_CHARS)).encode())
    return h.hexdigest()


def _to_arrays(columns: dict) -> dict:
    """:func:`_plain_columns`' columns as the arrays the parsed-trace cache stores."""
    ids = columns["block_ids"]
    return {"arrival_us": columns["arrival_us"], "prompt_tokens": columns["prompt_tokens"],
            "output_tokens": columns["output_tokens"], "offsets": ids.offsets, "ids": ids.ids}


def _from_arrays(a: dict) -> dict:
    """The columns :func:`_plain_columns` returned, from the arrays :func:`_to_arrays` made."""
    return {"arrival_us": a["arrival_us"], "prompt_tokens": a["prompt_tokens"],
            "output_tokens": a["output_tokens"], "block_ids": CsrIds(a["offsets"], a["ids"]),
            "hashed_tokens": a["prompt_tokens"]}


def _table(path, columns: dict, skipped: int) -> RequestTable:
    return build_request_table(
        columns, block_size_tokens=MOONCAKE_BLOCK_TOKENS, path=str(path), skipped=skipped,
        source={"format": "mooncake", "file": Path(path).name})


def _plain_lines(path, max_line: int):
    """The stripped non-blank lines of ``path`` in batches, what
    :func:`~kvsim.ingest.tracefile.json_lines` yields; ``None`` (and no more) at a line of
    ``max_line`` characters or more, or of ``_CHUNK_CHARS`` or more (no plain Mooncake line
    is that long: the line-by-line reader reads such a file)."""
    with open_text(path) as fh:
        rest = ""
        while True:
            chunk = fh.read(_CHUNK_CHARS)
            cut = chunk.rfind("\n")
            if chunk and cut < 0:  # no line ends in this batch
                rest += chunk
                if len(rest) >= min(max_line, _CHUNK_CHARS):
                    yield None
                    return
                continue
            lines = (rest + chunk[:cut]).split("\n") if chunk else [rest]
            rest = chunk[cut + 1:]
            if max(map(len, lines), default=0) >= max_line or len(rest) >= max_line:
                yield None
                return
            yield [t for t in map(str.strip, lines) if t]
            if not chunk:
                return


def _plain_columns(path, lim) -> dict | None:
    """The columns of a trace every line of which is the plain case, the case of every
    published Mooncake trace: a JSON object with an integer or float ``timestamp`` within
    the limits, integer lengths within the limits, ``ceil(input_length / 512)`` integer
    ``hash_ids`` within int64 that form a prefix tree.  Parsed a batch at a time and
    checked with numpy, equal to what the line-by-line reader builds; ``None`` for any
    other file (a bad line, a number written as a string, ids off the prefix tree, a
    decoding error), which the line-by-line reader then reads, with its warnings and its
    one-line errors."""
    scan = json.JSONDecoder().scan_once
    fields = itemgetter(*_KEYS)
    # one batch of lines at a time, checked and appended to growing numpy columns: the
    # parsed Python lists of a batch are dropped before the next, and no column is ever
    # held twice (the whole trace's ids as Python ints would take ~36 bytes an id and a
    # list a request; as int64, 8 bytes an id)
    arrival, prompt, output, flat_ids, lens = (GrowingArray(np.int64) for _ in range(5))
    top_ms = lim.max_epoch_us / 1000.0
    try:
        for lines in _plain_lines(path, lim.max_line_chars):
            if lines is None:
                return None
            parsed = [scan(text, 0) for text in lines]  # (value, end): json.loads's parse
            recs = list(map(itemgetter(0), parsed))
            if list(map(itemgetter(1), parsed)) != list(map(len, lines)) \
                    or not set(map(type, recs)) <= {dict}:
                return None  # text after the value, or not an object
            del parsed, lines
            if not recs:
                continue
            t_b, in_b, out_b, ids_b = zip(*map(fields, recs))
            del recs
            if not set(map(type, t_b)) <= {int, float} \
                    or not set(map(type, chain(in_b, out_b))) <= {int} \
                    or not set(map(type, ids_b)) <= {list}:
                return None
            flat = list(chain.from_iterable(ids_b))
            if not set(map(type, flat)) <= {int}:
                return None
            t = np.fromiter(map(float, t_b), dtype=np.float64, count=len(t_b))
            n_in = np.array(in_b, dtype=np.int64)
            n_out = np.array(out_b, dtype=np.int64)
            n_ids = np.fromiter(map(len, ids_b), dtype=np.int64, count=len(ids_b))
            # the line-by-line reader's checks, value by value (so a batch at a time)
            t_us = t * 1000.0
            if not (np.isfinite(t).all() and (t >= 0.0).all() and (t <= top_ms).all()
                    and (t_us < 2.0**63).all()
                    and (n_in >= 1).all() and (n_in <= lim.max_prompt_tokens).all()
                    and (n_out >= 1).all() and (n_out <= lim.max_output_tokens).all()
                    and (n_ids == -(-n_in // MOONCAKE_BLOCK_TOKENS)).all()):
                return None
            arrival.append(np.rint(t_us).astype(np.int64))  # int(round(t * 1000.0)): half to even
            prompt.append(n_in)
            output.append(n_out)
            lens.append(n_ids)
            flat_ids.append(np.array(flat, dtype=np.int64))
            del t_b, in_b, out_b, ids_b, flat
    except (KvsimInputError, OSError, StopIteration, KeyError, ValueError, RecursionError,
            OverflowError):
        return None  # json's errors are ValueErrors; the line-by-line reader names them
    if not len(arrival):
        return None
    lens_a = lens.take()
    ids = flat_ids.take()
    if not _prefix_tree(ids, lens_a):
        return None
    off = np.zeros(len(lens_a) + 1, dtype=np.int64)  # block_ids as CSR: no array per request
    np.cumsum(lens_a, out=off[1:])
    del lens_a
    t_rel = arrival.take()
    t_rel -= t_rel.min()
    n_in = prompt.take()
    return {"arrival_us": t_rel, "prompt_tokens": n_in, "output_tokens": output.take(),
            "block_ids": CsrIds(off, ids), "hashed_tokens": n_in}


#: Ids checked per batch by :func:`_prefix_tree` (its working arrays are a batch's).
_TREE_BATCH_IDS = 1 << 20


def _prefix_tree(flat: np.ndarray, lens: np.ndarray) -> bool:
    """True when every id always follows the same id (or always starts its list): the
    line-by-line check (``parent.setdefault``) over the flattened ids, -1 for "nothing".

    Ids that are small non-negative integers (every published Mooncake trace: remapped
    0, 1, 2, ...) are checked with one parent per id value, a batch of ids at a time, so
    the working memory grows with the distinct ids, not with how often they come (a trace
    repeated 10 times needs no more); other ids with one sort."""
    if flat.size == 0:
        return True
    starts = np.cumsum(lens)
    starts -= lens
    starts = starts[lens > 0]  # where each non-empty list starts
    top = int(flat.max())
    if int(flat.min()) < 0 or top > 4 * flat.size + (1 << 20):
        prev = np.empty_like(flat)
        prev[1:] = flat[:-1]
        prev[starts] = -1
        _uniq, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
        return bool((prev == prev[first][inverse.ravel()]).all())
    parent = np.empty(top + 1, dtype=np.int64)
    # pass 1: each id's parent as its last occurrence has it; pass 2: every occurrence
    # agrees (any two that differ make one of them disagree with the last)
    for check in (False, True):
        for a in range(0, flat.size, _TREE_BATCH_IDS):
            b = min(a + _TREE_BATCH_IDS, flat.size)
            prev = np.empty(b - a, dtype=np.int64)
            prev[1:] = flat[a:b - 1]
            prev[0] = flat[a - 1] if a else -1
            prev[starts[np.searchsorted(starts, a):np.searchsorted(starts, b)] - a] = -1
            if not check:
                parent[flat[a:b]] = prev
            elif not (parent[flat[a:b]] == prev).all():
                return False
    return True
