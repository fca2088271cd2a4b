"""Compare the two prefix-cache schemes -- vLLM's hash chain and SGLang's radix tree -- on
one stream of prompts, same pool size, same admission order.

The stream is a sequence of requests, each given by its block hashes (``0`` for a partial
or unidentified block, see :func:`kvsim.ingest.vllm_hashing.request_hashes`) and its prompt
length in tokens.  At most ``max_running`` requests are resident; when a new one arrives
and the limit is reached, the oldest finishes first (FCFS).  A request whose blocks do not
fit is refused (counted) and dropped.  Both schemes run in plain Python (the hash chain
through :mod:`kvsim.memory.reference`, which the compiled core matches exactly).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from kvsim.memory.radix import RadixCache
from kvsim.memory.reference import KVCacheManager

#: Columns of the result, one row per scheme.
COLUMNS = ("scheme", "requests", "refused", "query_tokens", "hit_tokens", "hit_rate",
           "evicted_blocks", "dedup_blocks")


def compare_schemes(requests: Iterable[tuple[Sequence[int], int]], num_blocks: int,
                    block_size: int, max_running: int = 16) -> pd.DataFrame:
    """Replay ``requests`` ((hashes, num_tokens) pairs) through both schemes and return one
    row per scheme (``COLUMNS``).  Deterministic: no randomness, no clock."""
    requests = list(requests)
    rows = []
    for scheme, pool in (("vllm-hash-chain", KVCacheManager(num_blocks, block_size)),
                         ("sglang-radix", RadixCache(num_blocks, block_size))):
        running: list[int] = []
        refused = 0
        for hashes, num_tokens in requests:
            if len(running) >= max_running:
                seq = running.pop(0)
                pool.free(seq)
                pool.close_seq(seq)
            seq = pool.open_seq()
            if pool.allocate(seq, list(hashes), num_tokens) is None:
                refused += 1
                pool.close_seq(seq)
                continue
            running.append(seq)
        c = pool.counters
        rows.append({
            "scheme": scheme,
            "requests": len(requests),
            "refused": refused,
            "query_tokens": c["query_tokens"],
            "hit_tokens": c["hit_tokens"],
            "hit_rate": c["hit_tokens"] / c["query_tokens"] if c["query_tokens"] else 0.0,
            "evicted_blocks": c["evicted_blocks"],
            "dedup_blocks": c.get("dedup_blocks", 0),
        })
    return pd.DataFrame(rows, columns=list(COLUMNS))
