"""Routing a request to a replica, and running replicas behind a router in arrival order
(the routers: :mod:`kvsim.modes.closed.cluster`'s docstring; docs/simulate.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvsim.engine import scheduler as S
from kvsim.engine.scheduler_blocks import _cached_prefix
from kvsim.ingest.requests import RequestTable
from kvsim.modes.closed.closed_loop import Engine

ROUTERS = ("round_robin", "least_loaded", "session", "prefix", "tiered")
#: Dynamo's default ``--kv-overlap-score-weight`` (docs/router/kv_cache_routing.md).
PREFIX_OVERLAP_WEIGHT = 1.0


def _route(router: str, i: int, engines: list[Engine], hb: np.ndarray, nb: int,
           prompt_tokens: int, B: int, session: int, sticky: dict, waiting_blocks) -> int:
    n = len(engines)
    if router == "round_robin":
        return i % n
    load = [e.outstanding() for e in engines]
    if router == "session" and session >= 0 and session in sticky:
        return sticky[session]
    if router == "tiered":
        from kvsim.modes.closed.tier_router import route

        return route(engines, hb, nb, prompt_tokens, B, waiting_blocks, load)
    if router in ("least_loaded", "session"):
        w = int(np.argmin(load))
        if session >= 0:
            sticky[session] = w
        return w
    best, best_key = 0, None
    for w, e in enumerate(engines):
        sc = e.sched
        phk, phv, tk = sc.lookup
        # a cheap first test: the cost is at least nb - limit + active (limit: the most
        # blocks that can be cached), so a replica that cannot beat the best is not scored
        active = int(sc.st[S.S_HELD]) + waiting_blocks[w]
        if best_key is not None:
            floor = PREFIX_OVERLAP_WEIGHT * (nb - min(nb, max((prompt_tokens - 1) // B, 0)))
            if (floor + active, load[w], w) > best_key:
                continue
        cached = _cached_prefix(hb, nb, prompt_tokens, B, sc.slot_args[20], phk, phv, tk)
        key = (PREFIX_OVERLAP_WEIGHT * (nb - cached) + active, load[w], w)
        if best_key is None or key < best_key:
            best, best_key = w, key
    return best


def _run_cluster(table: RequestTable, engines: list[Engine], router: str, B: int,
                 pb: tuple[np.ndarray, np.ndarray], warmup: int = 0,
                 on_progress: Callable[[int, int], None] | None = None) -> None:
    """Route each request at its arrival time.  Replicas interact only through the router,
    so between two arrivals each one runs its own steps independently: before routing
    request ``i`` every replica runs the steps that start before ``arrival_i``.
    ``on_progress(served, N)``: the requests the replicas have finished, after each
    arrival."""
    df = table.df
    arr = df["arrival_us"].to_numpy(np.int64)
    prompt = df["prompt_tokens"].to_numpy(np.int64)
    session = df["session"].to_numpy(np.int64)
    pb_off, pb_hash = pb
    N = len(df)
    sticky: dict = {}
    waiting_blocks = [0] * len(engines)
    admitted = [0] * len(engines)
    nb_all = (prompt + B - 1) // B
    # the engines' state and clocks read as Python ints / floats (memoryviews share the
    # arrays' memory: a numpy scalar read costs several times more, 8 engines per arrival)
    sts = [memoryview(e.sched.st) for e in engines]
    clocks = [memoryview(e.sched.stf) for e in engines]
    orders = [e.sched.order for e in engines]
    nb_list = nb_all.tolist()
    iS_NRUN, iS_ADMIT, iS_QN = S.S_NRUN, S.S_ADMIT, S.S_QN
    for i in range(N):
        t = float(arr[i])
        for w, e in enumerate(engines):
            st = sts[w]
            if (st[iS_NRUN] > 0 or st[iS_ADMIT] < st[iS_QN]) and clocks[w][0] < t:
                e.advance(t)  # has_work() and clock_us < t
            adm = st[iS_ADMIT]
            if adm > admitted[w]:
                order = orders[w]
                for j in range(admitted[w], adm):
                    waiting_blocks[w] -= nb_list[order[j]]
                # vLLM's scheduler re-queues preempted requests: S_ADMIT may step back
                admitted[w] = adm
        if i == warmup and warmup > 0:
            for e in engines:
                e.start_measuring()
        hb = pb_hash[pb_off[i]:pb_off[i + 1]]
        w = _route(router, i, engines, hb, int(nb_all[i]), int(prompt[i]), B,
                   int(session[i]), sticky, waiting_blocks)
        e = engines[w]
        if not e.has_work() and e.clock_us < t:
            e.sched.stf[0] = t  # an idle engine waits for its next request
        e.enqueue(i)
        waiting_blocks[w] += int(nb_all[i])
        if on_progress is not None and (i & 63) == 63:  # a progress bar: every 64 arrivals
            on_progress(sum(int(x.sched.st[S.S_DONE]) for x in engines), N)
    for e in engines:
        e.advance(-1.0)
    if on_progress is not None:
        on_progress(sum(int(x.sched.st[S.S_DONE]) for x in engines), N)
