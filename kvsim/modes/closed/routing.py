"""Routing a request to a replica, and running replicas behind a router in arrival order
(the routers: :mod:`kvsim.modes.closed.cluster`'s docstring; docs/simulate.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kvsim.core import row_store
from kvsim.engine import scheduler as S
from kvsim.ingest.requests import RequestTable
from kvsim.modes.closed.closed_loop import Engine

if TYPE_CHECKING:
    from kvsim.modes.closed.closed_facts import PromptHashes

ROUTERS = ("round_robin", "least_loaded", "session", "prefix", "tiered")
#: Dynamo's default ``--kv-overlap-score-weight`` (docs/router/kv_cache_routing.md).
PREFIX_OVERLAP_WEIGHT = 1.0
INF = float("inf")


def prefix_scorer(engines: list[Engine]):
    """``score(hb, nb, prompt_tokens, B, waiting)``: the ``prefix`` router's pick over
    ``engines`` (``waiting``: int64 array of each replica's waiting prompt blocks) in one
    compiled call, :func:`kvsim.engine.scheduler_blocks._route_prefix`, with the engines'
    arrays gathered once (the state, the held-block table, the pool's prefix index and
    the lower tiers' table are the same arrays for a whole run) into one
    :class:`kvsim.replay.kernel.engine_ref.RouteRef` with ``waiting`` (made again only when
    a call passes another ``waiting`` array): a call unboxes one pointer, not five tuples
    of an array per replica."""
    from kvsim.engine.scheduler_blocks import _route_prefix
    from kvsim.jit.disk_cache import cold, setup_func
    from kvsim.modes.closed.closed_loop import _entry
    from kvsim.replay.kernel.engine_ref import new_route_ref, route_prefix
    from kvsim.replay.variants import runs_interpreted as interpreted

    arrays = (tuple(e.sched.st for e in engines), tuple(e.sched.slot_args[20] for e in engines),
              *(tuple(e.sched.lookup[k] for e in engines) for k in range(3)))
    weight, i_qn, i_done = PREFIX_OVERLAP_WEIGHT, S.S_QN, S.S_DONE
    if interpreted(engines) and cold(route_prefix):
        # the interpreted engines while the scorer is cold: its Python twin on the arrays
        py = setup_func(_route_prefix, True)
        return lambda hb, nb, prompt_tokens, B, waiting: py(hb, nb, prompt_tokens, B, weight,
                                                            waiting, *arrays, i_qn, i_done)
    held = [None, None, None]  # the waiting array, its RouteRef, numba's entry for them

    def score(hb, nb: int, prompt_tokens: int, B: int, waiting: np.ndarray) -> int:
        if waiting is not held[0]:
            rr = new_route_ref(*arrays, waiting)
            w = route_prefix(hb, nb, prompt_tokens, B, weight, rr, i_qn, i_done)  # compiles
            held[:] = waiting, rr, _entry(route_prefix, (hb, nb, prompt_tokens, B, weight, rr,
                                                          i_qn, i_done))
            return w
        return held[2](hb, nb, prompt_tokens, B, weight, held[1], i_qn, i_done)

    return score


def _route(router: str, i: int, engines: list[Engine], hb: np.ndarray, nb: int,
           prompt_tokens: int, B: int, session: int, sticky: dict, waiting_blocks,
           prefix=None) -> int:
    """The replica request ``i`` goes to (``waiting_blocks``: each replica's waiting
    prompt blocks; ``prefix``: :func:`prefix_scorer` of ``engines``, made here if None)."""
    n = len(engines)
    if router == "round_robin":
        return i % n
    if router == "prefix":
        score = prefix_scorer(engines) if prefix is None else prefix
        return score(hb, nb, prompt_tokens, B, np.asarray(waiting_blocks, dtype=np.int64))
    load = [e.outstanding() for e in engines]
    if router == "session" and session >= 0 and session in sticky:
        return sticky[session]
    if router == "tiered":
        from kvsim.modes.closed.tier_router import route

        return route(engines, hb, nb, prompt_tokens, B, np.asarray(waiting_blocks).tolist(),
                     load)
    w = int(np.argmin(load))  # least_loaded, session
    if session >= 0:
        sticky[session] = w
    return w


#: arrivals whose values the router holds as Python lists at once (a chosen bound: 64 Ki
#: requests, ~7 MB of Python objects)
ROUTE_CHUNK = 1 << 16
#: arrivals between two calls of ``_run_cluster``'s ``on_release`` (the run's row store
#: gives back the pages of the rows passed: kvsim.core.row_store); a chosen bound, a
#: few calls on the Mooncake trace (12,031 requests), each a scan of the replicas' held rows
RELEASE_ROWS = 1 << 12


def _run_cluster(table: RequestTable, engines: list[Engine], router: str, B: int,
                 pb: PromptHashes, warmup: int = 0,
                 on_progress: Callable[[int, int], None] | None = None,
                 on_release: Callable[[int], None] | None = None) -> None:
    """Route each request at its arrival time.  Replicas interact only through the router,
    so between two arrivals each one runs its own steps independently: before routing
    request ``i`` every replica runs the steps that start before ``arrival_i``.
    ``on_progress(served, N)``: the requests the replicas have finished, after each
    arrival."""
    arr = np.asarray(table.column("arrival_us"), dtype=np.int64)
    prompt = np.asarray(table.column("prompt_tokens"), dtype=np.int64)
    session = np.asarray(table.column("session"), dtype=np.int64)
    hashes_of = pb.slice
    N = len(table)
    sticky: dict = {}
    R = len(engines)
    waiting_blocks = np.zeros(R, dtype=np.int64)  # prompt blocks waiting, per replica
    admitted = [0] * R
    nb_all = row_store.copy((prompt + B - 1) // B)  # per request: the run's row store
    # the engines' state and clocks read as Python ints / floats (memoryviews share the
    # arrays' memory: a numpy scalar read costs several times more, 8 engines per arrival)
    sts = [memoryview(e.sched.st) for e in engines]
    clocks = [memoryview(e.sched.stf) for e in engines]
    orders = [e.sched.order for e in engines]
    score = prefix_scorer(engines) if router == "prefix" else None
    iS_NRUN, iS_ADMIT, iS_QN, iS_FIN = S.S_NRUN, S.S_ADMIT, S.S_QN, S.S_FINISHED
    advances = [e.advance for e in engines]
    replicas = list(zip(range(R), sts, clocks, advances))
    # waiting prompt blocks per replica as Python ints; the array the scorer reads is
    # written only where one changed (numpy scalar reads and writes cost several times more)
    waiting = [0] * R
    # the time each replica must next run before an arrival at t: its clock while it has
    # work (has_work()), never (inf) while idle.  Only advance() and an enqueue change a
    # replica's work, clock or admissions, both here: the replicas' state is read after
    # one of them, not at every arrival (8 replicas x ~12,000 arrivals; ~0.8 advance calls
    # an arrival on the Mooncake trace)
    due = [INF] * R
    for i in range(N):
        k = i & (ROUTE_CHUNK - 1)
        if k == 0:  # the next chunk's values as Python ints / floats (cheap reads); the
            # lists are a chunk's, not the trace's (~110 bytes a request: issue 38)
            c1 = min(i + ROUTE_CHUNK, N)
            arr_list = arr[i:c1].astype(np.float64).tolist()
            nb_list = nb_all[i:c1].tolist()
            prompt_list = prompt[i:c1].tolist()
            session_list = session[i:c1].tolist()
        if on_release is not None and (i & (RELEASE_ROWS - 1)) == 0:
            on_release(i)  # rows below i and below every replica's oldest: passed
        t = arr_list[k]
        if min(due) < t:
            for w, st, clock, advance in replicas:
                if due[w] >= t:
                    continue
                advance(t)  # has_work() and clock_us < t
                adm = st[iS_ADMIT]
                if adm > admitted[w]:
                    order = orders[w]
                    blocks = waiting[w]
                    for j in range(admitted[w], adm):
                        blocks -= int(nb_all[order[j]])
                    waiting[w] = blocks
                    waiting_blocks[w] = blocks
                    # vLLM's scheduler re-queues preempted requests: S_ADMIT may step back
                    admitted[w] = adm
                due[w] = clock[0] if (st[iS_NRUN] > 0 or adm < st[iS_QN]) else INF
        if i == warmup and warmup > 0:
            for e in engines:
                e.start_measuring()
        hb = hashes_of(i)
        nb = nb_list[k]
        w = _route(router, i, engines, hb, nb, prompt_list[k], B, session_list[k], sticky,
                   waiting_blocks, score)
        st = sts[w]
        qn = st[iS_QN]
        clock = clocks[w]
        if due[w] == INF and clock[0] < t:
            clock[0] = t  # an idle engine waits for its next request
        if qn >= orders[w].shape[0]:  # a queue grows with the requests routed to it
            orders[w] = engines[w].grow_order()
        orders[w][qn] = i  # Engine.enqueue(i), on the memoryview
        st[iS_QN] = qn + 1
        st[iS_FIN] = 0
        due[w] = clock[0]  # it has work now
        blocks = waiting[w] + nb
        waiting[w] = blocks
        waiting_blocks[w] = blocks
        if on_progress is not None and (i & 63) == 63:  # a progress bar: every 64 arrivals
            on_progress(sum(int(x.sched.st[S.S_DONE]) for x in engines), N)
    for e in engines:
        e.advance(-1.0)
    if on_progress is not None:
        on_progress(sum(int(x.sched.st[S.S_DONE]) for x in engines), N)
