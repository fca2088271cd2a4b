"""Serve a Request table on one or more closed-loop engines behind a router.

:func:`serve` is the Python API under ``kvsim simulate --requests`` / ``kvsim compare
--profile`` (closed loop, the default wherever the input is a Request table).  Each
replica is an :class:`kvsim.modes.closed.closed_loop.Engine` with its own HBM pool and lower
tiers.  Time advances as a discrete-event simulation: the replica whose next step starts
first runs it, unless a request arrives before that; an arriving request is routed at its
arrival time, on the replicas' state at that moment.

Routers (``router=``):

``round_robin``
    request ``i`` (arrival order) goes to replica ``i mod N``.
``least_loaded``
    the replica with the fewest outstanding requests (routed, not finished); ties: lowest
    index.
``session``
    sticky sessions: the first request of a session goes to the least-loaded replica,
    later ones to the same replica; requests without a session are least-loaded.
``prefix``
    KV-aware (NVIDIA Dynamo's KV router, docs/design_docs/router_design.md of
    ai-dynamo/dynamo, with ``--kv-overlap-score-weight 1`` and ``--router-temperature 0``,
    its defaults): for every replica ``w``,
    ``cost_w = overlap_weight x (prompt_blocks - cached_prefix_blocks_w) + active_blocks_w``
    where ``cached_prefix_blocks_w`` is the longest chain of the prompt's blocks cached on
    ``w`` (HBM, then DRAM / CXL / NVMe: the admission lookup of the closed loop) and
    ``active_blocks_w`` the blocks held by ``w``'s running sequences plus the prompt blocks
    of requests waiting there (Dynamo's "potential active blocks" without the new request's
    own blocks, which are the same on every replica).  The lowest cost wins; ties: fewest
    outstanding requests, then lowest index (Dynamo samples ties at temperature 0 by
    order).  llm-d's precise prefix-cache scorer scores the same longest consecutive
    prefix; its load scorers play the role of ``active_blocks_w``.
``tiered``
    ``prefix`` with each cached block priced by where it sits (HBM free, a lower or shared
    tier the transfer over its link, relative to recomputing it):
    :mod:`kvsim.modes.closed.tier_router`.

A shared cluster tier (``SimConfig.shared_tier_gb``) is one store every replica reaches:
:mod:`kvsim.modes.closed.shared_tier`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvsim.core import row_store
from kvsim.core.errors import KvsimInputError
from kvsim.engine import scheduler as S
from kvsim.ingest.requests import RequestTable
from kvsim.modes.closed import closed_loop
from kvsim.modes.closed.closed_loop import (
    Engine,
    EngineOptions,
    prepare,
    resolve_scheduler,
    vllm_hashes,
)
from kvsim.modes.closed.routing import (  # noqa: F401 (re-exported)
    PREFIX_OVERLAP_WEIGHT,
    ROUTERS,
    _route,
    _run_cluster,
)
from kvsim.spec.sim_config import SimConfig

#: the Request-table columns a one-replica run reads no more once its engine and block
#: facts are made (the engine holds what it reads; vLLM's step reads none of these):
#: dropped with the block ids of a table handed over (``serve(release_block_ids=True)``)
UNREAD_IN_RUN = ("session", "model", "n", "beam_width", "spec_draft_tokens",
                 "spec_accept_prob", "hashed_tokens")
#: a routed replica's first queue capacity (requests; doubled when full, Engine.grow_order)
ORDER_FIRST = 1 << 12


def _events(table: RequestTable, block_size_tokens: int) -> int:
    """About how many event rows the closed loop replays for ``table`` (prompt blocks plus
    one per output token), as the engine counts them for ``auto``."""
    return int(table.column("prompt_tokens").sum() // block_size_tokens
               + table.column("output_tokens").sum())


def serve(table: RequestTable, policy, config: SimConfig | None = None, *,
          replicas: int = 1, router: str = "round_robin",
          engine: EngineOptions | None = None, decision_log: str | Path | None = None,
          on_progress: Callable[[int, int], None] | None = None, pd=None,
          step_table: bool = True, release_block_ids: bool = False):
    """Serve ``table`` closed loop on ``replicas`` engines behind ``router``; returns a
    :class:`kvsim.replay.driver.SimResult` whose ``summary`` has the cluster-wide keys of
    docs/simulate.md and ``summary["replicas_detail"]`` one row per replica.  ``pd``
    (:class:`kvsim.modes.closed.disagg.PdOptions`): prefill and decode pools instead
    (:mod:`kvsim.modes.closed.disagg`; ``replicas`` is then P + D).  ``step_table`` False:
    the engines keep only what the summary reads of their steps (the measured steps'
    latencies, :mod:`kvsim.results.step_records`; the same summary), and
    ``SimResult.steps`` is a table with no row (without ``pd``).  ``release_block_ids``:
    the caller hands ``table`` over (the CLI): its block ids (CSR, ~200 bytes a Mooncake
    request) are dropped (:meth:`kvsim.ingest.requests.RequestTable.release_block_ids`) as
    soon as the run needs them no more -- after the prompt-block facts when no router
    reads the prompts (one replica, no warm-up) -- so the run does not hold them (issue
    38, "Memory"); the results are the same."""
    from kvsim.modes.closed import shared_tier
    from kvsim.modes.closed.closed_loop import closed_engine
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.driver import _describe
    from kvsim.replay.precompile import split_closed_compile

    config = shared_tier.config_for(config or SimConfig())
    opts = engine or EngineOptions()
    if replicas < 1:
        raise KvsimInputError(f"expected --replicas >= 1, got {replicas}", None, None,
                              "--replicas")
    if router not in ROUTERS:
        raise KvsimInputError(f"expected --router {' | '.join(ROUTERS)}, got {router!r}",
                              None, None, "--router")
    opts, _why = resolve_scheduler(table, config, opts)  # auto: vllm unless unsupported
    from kvsim.modes.closed import hybrid_check

    if hybrid_check.wanted(config, opts):  # several layer groups: vLLM's per-group pool
        hybrid_check.check_supported(table, policy, config, opts, replicas, pd, decision_log)
        from kvsim.modes.closed import hybrid_serve

        return hybrid_serve.serve_hybrid_trace(table, config, opts, on_progress=on_progress)
    pol = resolve_policy(policy)
    offered = table
    cost, hbm_blocks, costs, block_bytes, off, ids, table, dropped = \
        prepare(table, config, opts)
    missed = _dropped_prompts(offered, table, opts.block_size_tokens) if dropped else None
    if release_block_ids and offered is not table:  # the kept rows' ids are table's own
        offered.release_block_ids()
    del offered
    costs = shared_tier.network_costs(config, costs)  # the shared tier behind the network
    cfg_dict = _describe(config, costs, block_bytes)
    cfg_dict.update(schedule="closed", scheduler=opts.scheduler, replicas=replicas,
                    router=router,
                    max_num_seqs=opts.max_num_seqs,
                    max_num_batched_tokens=opts.max_num_batched_tokens,
                    block_size_tokens=opts.block_size_tokens,
                    timing_model=cost.timing_model, timing_profile=cost.timing.profile)
    # a cold compiled closed loop: core.run compiles in a worker meanwhile (2+ cores)
    engine_name = closed_engine(config, pol, _events(table, opts.block_size_tokens),
                                opts.scheduler)
    # the interpreted engine: the set-up's passes as Python while cold (setup_func)
    python = engine_name != "compiled"
    with split_closed_compile(engine_name, opts.scheduler):
        if pd is not None:
            from kvsim.modes.closed.disagg_serve import serve_pd

            if decision_log is not None:
                raise KvsimInputError("--decision-log with --pd is not supported", None,
                                      None, "--pd")
            cfg_dict.update(replicas=pd.prefill + pd.decode)
            return serve_pd(table, pol, config, pd, router, opts, cost, hbm_blocks, costs,
                            block_bytes, off, ids, dropped, cfg_dict, on_progress,
                            python=python)
        del off, ids  # _serve reads them from the table (and may release them)
        return _serve(table, pol, config, replicas, router, opts, decision_log, cost,
                      hbm_blocks, costs, block_bytes, dropped, cfg_dict,
                      on_progress, missed, step_table, release_block_ids=release_block_ids,
                      python=python)


def _dropped_prompts(offered: RequestTable, kept: RequestTable, B: int) -> np.ndarray:
    """(arrival_us, prompt tokens, prompt blocks) of the requests :func:`prepare` dropped
    (larger than HBM): the hit rates count their prompts as looked up and missed
    (docs/simulate.md, "Metrics: hit rates")."""
    key = ("arrival_us", "prompt_tokens", "output_tokens")
    a = np.stack([np.asarray(offered.column(c), dtype=np.int64) for c in key], axis=1)
    k = np.stack([np.asarray(kept.column(c), dtype=np.int64) for c in key], axis=1)
    # an offered row is gone when no kept row has its (arrival, prompt, output)
    _u, inv = np.unique(np.concatenate([a, k]), axis=0, return_inverse=True)
    inv = inv.ravel()
    gone = ~np.isin(inv[:len(a)], inv[len(a):])
    prompt = a[gone, 1]
    return np.stack([a[gone, 0], prompt, (prompt + B - 1) // B])


def _serve(table, *args, release_block_ids: bool = False, **kw):
    """:func:`serve` after its set-up: build the engines, run them, summarise.  The run's
    per-request arrays (the block facts, vLLM's request constants, the slot map, hit
    tokens, the queue of one replica, and the columns and block ids of a table handed
    over) are made in one :class:`kvsim.core.row_store.RowStore`, whose pages below the
    oldest request the run still reads are given back as it goes (issue 38, "Memory")."""
    store = row_store.RowStore()
    if release_block_ids:  # the caller's table is ours: its columns into the store
        table.hold_in(store)
    with row_store.active(store):
        return _serve_rows(store, table, *args, release_block_ids=release_block_ids, **kw)


def _serve_rows(store, table, pol, config, replicas, router, opts, decision_log, cost,
                hbm_blocks, costs, block_bytes, dropped, cfg_dict, on_progress, missed=None,
                step_table: bool = True, release_block_ids: bool = False,
                python: bool = False):
    """:func:`_serve` in its row store (current); ``python``: the set-up's passes for the
    interpreted engine (:func:`kvsim.jit.disk_cache.setup_func`)."""
    from kvsim.modes.closed.closed_facts import PromptHashes, block_facts
    from kvsim.modes.closed.serving_metrics import cluster_summary
    from kvsim.policy.registry import resolve_tier_policy
    from kvsim.replay.driver import SimResult
    from kvsim.results.decision_log import DecisionLogWriter

    N = len(table)
    warmup = config.warmup_count(N)
    off, ids = table.flat_block_ids()
    writers = []
    engines = []
    hashes = vllm_hashes(table, off, ids, resolve_scheduler(table, config, opts)[0], python)
    # each set-up piece gives back the store's pages it wrote or read (the run maps back
    # what it reads): the set-up's peak is then its largest piece, not their sum
    store.release_all()
    for w in range(replicas):
        writer = None
        if decision_log is not None:
            from kvsim.replay.kernel import core
            from kvsim.spec.sim_config import LOWER_TIERS

            path = Path(decision_log)
            if replicas > 1:
                path = path.with_name(f"{path.stem}.replica{w}{path.suffix}")
            reasons = [pol.reasons] + [resolve_tier_policy(config.tier_policy(t),
                                                           t).reasons for t in LOWER_TIERS]
            writer = DecisionLogWriter(path, policy=pol.name, trace="requests",
                                       config={**cfg_dict, "replica": w},
                                       reasons_by_tier=reasons, why=core.WHY)
            writer.__enter__()
            writers.append(writer)
        # a router's queue (arrivals appended as they come) with replicas or a warm-up
        # (which starts at the first measured arrival); else every row preloaded
        routed = replicas > 1 or warmup > 0
        # (grown as requests are routed: Engine.grow_order)
        order = np.zeros(min(max(N, 1), ORDER_FIRST), dtype=np.int64) if routed else None
        engines.append(Engine(table, off, ids, pol, config, opts, cost, hbm_blocks, costs,
                              block_bytes, writer, order=order, replica=w, hashes=hashes,
                              step_table=step_table))
        store.release_all()
    from kvsim.modes.closed import shared_tier

    if routed:
        _share_per_request(engines)
    if shared_tier.enabled(config):
        shared_tier.share(engines)  # one store: every replica's lower tiers are replica 0's
    # after the engines: building one typed core.run, so a cold compile of it has started
    # next_use only for a policy that reads the future (the core reads it for no other)
    facts_pb = block_facts(table, off, ids, opts.block_size_tokens, next_use=pol.offline,
                           python=python)
    for e in engines:
        e.set_block_facts(facts_pb)
    if not routed:  # no router reads the prompts: the block ids are read no more
        del off, ids
        if release_block_ids:
            table.release_block_ids(UNREAD_IN_RUN)
    store.release_all()  # what the set-up wrote: the run maps back the rows it reads
    try:
        if not routed:
            e = engines[0]

            def tick():  # every YIELD_STEPS steps
                store.release_below(e.oldest_unfinished())
                if on_progress is not None:
                    on_progress(int(e.sched.st[S.S_DONE]), N)

            e.advance(-1.0, closed_loop.YIELD_STEPS, on_yield=tick)
        else:
            _run_cluster(table, engines, router, opts.block_size_tokens,
                         PromptHashes(table, off, ids, opts.block_size_tokens, python),
                         warmup, on_progress, on_release=lambda i: store.release_below(
                             min(i, *(x.oldest_unfinished() for x in engines))))
        for e in engines:
            e.finish()
        store.release_below(N)  # the summary reads what it needs again
    except BaseException as exc:
        for wr in writers:
            wr.__exit__(type(exc), exc, exc.__traceback__)
        raise
    for wr in writers:
        wr.__exit__(None, None, None)
    start_us = float(table.column("arrival_us")[warmup]) if warmup > 0 else 0.0
    summary, requests, steps = cluster_summary(pol, engines, costs, N, router, dropped,
                                               warmup, start_us, lazy=True)
    if missed is not None:  # dropped requests arriving in the measured window: misses
        from kvsim.modes.closed.serving_metrics import count_dropped_as_misses

        inside = missed[:, missed[0] >= start_us] if warmup > 0 else missed
        count_dropped_as_misses(summary, int(inside[1].sum()), int(inside[2].sum()))
    summary["timing_model"] = cost.timing_model  # which step-time model timed the steps
    summary["scheduler"] = opts.scheduler  # who decided the steps: vllm or kvsim
    if config.tenant_metrics:
        from kvsim.results.tenant_view import tenant_table

        summary["tenant_rows"] = tenant_table(requests.frame(), warmup).to_dict("records")
    from kvsim.replay.link_metrics import link_summary  # --link-model queue only

    summary.update(link_summary([e.run for e in engines], [e.clock_us for e in engines],
                                measured=np.arange(warmup, N) if warmup > 0 else None,
                                names=("shared", "cxl", "nvme") if shared_tier.enabled(config)
                                else ("dram", "cxl", "nvme")))
    if shared_tier.enabled(config):
        summary.update(shared_tier.shared_keys(summary, engines, warmup))
    return SimResult(pol.name, bool(pol.offline), summary, requests, steps, cfg_dict,
                     "requests", costs, {})


def _share_per_request(engines: list[Engine]) -> None:
    """A routed request runs on one replica only, so the per-request arrays a replica
    reads and writes only at its own requests' ids are one array for all the replicas
    (8 bytes a request each, not 8 per replica; issue 38): the tokens the scheduler
    assumed cached at admission (``hitk``) and the request -> row map (``smap``, all -1
    until a replica gives a request a row and again once it frees it).  Not where the
    row map is the identity (a decision log with a shared lower tier: every id a row),
    nor where kvsim's scheduler gives samples / beams slots past the requests' (each
    replica numbers its own from N up: the same slot, another request)."""
    e0 = engines[0]
    if any(len(e.sched.src) > e.N + 1 for e in engines):  # forked / pruned slots
        return
    for e in engines[1:]:
        if e.sched.hitk.shape == e0.sched.hitk.shape:
            e.sched.hitk = e0.sched.hitk
        if e.slots.smap.shape == e0.slots.smap.shape and not (e.slots.identity
                                                                or e0.slots.identity):
            e.slots.smap = e0.slots.smap
        e._args = None  # the engine's arguments made again with the shared arrays


def compare_requests(table: RequestTable, policies=None, config: SimConfig | None = None, *,
                     replicas: int = 1, router: str = "round_robin",
                     engine: EngineOptions | None = None, jobs: int = 1,
                     on_progress: Callable[[str], None] | None = None,
                     on_work: Callable[[int, int], None] | None = None,
                     pd_options=None):
    """:func:`serve` under each policy (belady added as the offline bound when
    available); one row per policy with the summary keys, plus
    ``gap_hbm_hit_rate_to_belady``, ``gap_ttft_p99_us_to_belady`` and, when lru is listed,
    ``ttft_p50_us_vs_lru`` / ``ttft_p99_us_vs_lru`` (this policy's minus lru's)."""
    from kvsim.modes.comparison import WorkMeter, default_policies
    from kvsim.policy.registry import resolve_policy

    names = list(policies) if policies else default_policies()
    for n in names:
        resolve_policy(n)
    run_names = list(names)
    bound = "belady"
    if bound not in run_names:
        try:
            resolve_policy(bound)
            run_names.append(bound)
        except KvsimInputError:
            bound = None
    config = config or SimConfig()
    opts = engine or EngineOptions()
    if opts.hybrid_pool == "auto":  # a comparison of policies: every layer alike
        opts = dataclasses.replace(opts, hybrid_pool="off")
    engine, _why = resolve_scheduler(table, config, opts)  # once, for every policy
    from kvsim.replay.precompile import compare_engine, needs_split, replay_jobs

    # auto: one engine for every policy (kvsim.replay.precompile.compare_engine), closed loop
    rows = _events(table, opts.block_size_tokens)
    chosen = compare_engine(config.engine, rows, len(run_names), closed=engine.scheduler)
    jobs = replay_jobs(config.engine, chosen, jobs)  # a cold small run: every core
    config = dataclasses.replace(config, engine=chosen)
    split, first, cold = needs_split(config.engine, engine.scheduler, run_names)
    args = (table, config, replicas, router, engine, pd_options)
    results: dict[str, dict] = {}
    todo = list(run_names)
    meter = WorkMeter(len(table), len(run_names), on_work)  # requests served
    if split:
        # a cold compile: the core compiles here (first policy) while forked workers
        # compile the other policies' hooks (kvsim.replay.precompile)
        from kvsim.replay.precompile import compile_workers, first_then_hooks

        results[first] = first_then_hooks(_serve_summary, (first, *args, meter.partial), cold,
                                          compile_workers(jobs), closed=True, done=results)
        for n in [first, *(n for n in todo if n in results and n != first)]:
            if on_progress:
                on_progress(n)
            meter.finish()
            todo.remove(n)
        # the replays after a cold compile use its processes (compile_workers)
        jobs = compile_workers(jobs)
    if jobs > 1 and len(todo) > 1:
        from kvsim.core.workers import process_pool

        # no more workers than policies (--jobs 100000 forked 100,000 processes)
        with process_pool(min(jobs, len(todo))) as ex:  # die with this process
            futures = {n: ex.submit(_serve_summary, n, *args) for n in todo}
            for n in todo:
                results[n] = futures[n].result()
                if on_progress:
                    on_progress(n)
                meter.finish()
    else:
        for n in todo:
            results[n] = _serve_summary(n, *args, on_progress=meter.partial)
            if on_progress:
                on_progress(n)
            meter.finish()
    ref = results.get(bound) if bound else None
    base = results.get("lru")
    nan = float("nan")
    rows = []
    for n in names + [n for n in run_names if n not in names]:  # belady's row shown too
        row = dict(results[n])
        row["ttft_p50_us_vs_lru"] = row["ttft_p50_us"] - base["ttft_p50_us"] if base else nan
        row["ttft_p99_us_vs_lru"] = row["ttft_p99_us"] - base["ttft_p99_us"] if base else nan
        row["gap_hbm_hit_rate_to_belady"] = (ref["hbm_hit_rate"] - row["hbm_hit_rate"]
                                             if ref else nan)
        row["gap_ttft_p99_us_to_belady"] = (row["ttft_p99_us"] - ref["ttft_p99_us"]
                                            if ref else nan)
        rows.append(row)
    import pandas

    from kvsim.results.compare_view import label_bounds

    return label_bounds(pandas.DataFrame(rows), "closed")  # no bound in the closed loop


def _serve_summary(name, table, config, replicas, router, engine, pd_options=None,
                   on_progress: Callable[[int, int], None] | None = None) -> dict:
    s = dict(serve(table, name, config, replicas=replicas, router=router,
                   engine=engine, on_progress=on_progress, pd=pd_options,
                   step_table=False).summary)  # the summary only
    s.pop("replica_rows", None)
    return s
