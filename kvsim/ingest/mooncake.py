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
    # some line is not the plain case (or the file is bad): line by line, every error named
    bad = BadRows(skip_bad_rows)
    arrival, prompt, output, ids = [], [], [], []
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
        arrival.append(t_us)
        prompt.append(n_in)
        output.append(n_out)
        ids.append(h)
    t0 = min(arrival) if arrival else 0
    arrival = [t - t0 for t in arrival]
    if off_tree:
        warnings.warn(KvsimWarning(
            f"{path}: {off_tree:,} of {len(arrival):,} requests have hash_ids that do not form "
            f"a prefix tree (first: {first_off}); kvsim chains ids by prefix, so those blocks "
            "are shared only after an identical prefix (less sharing than the raw ids "
            "suggest); --strict refuses such a trace"), stacklevel=2)
    return _table(path, {"arrival_us": arrival, "prompt_tokens": prompt,
                         "output_tokens": output, "block_ids": ids, "hashed_tokens": prompt},
                  bad.count)


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
    # one batch of lines at a time into numpy: the parsed Python lists of a batch are
    # dropped before the next (the whole trace's ids as Python ints would take ~36 bytes
    # an id and a list a request; as int64, 8 bytes an id)
    ts, n_in, n_out, id_parts, len_parts = [], [], [], [], []
    try:
        for lines in _plain_lines(path, lim.max_line_chars):
            if lines is None:
                return None
            parsed = [scan(text, 0) for text in lines]  # (value, end): json.loads's parse
            recs = list(map(itemgetter(0), parsed))
            if list(map(itemgetter(1), parsed)) != list(map(len, lines)) \
                    or not set(map(type, recs)) <= {dict}:
                return None  # text after the value, or not an object
            if not recs:
                continue
            t_b, in_b, out_b, ids_b = zip(*map(fields, recs))
            if not set(map(type, t_b)) <= {int, float} \
                    or not set(map(type, chain(in_b, out_b))) <= {int} \
                    or not set(map(type, ids_b)) <= {list}:
                return None
            flat = list(chain.from_iterable(ids_b))
            if not set(map(type, flat)) <= {int}:
                return None
            ts.append(np.fromiter(map(float, t_b), dtype=np.float64, count=len(t_b)))
            n_in.append(np.array(in_b, dtype=np.int64))
            n_out.append(np.array(out_b, dtype=np.int64))
            id_parts.append(np.array(flat, dtype=np.int64))
            len_parts.append(np.fromiter(map(len, ids_b), dtype=np.int64, count=len(ids_b)))
    except (KvsimInputError, OSError, StopIteration, KeyError, ValueError, RecursionError,
            OverflowError):
        return None  # json's errors are ValueErrors; the line-by-line reader names them
    if not ts:
        return None
    t = np.concatenate(ts)
    prompt = np.concatenate(n_in)
    output = np.concatenate(n_out)
    flat_ids = np.concatenate(id_parts)
    lens = np.concatenate(len_parts)
    del ts, n_in, n_out, id_parts, len_parts
    t_us = t * 1000.0
    if not (np.isfinite(t).all() and (t >= 0.0).all()
            and (t <= lim.max_epoch_us / 1000.0).all() and (t_us < 2.0**63).all()
            and (prompt >= 1).all() and (prompt <= lim.max_prompt_tokens).all()
            and (output >= 1).all() and (output <= lim.max_output_tokens).all()):
        return None
    if not (lens == -(-prompt // MOONCAKE_BLOCK_TOKENS)).all() or not _prefix_tree(flat_ids, lens):
        return None
    arrival = np.rint(t_us).astype(np.int64)  # int(round(t * 1000.0)): half to even
    off = np.zeros(len(lens) + 1, dtype=np.int64)  # block_ids as CSR: no array per request
    np.cumsum(lens, out=off[1:])
    return {"arrival_us": arrival - arrival.min(), "prompt_tokens": prompt,
            "output_tokens": output, "block_ids": CsrIds(off, flat_ids),
            "hashed_tokens": prompt}


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
    starts = (np.cumsum(lens) - lens)[lens > 0]  # where each non-empty list starts
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
