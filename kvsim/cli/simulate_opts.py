"""Options of ``kvsim simulate`` and ``kvsim compare``: the replay's configuration, its
outputs and the table's rendering, each with its help text (the closed loop's own options
are in :mod:`kvsim.cli.closed_opts`); the tenant options of ``kvsim compare`` and its
tenant table; the replay's configuration from those options, the policies compare runs and
the results' CSV / Parquet outputs (:func:`sim_config`, :func:`policies_to_run`,
:func:`write_rows`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli import compat
from kvsim.core.errors import KvsimInputError

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
         "write_through (copy down on first use), write_through_selective (on second use); "
         "vllm_offload: vLLM's native CPU offloading (prompt blocks copied to DRAM as they are "
         "computed, vLLM's request-ranked LRU, loaded on a hit; the closed loop with vLLM's "
         "scheduler, DRAM only; docs/memory-model.md).")]
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
    help="--mode cache only: prefix (a lookup stops at the first missing block, as "
         "kvcache-simulator counts hits), vllm (prefix with vLLM's rules: at most prompt - 1 "
         "tokens hit, an identified partial last block is never shared) or block (every "
         "resident block of the prompt counts, each block one access).")]
PolicyFileOpt = Annotated[list[Path] | None, typer.Option(
    "--policy-file", metavar="FILE.py",
    help="Load a user policy module (one Python file, see docs/policies.md); repeatable. "
         "Its NAME then works with --policy / --policies; `compare` replays it too "
         "(added to --policies, or to every built-in policy).", show_default=False)]
CsvOpt = Annotated[Path | None, typer.Option(
    "--csv", metavar="PATH", help="Also write the result rows as CSV.", show_default=False)]
ParquetOpt = Annotated[Path | None, typer.Option(
    "--parquet", metavar="PATH", help="Also write the result rows as Parquet.",
    show_default=False)]
LifecycleOpt = Annotated[bool, typer.Option(
    "--log-lifecycle", help="The decision log also records ALLOCATE / HIT / REVIVE / "
    "RELEASE / FREE rows (much larger).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for policies that randomise.")]
ProfileOpt = Annotated[str | None, typer.Option(
    "--profile", metavar="NAME|FILE.toml",
    help="Generate a synthetic workload from this profile first (instead of --trace); "
         "see `kvsim generate`.  It is lowered for this replay: same --hardware and "
         "--model, and the scheduler's KV budget is the HBM pool (--hbm-gb / "
         "--hbm-blocks), so a smaller HBM admits fewer requests at once as a real "
         "engine would.", show_default=False)]
#: Requests a profile generates when ``--requests`` is not given.
DEFAULT_PROFILE_REQUESTS = 1024
RequestsOpt = Annotated[int | None, typer.Option(
    "--requests", min=1, metavar="N", show_default=False,
    help=f"Requests to generate with --profile (default {DEFAULT_PROFILE_REQUESTS}); a "
         "trace's requests are the file's.")]


def profile_requests(requests: int | None, profile) -> int:
    """``--requests`` as the number of requests ``--profile`` generates; a one-line error
    when it is given with a trace, whose requests are the file's (it was ignored)."""
    if requests is not None and profile is None:
        raise KvsimInputError(f"expected --requests only with --profile (how many requests "
                              f"to generate): a trace's requests are the file's, and "
                              f"--requests {requests} would be ignored; to serve part of a "
                              "trace, cut the file (a request trace's first N lines)",
                              None, None, "--requests")
    return DEFAULT_PROFILE_REQUESTS if requests is None else int(requests)
HbmMbOpt = compat.mb_option("hbm")
DramMbOpt = compat.mb_option("dram")
CxlMbOpt = compat.mb_option("cxl")
NvmeMbOpt = compat.mb_option("nvme")
LiveOffloadOpt = Annotated[bool, typer.Option(
    "--live-offload", help="Live KV offload: HBM may hold fewer blocks than the running "
    "requests' contexts; their blocks are spilled to DRAM/CXL/NVMe and fetched back before "
    "the step that reads them (stalls, prefetch by the policy).  Recorded schedule only; "
    "docs/memory-model.md, 'Live offload'.")]
EngineOpt = Annotated[str, typer.Option(
    "--engine", metavar="ENGINE",
    help="auto (default: compiled when already compiled for these policies, cached on "
         "disk, or for traces of >= 1,000,000 events; else interpreted), "
         "compiled (numba; the first run per policy compiles, then it is cached on disk) or "
         "interpreted (same code run by Python: no compile, ~100x slower per event).")]


ColumnsOpt = Annotated[str | None, typer.Option(
    "--columns", metavar="A,B,...",
    help="Table columns, by --json key (e.g. hbm_hit_rate,ttft_p99_us,evictions), or "
         "'+a,+b' to add to the default set.  Derived: lower_tier_hit_rate, gap_to_bound, "
         "prefetch_detail, peak_blocks, p99_vs_lru, decode_critical_vs_lru.  The files "
         "(--json/--csv/--parquet) keep every metric.", show_default=False)]
