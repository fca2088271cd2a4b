"""The batch-job reorder study (``kvsim reorder``): how much prefix reuse and throughput
does a batch job's submission order leave on the table?

An offline batch job (ServeGen's trace_a/b/c, or any request trace served as one batch)
has no arrivals: every request is queued at t = 0 (or submitted at a fixed rate) and the
engine admits them first come, first served.  The order is therefore the one knob the
batch scheduler owns.  The study serves the same requests closed loop in several orders
and reports, for each, the prefix hit rate, the makespan and the throughput:

* ``submission``: the order of the input file (the trace's);
* ``grouped``: requests grouped by their first block (a shared system prompt or task
  template), groups in order of first appearance, submission order inside a group;
* ``dfs``: the depth-first order of the prompts' prefix tree (a trie over block ids;
  siblings in order of first appearance): consecutive requests share the longest prefix
  the trie allows, the order SGLang's cache-aware scheduler approximates (Zheng et al.,
  "SGLang", 2024, section 3: "longest-shared-prefix-first" is a DFS of the radix tree).
  It is the best order kvsim finds; it is not proven optimal (an order that also balances
  prefill and decode could finish sooner).

Every order sees the same requests (ids renumbered in the new order), so only the order
changes a figure.  ``adjacent_shared_blocks`` is the mean number of leading native blocks
a request shares with the request just before it (an offline measure of the order).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.ingest.requests import RequestTable

#: The orders of the study, in their report order.
ORDERS = ("submission", "grouped", "dfs")


def _prefix_nodes(table: RequestTable) -> list[list[int]]:
    """Per request, the prefix-tree node of each of its blocks (nodes numbered by first
    appearance in submission order): equal node = equal block after an equal prefix."""
    nodes: dict[tuple[int, int], int] = {}
    out = []
    for ids in table.df["block_ids"]:
        parent, path = -1, []
        for b in np.asarray(ids, dtype=np.int64).tolist():
            parent = nodes.setdefault((parent, b), len(nodes))
            path.append(parent)
        out.append(path)
    return out


def order_indices(table: RequestTable, how: str) -> np.ndarray:
    """Row indices of ``table`` (submission order = row order) in order ``how``."""
    n = len(table)
    if how == "submission":
        return np.arange(n, dtype=np.int64)
    paths = _prefix_nodes(table)
    if how == "grouped":
        first = [p[0] if p else -1 - i for i, p in enumerate(paths)]
        rank: dict[int, int] = {}
        for f in first:
            rank.setdefault(f, len(rank))
        return np.asarray(sorted(range(n), key=lambda i: (rank[first[i]], i)), dtype=np.int64)
    if how == "dfs":
        # node numbers grow with first appearance, so sorting the node paths is a DFS
        # with siblings in first-appearance order; a prefix sorts before its extensions
        return np.asarray(sorted(range(n), key=lambda i: (paths[i], i)), dtype=np.int64)
    raise bad_value(None, None, "--orders", "a list of " + ", ".join(ORDERS), how)


def adjacent_shared_blocks(table: RequestTable, order: np.ndarray) -> float:
    """Mean leading blocks each request shares with the one before it in ``order``."""
    paths = _prefix_nodes(table)
    total = 0
    for a, b in zip(order[:-1], order[1:]):
        pa, pb = paths[a], paths[b]
        k = 0
        while k < len(pa) and k < len(pb) and pa[k] == pb[k]:
            k += 1
        total += k
    return total / max(len(order) - 1, 1)


def reordered(table: RequestTable, order: np.ndarray,
              submission_rate: float | None = None) -> RequestTable:
    """``table``'s requests in ``order`` as one batch job: all arriving at t = 0, or the
    k-th at ``k / submission_rate`` seconds; ids renumbered 0..N-1 in the new order."""
    df = table.df.iloc[order].reset_index(drop=True).copy()
    n = len(df)
    if submission_rate is None:
        df["arrival_us"] = np.zeros(n, dtype=np.int64)
    else:
        if not submission_rate > 0:
            raise bad_value(None, None, "--submission-rate", "a rate > 0", submission_rate)
        df["arrival_us"] = np.round(np.arange(n) / submission_rate * 1e6).astype(np.int64)
    df["request_id"] = np.arange(n, dtype=np.int64)
    source = dict(table.source, batch=True, submission_rate=submission_rate)
    return replace(table, df=df, source=source)


def reorder_study(table: RequestTable, *, orders: tuple[str, ...] | list[str] = ORDERS,
                  policy: str = "lru", config=None, engine=None,
                  submission_rate: float | None = None) -> pd.DataFrame:
    """Serve ``table`` closed loop once per order; one row per order with ``order``,
    ``requests``, ``prefix_hit_rate`` (any tier), ``hit_tokens``, ``hbm_block_hit_rate``,
    ``makespan_s``,
    ``throughput_requests_per_s``, ``throughput_tokens_per_s``, ``adjacent_shared_blocks``
    and ``makespan_vs_submission`` (makespan / the submission order's, when it is run)."""
    from kvsim.modes.closed.cluster import serve

    if not orders:
        raise KvsimInputError("expected at least one order", None, None, "--orders")
    rows = []
    for how in orders:
        idx = order_indices(table, how)
        res = serve(reordered(table, idx, submission_rate), policy, config, engine=engine)
        s = res.summary
        rows.append({
            "order": how, "requests": len(table),
            "prefix_hit_rate": float(s["prefix_hit_rate"]),
            "hit_tokens": int(s["hit_tokens"]),
            "hbm_block_hit_rate": float(s["hbm_block_hit_rate"]),
            "makespan_s": float(s["makespan_us"]) / 1e6,
            "throughput_requests_per_s": float(s["throughput_requests_per_s"]),
            "throughput_tokens_per_s": float(s["throughput_tokens_per_s"]),
            "adjacent_shared_blocks": adjacent_shared_blocks(table, idx),
            "evictions": int(s["evictions"]), "preemptions": int(s["preemptions"]),
            "dropped_requests": int(s["dropped_requests"]),
        })
    df = pd.DataFrame(rows)
    if "submission" in list(orders):
        base = df.loc[df["order"] == "submission", "makespan_s"].iloc[0]
        df["makespan_vs_submission"] = df["makespan_s"] / base if base > 0 else np.nan
    return df
