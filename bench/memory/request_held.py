"""Bytes the closed loop holds before its run, by holder (issue 38, "Memory"): builds what
``kvsim simulate --request-trace T`` builds for one replica (h100-sxm defaults, lru, vLLM's
scheduler) up to the engine and the block facts, and sums the numpy arrays each holds
(a buffer counted once, at its first holder).

    python bench/memory/request_held.py /tmp/x1.jsonl /tmp/x10.jsonl

Holders: the Request table's columns, its block ids (CSR), vLLM's block hashes, the
scheduler's request arguments / per-slot arrays / order, vLLM's request rows (``vs``), the
block facts, the closed loop's event columns, the replay's arrays.
"""

from __future__ import annotations

import sys

import numpy as np


def _nbytes(x, seen: set) -> int:
    if isinstance(x, np.ndarray):
        base = x if x.base is None else x.base
        if id(base) in seen:
            return 0
        seen.add(id(base))
        return int(getattr(base, "nbytes", 0))
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(y, seen) for y in x)
    return 0


def held(path: str) -> dict:
    from kvsim.ingest import read_requests
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import (
        Engine,
        EngineOptions,
        prepare,
        resolve_scheduler,
        vllm_hashes,
    )
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    t = read_requests(path)
    config = SimConfig()
    opts, _ = resolve_scheduler(t, config, EngineOptions())
    cost, hbm, costs, bb, off, ids, t, _dropped = prepare(t, config, opts)
    h = vllm_hashes(t, off, ids, opts)
    e = Engine(t, off, ids, resolve_policy("lru"), config, opts, cost, hbm, costs, bb, None,
               hashes=h)
    facts = block_facts(t, off, ids, opts.block_size_tokens, next_use=False)
    sc = e.sched
    groups = {"table columns": list(t.columns().values()), "block ids (CSR)": [off, ids],
              "vLLM hashes": list(h), "scheduler request args": list(sc.req_args),
              "scheduler slot args": list(sc.slot_args), "scheduler order": [sc.order],
              "scheduler rows/hitk/adm": [sc.hitk, sc.adm, sc.I, sc.F],
              "vLLM request rows (vs)": list(e.vs), "block facts": list(facts),
              "event columns, nu, seen, insys": [*e.cols, e.nu, e.seen, e.insys],
              "replay arrays": [v for v in vars(e.run).values() if isinstance(v, np.ndarray)]}
    seen: set = set()
    return {"requests": len(t), **{k: _nbytes(v, seen) / 2**20 for k, v in groups.items()}}


def main() -> None:
    rows = [held(p) for p in sys.argv[1:]]
    print("| holder | " + " | ".join(f"{r['requests']:,} requests (MiB)" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for k in rows[0]:
        if k != "requests":
            print(f"| {k} | " + " | ".join(f"{r[k]:.1f}" for r in rows) + " |")


if __name__ == "__main__":
    main()
