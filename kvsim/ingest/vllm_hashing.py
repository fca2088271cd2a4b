"""Prefix-chain block hashes, vLLM style: hash(parent hash, block tokens, extra keys).

vLLM v1 (``kv_cache_utils.hash_block_tokens``) hashes each FULL block as
``H(parent_hash or NONE_HASH, tuple(tokens), extra_keys)``; extra keys (a LoRA name, a
cache salt, multimodal hashes) namespace blocks so equal tokens under different extra keys
never share.  vLLM puts the cache salt on the first block only; since every later hash
chains through the first, the whole chain is namespaced.  We do the same with a stable
64-bit BLAKE2b (vLLM uses sha256 or its builtin hash; the function does not matter, only
that equal (prefix, tokens, extra) give equal hashes and anything else does not).

Hashes are non-zero signed int64 (0 is ``kvsim.core.schema.NO_HASH``).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

#: Parent hash of the first block (vLLM's NONE_HASH plays this role).
NONE_HASH = 0


def hash_block(parent: int, tokens: Sequence[int], extra: Sequence[object] = ()) -> int:
    """The chain hash of one block: a non-zero int64."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<q", parent))
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    if extra:
        h.update(repr(tuple(extra)).encode())
    value = struct.unpack("<q", h.digest())[0]
    return value if value != 0 else 1


def block_hashes(tokens: Sequence[int], block_size: int, extra: Sequence[object] = ()) -> list[int]:
    """Hashes of the FULL blocks of ``tokens`` (a trailing partial block has none);
    ``extra`` keys (LoRA id, cache salt) go into the first block's hash."""
    out: list[int] = []
    parent = NONE_HASH
    for i in range(len(tokens) // block_size):
        parent = hash_block(parent, tokens[i * block_size:(i + 1) * block_size],
                            extra if i == 0 else ())
        out.append(parent)
    return out


def request_hashes(tokens: Sequence[int], block_size: int, extra: Sequence[object] = ()) -> list[int]:
    """One entry per block of the request (full blocks' hashes, then 0 for a trailing
    partial block): the ``hashes`` argument of ``allocate``."""
    full = block_hashes(tokens, block_size, extra)
    if len(tokens) % block_size:
        full.append(0)
    return full
