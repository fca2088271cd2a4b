"""``kvsim plan`` (API: :func:`kvsim.analysis.plan.run_plan`): the cheapest configuration
that serves a request trace within an SLO, its Pareto front and dollars per million
tokens (docs/plan.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvsim.cli import app
from kvsim.cli.closed_opts import (
    BlockSizeOpt,
    FormatOpt,
    MaxSeqsOpt,
    MaxTokensOpt,
    RequestTraceOpt,
    RouterOpt,
    TimingOpt,
    TraceBlockSizeOpt,
    load_table,
)
from kvsim.cli.common import (
    JsonOption,
    check_outputs,
    emit_json,
    err_console,
    progress,
    quiet_progress,
)
from kvsim.cli.simulate_opts import RequestsOpt, profile_requests
from kvsim.core.errors import KvsimInputError


def _list(text: str, option: str, kind=float) -> tuple:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(kind(part))
        except ValueError:
            raise KvsimInputError(f"expected a comma-separated list of {kind.__name__}s, "
                                  f"got {part!r}", None, None, option) from None
    if not out:
        raise KvsimInputError("expected at least one value", None, None, option)
    return tuple(out)


def _deadline_us(text: str | None, option: str) -> int | None:
    if text is None:
        return None
    from kvsim.analysis.plan import parse_slo

    try:
        return int(parse_slo(f"ttft_p99={text}").target) if text else None
    except KvsimInputError:  # its error names --slo: name this option
        raise KvsimInputError(f"expected a time > 0 with a unit (e.g. 2s, 100ms, 800000us), "
                              f"got {text!r}", None, None, option) from None


@app.command("plan", short_help="Search replicas x GPU kind x tier sizes x policies for "
             "the cheapest configuration meeting an SLO; Pareto front and $ per M tokens.")
def plan_command(
    slo: Annotated[str, typer.Option(
        "--slo", metavar="METRIC=VALUE",
        help="The SLO: ttft_p99=2s, tpot_p99=50ms (units us, ms, s) or goodput=0.95 (the "
        "fraction of requests meeting their own TTFT/TPOT deadlines).")],
    request_trace: RequestTraceOpt = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", help="A workload profile (name or .toml) instead of --request-trace.",
        show_default=False)] = None,
    requests: RequestsOpt = None,
    fmt: FormatOpt = None,
    trace_block_size: TraceBlockSizeOpt = None,
    model: Annotated[str, typer.Option(
        "--model", help="Model served (catalog name or config.json).")] = "llama-3.1-8b",
    prices: Annotated[str | None, typer.Option(
        "--prices", metavar="NAME|FILE.toml",
        help="Price table (default: the bundled cloud-list-2024, public list prices at a "
        "date; copy profiles/prices/cloud-list-2024.toml and edit it).",
        show_default=False)] = None,
    hardware: Annotated[str, typer.Option(
        "--hardware", metavar="LIST", help="GPU kinds (hardware profiles), comma-separated; "
        "one GPU per replica.")] = "h100-sxm",
    replicas: Annotated[str, typer.Option(
        "--replicas", metavar="LIST", help="Replica counts, comma-separated.")] = "1,2,4",
    policies: Annotated[str, typer.Option(
        "--policies", metavar="LIST", help="HBM policies, comma-separated.")] = "lru",
    dram_gb: Annotated[str, typer.Option(
        "--dram-gb", metavar="LIST", help="DRAM tier sizes per replica (GB, 0 = none).")] = "0",
    cxl_gb: Annotated[str, typer.Option(
        "--cxl-gb", metavar="LIST", help="CXL tier sizes per replica (GB, 0 = none).")] = "0",
    nvme_gb: Annotated[str, typer.Option(
        "--nvme-gb", metavar="LIST", help="NVMe tier sizes per replica (GB, 0 = none).")] = "0",
    router: RouterOpt = None,
    block_size: BlockSizeOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    max_num_batched_tokens: MaxTokensOpt = None,
    timing: TimingOpt = None,
    ttft_deadline: Annotated[str | None, typer.Option(
        "--ttft-deadline", metavar="TIME", help="goodput: TTFT deadline (e.g. 2s) of the "
        "requests whose trace carries none.", show_default=False)] = None,
    tpot_deadline: Annotated[str | None, typer.Option(
        "--tpot-deadline", metavar="TIME", help="goodput: TPOT deadline (e.g. 100ms) of the "
        "requests whose trace carries none.", show_default=False)] = None,
    warmup_fraction: Annotated[float, typer.Option(
        "--warmup-fraction", min=0.0, max=0.99, help="The first floor(F x requests) "
        "requests are not measured.")] = 0.0,
    prune: Annotated[bool, typer.Option(
        "--prune/--no-prune", help="Skip tier sizes the one-pass LRU curve shows cannot "
        "gain hits (docs/plan.md, 'Pruning').")] = True,
    engine: Annotated[str, typer.Option(
        "--engine", metavar="NAME", help="Replay engine: auto, compiled or "
        "interpreted.")] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="Seed of --profile and of randomised "
                                      "policies.")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel cells "
                                      "(process pool, or Ray's CPUs with --executor ray)."
                                      )] = 1,
    executor: Annotated[str, typer.Option(
        "--executor", metavar="NAME", help="local (process pool) or ray (each cell a Ray "
        "task; optional extra: pip install 'kvsim[ray]'; same results, same cell cache)."
        )] = "local",
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="Ray cluster address for --executor ray (default: start a "
        "local Ray instance with --jobs CPUs).")] = None,
    out: Annotated[Path, typer.Option(
        "--out", metavar="DIR", help="Output folder: plan.parquet (every cell), plan.json "
        "(the answer, the front, the prices' sources), cells/ (the cache: a rerun replays "
        "only missing cells).")] = Path("plan-out"),
    force: Annotated[bool, typer.Option(
        "--force", help="Write into a non-empty --out that is not a kvsim plan folder.")] = False,
    json_: JsonOption = False,
) -> None:
    """Serve the request trace closed loop on every configuration of the grid (GPU kind x
    replicas x DRAM x CXL x NVMe x policy), price each with the price table, and print the
    cheapest configuration meeting the SLO, the Pareto front of cost against the SLO
    metric, and $ per million tokens.  Cells are cached under --out; an interrupted plan
    resumes where it stopped."""
    from kvsim.analysis.plan import PlanSpec, parse_slo, run_plan
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.spec.prices import load_prices
    from kvsim.spec.sim_config import SimConfig

    if (request_trace is None) == (profile is None):
        raise KvsimInputError("expected exactly one of --request-trace or --profile", None,
                              None, "--request-trace")
    requests = profile_requests(requests, profile)
    check_outputs(("--out", out, "dir"))
    if executor == "ray":
        from kvsim.analysis.sweep import require_ray

        require_ray()  # a missing extra: one line before any work
    the_slo = parse_slo(slo, _deadline_us(ttft_deadline, "--ttft-deadline"),
                        _deadline_us(tpot_deadline, "--tpot-deadline"))
    replica_counts = _list(replicas, "--replicas", int)
    if max(replica_counts) >= 1:  # the largest cell's replicas fit the memory budget
        from kvsim.core.limits import check_replicas_memory

        check_replicas_memory(max(replica_counts))
    table = load_table(profile, requests, seed, request_trace, fmt, trace_block_size)
    opts = EngineOptions(block_size_tokens=block_size or 16, max_num_seqs=max_num_seqs or 256,
                         max_num_batched_tokens=max_num_batched_tokens or 8192, model=model,
                         timing=timing or "auto")
    spec = PlanSpec(the_slo, load_prices(prices),
                    hardware=_list(hardware, "--hardware", str),
                    replicas=replica_counts,
                    policies=_list(policies, "--policies", str),
                    dram_gb=_list(dram_gb, "--dram-gb"), cxl_gb=_list(cxl_gb, "--cxl-gb"),
                    nvme_gb=_list(nvme_gb, "--nvme-gb"), router=router or "round_robin",
                    base=SimConfig(model=model, warmup_fraction=warmup_fraction,
                                   engine=engine, seed=seed),
                    engine=opts, prune=prune)
    t0 = time.perf_counter()
    with progress(transient=False, quiet=quiet_progress(json_)) as bar:
        task = bar.add_task(f"plan: {len(table):,} requests", total=len(spec.cells()))

        def on_cell(done, total, cell, cached) -> None:
            bar.update(task, completed=done, total=total)

        res = run_plan(table, spec, out, jobs=jobs, force=force, on_cell=on_cell,
                       executor=executor, ray_address=ray_address)
    err_console.print(f"{res.cells} cells: {res.computed} replayed, {res.cached} from the "
                      f"cache, {res.pruned} pruned by the curve, "
                      f"{time.perf_counter() - t0:.1f} s; wrote {out}/plan.parquet, "
                      f"{out}/plan.json", highlight=False)
    if res.best is None:
        err_console.print(f"warning: no configuration of the grid meets {the_slo.describe()}; "
                          "widen the grid (more replicas, other GPU kinds)", highlight=False)
    if json_:
        emit_json(res.summary)
        return
    from kvsim.cli.render import print_view

    print_view(plan_view(res, the_slo))


def _fmt_metric(slo, v: float) -> str:
    if v != v:
        return "-"
    return f"{v:.3f}" if slo.metric == "goodput" else f"{v / 1e3:,.1f}"


def plan_view(res, slo) -> Table:
    """The answer and the Pareto front, cheapest first."""
    from rich import box

    b = res.best
    head = (f"cheapest meeting {slo.describe()}: " + (
        "none" if b is None else
        f"{b['replicas']} x {b['hardware']}, {b['policy']}, DRAM {b['dram_gb']:g} / CXL "
        f"{b['cxl_gb']:g} / NVMe {b['nvme_gb']:g} GB per replica, ${b['usd_per_hour']:.3f}/h, "
        f"${b['usd_per_m_tokens']:.4f} per M tokens"))
    unit = "" if slo.metric == "goodput" else " ms"
    t = Table(title=head + f"\nPareto front (cost vs {slo.metric}; list prices "
              f"{res.summary['prices']['name']})", title_justify="left",
              box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, header_style="bold")
    for col in ("GPU", "replicas", "policy", "DRAM GB", "CXL GB", "NVMe GB", "$/hour",
                f"{slo.metric}{unit}", "meets", "$/M tok", "HBM hit", "prefix hit"):
        t.add_column(col, justify="left" if col in ("GPU", "policy") else "right")
    for r in res.front.to_dict("records"):
        t.add_row(r["hardware"], str(r["replicas"]), r["policy"], f"{r['dram_gb']:g}",
                  f"{r['cxl_gb']:g}", f"{r['nvme_gb']:g}", f"{r['usd_per_hour']:.3f}",
                  _fmt_metric(slo, r["slo_value"]), "yes" if r["meets_slo"] else "no",
                  f"{r['usd_per_m_tokens']:.4f}", f"{100 * r['hbm_hit_rate']:.2f}%",
                  f"{100 * r['prefix_hit_rate']:.2f}%")
    return t
