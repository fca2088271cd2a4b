"""``kvsim simulate`` and ``kvsim compare`` (API: :func:`kvsim.api.simulate`,
:func:`kvsim.api.compare`).  How to read the output: docs/simulate.md."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvsim.cli import app, compat
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
    emit_json,
    progress,
    quiet_progress,
)
from kvsim.cli.render import live_verdict, print_groups, print_pd, print_replicas
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
    split_tenant_rows,
    tenant_view,
    with_tenants,
)
from kvsim.cli.sizing import print_warnings, run_warnings, size_table
from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import atomic_output

if TYPE_CHECKING:  # pandas: imported where a table is written or shown, not for --json
    import pandas as pd


def _config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model, tier_policy,
            write_policy, preemption, priority_scheduling, no_prefetch, warmup, log_lifecycle,
            seed, engine, warmup_requests=None, mode="engine", cache_variant="prefix",
            mb=(None, None, None, None), live_offload=False):
    from kvsim.spec.sim_config import SimConfig, parse_tier_policies

    hbm_gb, dram_gb, cxl_gb, nvme_gb = (
        compat.capacity_gb(gb, m, tier) for gb, m, tier in
        zip((hbm_gb, dram_gb, cxl_gb, nvme_gb), mb, ("hbm", "dram", "cxl", "nvme")))
    return SimConfig(hardware=hardware, hbm_gb=hbm_gb, hbm_blocks=hbm_blocks, dram_gb=dram_gb,
                     cxl_gb=cxl_gb, nvme_gb=nvme_gb, model=model,
                     tier_policies=parse_tier_policies(tier_policy), write_policy=write_policy,
                     preemption=preemption, priority_scheduling=priority_scheduling,
                     prefetch=not no_prefetch, warmup_fraction=warmup,
                     log_lifecycle=log_lifecycle, seed=seed, engine=engine,
                     warmup_requests=warmup_requests, mode=mode, cache_variant=cache_variant,
                     live_offload=live_offload)


def _load_policy_files(files) -> list[str]:
    """Load each ``--policy-file``; their policies' names, in order."""
    from kvsim.policy.registry import load_policy_file

    return [load_policy_file(f).name for f in files or ()]


def _with_policy_files(names: list[str] | None, loaded: list[str]) -> list[str] | None:
    """compare's policies: ``--policies`` (default: every built-in one) plus each
    ``--policy-file`` policy not already listed (a loaded file is meant to be compared)."""
    if not loaded:
        return names
    from kvsim.modes.comparison import default_policies

    base = list(names) if names else default_policies()
    return base + [n for n in dict.fromkeys(loaded) if n not in base]


#: Columns holding a list per row (latency quantiles): kept in JSON and Parquet, left out
#: of CSV (one value per cell).
_LIST_COLUMNS = ("step_latency_q_us", "ttft_q_us")


def _write_rows(df: pd.DataFrame, csv: Path | None, parquet: Path | None) -> None:
    if csv is not None:
        with atomic_output(csv) as tmp:
            df.drop(columns=[c for c in _LIST_COLUMNS if c in df.columns]).to_csv(
                tmp, index=False)
    if parquet is not None:
        with atomic_output(parquet) as tmp:
            df.to_parquet(tmp, index=False)


def _label(profile: str, requests: int, seed: int) -> str:
    """The ``trace`` of the JSON output for a generated workload."""
    return f"profile {profile} ({requests} requests, seed {seed})"


def _scope(row, config) -> str:
    """Title tail: which mode produced the table, and what it measured."""
    text = f"{int(row['requests']):,} requests"
    warm = row.get("warmup_requests") or 0
    if config.mode == "cache":
        return f"cache mode ({config.cache_variant} lookups, no timing), " + text + \
            (f" after {int(warm):,} warm-up" if warm else "")
    text += f", {int(row['steps']):,} steps"
    if getattr(config, "live_offload", False):
        text += ", live offload"
    return "engine mode, " + text + (f" after {int(warm):,} warm-up" if warm else "")


def _title(label: str, row: dict | None, config, sched: str) -> str:
    """The table's title: what was replayed, in which mode, on which schedule."""
    if row is None:
        return label
    return f"{label} — {_scope(row, config)}, {sched} schedule"


def _source_label(trace, profile, requests, seed, request_trace) -> str:
    """The ``trace`` of the JSON output: the event file, the profile, or the request trace."""
    if trace is not None:
        return str(trace)
    if profile is not None:
        return _label(profile, requests, seed)
    return str(request_trace)


