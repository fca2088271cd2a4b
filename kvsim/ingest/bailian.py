"""Reader for the Alibaba Bailian (Qwen) usage traces (alibaba-edu/qwen-bailian-usagetraces-anon,
the traces of "KVCache Cache in the Wild", USENIX ATC'25).

JSONL, one request per line::

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

``timestamp`` is seconds from the trace start; ``parent_chat_id`` is -1 for a root request;
``type`` is text / search / image / file; ``hash_ids`` are salted SipHash-2-4 hashes of the
prompt's 16-token blocks, remapped to sequential integers (README, "Anonymization").

Lowering: ``block_ids = hash_ids`` at a native block of :data:`BAILIAN_BLOCK_TOKENS`
tokens.  ``len(hash_ids)`` must be ``ceil(input_length/16)`` (the last, partial block
hashed too: ``hashed_tokens = input_length``) or ``floor(input_length/16)`` (full blocks
only); anything else is a bad row.  The lowering chains the ids, so prefix identity holds
even if the ids hash block content alone.  **Sessions** follow the ``parent_chat_id``
chain: a request's session is the root of its chain (the first ancestor whose parent is
-1, or the first ancestor missing from the file); a request that another request names as
its parent has ``session_continues`` set (a follow-up turn comes) and ``next_turn_gap_us``
= the child's arrival minus this request's arrival (the trace records no finish time, so
this is an upper bound of the finish-to-next-turn gap; at least 1 us).
"""

from __future__ import annotations

from pathlib import Path

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.limits import get_limits
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_int, as_int_list, as_time_us, json_lines, parse_json

#: Tokens per hash id (README: "Group tokens into 16-token blocks"; file names *_blksz_16).
BAILIAN_BLOCK_TOKENS = 16
#: Request types the README lists.
BAILIAN_TYPES = ("text", "search", "image", "file")


def read_bailian(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read a Bailian usage trace (JSONL) into the canonical Request table."""
    bad = BadRows(skip_bad_rows)
    lim = get_limits()
    rows: list[tuple[int, int, int, int, int, list[int], int]] = []
    seen_chat: dict[int, int] = {}
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            for key in ("chat_id", "parent_chat_id", "timestamp", "input_length",
                        "output_length", "hash_ids"):
                if key not in rec:
                    raise KvsimInputError("missing required field", path, loc, key)
            chat = as_int(rec["chat_id"], path, loc, "chat_id", 0)
            parent = as_int(rec["parent_chat_id"], path, loc, "parent_chat_id", -1)
            if parent == chat:
                raise bad_value(path, loc, "parent_chat_id", "-1 or another chat's id",
                                rec["parent_chat_id"])
            if chat in seen_chat:
                raise KvsimInputError(f"chat_id {chat} already used on line "
                                      f"{seen_chat[chat]}", path, loc, "chat_id")
            t_us = as_time_us(rec["timestamp"], 1e6, path, loc, "timestamp")
            n_in = as_int(rec["input_length"], path, loc, "input_length", 1,
                          lim.max_prompt_tokens)
            n_out = as_int(rec["output_length"], path, loc, "output_length", 0,
                           lim.max_output_tokens)
            if "type" in rec and rec["type"] not in BAILIAN_TYPES:
                raise bad_value(path, loc, "type", "one of " + ", ".join(BAILIAN_TYPES),
                                rec["type"])
            h = as_int_list(rec["hash_ids"], path, loc, "hash_ids")
            full, ceil_ = n_in // BAILIAN_BLOCK_TOKENS, -(-n_in // BAILIAN_BLOCK_TOKENS)
            if len(h) not in (full, ceil_):
                raise KvsimInputError(
                    f"expected ceil(input_length/16) = {ceil_} ids (or {full}, full blocks "
                    f"only), got {len(h)}", path, loc, "hash_ids")
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        seen_chat[chat] = lineno
        hashed = n_in if len(h) == ceil_ else len(h) * BAILIAN_BLOCK_TOKENS
        rows.append((chat, parent, t_us, n_in, max(n_out, 1), h, hashed))
    parent_of = {r[0]: r[1] for r in rows}
    first_child_us: dict[int, int] = {}
    for r in rows:
        if r[1] != -1 and (r[1] not in first_child_us or r[2] < first_child_us[r[1]]):
            first_child_us[r[1]] = r[2]
    roots: dict[int, int] = {}

    def root(chat: int) -> int:
        path_: list[int] = []
        cur = chat
        while cur not in roots:
            path_.append(cur)
            p = parent_of.get(cur, -1)
            if p == -1 or p not in parent_of:  # a root, or its parent is not in the file
                roots[cur] = cur if p == -1 else p
                break
            if len(path_) > len(parent_of):
                raise KvsimInputError(f"parent_chat_id chain of chat {chat} loops", path,
                                      None, "parent_chat_id")
            cur = p
        r = roots[cur]
        for c in path_:
            roots[c] = r
        return r

    sessions: dict[int, int] = {}
    session = [sessions.setdefault(root(r[0]), len(sessions)) for r in rows]
    return build_request_table(
        {"arrival_us": [r[2] for r in rows], "prompt_tokens": [r[3] for r in rows],
         "output_tokens": [r[4] for r in rows], "block_ids": [r[5] for r in rows],
         "hashed_tokens": [r[6] for r in rows], "session": session,
         "session_continues": [r[0] in first_child_us for r in rows],
         "next_turn_gap_us": [max(first_child_us[r[0]] - r[2], 1) if r[0] in first_child_us
                              else -1 for r in rows]},
        block_size_tokens=BAILIAN_BLOCK_TOKENS, path=str(path), skipped=bad.count,
        source={"format": "bailian", "file": Path(path).name})