WideOpt = Annotated[bool, typer.Option(
    "--wide", help="Every column, at the table's natural width (scroll, or `less -S`).")]
SortOpt = Annotated[str | None, typer.Option(
    "--sort", metavar="COLUMN",
    help="Sort rows by this column, best first ('-COLUMN' reverses).", show_default=False)]


# --- tenants: ``--tenant-quota`` (per-tenant quotas, enforced by the ``quota_lru`` policy) and
# ``--tenants`` (one row per policy and tenant: hit rate, TTFT p99, HBM evictions suffered and
# caused).  docs/policies.md, "Tenant quotas"; docs/simulate.md, "Per-tenant metrics".
TenantQuotaOpt = Annotated[list[str] | None, typer.Option(
    "--tenant-quota", metavar="TENANT:TIER:cap=N[,share=M][,high=H[,low=L]]",
    help="A tenant's quota in one tier, in blocks of that tier (repeat the option): cap = "
    "hard cap, share = guaranteed share, high/low = watermarks (past high, the tier's "
    "evictions take the tenant's blocks until it is down to low; low defaults to high).  "
    "Enforced by the quota_lru policy (as HBM policy, "
    "or --tier-policy dram=quota_lru); other policies ignore it.", show_default=False)]
TenantsOpt = Annotated[bool, typer.Option(
    "--tenants", help="Also print one row per policy and tenant: hit rate, TTFT p99, HBM "
    "evictions suffered and caused (--json: 'tenant_rows' in each policy's row).")]


def with_tenants(config, tenants: bool, quotas) -> object:
    """``config`` with the tenant options applied (unchanged when neither is given)."""
    from kvsim.spec.sim_config import parse_tenant_quotas

    q = parse_tenant_quotas(quotas)
    if not tenants and not q:
        return config
    return dataclasses.replace(config, tenant_metrics=bool(tenants), tenant_quotas=q)


def split_tenant_rows(df):
    """``df`` without its ``tenant_rows`` column (a list per policy), and that column as
    ``[(policy, rows), ...]``; None when the run made none."""
    if "tenant_rows" not in df.columns:
        return df, None
    rows = [(p, r if isinstance(r, list) else []) for p, r in zip(df["policy"],
                                                                  df["tenant_rows"])]
    return df.drop(columns=["tenant_rows"]), rows


def tenant_view(rows):
    """One row per policy and tenant (a rich Table)."""
    from rich import box
    from rich.table import Table

    t = Table(title="per tenant (evictions: HBM blocks; suffered = the tenant's blocks "
              "evicted, caused = evicted to make room for the tenant)", title_justify="left",
              box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, header_style="bold")
    for col in ("policy", "tenant", "requests", "hit rate", "HBM hit", "TTFT p99 ms",
                "evictions suffered", "evictions caused"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for policy, trs in rows:
        for r in trs:
            ttft = r["ttft_p99_us"]
            t.add_row(str(policy), str(r["tenant"]), f"{r['requests']:,}",
                      "-" if r["hit_rate"] != r["hit_rate"] else f"{100 * r['hit_rate']:.2f}%",
                      "-" if r["hbm_hit_rate"] != r["hbm_hit_rate"]
                      else f"{100 * r['hbm_hit_rate']:.2f}%",
                      "-" if ttft != ttft else f"{ttft / 1e3:,.2f}",
                      f"{r['evictions_suffered']:,}", f"{r['evictions_caused']:,}")
    return t


def sim_config(hardware, hbm_gb, hbm_blocks, dram_gb, cxl_gb, nvme_gb, model, tier_policy,
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


def load_policy_files(files) -> list[str]:
    """Load each ``--policy-file``; their policies' names, in order."""
    from kvsim.policy.registry import load_policy_file

    return [load_policy_file(f).name for f in files or ()]


def with_policy_files(names: list[str] | None, loaded: list[str]) -> list[str] | None:
    """compare's policies: ``--policies`` (default: every built-in one) plus each
    ``--policy-file`` policy not already listed (a loaded file is meant to be compared)."""
    if not loaded:
        return names
    from kvsim.modes.comparison import default_policies

    base = list(names) if names else default_policies()
    return base + [n for n in dict.fromkeys(loaded) if n not in base]


def policies_to_run(names: list[str] | None, config, sched: str = "recorded") -> list[str]:
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


#: Columns holding a list per row (latency quantiles): kept in JSON and Parquet, left out
#: of CSV (one value per cell).
_LIST_COLUMNS = ("step_latency_q_us", "ttft_q_us")


def write_rows(df, csv: Path | None, parquet: Path | None) -> None:
    """The results table as CSV (without the list columns) and / or Parquet."""
    from kvsim.core.fsutil import atomic_output

    if csv is not None:
        with atomic_output(csv) as tmp:
            df.drop(columns=[c for c in _LIST_COLUMNS if c in df.columns]).to_csv(
                tmp, index=False)
    if parquet is not None:
        with atomic_output(parquet) as tmp:
            df.to_parquet(tmp, index=False)