def _policies_to_run(names: list[str] | None, config, sched: str = "recorded") -> list[str]:
    """What compare replays: the policies asked for (default: every installed one) plus
    the offline references it adds (the progress bar's real total): on a recorded
    schedule ``optimal`` always and ``belady`` in engine mode (kvsim.modes.comparison); closed
    loop, ``belady`` (kvsim.modes.closed.cluster.compare_requests)."""
    from kvsim.modes.comparison import default_policies
    from kvsim.policy.registry import list_policies

    run = list(names) if names else list(default_policies())
    if sched != "closed" and "optimal" not in run:
        run.append("optimal")
    if getattr(config, "live_offload", False):
        return run  # its bound is optimal (kvsim.bounds.live_optimal)
    if (sched == "closed" or config.mode != "cache") and "belady" not in run \
            and any(p.name == "belady" for p in list_policies()):
        run.append("belady")
    return run


def render_results(df: pd.DataFrame, title: str, columns: str | None, wide: bool,
                   sort: str | None, with_verdict: bool) -> None:
    """Print a results frame as a table that fits the terminal (kvsim.cli.render)."""
    from kvsim.cli import render

    live = "live_offload" in df.columns and bool(df["live_offload"].fillna(False).any())
    if live and columns is None and not wide:
        columns = ",".join(render.LIVE_DEFAULT_COLUMNS)
    cols = render.parse_columns(columns, wide)
    if columns is None and render.bound_name(df) is None:  # nothing to measure a gap to
        cols = [c for c in cols if c.key != "gap_to_bound"]
    table = render.metric_table(df, title, cols, sort=sort)
    items = [table]
    if with_verdict and live:
        items.append(live_verdict(df))
    elif with_verdict:
        items.append(render.verdict(df))
    render.print_view(*items, wide=wide)


@app.command("simulate", short_help="Replay an event file under one placement policy "
             "through HBM/DRAM/CXL/NVMe and report latency, hit rates and traffic.")
def simulate_command(
    trace: TraceOpt = None,
    profile: ProfileOpt = None,
    requests: RequestsOpt = 1024,
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
    from kvsim.api import simulate

    if (trace is not None) + (profile is not None) + (request_trace is not None) != 1:
        raise KvsimInputError("expected exactly one of --trace EVENTS, --profile NAME or "
                              "--request-trace FILE", None, None, "--trace")
    if trace_block_size is not None and request_trace is None:
        raise KvsimInputError("expected --trace-block-size only with --request-trace (the "
                              "block size of its block ids)", None, None, "--trace-block-size")
    block_size, max_num_seqs, max_num_batched_tokens = engine_options(
        trace, block_size, max_num_seqs, max_num_batched_tokens)
    check_timing(trace, timing)
    check_outputs(("--decision-log", decision_log, "parquet"),
                  ("--requests-out", requests_out, "parquet"), ("--csv", csv, "csv"),
                  ("--parquet", parquet, "parquet"))
    _load_policy_files(policy_file)
    config = _config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model,
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
    label = _source_label(trace, profile, requests, seed, request_trace)
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
    warnings += run_warnings([dict(result.summary)], trace, span_us, config)
    print_warnings(warnings)
    if csv is not None or parquet is not None or not json_:  # pandas only for these
        import pandas as pd
        df = pd.DataFrame([result.summary])
        _write_rows(df, csv, parquet)
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
    render_results(df, _title(label, result.summary, config, sched), columns, wide, sort,
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
    requests: RequestsOpt = 1024,
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
        "--jobs", min=1, metavar="N", help="Policies replayed in parallel processes.")] = 1,
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
    if trace_block_size is not None and request_trace is None:
        raise KvsimInputError("expected --trace-block-size only with --request-trace (the "
                              "block size of its block ids)", None, None, "--trace-block-size")
    block_size, max_num_seqs, max_num_batched_tokens = engine_options(
        trace, block_size, max_num_seqs, max_num_batched_tokens)
    check_timing(trace, timing)
    check_outputs(("--decision-log-dir", decision_log_dir, "dir"), ("--csv", csv, "csv"),
                  ("--parquet", parquet, "parquet"))
    loaded = _load_policy_files(policy_file)
    config = _config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model,
                     tier_policy, write_policy, preemption, priority_scheduling, no_prefetch,
                     warmup_fraction, log_lifecycle, seed, engine, warmup_requests, mode,
                     cache_variant, (hbm_mb, dram_mb, cxl_mb, nvme_mb), live_offload)
    config = with_tenants(config, tenants, tenant_quota)
    config = cluster_memory(config, link_model, shared_tier_gb, shared_tier_policy,
                            shared_link_gbps, shared_link_latency_us)
    names = [p.strip() for p in policies.split(",") if p.strip()] if policies else None
    names = _with_policy_files(names, loaded)
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
        run = _policies_to_run(names, config, sched)
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
    _write_rows(df, csv, parquet)
    warnings += run_warnings(df, trace, span_us, config)
    print_warnings(warnings)
    label = _source_label(trace, profile, requests, seed, request_trace)
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
    title = _title(label, df.iloc[0].to_dict() if len(df) else None, config, sched)
    render_results(df, title, columns, wide, sort, with_verdict=True)
    if tenant_rows is not None:
        from kvsim.cli.render import print_view

        print_view(tenant_view(tenant_rows))
