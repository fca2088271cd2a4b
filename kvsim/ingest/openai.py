"""Reader for OpenAI-compatible proxy logs (LiteLLM / gateway style JSONL, one call a line).

Each line is one completed call.  Keys looked up (first present wins; ``a.b`` = nested):

=================== ==========================================================================
field               keys
=================== ==========================================================================
arrival (required)  ``timestamp``, ``created``, ``start_time``, ``request.timestamp``: epoch
                    seconds (values above 1e11 are read as milliseconds) or ISO 8601 text
prompt_tokens (req) ``usage.prompt_tokens``, ``response.usage.prompt_tokens``
output_tokens (req) ``usage.completion_tokens``, ``response.usage.completion_tokens``
model               ``model``, ``request.model``, ``response.model``
token ids           ``prompt_token_ids``, ``request.prompt_token_ids``, or ``prompt`` given
                    as a list of integers
prompt text         ``prompt`` / ``request.prompt`` (text), or ``messages`` /
                    ``request.messages`` (list of ``{role, content}``)
session             ``session_id``, ``metadata.session_id``, ``user``, ``request.user``
tenant              ``tenant``, ``metadata.tenant`` (integer or name)
request_priority    ``priority``, ``request.priority``, ``metadata.priority`` (0..100,
                    higher = more important)
TTFT / TPOT SLO     ``slo.ttft_ms`` / ``slo.tpot_ms``, ``ttft_slo_ms`` / ``tpot_slo_ms``,
                    ``metadata.ttft_slo_ms`` / ``metadata.tpot_slo_ms``
n, beam width       ``n`` / ``request.n``; ``beam_width`` / ``request.beam_width``
=================== ==========================================================================

Content identity.  Token ids, when logged, are chain-hashed in FULL blocks of
:data:`OPENAI_BLOCK_TOKENS` tokens (vLLM's rule: the trailing partial block has no hash).
When only text is logged, a **tokenization proxy** stands in for the real tokenizer: the
UTF-8 bytes of the prompt (messages rendered as ``role\\ncontent\\n`` in order) are cut into
4-byte pseudo-tokens (OpenAI's rule of thumb: about 4 characters per token) which are
hashed the same way.  The proxy is NOT the model's tokenizer: identical text prefixes
share blocks, but block boundaries only approximate the real ones.  Blocks are never
claimed beyond ``usage.prompt_tokens`` (the served count is the truth).  The namespace
(chain root) is the model name: two models never share KV.  Arrivals are relative to the
earliest call; sessions and tenant names are numbered by first appearance.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.ingest.hashing import name_hash, token_block_ids
from kvsim.ingest.requests import RequestTable, build_request_table
from kvsim.ingest.tracefile import BadRows, as_float, as_int, get_path, json_lines, parse_json

#: Tokens per hashed block for logs with token ids or text (vLLM's default block size).
OPENAI_BLOCK_TOKENS = 16
#: Bytes per pseudo-token of the text proxy (OpenAI: "one token ~ 4 characters of text").
PROXY_BYTES_PER_TOKEN = 4

_TIME_KEYS = ("timestamp", "created", "start_time", "request.timestamp")
_PROMPT_KEYS = ("usage.prompt_tokens", "response.usage.prompt_tokens")
_OUTPUT_KEYS = ("usage.completion_tokens", "response.usage.completion_tokens")
_MODEL_KEYS = ("model", "request.model", "response.model")
_SESSION_KEYS = ("session_id", "metadata.session_id", "user", "request.user")
_TENANT_KEYS = ("tenant", "metadata.tenant")
_PRIORITY_KEYS = ("priority", "request.priority", "metadata.priority")
_TTFT_KEYS = ("slo.ttft_ms", "ttft_slo_ms", "metadata.ttft_slo_ms")
_TPOT_KEYS = ("slo.tpot_ms", "tpot_slo_ms", "metadata.tpot_slo_ms")


def _first(rec: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    for k in keys:
        v = get_path(rec, k)
        if v is not None:
            return k, v
    return None, None


def _time_us(value: Any, path, loc: str, key: str) -> int:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            try:
                dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
            except (ValueError, OverflowError):
                raise bad_value(path, loc, key, "epoch seconds or an ISO 8601 time",
                                value) from None
            if dt.tzinfo is None:
                return int(round((dt - datetime(1970, 1, 1)).total_seconds() * 1e6))
            return int(round(dt.timestamp() * 1e6))
    from kvsim.core.limits import get_limits

    # epoch seconds, or milliseconds above 1e11: either way at most max_epoch_us
    t = as_float(value, path, loc, key, 0.0, get_limits().max_epoch_us / 1e3)
    us = int(round(t * 1e3)) if t > 1e11 else int(round(t * 1e6))
    if us > get_limits().max_epoch_us:
        raise bad_value(path, loc, key, "epoch seconds or milliseconds before the year 2200",
                        value)
    return us


def _prompt_text(rec: dict, path, loc: str) -> tuple[str | None, list[int] | None]:
    """(text, token ids) as logged; either may be None."""
    key, ids = _first(rec, ("prompt_token_ids", "request.prompt_token_ids"))
    pkey, prompt = _first(rec, ("prompt", "request.prompt"))
    if ids is None and isinstance(prompt, list) and prompt and all(
            isinstance(x, int) for x in prompt):
        key, ids = pkey, prompt
    if ids is not None:
        if not isinstance(ids, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and -2**63 <= x < 2**63
                for x in ids):
            raise bad_value(path, loc, key, "a list of token ids", ids)
        return None, ids
    if isinstance(prompt, str):
        return prompt, None
    mkey, messages = _first(rec, ("messages", "request.messages"))
    if messages is None:
        return None, None
    if not isinstance(messages, list):
        raise bad_value(path, loc, mkey, "a list of {role, content} messages", messages)
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            raise bad_value(path, loc, mkey, "a list of {role, content} messages", m)
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones, in order
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{m.get('role', '')}\n{content}\n")
    return "".join(parts), None


def proxy_tokens(text: str) -> np.ndarray:
    """The documented tokenization proxy: 4-byte little-endian chunks of the UTF-8 text."""
    raw = text.encode("utf-8")
    pad = (-len(raw)) % PROXY_BYTES_PER_TOKEN
    return np.frombuffer(raw + b"\0" * pad, dtype="<u4").astype(np.int64)


def read_openai(path: str | Path, *, skip_bad_rows: bool = False) -> RequestTable:
    """Read an OpenAI-compatible proxy log (JSONL) into the canonical Request table."""
    bad = BadRows(skip_bad_rows)
    cols: dict[str, list] = {k: [] for k in (
        "arrival_us", "prompt_tokens", "output_tokens", "block_ids", "hashed_tokens",
        "session", "tenant", "request_priority", "ttft_deadline_us", "tpot_deadline_us", "n",
        "beam_width", "model")}
    sessions: dict[str, int] = {}
    tenants: dict[str, int] = {}
    for lineno, text in json_lines(path):
        loc = f"line {lineno}"
        try:
            rec = parse_json(path, lineno, text)
            if not isinstance(rec, dict):
                raise KvsimInputError("expected a JSON object", path, loc)
            row = _row(rec, path, loc, sessions, tenants)
        except KvsimInputError as exc:
            bad.handle(exc)
            continue
        for k, v in row.items():
            cols[k].append(v)
    if cols["arrival_us"]:
        t0 = min(cols["arrival_us"])
        cols["arrival_us"] = [t - t0 for t in cols["arrival_us"]]
    return build_request_table(cols, block_size_tokens=OPENAI_BLOCK_TOKENS, path=str(path),
                               skipped=bad.count,
                               source={"format": "openai", "file": Path(path).name})


def _row(rec: dict, path, loc: str, sessions: dict, tenants: dict) -> dict[str, Any]:
    tkey, tval = _first(rec, _TIME_KEYS)
    if tkey is None:
        raise KvsimInputError("missing arrival time (one of timestamp, created, start_time)",
                              path, loc, "timestamp")
    pkey, pval = _first(rec, _PROMPT_KEYS)
    okey, oval = _first(rec, _OUTPUT_KEYS)
    if pkey is None:
        raise KvsimInputError("missing required field", path, loc, "usage.prompt_tokens")
    if okey is None:
        raise KvsimInputError("missing required field", path, loc, "usage.completion_tokens")
    from kvsim.core.limits import get_limits

    lim = get_limits()
    prompt = as_int(pval, path, loc, pkey, 1, lim.max_prompt_tokens)
    _, model = _first(rec, _MODEL_KEYS)
    model = str(model or "")
    text, ids = _prompt_text(rec, path, loc)
    if ids is not None:
        tokens = np.asarray(ids, dtype=np.int64)
    elif text is not None:
        tokens = proxy_tokens(text)
    else:
        tokens = np.zeros(0, dtype=np.int64)
    max_blocks = prompt // OPENAI_BLOCK_TOKENS
    block_ids = token_block_ids(tokens[: max_blocks * OPENAI_BLOCK_TOKENS],
                                OPENAI_BLOCK_TOKENS, name_hash("openai:" + model))
    skey, sval = _first(rec, _SESSION_KEYS)
    session = sessions.setdefault(str(sval), len(sessions)) if sval is not None else -1
    _, tval_ = _first(rec, _TENANT_KEYS)
    if tval_ is None:
        tenant = 0
    elif isinstance(tval_, int) and not isinstance(tval_, bool):
        tenant = tval_
    else:
        tenant = tenants.setdefault(str(tval_), len(tenants) + 1)
    qkey, qval = _first(rec, _PRIORITY_KEYS)
    priority = 50 if qkey is None else as_int(qval, path, loc, qkey, 0)
    if priority > 100:
        raise bad_value(path, loc, qkey, "a priority 0..100", qval)
    ttft_key, ttft = _first(rec, _TTFT_KEYS)
    tpot_key, tpot = _first(rec, _TPOT_KEYS)
    n_key, n = _first(rec, ("n", "request.n"))
    b_key, beam = _first(rec, ("beam_width", "request.beam_width"))
    return {
        "arrival_us": _time_us(tval, path, loc, tkey),
        "prompt_tokens": prompt,
        "output_tokens": max(as_int(oval, path, loc, okey, 0, lim.max_output_tokens), 1),
        "block_ids": block_ids,
        "hashed_tokens": len(block_ids) * OPENAI_BLOCK_TOKENS,
        "session": session,
        "tenant": tenant,
        "request_priority": priority,
        "ttft_deadline_us": -1 if ttft is None else
        max(int(round(as_float(ttft, path, loc, ttft_key, 0.001, 9e12) * 1000)), 1),
        "tpot_deadline_us": -1 if tpot is None else
        max(int(round(as_float(tpot, path, loc, tpot_key, 0.001, 9e12) * 1000)), 1),
        "n": 1 if n is None else as_int(n, path, loc, n_key, 1, lim.max_fanout),
        "beam_width": 1 if beam is None else as_int(beam, path, loc, b_key, 1, lim.max_fanout),
        "model": model,
    }
