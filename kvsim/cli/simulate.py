"""``kvsim simulate`` and ``kvsim compare`` (API: :func:`kvsim.api.simulate`,
:func:`kvsim.api.compare`).  How to read the output: docs/simulate.md."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli import app
from kvsim.cli.closed_opts import (
    BlockSizeOpt,
    DropOverContextOpt,
    FormatOpt,
    HybridPoolOpt,
    LinkModelOpt,
    MaxSeqsOpt,
    MaxTokensOpt,
    PdLinkGbpsOpt,
    PdLinkLatencyOpt,
    PdMaxInflightOpt,
    PdOpt,
    ReplicasOpt,
    RequestTraceOpt,
    RouterOpt,
    SaltByTenantOpt,
    ScheduleOpt,
    SchedulerOpt,
    SharedLinkGbpsOpt,
    SharedLinkLatencyOpt,
    SharedTierGbOpt,
    SharedTierPolicyOpt,
    SpecLookaheadOpt,
    SpecMethodOpt,
    TimingOpt,
    TraceBlockSizeOpt,
    check_event_file_options,
    check_is_event_file,
    check_scheduler,
    check_timing,
    cluster_memory,
    engine_options,
    lower_for,
    parse_replicas,
    pd_options,
    request_table,
    resolve_schedule,
    single_replica,
    timing_name,
)
from kvsim.cli.common import (
    JsonOption,
    check_outputs,
    comma_names,
    emit_json,
    progress,
    quiet_progress,
)
from kvsim.cli.render import (
    print_groups,
    print_pd,
    print_replicas,
    render_results,
    run_title,
    source_label,
)
from kvsim.cli.simulate_opts import (
    CacheVariantOpt,
    ColumnsOpt,
    CsvOpt,
    CxlMbOpt,
    CxlOpt,
    DramMbOpt,
    DramOpt,
    EngineOpt,
    HardwareOpt,
    HbmBlocksOpt,
    HbmGbOpt,
    HbmMbOpt,
    LifecycleOpt,
    LiveOffloadOpt,
    ModelOpt,
    ModeOpt,
    NoPrefetchOpt,
    NvmeMbOpt,
    NvmeOpt,
    ParquetOpt,
    PolicyFileOpt,
    PreemptionOpt,
    PrioritySchedOpt,
    ProfileOpt,
    RequestsOpt,
    SeedOpt,
    SortOpt,
    TenantQuotaOpt,
    TenantsOpt,
    TierPolicyOpt,
    TraceOpt,
    WarmupOpt,
    WarmupRequestsOpt,
    WideOpt,
    WritePolicyOpt,
    load_policy_files,
    policies_to_run,
    profile_requests,
    sim_config,
    split_tenant_rows,
    tenant_view,
    with_policy_files,
    with_tenants,
    write_rows,
)
from kvsim.cli.sizing import print_warnings, run_warnings, size_table
from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import atomic_output


@app.command("simulate", short_help="Replay an event file under one placement policy "
             "through HBM/DRAM/CXL/NVMe and report latency, hit rates and traffic.")
def simulate_command(
    trace: TraceOpt = None,
    profile: ProfileOpt = None,
    requests: RequestsOpt = None,
    policy: Annotated[str, typer.Option(
        "--policy", metavar="NAME|FILE.py",
        help="HBM placement policy: a registered name (see `kvsim compare --help`) or a "
             "policy file.")] = "lru",
    hardware: HardwareOpt = "h100-sxm",
    hbm_gb: HbmGbOpt = None,
    hbm_blocks: HbmBlocksOpt = None,
    dram_gb: DramOpt = None,
    cxl_gb: CxlOpt = None,
    nvme_gb: NvmeOpt = None,
    hbm_mb: HbmMbOpt = None,
    dram_mb: DramMbOpt = None,
    cxl_mb: CxlMbOpt = None,
    nvme_mb: NvmeMbOpt = None,
    model: ModelOpt = None,
    tier_policy: TierPolicyOpt = None,
    write_policy: WritePolicyOpt = "write_back",
    preemption: PreemptionOpt = "recompute",
    priority_scheduling: PrioritySchedOpt = False,
    no_prefetch: NoPrefetchOpt = False,
    warmup_fraction: WarmupOpt = 0.0,
    warmup_requests: WarmupRequestsOpt = None,
    mode: ModeOpt = "engine",
    cache_variant: CacheVariantOpt = "prefix",
    live_offload: LiveOffloadOpt = False,
    policy_file: PolicyFileOpt = None,
    decision_log: Annotated[Path | None, typer.Option(
        "--decision-log", metavar="PATH",
        help="Write every eviction, spill, promotion, prefetch, recompute and preemption "
             "with its reason and the competing candidates to this Parquet file "
             "(read it with `kvsim log ...`).", show_default=False)] = None,
    log_lifecycle: LifecycleOpt = False,
    requests_out: Annotated[Path | None, typer.Option(
        "--requests-out", metavar="PATH",
        help="Write the per-request table (TTFT, TPOT, hits, misses) as Parquet.",
        show_default=False)] = None,
    csv: CsvOpt = None,
    parquet: ParquetOpt = None,
    seed: SeedOpt = 0,
    engine: EngineOpt = "auto",
    columns: ColumnsOpt = None,
    wide: WideOpt = False,
    sort: SortOpt = None,
    request_trace: RequestTraceOpt = None,
    fmt: FormatOpt = None,
    trace_block_size: TraceBlockSizeOpt = None,
    salt_by_tenant: SaltByTenantOpt = False,
    schedule: ScheduleOpt = None,
    replicas: ReplicasOpt = "1",
    router: RouterOpt = None,
    link_model: LinkModelOpt = "none",
    shared_tier_gb: SharedTierGbOpt = None,
    shared_tier_policy: SharedTierPolicyOpt = "lru",
    shared_link_gbps: SharedLinkGbpsOpt = 100.0,
    shared_link_latency_us: SharedLinkLatencyOpt = 10.0,
    drop_over_context: DropOverContextOpt = False,
    block_size: BlockSizeOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    max_num_batched_tokens: MaxTokensOpt = None,
    timing: TimingOpt = None,
    scheduler: SchedulerOpt = "auto",
    spec_lookahead: SpecLookaheadOpt = False, spec_method: SpecMethodOpt = "none",
    hybrid_pool: HybridPoolOpt = "auto",
    pd_split: PdOpt = None, pd_link_gbps: PdLinkGbpsOpt = 100.0, pd_link_latency_us:
    PdLinkLatencyOpt = 10.0, pd_max_inflight: PdMaxInflightOpt = 0,
    json_: JsonOption = False,
) -> None:
    """Replay TRACE through HBM (vLLM-exact prefix caching) and the DRAM/CXL/NVMe tiers of
    a hardware profile under one HBM placement policy; print step-latency percentiles,
    TTFT/TPOT, deadline and decode-critical misses, hit rates per tier, bytes per link,
    recomputation, evictions, spills, prefetches and peak use.  Metrics: docs/simulate.md;
    formulas: docs/cost-model.md."""
    from kvsim.core.parsed_cache import digest_ahead

    for path in (trace, request_trace):  # hashed while the engine is imported
        if path is not None:
            digest_ahead(path)
    from kvsim.api import simulate

    if (trace is not None) + (profile is not None) + (request_trace is not None) != 1:
        raise KvsimInputError("expected exactly one of --trace EVENTS, --profile NAME or "
                              "--request-trace FILE", None, None, "--trace")
    requests = profile_requests(requests, profile)
    if trace_block_size is not None and request_trace is None:
        raise KvsimInputError("expected --trace-block-size only with --request-trace (the "
                              "block size of its block ids)", None, None, "--trace-block-size")
    block_size, max_num_seqs, max_num_batched_tokens = engine_options(
        trace, block_size, max_num_seqs, max_num_batched_tokens)
    check_timing(trace, timing)
    check_outputs(("--decision-log", decision_log, "parquet"),
                  ("--requests-out", requests_out, "parquet"), ("--csv", csv, "csv"),
                  ("--parquet", parquet, "parquet"))
    load_policy_files(policy_file)
    config = sim_config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model,
                     tier_policy, write_policy, preemption, priority_scheduling, no_prefetch,
                     warmup_fraction, log_lifecycle, seed, engine, warmup_requests, mode,
                     cache_variant, (hbm_mb, dram_mb, cxl_mb, nvme_mb), live_offload)
    config = cluster_memory(config, link_model, shared_tier_gb, shared_tier_policy,
                            shared_link_gbps, shared_link_latency_us)
    sched = resolve_schedule(schedule, trace is None, config.mode, config.live_offload)
    check_scheduler(scheduler, sched)
    check_event_file_options(trace, replicas, router, spec_method, spec_lookahead,
                             salt_by_tenant=salt_by_tenant, drop_over_context=drop_over_context,
                             hybrid_pool=hybrid_pool != "auto")
    check_is_event_file(trace)
    pdo = pd_options(pd_split, pd_link_gbps, pd_link_latency_us, pd_max_inflight, replicas, sched)
    replicas = parse_replicas(replicas)
    label = source_label(trace, profile, requests, seed, request_trace)
    quiet = quiet_progress(json_)
    warnings: list[dict] = []
    span_us = None
    table = None
    with progress(quiet=quiet) as bar, \
            tempfile.TemporaryDirectory(prefix="kvsim-simulate-") as tmpdir:
        task = bar.add_task(f"replay {policy}", total=None,
                            unit="events" if trace is not None or sched == "recorded"
                            else "requests served")
        if trace is None:  # a Request table: served closed loop, or lowered first
            table, opts = request_table(profile, requests, seed, request_trace, fmt, model,
                                         block_size, max_num_seqs, max_num_batched_tokens,
                                         config, sched, timing,
                                         trace_block_size, salt_by_tenant, scheduler,
                                         spec_lookahead, spec_method, hybrid_pool)
            table, replicas, span_us = size_table(table, opts, config, replicas, sched,
                                             drop_over_context, warnings,
                                             strict=request_trace is not None)
            router = router or "round_robin"
            if sched == "closed":
                from kvsim.modes.closed.cluster import serve

                result = serve(table, policy, config, replicas=replicas, router=router,
                               engine=opts, decision_log=decision_log, pd=pdo,
                               step_table=False,  # printed: the summary (and requests)
                               release_block_ids=True,  # the table is read no more here
                               on_progress=lambda done, total: bar.update(
                                   task, completed=done, total=total))
            else:
                trace = lower_for(table, config, opts, Path(tmpdir))
        if sched == "recorded":
            single_replica(replicas)
            result = simulate(trace, policy, config, decision_log=decision_log,
                              on_progress=lambda done, total: bar.update(
                                  task, completed=done, total=total))
    replica_rows = result.summary.pop("replica_rows", None)
    warnings += run_warnings([dict(result.summary)], trace, span_us, config,
                             single_run=True)
    print_warnings(warnings)
    if csv is not None or parquet is not None or not json_:  # pandas only for these
        import pandas as pd
        df = pd.DataFrame([result.summary])
        write_rows(df, csv, parquet)
    if requests_out is not None:
        with atomic_output(requests_out) as tmp:
            result.requests.to_parquet(tmp, index=False)
    if json_:
        out = {"policies": [result.summary], "trace": label, "mode": config.mode,
               "config": result.config,
               "timing_model": None if table is None else timing_name(opts, config),
               "warnings": warnings}
        if replica_rows is not None:
            out["replicas"] = replica_rows
        emit_json(out)
        return
    render_results(df, run_title(label, result.summary, config, sched), columns, wide, sort,
                   with_verdict=False)
    if replica_rows is not None and len(replica_rows) > 1:
        print_replicas(replica_rows)
    if "pd" in result.summary:
        print_pd(result.summary)
    if "group_rows" in result.summary:  # the hybrid pool's layer groups
        print_groups(result.summary)


@app.command("compare", short_help="Replay the same trace under every policy (or a list) "
             "and print one table: who wins, by how much, and the gap to Belady's bound.")
def compare_command(
    trace: TraceOpt = None,
    profile: ProfileOpt = None,
    requests: RequestsOpt = None,
    policies: Annotated[str | None, typer.Option(
        "--policies", metavar="A,B,...",
        help="Policies to compare (default: every registered one).  The offline "
             "references are added and always shown: optimal (the bound: cache mode, and "
             "a recorded schedule without preemptions) and belady (engine mode and closed "
             "loop; an offline heuristic, not a bound).  docs/simulate.md, 'Bounds'.",
        show_default=False)] = None,
    hardware: HardwareOpt = "h100-sxm",
    hbm_gb: HbmGbOpt = None,
    hbm_blocks: HbmBlocksOpt = None,
    dram_gb: DramOpt = None,
    cxl_gb: CxlOpt = None,
    nvme_gb: NvmeOpt = None,
    hbm_mb: HbmMbOpt = None,
    dram_mb: DramMbOpt = None,
    cxl_mb: CxlMbOpt = None,
    nvme_mb: NvmeMbOpt = None,
    model: ModelOpt = None,
    tier_policy: TierPolicyOpt = None,
    write_policy: WritePolicyOpt = "write_back",
    preemption: PreemptionOpt = "recompute",
    priority_scheduling: PrioritySchedOpt = False,
    no_prefetch: NoPrefetchOpt = False,
    warmup_fraction: WarmupOpt = 0.0,
    warmup_requests: WarmupRequestsOpt = None,
    mode: ModeOpt = "engine",
    cache_variant: CacheVariantOpt = "prefix",
    live_offload: LiveOffloadOpt = False,
    policy_file: PolicyFileOpt = None,
    decision_log_dir: Annotated[Path | None, typer.Option(
        "--decision-log-dir", metavar="DIR",
        help="Write one decision log per policy, DIR/<policy>.parquet.",
        show_default=False)] = None,
    log_lifecycle: LifecycleOpt = False,
    jobs: Annotated[int, typer.Option(
        "--jobs", min=1, metavar="N", help="Policies replayed in parallel processes (a cold "
        "compile, and a small first run on the interpreted engine, use every core).")] = 1,
    csv: CsvOpt = None,
    parquet: ParquetOpt = None,
    seed: Annotated[int, typer.Option(
        "--seed", help="Seed for --profile generation and randomising policies.")] = 0,
    engine: EngineOpt = "auto",
    columns: ColumnsOpt = None,
    wide: WideOpt = False,
    sort: SortOpt = None,
    html: Annotated[Path | None, typer.Option(
        "--html", metavar="FILE", help="Also write a self-contained HTML report: per-policy "
        "bars, step-latency and TTFT CDFs, per-tier traffic (no network, no JavaScript; "
        "`kvsim report` draws it again from --parquet).", show_default=False)] = None,
    request_trace: RequestTraceOpt = None,
    fmt: FormatOpt = None,
    trace_block_size: TraceBlockSizeOpt = None,
    salt_by_tenant: SaltByTenantOpt = False,
    schedule: ScheduleOpt = None,
    replicas: ReplicasOpt = "1",
    router: RouterOpt = None,
    link_model: LinkModelOpt = "none",
    shared_tier_gb: SharedTierGbOpt = None,
    shared_tier_policy: SharedTierPolicyOpt = "lru",
    shared_link_gbps: SharedLinkGbpsOpt = 100.0,
    shared_link_latency_us: SharedLinkLatencyOpt = 10.0,
    drop_over_context: DropOverContextOpt = False,
    block_size: BlockSizeOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    max_num_batched_tokens: MaxTokensOpt = None,
    timing: TimingOpt = None,
    tenants: TenantsOpt = False,
    tenant_quota: TenantQuotaOpt = None,
    scheduler: SchedulerOpt = "auto",
    spec_lookahead: SpecLookaheadOpt = False, spec_method: SpecMethodOpt = "none",
    pd_split: PdOpt = None, pd_link_gbps: PdLinkGbpsOpt = 100.0, pd_link_latency_us:
    PdLinkLatencyOpt = 10.0, pd_max_inflight: PdMaxInflightOpt = 0,
    json_: JsonOption = False,
) -> None:
    """Replay one trace under several HBM placement policies (same tiers, same cost model)
    and print one table with policies as rows: step latency p50/p95/p99/p99.9, TTFT and
    TPOT, deadline and decode-critical misses, hit rate per tier, prefix hit rate, bytes
    per link, recompute tokens, evictions, spills, prefetches, peak use, and each policy's
    gap to belady (the offline bound, labelled).  The best online value per column is
    highlighted.  How to read it: docs/simulate.md."""
    from kvsim.modes.comparison import compare

    if (trace is not None) + (profile is not None) + (request_trace is not None) != 1:
        raise KvsimInputError("expected exactly one of --trace EVENTS, --profile NAME or "
                              "--request-trace FILE", None, None, "--trace")
    requests = profile_requests(requests, profile)
    if trace_block_size is not None and request_trace is None:
        raise KvsimInputError("expected --trace-block-size only with --request-trace (the "
                              "block size of its block ids)", None, None, "--trace-block-size")
    block_size, max_num_seqs, max_num_batched_tokens = engine_options(
        trace, block_size, max_num_seqs, max_num_batched_tokens)
    check_timing(trace, timing)
    check_outputs(("--decision-log-dir", decision_log_dir, "dir"), ("--csv", csv, "csv"),
                  ("--parquet", parquet, "parquet"))
    loaded = load_policy_files(policy_file)
    config = sim_config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model,
                     tier_policy, write_policy, preemption, priority_scheduling, no_prefetch,
                     warmup_fraction, log_lifecycle, seed, engine, warmup_requests, mode,
                     cache_variant, (hbm_mb, dram_mb, cxl_mb, nvme_mb), live_offload)
    config = with_tenants(config, tenants, tenant_quota)
    config = cluster_memory(config, link_model, shared_tier_gb, shared_tier_policy,
                            shared_link_gbps, shared_link_latency_us)
    names = comma_names("--policies", policies)
    names = with_policy_files(names, loaded)
    sched = resolve_schedule(schedule, trace is None, config.mode, config.live_offload)
    check_scheduler(scheduler, sched)
    check_event_file_options(trace, replicas, router, spec_method, spec_lookahead,
                             salt_by_tenant=salt_by_tenant, drop_over_context=drop_over_context)
    check_is_event_file(trace)
    pdo = pd_options(pd_split, pd_link_gbps, pd_link_latency_us, pd_max_inflight, replicas, sched)
    replicas = parse_replicas(replicas)
    quiet = quiet_progress(json_)
    warnings: list[dict] = []
    span_us = None
    with tempfile.TemporaryDirectory(prefix="kvsim-compare-") as tmpdir:
        source = trace
        table = None
        if trace is None:
            table, opts = request_table(profile, requests, seed, request_trace, fmt, model,
                                         block_size, max_num_seqs, max_num_batched_tokens,
                                         config, sched, timing,
                                         trace_block_size, salt_by_tenant, scheduler,
                                         spec_lookahead, spec_method, "off")  # compare: all alike
            table, replicas, span_us = size_table(table, opts, config, replicas, sched,
                                             drop_over_context, warnings,
                                             strict=request_trace is not None)
            router = router or "round_robin"
            if sched == "recorded":
                single_replica(replicas)
                source = lower_for(table, config, opts, Path(tmpdir))
        run = policies_to_run(names, config, sched)
        with progress(quiet=quiet) as bar:
            unit = "requests served" if sched == "closed" else "events"
            task = bar.add_task(f"{len(run)} policies ({', '.join(run[:1])} ...)", total=None,
                                unit=unit)

            finished: set[str] = set()

            def on_policy(name: str) -> None:
                # Policies finish out of order under --jobs and the compile split: name
                # the ones still to finish, not a position in the list.
                finished.add(name)
                left = [p for p in run if p not in finished]
                more = f", +{len(left) - 2}" if len(left) > 2 else ""
                bar.update(task, description=(
                    f"{len(run)} policies (to finish: {', '.join(left[:2])}{more})" if left
                    else f"{len(run)} policies"))

            def on_work(done: int, total: int) -> None:  # events (requests) of all replays
                bar.update(task, completed=done, total=total)

            if sched == "closed":
                from kvsim.modes.closed.cluster import compare_requests

                if decision_log_dir is not None:
                    raise KvsimInputError("expected kvsim simulate --decision-log for a "
                                          "closed-loop decision log (compare writes them "
                                          "only with --schedule recorded)", None, None,
                                          "--decision-log-dir")
                df = compare_requests(table, names, config, replicas=replicas, router=router,
                                      engine=opts, jobs=jobs, on_progress=on_policy,
                                      on_work=on_work, pd_options=pdo)
            else:
                df = compare(source, names, config, decision_log_dir=decision_log_dir,
                             jobs=jobs, on_progress=on_policy, on_work=on_work)
    df, tenant_rows = split_tenant_rows(df)
    write_rows(df, csv, parquet)
    warnings += run_warnings(df, trace, span_us, config)
    print_warnings(warnings)
    label = source_label(trace, profile, requests, seed, request_trace)
    label += (f", {replicas} replicas ({router})" if replicas > 1 and pdo is None else
              f", P/D {pd_split} ({router})" if pdo is not None else "")
    if html is not None:
        from kvsim.analysis.report_compare import build_compare_report

        build_compare_report(df, html, title=label)
    if json_:
        from kvsim.results.compare_view import verdict_info

        records = df.to_dict(orient="records")
        for rec, (_, trs) in zip(records, tenant_rows or []):
            rec["tenant_rows"] = trs
        emit_json({"policies": records, "trace": label,
                   "mode": config.mode, "config": config.to_dict(),
                   "timing_model": None if table is None else timing_name(opts, config),
                   "verdict": verdict_info(df), "warnings": warnings})
        return
    title = run_title(label, df.iloc[0].to_dict() if len(df) else None, config, sched)
    render_results(df, title, columns, wide, sort, with_verdict=True)
    if tenant_rows is not None:
        from kvsim.cli.render import print_view

        print_view(tenant_view(tenant_rows))
