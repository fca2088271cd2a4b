"""``kvsim simulate`` and ``kvsim compare`` (API: :func:`kvsim.sim.simulate`,
:func:`kvsim.sim.compare`).  How to read the output: docs/simulate.md."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from kvsim.cli import app
from kvsim.cli.closed_opts import (BlockSizeOpt, FormatOpt, MaxSeqsOpt, MaxTokensOpt,
                                   ReplicasOpt, RequestTraceOpt, RouterOpt, ScheduleOpt,
                                   load_table, resolve_schedule)
from kvsim.cli.common import JsonOption, emit_json, err_console, out_console, progress
from kvsim.errors import KvsimInputError
from kvsim.fsutil import atomic_output

TraceOpt = Annotated[Path | None, typer.Option(
    "--trace", metavar="EVENTS",
    help="Event file to replay (Parquet, or JSONL when named *.jsonl[.gz|.zst]); made by "
         "`kvsim import-request-trace` or `kvsim generate`.", show_default=False)]
HardwareOpt = Annotated[str, typer.Option(
    "--hardware", metavar="NAME|FILE.toml",
    help="Hardware profile: a bundled name (h100-sxm, h200, a100-80g, gh200, l40s, ...) or "
         "a profile TOML (e.g. a calibrated one).")]
HbmGbOpt = Annotated[float | None, typer.Option(
    "--hbm-gb", min=0, metavar="GB",
    help="HBM capacity for KV blocks in GB (1e9 bytes).  Default: GPU memory x 0.9 (vLLM's "
         "gpu_memory_utilization) - model weights.", show_default=False)]
HbmBlocksOpt = Annotated[int | None, typer.Option(
    "--hbm-blocks", min=1, metavar="N",
    help="Exact number of HBM KV blocks (overrides --hbm-gb).", show_default=False)]
DramOpt = Annotated[float | None, typer.Option(
    "--dram-gb", min=0, metavar="GB", help="DRAM tier capacity in GB; 0 disables the tier. "
    "Default: the hardware profile's.", show_default=False)]
CxlOpt = Annotated[float | None, typer.Option(
    "--cxl-gb", min=0, metavar="GB", help="CXL tier capacity in GB; 0 disables the tier. "
    "Default: the hardware profile's.", show_default=False)]
NvmeOpt = Annotated[float | None, typer.Option(
    "--nvme-gb", min=0, metavar="GB", help="NVMe tier capacity in GB; 0 disables the tier. "
    "Default: the hardware profile's.", show_default=False)]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", metavar="NAME", help="Model whose weights are subtracted from GPU memory "
    "(default: the trace header's model).", show_default=False)]
TierPolicyOpt = Annotated[str | None, typer.Option(
    "--tier-policy", metavar="TIER=POLICY[,...]",
    help="Eviction policy of each lower tier, e.g. 'dram=lru,cxl=s3fifo,nvme=fifo' "
         "(default lru everywhere).", show_default=False)]
WritePolicyOpt = Annotated[str, typer.Option(
    "--write-policy", metavar="POLICY",
    help="Host-write policy (SGLang HiCache): write_back (copy down when evicted from HBM), "
         "write_through (copy down on first use), write_through_selective (on second use).")]
PreemptionOpt = Annotated[str, typer.Option(
    "--preemption", metavar="MODE",
    help="When HBM is full of blocks in use: recompute (vLLM v1: the victim's tokens are "
         "recomputed when it resumes) or swap (its blocks go to host memory and back).")]
PrioritySchedOpt = Annotated[bool, typer.Option(
    "--priority-scheduling", help="Preempt the lowest request_priority running request "
    "instead of the last admitted one (vLLM priority scheduling).")]
NoPrefetchOpt = Annotated[bool, typer.Option(
    "--no-prefetch", help="Never hide lower-tier promotions behind queueing time (every "
    "promotion stalls the step).")]
WarmupOpt = Annotated[float, typer.Option(
    "--warmup-fraction", min=0.0, max=0.99, metavar="F",
    help="Warm-up: exclude the first floor(F x requests) requests, counted in arrival "
         "order, from the metrics (step counters from the step the first measured request "
         "arrives in).")]
WarmupRequestsOpt = Annotated[int | None, typer.Option(
    "--warmup-requests", min=0, metavar="N",
    help="Warm-up as an absolute count: the first N requests in arrival order (instead of "
         "--warmup-fraction).", show_default=False)]
ModeOpt = Annotated[str, typer.Option(
    "--mode", metavar="MODE",
    help="engine (default: the scheduled replay, continuous batching and latencies) or "
         "cache (requests one at a time in arrival order, lookup then insert, no timing: "
         "the hit-rate semantics of the Mooncake paper and kvcache-simulator).")]
CacheVariantOpt = Annotated[str, typer.Option(
    "--cache-variant", metavar="VARIANT",
    help="--mode cache only: prefix (a lookup stops at the first missing block, as vLLM "
         "and kvcache-simulator count hits) or block (every resident block of the prompt "
         "counts, each block one access).")]
PolicyFileOpt = Annotated[list[Path] | None, typer.Option(
    "--policy-file", metavar="FILE.py",
    help="Load a user policy module (one Python file, see docs/policies.md); repeatable. "
         "Its NAME then works with --policy / --policies.", show_default=False)]
CsvOpt = Annotated[Path | None, typer.Option(
    "--csv", metavar="PATH", help="Also write the result rows as CSV.", show_default=False)]
ParquetOpt = Annotated[Path | None, typer.Option(
    "--parquet", metavar="PATH", help="Also write the result rows as Parquet.",
    show_default=False)]
LifecycleOpt = Annotated[bool, typer.Option(
    "--log-lifecycle", help="The decision log also records ALLOCATE / HIT / REVIVE / "
    "RELEASE / FREE rows (much larger).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for policies that randomise.")]
EngineOpt = Annotated[str, typer.Option(
    "--engine", metavar="ENGINE",
    help="auto (default: compiled for traces of >= 1,000,000 events, else interpreted), "
         "compiled (numba; the first run per policy compiles, then it is cached on disk) or "
         "interpreted (same code run by Python: no compile, ~100x slower per event).")]


def _config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model, tier_policy,
            write_policy, preemption, priority_scheduling, no_prefetch, warmup, log_lifecycle,
            seed, engine, warmup_requests=None, mode="engine", cache_variant="prefix"):
    from kvsim.sim import SimConfig
    from kvsim.sim.config import parse_tier_policies

    return SimConfig(hardware=hardware, hbm_gb=hbm_gb, hbm_blocks=hbm_blocks, dram_gb=dram_gb,
                     cxl_gb=cxl_gb, nvme_gb=nvme_gb, model=model,
                     tier_policies=parse_tier_policies(tier_policy), write_policy=write_policy,
                     preemption=preemption, priority_scheduling=priority_scheduling,
                     prefetch=not no_prefetch, warmup_fraction=warmup,
                     log_lifecycle=log_lifecycle, seed=seed, engine=engine,
                     warmup_requests=warmup_requests, mode=mode, cache_variant=cache_variant)


def _load_policy_files(files) -> None:
    from kvsim.policy_registry import load_policy_file

    for f in files or ():
        load_policy_file(f)


def _write_rows(df: pd.DataFrame, csv: Path | None, parquet: Path | None) -> None:
    if csv is not None:
        with atomic_output(csv) as tmp:
            df.to_csv(tmp, index=False)
    if parquet is not None:
        with atomic_output(parquet) as tmp:
            df.to_parquet(tmp, index=False)


# (key, header, format, better: "min" | "max" | None)
_COLUMNS = (
    ("p50_step_us", "step p50 us", "{:,.0f}", "min"),
    ("p95_step_us", "p95", "{:,.0f}", "min"),
    ("p99_step_us", "p99", "{:,.0f}", "min"),
    ("p999_step_us", "p99.9", "{:,.0f}", "min"),
    ("ttft_p50_us", "TTFT p50 ms", "ms", "min"),
    ("ttft_p90_us", "TTFT p90 ms", "ms", "min"),
    ("ttft_p99_us", "TTFT p99 ms", "ms", "min"),
    ("ttft_p99_us_vs_lru", "TTFT p99 vs lru ms", "ms", None),
    ("queue_p99_us", "queue p99 ms", "ms", "min"),
    ("throughput_tokens_per_s", "out tok/s", "{:,.0f}", "max"),
    ("slo_attainment", "SLO met", "pct", "max"),
    ("prefill_tokens_saved", "prefill tok saved", "{:,}", "max"),
    ("tpot_p50_us", "TPOT p50 ms", "ms", "min"),
    ("tpot_p99_us", "TPOT p99 ms", "ms", "min"),
    ("deadline_misses", "deadline misses", "{:,}", "min"),
    ("decode_critical_misses", "decode-crit misses", "{:,}", "min"),
    ("hbm_hit_rate", "HBM hit", "pct", "max"),
    ("dram_hit_rate", "DRAM hit", "pct", "max"),
    ("cxl_hit_rate", "CXL hit", "pct", "max"),
    ("nvme_hit_rate", "NVMe hit", "pct", "max"),
    ("prefix_hit_rate", "prefix hit", "pct", "max"),
    ("bytes_dram_link", "DRAM link GB", "gb", "min"),
    ("bytes_cxl_link", "CXL link GB", "gb", "min"),
    ("bytes_nvme_link", "NVMe link GB", "gb", "min"),
    ("recompute_tokens", "recompute tok", "{:,}", "min"),
    ("evictions", "evictions", "{:,}", None),
    ("spills", "spills", "{:,}", None),
    ("prefetches", "prefetch (useful/wasted)", "pf", None),
    ("peak_hbm_blocks", "peak HBM/DRAM/CXL/NVMe blocks", "peak", None),
    ("gap_hbm_hit_rate_to_belady", "HBM-hit gap to belady", "pp", "min"),
    ("gap_p99_step_us_to_belady", "p99 gap to belady us", "{:+,.0f}", "min"),
    ("p99_step_us_vs_lru", "p99 vs lru", "vs_lru", None),
    ("decode_critical_misses_vs_lru", "decode-crit misses vs lru", "dc_vs_lru", None),
)


def _fmt(row: dict, key: str, fmt: str) -> str:
    v = row.get(key)
    if fmt == "pf":
        return f"{row['prefetches']:,} ({row['prefetches_useful']:,}/{row['prefetches_wasted']:,})"
    if fmt == "peak":
        return "/".join(f"{row[f'peak_{t}_blocks']:,}" for t in ("hbm", "dram", "cxl", "nvme"))
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if fmt == "vs_lru":  # us and percent: a win of microseconds should look like one
        return f"{v:+,.1f} us ({row['p99_step_pct_vs_lru']:+.3f}%)"
    if fmt == "dc_vs_lru":
        base = row["decode_critical_misses"] - v
        pct = f" ({100 * v / base:+.0f}%)" if base else ""
        return f"{int(v):+,}{pct}"
    if fmt == "ms":
        return f"{v / 1000:,.2f}"
    if fmt == "pct":
        return f"{100 * v:.2f}%"
    if fmt == "pp":
        return f"{100 * v:+.2f} pp"
    if fmt == "gb":
        return f"{v / 1e9:,.2f}"
    return fmt.format(v)


def render_table(df: pd.DataFrame, title: str) -> Table:
    """Policies as rows; the best online value of each comparable column in bold green;
    offline policies (belady) labelled as bounds and never counted as winners."""
    rows = df.to_dict(orient="records")
    online = [r for r in rows if not r.get("offline")]
    best = {}
    for key, _, _, better in _COLUMNS:
        if better is None:
            continue
        vals = [r.get(key) for r in online
                if r.get(key) is not None and not (isinstance(r.get(key), float)
                                                   and math.isnan(r.get(key)))]
        if len(vals) >= 2 and min(vals) != max(vals):
            best[key] = min(vals) if better == "min" else max(vals)
    table = Table(title=title, header_style="bold")
    table.add_column("policy", no_wrap=True)
    for key, header, _, _ in _COLUMNS:
        if key in df.columns or key in ("prefetches", "peak_hbm_blocks"):
            table.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        name = r["policy"] + (" (offline bound)" if r.get("offline") else "")
        cells = [name]
        for key, _, fmt, _ in _COLUMNS:
            if not (key in df.columns or key in ("prefetches", "peak_hbm_blocks")):
                continue
            text = _fmt(r, key, fmt)
            if key in best and not r.get("offline") and r.get(key) == best[key]:
                text = f"[bold green]{text}[/]"
            cells.append(text)
        table.add_row(*cells)
    return table


def _scope(row, config) -> str:
    """Title tail: which mode produced the table, and what it measured."""
    text = f"{int(row['requests']):,} requests"
    if config.mode == "cache":
        return f"cache mode ({config.cache_variant} lookups, no timing), " + text + \
            (f" after {int(row['warmup_requests']):,} warm-up" if row["warmup_requests"]
             else "")
    text += f", {int(row['steps']):,} steps"
    return "engine mode, " + text + (f" after {int(row['warmup_requests']):,} warm-up"
                                     if row["warmup_requests"] else "")


def _print_wide(table: Table) -> None:
    """Print at the table's natural width (wider than the terminal: scroll, or `less -S`),
    so no column is squeezed to nothing."""
    import sys

    from rich.console import Console

    Console(file=sys.stdout, width=1000, soft_wrap=True,
            force_terminal=out_console.is_terminal).print(table)


@app.command("simulate", short_help="Replay an event file under one placement policy "
             "through HBM/DRAM/CXL/NVMe and report latency, hit rates and traffic.")
def simulate_command(
    trace: TraceOpt = None,
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
    request_trace: RequestTraceOpt = None,
    fmt: FormatOpt = None,
    schedule: ScheduleOpt = None,
    replicas: ReplicasOpt = 1,
    router: RouterOpt = "round_robin",
    block_size: BlockSizeOpt = 16,
    max_num_seqs: MaxSeqsOpt = 256,
    max_num_batched_tokens: MaxTokensOpt = 8192,
    json_: JsonOption = False,
) -> None:
    """Replay TRACE through HBM (vLLM-exact prefix caching) and the DRAM/CXL/NVMe tiers of
    a hardware profile under one HBM placement policy; print step-latency percentiles,
    TTFT/TPOT, deadline and decode-critical misses, hit rates per tier, bytes per link,
    recomputation, evictions, spills, prefetches and peak use.  Metrics: docs/simulate.md;
    formulas: docs/cost-model.md."""
    from kvsim.sim import simulate

    if (trace is None) == (request_trace is None):
        raise KvsimInputError("expected exactly one of --trace EVENTS (an event file) or "
                              "--request-trace FILE", None, None, "--trace")
    _load_policy_files(policy_file)
    config = _config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model,
                     tier_policy, write_policy, preemption, priority_scheduling, no_prefetch,
                     warmup_fraction, log_lifecycle, seed, engine, warmup_requests, mode,
                     cache_variant)
    sched = resolve_schedule(schedule, request_trace is not None, config.mode)
    label = str(trace if trace is not None else request_trace)
    with progress() as bar, tempfile.TemporaryDirectory(prefix="kvsim-sim-") as tmpdir:
        task = bar.add_task(f"replay {policy}", total=None)
        if request_trace is not None:
            from kvsim.sim.closed_loop import EngineOptions

            table = load_table(None, 0, seed, request_trace, fmt)
            opts = EngineOptions(block_size_tokens=block_size, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 model=model or "llama-3-8b")
            if sched == "closed":
                from kvsim.sim.cluster import serve

                result = serve(table, policy, config, replicas=replicas, router=router,
                               engine=opts, decision_log=decision_log)
            else:
                trace = _lower_for(table, config, opts, Path(tmpdir))
        if sched == "recorded":
            _single_replica(replicas)
            result = simulate(trace, policy, config, decision_log=decision_log,
                              on_progress=lambda done, total: bar.update(
                                  task, completed=done, total=total))
    replica_rows = result.summary.pop("replica_rows", None)
    df = pd.DataFrame([result.summary])
    _write_rows(df, csv, parquet)
    if requests_out is not None:
        with atomic_output(requests_out) as tmp:
            result.requests.to_parquet(tmp, index=False)
    if json_:
        out = {"policies": [result.summary], "trace": label, "mode": config.mode,
               "config": result.config}
        if replica_rows is not None:
            out["replicas"] = replica_rows
        emit_json(out)
        return
    _print_wide(render_table(df, f"{label} — {_scope(result.summary, config)}, {sched} "
                                 "schedule"))
    if replica_rows is not None and len(replica_rows) > 1:
        _print_wide(render_replicas(replica_rows))


def render_replicas(rows: list[dict]) -> Table:
    """One row per replica (kvsim.sim.serving_metrics.REPLICA_KEYS)."""
    table = Table(title="replicas", header_style="bold")
    keys = list(rows[0])
    for k in keys:
        table.add_column(k, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*[f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" for v in r.values()])
    return table


def _single_replica(replicas: int) -> None:
    if replicas != 1:
        raise KvsimInputError("expected --replicas 1 with --schedule recorded (an event "
                              "file is one engine's steps)", None, None, "--replicas")


def _lower_for(table, config, opts, tmpdir: Path) -> Path:
    """Lower ``table`` for this replay (``--schedule recorded`` of a Request table)."""
    from kvsim.ingest.lower import lower_requests

    path = tmpdir / "lowered.parquet"
    lowering = config.lowering_options(opts.block_size_tokens, opts.model)
    lower_requests(table, path, max_num_seqs=opts.max_num_seqs,
                   max_num_batched_tokens=opts.max_num_batched_tokens, seed=config.seed,
                   **lowering)
    return path


@app.command("compare", short_help="Replay the same trace under every policy (or a list) "
             "and print one table: who wins, by how much, and the gap to Belady's bound.")
def compare_command(
    trace: TraceOpt = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="NAME|FILE.toml",
        help="Generate a synthetic workload from this profile first (instead of --trace); "
             "see `kvsim generate`.  It is lowered for this replay: same --hardware and "
             "--model, and the scheduler's KV budget is the HBM pool (--hbm-gb / "
             "--hbm-blocks), so a smaller HBM admits fewer requests at once as a real "
             "engine would.", show_default=False)] = None,
    requests: Annotated[int, typer.Option(
        "--requests", min=1, metavar="N", help="Requests to generate with --profile.")] = 1024,
    policies: Annotated[str | None, typer.Option(
        "--policies", metavar="A,B,...",
        help="Policies to compare (default: every registered one).  belady runs anyway as "
             "the offline bound for the gap columns.", show_default=False)] = None,
    hardware: HardwareOpt = "h100-sxm",
    hbm_gb: HbmGbOpt = None,
    hbm_blocks: HbmBlocksOpt = None,
    dram_gb: DramOpt = None,
    cxl_gb: CxlOpt = None,
    nvme_gb: NvmeOpt = None,
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
    request_trace: RequestTraceOpt = None,
    fmt: FormatOpt = None,
    schedule: ScheduleOpt = None,
    replicas: ReplicasOpt = 1,
    router: RouterOpt = "round_robin",
    block_size: BlockSizeOpt = 16,
    max_num_seqs: MaxSeqsOpt = 256,
    max_num_batched_tokens: MaxTokensOpt = 8192,
    json_: JsonOption = False,
) -> None:
    """Replay one trace under several HBM placement policies (same tiers, same cost model)
    and print one table with policies as rows: step latency p50/p95/p99/p99.9, TTFT and
    TPOT, deadline and decode-critical misses, hit rate per tier, prefix hit rate, bytes
    per link, recompute tokens, evictions, spills, prefetches, peak use, and each policy's
    gap to belady (the offline bound, labelled).  The best online value per column is
    highlighted.  How to read it: docs/simulate.md."""
    from kvsim.sim import compare

    if (trace is not None) + (profile is not None) + (request_trace is not None) != 1:
        raise KvsimInputError("expected exactly one of --trace EVENTS, --profile NAME or "
                              "--request-trace FILE", None, None, "--trace")
    _load_policy_files(policy_file)
    config = _config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model,
                     tier_policy, write_policy, preemption, priority_scheduling, no_prefetch,
                     warmup_fraction, log_lifecycle, seed, engine, warmup_requests, mode,
                     cache_variant)
    names = [p.strip() for p in policies.split(",") if p.strip()] if policies else None
    sched = resolve_schedule(schedule, trace is None, config.mode)
    with tempfile.TemporaryDirectory(prefix="kvsim-compare-") as tmpdir:
        source = trace
        table = None
        if trace is None:
            from kvsim.sim.closed_loop import EngineOptions

            table = load_table(profile, requests, seed, request_trace, fmt)
            opts = EngineOptions(block_size_tokens=block_size, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=max_num_batched_tokens,
                                 model=model or "llama-3-8b")
            budget = config.lowering_options(block_size, opts.model).get("num_gpu_blocks")
            err_console.print(f"{len(table):,} requests "
                              + (f"from profile {profile} (seed {seed})" if profile else
                                 f"from {request_trace}") + f", {sched} schedule"
                              + (f", scheduler budget {budget:,} blocks = the HBM pool"
                                 if budget else ""))
            if sched == "recorded":
                _single_replica(replicas)
                source = _lower_for(table, config, opts, Path(tmpdir))
        with progress() as bar:
            task = bar.add_task("policies", total=None)
            if sched == "closed":
                from kvsim.sim.cluster import compare_requests

                if decision_log_dir is not None:
                    raise KvsimInputError("expected kvsim simulate --decision-log for a "
                                          "closed-loop decision log (compare writes them "
                                          "only with --schedule recorded)", None, None,
                                          "--decision-log-dir")

                df = compare_requests(table, names, config, replicas=replicas, router=router,
                                      engine=opts, jobs=jobs,
                                      on_progress=lambda name: bar.advance(task))
            else:
                df = compare(source, names, config, decision_log_dir=decision_log_dir,
                             jobs=jobs, on_progress=lambda name: bar.advance(task))
    _write_rows(df, csv, parquet)
    label = str(trace) if trace is not None else (
        f"profile {profile} ({requests} requests, seed {seed})" if profile is not None
        else str(request_trace))
    label += f", {sched} schedule" + (f", {replicas} replicas ({router})" if replicas > 1
                                       else "")
    if json_:
        emit_json({"policies": df.to_dict(orient="records"), "trace": label,
                   "mode": config.mode, "config": config.to_dict()})
        return
    first = df.iloc[0] if len(df) else None
    title = label if first is None else f"{label} — {_scope(first, config)}"
    _print_wide(render_table(df, title))
