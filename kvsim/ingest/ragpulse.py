"""Reader for RAGPulse (flashserve/RAGPulse, a week of a university RAG Q&A service).

Layout: a folder holding ``0_trace.jsonl`` (or any trace file) plus five side files::

    0_trace.jsonl       {"timestamp": "27", "input_length": 3861, "output_length": 127,
                         "hash_ids": {"sys_prompt": [...], "passages_ids": [...],
                                      "history": [...], "web_search": [...],
                                      "user_input": [...]},
                         "session_id": "1758081660427-xa8rbsd2uco1"}
    1_sys_prompt.jsonl  {"sys_prompt_id": 8325, "token_length": 512}
    2_passages.jsonl    {"passage_id": 0, "token_length": 84}
    3_history.jsonl     {"history_id": 15200, "token_length": 11}
    4_user_input.jsonl  {"user_input_id": ..., "token_length": ...}
    5_web_search.jsonl  {"web_search_id": ..., "token_length": ...}

``timestamp`` is seconds (a string) from the trace start; each id names a chunk of at most
512 tokens whose length comes from the side files (ids are unique across the five files,
as the RAGPulse replay script's single ``hash_id_dict`` assumes).

Lowering (docs/importers.md, "ragpulse"): the prompt is the concatenation of the
components in the order :data:`COMPONENT_ORDER` (the order of the released example
record and of the replay script), each component's chunks in list order.  Prefix identity
follows that token sequence: the concatenated prompt is cut into native blocks of
:data:`RAGPULSE_NATIVE_BLOCK_TOKENS` tokens and each native block's id names the chunk
segments it holds (chunk id, first offset, last offset); the lowering chains the ids, so
two requests share a block only when everything before it is equal too.  Chunks are
variable length, so a native block may straddle two chunks.  Tokens beyond the chunks'
total (template text the trace does not identify) have no identity; chunks beyond
``input_length`` are cut at it (the served count is the truth).

Position-independent reuse (CacheBlend-style, a chunk's KV reused wherever the chunk
recurs): :func:`chunk_reuse` computes it on the chunk sequence and the reader records it
in ``RequestTable.source["chunk_reuse"]``; the lowering copies ``source`` into the event
header, where ``kvsim inspect`` reports it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_int, as_int_list, as_time_us, json_lines, parse_json

#: Components of ``hash_ids`` in prompt order, with the side file naming their chunks.
COMPONENT_ORDER: tuple[tuple[str, str], ...] = (
    ("sys_prompt", "1_sys_prompt.jsonl"),
    ("passages_ids", "2_passages.jsonl"),
    ("history", "3_history.jsonl"),
    ("web_search", "5_web_search.jsonl"),
    ("user_input", "4_user_input.jsonl"),
)
#: The trace file's name in the release (used when the reader is given the folder).
TRACE_FILE = "0_trace.jsonl"
#: Native block of the Request table: vLLM's default block size (16 tokens), so a kvsim
#: block size that is a multiple of 16 maps onto whole native blocks.
RAGPULSE_NATIVE_BLOCK_TOKENS = 16
#: Largest chunk the RAGPulse release cuts (README: "chunk of up to 512 tokens").
RAGPULSE_MAX_CHUNK_TOKENS = 512


def is_ragpulse_folder(path: Path) -> bool:
    """A folder holding the RAGPulse trace file (also .gz / .zst)."""
    return path.is_dir() and _side_path(path, TRACE_FILE) is not None


def _load_side_file(path: Path, lengths: dict[int, int], owner: dict[int, str]) -> None:
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        rec = parse_json(path, lineno, text)
        if not isinstance(rec, dict):
            raise KvsimInputError("expected a JSON object {\"<x>_id\": id, "
                                  "\"token_length\": n}", path, loc)
        if "token_length" not in rec:
            raise KvsimInputError("missing required field", path, loc, "token_length")
        keys = [k for k in rec if k != "token_length"]
        if len(keys) != 1 or not str(keys[0]).endswith("_id"):
            raise KvsimInputError(f"expected exactly one '<component>_id' key besides "
                                  f"token_length, got {keys!r}", path, loc)
        cid = as_int(rec[keys[0]], path, loc, keys[0], 0)
        n = as_int(rec["token_length"], path, loc, "token_length", 0)
        if n > RAGPULSE_MAX_CHUNK_TOKENS:
            raise bad_value(path, loc, "token_length",
                            f"at most {RAGPULSE_MAX_CHUNK_TOKENS} tokens", rec["token_length"])
        if cid in lengths and lengths[cid] != n:
            raise KvsimInputError(f"chunk id {cid} given again with another length "
                                  f"({lengths[cid]} in {owner[cid]}, {n} here)", path, loc,
                                  keys[0])
        lengths[cid] = n
        owner[cid] = path.name


def load_chunk_lengths(folder: Path) -> dict[int, int]:
    """chunk id -> token length from the five side files in ``folder`` (all required)."""
    lengths: dict[int, int] = {}
    owner: dict[int, str] = {}
    for _, name in COMPONENT_ORDER:
        side = _side_path(folder, name)
        if side is None:
            raise KvsimInputError(f"missing RAGPulse side file {name} (chunk lengths) next "
                                  "to the trace", folder / name)
        _load_side_file(side, lengths, owner)
    return lengths


def _side_path(folder: Path, name: str) -> Path | None:
    for suffix in ("", ".gz", ".zst"):
        p = folder / (name + suffix)
        if p.is_file():
            return p
    return None


def _block_id(segments: list[tuple[int, int, int]]) -> int:
    """63-bit non-zero id of a native block holding ``segments`` (chunk, start, end)."""
    h = hashlib.blake2b(repr(segments).encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") & 0x7FFFFFFFFFFFFFFF) or 1


def native_block_ids(chunks: list[tuple[int, int]], prompt_tokens: int,
                     block_tokens: int = RAGPULSE_NATIVE_BLOCK_TOKENS) -> tuple[list[int], int]:
    """(native block ids, hashed_tokens) of a prompt made of ``chunks`` [(id, length)].

    The chunks are cut at ``prompt_tokens``; every native block wholly inside the chunks
    gets an id naming its segments; a trailing partial block is identified only when the
    chunks end exactly at the prompt's end (nothing unknown shares the block)."""
    covered = min(sum(n for _, n in chunks), prompt_tokens)
    if covered == prompt_tokens:
        nblocks = -(-covered // block_tokens)
        hashed = covered
    else:
        nblocks = covered // block_tokens
        hashed = nblocks * block_tokens
    ids: list[int] = []
    segs: list[tuple[int, int, int]] = []
    pos = 0          # tokens placed so far
    fill = 0         # tokens in the block being built
    for cid, n in chunks:
        off = 0
        while off < n and pos < nblocks * block_tokens and pos < covered:
            take = min(n - off, block_tokens - fill, covered - pos)
            segs.append((cid, off, off + take))
            off += take
            pos += take
            fill += take
            if fill == block_tokens or pos == covered:
                ids.append(_block_id(segs))
                segs, fill = [], 0
        if pos >= nblocks * block_tokens or pos >= covered:
            break
    return ids[:nblocks], hashed


def chunk_reuse(requests: list[list[tuple[int, int]]]) -> dict[str, Any]:
    """Token reuse an infinite cache finds on the chunk sequences, two ways.

    ``prefix``: a chunk is reused when the whole chunk sequence up to and including it
    began an earlier request (prefix caching at chunk granularity).  ``position
    independent``: a chunk is reused when the same chunk id appeared anywhere earlier in the
    trace (CacheBlend-style: its KV reused at a new position, selective recompute ignored).
    Fractions are of all chunk tokens; ``extra`` is what position independence adds."""
    seen_prefix: set[tuple[int, ...]] = set()
    seen_chunk: set[int] = set()
    total = prefix_tok = chunk_tok = 0
    for chunks in requests:
        prefix: tuple[int, ...] = ()
        in_prefix = True
        new_prefixes = []
        for cid, n in chunks:
            total += n
            prefix = prefix + (cid,)
            if in_prefix and prefix in seen_prefix:
                prefix_tok += n
            else:
                in_prefix = False
            new_prefixes.append(prefix)
            if cid in seen_chunk:
                chunk_tok += n
            seen_chunk.add(cid)
        seen_prefix.update(new_prefixes)
    frac = (lambda x: round(x / total, 6)) if total else (lambda x: 0.0)
    return {"chunk_tokens": total, "prefix_reuse_tokens": prefix_tok,
            "position_independent_reuse_tokens": chunk_tok,
            "prefix_reuse_token_fraction": frac(prefix_tok),
            "position_independent_reuse_token_fraction": frac(chunk_tok),
            "extra_position_independent_reuse_fraction": frac(chunk_tok - prefix_tok)}


def read_ragpulse(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read a RAGPulse trace (the folder, or its trace file with the side files beside it)."""
    path = Path(path)
    if path.is_dir():
        found = _side_path(path, TRACE_FILE)
        if found is None:
            raise KvsimInputError(f"expected the RAGPulse trace file {TRACE_FILE} in the "
                                  "folder", path / TRACE_FILE)
        trace = found
    else:
        trace = path
    folder = trace.parent
    lengths = load_chunk_lengths(folder)
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    cols: dict[str, list] = {k: [] for k in ("arrival_us", "prompt_tokens", "output_tokens",
                                             "block_ids", "hashed_tokens", "session")}
    sessions: dict[str, int] = {}
    chunk_lists: list[list[tuple[int, int]]] = []
    for lineno, text in json_lines(trace):
        loc = f"line {lineno}"
        try:
            rec = parse_json(trace, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", trace, loc)
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in rec:
                    raise KvsimInputError("missing required field", trace, loc, key)
            t_us = as_time_us(rec["timestamp"], 1e6, trace, loc, "timestamp")
            n_in = as_int(rec["input_length"], trace, loc, "input_length", 1,
                          lim.max_prompt_tokens)
            n_out = as_int(rec["output_length"], trace, loc, "output_length", 0,
                           lim.max_output_tokens)
            comp = rec["hash_ids"]
            if not isinstance(comp, dict):
                raise bad_value(trace, loc, "hash_ids", "an object of component lists "
                                "(sys_prompt, passages_ids, history, web_search, user_input)",
                                comp)
            unknown = sorted(set(comp) - {c for c, _ in COMPONENT_ORDER})
            if unknown:
                raise bad_value(trace, loc, f"hash_ids.{unknown[0]}", "one of " + ", ".join(
                    c for c, _ in COMPONENT_ORDER), unknown[0])
            chunks: list[tuple[int, int]] = []
            for name, side in COMPONENT_ORDER:
                ids = as_int_list(comp.get(name, []), trace, loc, f"hash_ids.{name}")
                for cid in ids:
                    if cid not in lengths:
                        raise KvsimInputError(f"chunk id {cid} is in no side file "
                                              f"(expected it in {side})", trace, loc,
                                              f"hash_ids.{name}")
                    chunks.append((cid, lengths[cid]))
            sid = rec.get("session_id")
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        block_ids, hashed = native_block_ids(chunks, n_in)
        cols["arrival_us"].append(t_us)
        cols["prompt_tokens"].append(n_in)
        cols["output_tokens"].append(max(n_out, 1))
        cols["block_ids"].append(block_ids)
        cols["hashed_tokens"].append(hashed)
        cols["session"].append(-1 if sid is None else sessions.setdefault(str(sid),
                                                                           len(sessions)))
        chunk_lists.append(_cut(chunks, n_in))
    return build_request_table(
        cols, block_size_tokens=RAGPULSE_NATIVE_BLOCK_TOKENS, path=str(trace),
        skipped=bad.count,
        source={"format": "ragpulse", "file": trace.name,
                "chunk_reuse": chunk_reuse(_by_arrival(chunk_lists, cols["arrival_us"]))})


def _by_arrival(items: list, arrival_us: list[int]) -> list:
    """``items`` in the Request table's order (stable sort by arrival)."""
    order = sorted(range(len(items)), key=lambda i: arrival_us[i])
    return [items[i] for i in order]


def _cut(chunks: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """The chunks as served: cut at ``limit`` tokens (the last one possibly shortened)."""
    out, pos = [], 0
    for cid, n in chunks:
        if pos >= limit:
            break
        out.append((cid, min(n, limit - pos)))
        pos += n
    return out
