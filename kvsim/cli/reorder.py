"""``kvsim reorder``: serve a request trace as one batch job in several orders (API:
:func:`kvsim.analysis.reorder.reorder_study`; docs/importers.md, "ServeGen offline batch
jobs", and docs/simulate.md's closed loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvsim.cli import app
from kvsim.cli.closed_opts import (
    BlockSizeOpt,
    DropOverContextOpt,
    FormatOpt,
    MaxSeqsOpt,
    MaxTokensOpt,
    SaltByTenantOpt,
    engine_options,
)
from kvsim.cli.common import JsonOption, emit_json, err_console, out_console
from kvsim.cli.importing import OutputTokensOpt, SubmissionRateOpt
from kvsim.cli.simulate_opts import (
    CxlOpt,
    DramOpt,
    HardwareOpt,
    HbmBlocksOpt,
    HbmGbOpt,
    ModelOpt,
    NvmeOpt,
    SeedOpt,
)
from kvsim.core.errors import KvsimInputError
from kvsim.core.fsutil import shown_path
from kvsim.spec.models.catalog import DEFAULT_MODEL


@app.command("reorder", short_help="Serve a request trace as one batch job in submission, "
             "prefix-grouped and prefix-tree (DFS) order: hit rate, makespan, throughput.")
def reorder_command(
    request_trace: Annotated[Path, typer.Option(
        "--request-trace", metavar="FILE", help="The batch job: any request trace kvsim "
        "reads (a ServeGen offline trace, Mooncake, Weka, ...); its arrivals are replaced "
        "by one batch submitted at t = 0 (or --submission-rate).", show_default=False)],
    fmt: FormatOpt = None,
    orders: Annotated[str, typer.Option(
        "--orders", metavar="A,B,...", help="Orders to serve: submission, grouped, dfs.")
    ] = "submission,grouped,dfs",
    policy: Annotated[str, typer.Option("--policy", help="HBM placement policy.")] = "lru",
    model: ModelOpt = None,
    hardware: HardwareOpt = "h100-sxm",
    hbm_gb: HbmGbOpt = None,
    hbm_blocks: HbmBlocksOpt = None,
    dram_gb: DramOpt = None,
    cxl_gb: CxlOpt = None,
    nvme_gb: NvmeOpt = None,
    block_size: BlockSizeOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    max_num_batched_tokens: MaxTokensOpt = None,
    output_tokens: OutputTokensOpt = None,
    submission_rate: SubmissionRateOpt = None,
    salt_by_tenant: SaltByTenantOpt = False,
    drop_over_context: DropOverContextOpt = False,
    seed: SeedOpt = 0,
    json_: JsonOption = False,
) -> None:
    """How much prefix reuse and throughput does the submission order of a batch job
    leave on the table?  Serves the same requests closed loop once per order (all queued
    at t = 0, FCFS) and prints hit rate, makespan and throughput per order."""
    from kvsim.analysis import sizing
    from kvsim.analysis.reorder import reorder_study
    from kvsim.core.options import comma_names
    from kvsim.ingest import read_requests
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.spec.sim_config import SimConfig

    wanted = tuple(comma_names("--orders", orders))  # distinct (main served dfs,dfs twice)
    bs, seqs, toks = engine_options(None, block_size, max_num_seqs, max_num_batched_tokens)
    opts = EngineOptions(block_size_tokens=bs, max_num_seqs=seqs, max_num_batched_tokens=toks,
                         model=model or DEFAULT_MODEL)
    tiers = {k: v for k, v in (("dram_gb", dram_gb), ("cxl_gb", cxl_gb),
                               ("nvme_gb", nvme_gb)) if v is not None}
    config = SimConfig(hardware=hardware, hbm_gb=hbm_gb, hbm_blocks=hbm_blocks,
                       model=opts.model, seed=seed, **tiers)
    # the study lays out the submission itself (kvsim.analysis.reorder.reordered)
    table = read_requests(request_trace, fmt, seed=seed, output_tokens=output_tokens,
                          salt_by_tenant=salt_by_tenant)
    ctx = sizing.context_check(table, opts.model)
    if ctx.over:
        if not drop_over_context:
            raise KvsimInputError(
                f"{ctx.over:,} of {ctx.requests:,} requests exceed {ctx.model}'s context of "
                f"{ctx.context_tokens:,} tokens: choose a longer-context --model or pass "
                "--drop-over-context", None, None, "--model")
        table = sizing.drop_over_context(table, ctx.context_tokens)
        err_console.print(f"warning: dropped {ctx.over:,} of {ctx.requests:,} requests over "
                          f"{ctx.model}'s context (--drop-over-context)", markup=False)
    df = reorder_study(table, orders=wanted, policy=policy, config=config, engine=opts,
                       submission_rate=submission_rate)
    _check_dropped(df.to_dict(orient="records"), config)
    if json_:
        emit_json({"trace": shown_path(request_trace), "model": opts.model, "policy": policy,
                   "submission_rate": submission_rate, "orders": df.to_dict(orient="records")})
        return
    out = Table(title=f"{shown_path(request_trace)}: {len(table):,} requests as one batch job, "
                f"{opts.model}, {policy}")
    for name in ("order", "hit rate", "HBM block hits", "makespan (s)", "req/s", "tok/s", "adjacent shared "
                 "blocks", "makespan / submission"):
        out.add_column(name, justify="left" if name == "order" else "right")
    for r in df.to_dict(orient="records"):
        out.add_row(r["order"], f"{r['prefix_hit_rate']:.4f}",
                    f"{r['hbm_block_hit_rate']:.4f}", f"{r['makespan_s']:,.3f}",
                    f"{r['throughput_requests_per_s']:,.2f}",
                    f"{r['throughput_tokens_per_s']:,.0f}",
                    f"{r['adjacent_shared_blocks']:.2f}",
                    f"{r.get('makespan_vs_submission', float('nan')):.3f}")
    out_console.print(out)


def _check_dropped(rows: list[dict], config) -> None:
    """Dropped requests are never silent (issue 38): a study in which no order served a
    request is refused; one that dropped some says how many (each order drops the same:
    a request is dropped when its prompt needs more blocks than HBM holds)."""
    dropped = max(int(r["dropped_requests"]) for r in rows)
    if not dropped:
        return
    total = int(rows[0]["requests"])
    option = "--hbm-blocks" if config.hbm_blocks is not None else "--hbm-gb"
    if all(int(r["dropped_requests"]) >= int(r["requests"]) for r in rows):
        raise KvsimInputError(
            f"expected an HBM pool that holds at least one request: all {total:,} requests "
            "were dropped (their prompt never fits the HBM pool); raise --hbm-gb / "
            "--hbm-blocks or lower --block-size", None, None, option)
    err_console.print(f"warning: {dropped:,} of {total:,} requests dropped: each needs more KV "
                      "blocks than HBM holds, so they are never admitted and the hit rates "
                      f"and makespans leave them out; raise {option} or lower --block-size",
                      markup=False, soft_wrap=True)
