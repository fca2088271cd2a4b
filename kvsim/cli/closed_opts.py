"""Options of the closed loop shared by ``kvsim simulate`` and ``kvsim compare``: which
schedule (closed loop or the event file's recorded steps), the serving engine's limits,
replicas and router, and a request trace as input (docs/simulate.md, "Closed loop")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsim.core.errors import KvsimInputError
from kvsim.spec.models.catalog import DEFAULT_MODEL

SCHEDULES = ("closed", "recorded")

ScheduleOpt = Annotated[str | None, typer.Option(
    "--schedule", metavar="closed|recorded",
    help="closed: the engine's scheduler runs inside the replay, so cache hits shorten "
         "prefill and the queue (default whenever the input is a Request table: --profile "
         "or --request-trace).  recorded: replay the STEP rows of an event file open loop "
         "(the only choice with --trace; with --profile / --request-trace the table is "
         "lowered first).", show_default=False)]
RequestTraceOpt = Annotated[Path | None, typer.Option(
    "--request-trace", metavar="FILE",
    help="A request trace (any format `kvsim import-request-trace` reads: Mooncake JSONL, "
         "Azure CSV, agentic, generic) served closed loop.", show_default=False)]
FormatOpt = Annotated[str | None, typer.Option(
    "--format", help="Reader of --request-trace (default: detected).", show_default=False)]
TraceBlockSizeOpt = Annotated[int | None, typer.Option(
    "--trace-block-size", min=1, show_default=False,
    help="Tokens per block of a generic --request-trace's block_ids column (default 16; "
         "as `kvsim import-request-trace --trace-block-size`).")]
ReplicasOpt = Annotated[str, typer.Option(
    "--replicas", metavar="N|auto",
    help="Identical engines serving the trace, each with its own HBM and lower tiers "
         "(closed loop; --profile / --request-trace only).  auto: the fewest that keep "
         "each below 70% busy under the step-time model even with a perfect prefix cache "
         "(kvsim.analysis.sizing; docs/simulate.md, 'Sizing').")]
DropOverContextOpt = Annotated[bool, typer.Option(
    "--drop-over-context", help="Drop the requests whose prompt + output exceed the "
    "model's context (max_position_embeddings) instead of refusing the trace.")]
SaltByTenantOpt = Annotated[bool, typer.Option(
    "--salt-by-tenant", help="Salt each request's prompt hashes with its tenant (vLLM's "
    "cache_salt per tenant): two tenants never share a KV block (docs/importers.md).")]
RouterOpt = Annotated[str | None, typer.Option(
    "--router", metavar="round_robin|least_loaded|session|prefix|tiered",
    help="How requests are sent to replicas (docs/simulate.md, \"Routers\").")]
BlockSizeOpt = Annotated[int | None, typer.Option(
    "--block-size", min=1, show_default=False,
    help="Tokens per KV block of the engine serving --profile / --request-trace (default 16, "
         "vLLM's; 512 for a Mooncake trace at its native block size).  An event file "
         "carries its own.")]
MaxSeqsOpt = Annotated[int | None, typer.Option(
    "--max-num-seqs", min=1, show_default=False,
    help="Most sequences running in one engine step (vLLM; default 256).  Not with --trace.")]
MaxTokensOpt = Annotated[int | None, typer.Option(
    "--max-num-batched-tokens", min=1, show_default=False,
    help="Token budget of one engine step (vLLM; default 8192).  Not with --trace.")]

SchedulerOpt = Annotated[str, typer.Option(
    "--scheduler", metavar="auto|vllm|kvsim",
    help="Who decides the closed loop's steps: vllm (vLLM 0.33's own v1 scheduler, ported "
         "and checked step by step against recordings of vLLM: recompute preemption, "
         "chunk-wise block allocation, reserve-full-ISL admission, speculative drafts; no "
         "n > 1, beams or --preemption swap), kvsim (kvsim's continuous-batching "
         "scheduler, which models those) or auto (the default: vllm, unless the run needs "
         "one of those, then kvsim, said in a note).  docs/simulate.md, \"Fidelity to "
         "vLLM\".")]
SpecLookaheadOpt = Annotated[bool, typer.Option(
    "--spec-lookahead",
    help="Speculative decoding under vLLM's scheduler: reserve the drafter's k KV slots "
         "past the scheduled tokens (vLLM's num_lookahead_tokens: EAGLE, MTP, a draft "
         "model; off: n-gram).  k and the acceptance are the trace's spec_draft_tokens / "
         "spec_accept_prob.  docs/simulate.md, \"Speculative decoding under vLLM's "
         "scheduler\".")]
SpecMethodOpt = Annotated[str, typer.Option(
    "--spec-method", metavar="none|ngram|mtp",
    help="The drafter, for the KV cache's size: mtp (DeepSeek-V3, Qwen3-Next: the model's "
         "multi-token-prediction layers hold KV in every block, as vLLM sizes them, so the "
         "pool holds fewer blocks; implies --spec-lookahead), ngram or none (default).  "
         "docs/estimate-kv.md, \"Speculative decoding\".")]
HybridPoolOpt = Annotated[str, typer.Option(
    "--hybrid-pool", metavar="auto|on|off",
    help="A model whose layers are not all full attention (gpt-oss: sliding windows; "
         "qwen3-next: Mamba): auto (the default) or on serves the closed loop through "
         "vLLM 0.33's hybrid KV-cache pool (one manager per layer group; interpreted, HBM "
         "only); off: every layer alike (compiled, with tiers).  docs/memory-model.md, "
         "\"Hybrid models in the closed loop\".")]
TimingOpt = Annotated[str | None, typer.Option(
    "--timing", metavar="auto|roofline|measured|FILE.toml",
    help="Step-time model of the engine serving --profile / --request-trace: measured "
         "(AIConfigurator's measured kernel tables, bundled for h100-sxm, h200, b200, "
         "a100-80g x llama-3(.1)-8b, llama-3(.1)-70b, qwen3-30b-a3b), roofline (datasheet "
         "FLOP/s and bandwidth), a timing profile file, or auto (default: measured where "
         "bundled, else roofline).  docs/cost-model.md, \"Step time\".",
    show_default=False)]


def check_timing(trace, timing) -> None:
    """``--timing`` is for a Request table: an event file's step times are fixed."""
    if trace is not None and timing is not None:
        raise KvsimInputError("expected no --timing with --trace: an event file's step "
                              "times are fixed when it is written (set it on `kvsim "
                              "generate` or `kvsim import-request-trace`)", None, None,
                              "--timing")


def timing_name(opts, config) -> str:
    """The name of the step-time model ``opts`` (EngineOptions) resolves to on
    ``config``'s hardware; a one-line error (exit 2) when it cannot be had."""
    from kvsim.engine.engine_model import build_cost_model

    return build_cost_model(config.model or opts.model, config.hardware,
                            block_size_tokens=opts.block_size_tokens,
                            timing=opts.timing).timing_model


#: Engine options' defaults: those of :class:`kvsim.modes.closed.closed_loop.EngineOptions` (where
#: their sources are).
ENGINE_DEFAULTS = {"--block-size": 16, "--max-num-seqs": 256, "--max-num-batched-tokens": 8192}


def engine_options(trace, block_size, max_num_seqs, max_num_batched_tokens) -> tuple:
    """The engine options with their defaults filled in; a one-line error when one is given
    with an event file (``--trace``), whose steps and block size are already fixed."""
    given = {"--block-size": block_size, "--max-num-seqs": max_num_seqs,
             "--max-num-batched-tokens": max_num_batched_tokens}
    if trace is not None:
        for name, value in given.items():
            if value is not None:
                raise KvsimInputError(f"expected no {name} with --trace: an event file's "
                                      "block size and engine steps are fixed when it is "
                                      "written (set it on `kvsim generate` or `kvsim "
                                      "import-request-trace`)", None, None, name)
    return tuple(ENGINE_DEFAULTS[k] if v is None else v for k, v in given.items())


def check_scheduler(scheduler: str, sched: str) -> None:
    """``--scheduler`` names the closed loop's scheduler: auto, vllm or kvsim; an explicit
    one only with the closed loop (auto is then moot)."""
    if scheduler not in ("auto", "kvsim", "vllm"):
        raise KvsimInputError(f"expected --scheduler auto | vllm | kvsim, got {scheduler!r}",
                              None, None, "--scheduler")
    if scheduler == "vllm" and sched != "closed":
        raise KvsimInputError("expected --scheduler vllm only with the closed schedule (an "
                              "event file's or a lowering's steps are already decided)",
                              None, None, "--scheduler")


def resolve_schedule(schedule: str | None, has_table: bool, mode: str = "engine",
                     live_offload: bool = False) -> str:
    """The schedule to use: ``closed`` by default for a Request table, ``recorded`` for an
    event file (the only one possible there), in ``--mode cache`` (no engine steps) and
    with ``--live-offload`` (it replays recorded steps: kvsim.modes.live.live_offload)."""
    if schedule is not None and schedule not in SCHEDULES:
        raise KvsimInputError(f"expected closed | recorded, got {schedule!r}", None, None,
                              "--schedule")
    if live_offload:
        if schedule == "closed":
            raise KvsimInputError("expected --schedule recorded (or none) with "
                                  "--live-offload (it replays an engine's recorded steps)",
                                  None, None, "--schedule")
        return "recorded"
    if mode == "cache":
        if schedule == "closed":
            raise KvsimInputError("expected --schedule recorded (or none) with --mode cache "
                                  "(requests one at a time, no engine)", None, None,
                                  "--schedule")
        return "recorded"
    if not has_table:
        if schedule == "closed":
            raise KvsimInputError("expected --profile or --request-trace for --schedule "
                                  "closed (an event file's steps are already decided)", None,
                                  None, "--schedule")
        return "recorded"
    return schedule or "closed"


def load_table(profile: str | None, num_requests: int, seed: int,
               request_trace: Path | None, fmt: str | None,
               trace_block_size: int | None = None, salt_by_tenant: bool = False):
    """The Request table of ``--profile`` (generated) or ``--request-trace`` (read;
    ``trace_block_size``: tokens per block of a generic trace's ``block_ids``;
    ``salt_by_tenant``: tenants never share a block, :func:`kvsim.ingest.requests.salt_by_tenant`)."""
    if profile is not None:
        from kvsim.ingest.requests import salt_by_tenant as salt
        from kvsim.spec.workload_profile import load_profile
        from kvsim.workload.generator import build_workload

        table = build_workload(load_profile(profile), num_requests, seed)
        return salt(table) if salt_by_tenant else table
    from kvsim.ingest import read_requests

    return read_requests(request_trace, fmt, seed=seed,
                         trace_block_tokens=16 if trace_block_size is None else trace_block_size,
                         salt_by_tenant=salt_by_tenant)


def parse_replicas(value: str | int) -> int | str:
    """``--replicas``: a positive integer or ``auto``."""
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text.isascii() and text.isdigit() and int(text) >= 1:
        from kvsim.core.limits import check_replicas_memory

        check_replicas_memory(int(text))  # before any replica is allocated
        return int(text)
    raise KvsimInputError(f"expected a positive integer or auto, got {value!r}", None, None,
                          "--replicas")


def check_event_file_options(trace, replicas, router, spec_method="none",
                             spec_lookahead=False, **request_options) -> None:
    """An event file is one engine's recorded schedule: it cannot be re-routed or split
    over replicas, nor re-scheduled with speculative drafts, and the options that shape
    the requests served (``request_options``, name -> given: ``salt_by_tenant``,
    ``drop_over_context``, ``hybrid_pool``) have nothing to act on (a one-line error
    pointing to ``--request-trace``, never silently ignored)."""
    if trace is None:
        return
    for name, given in request_options.items():
        if given:
            opt = "--" + name.replace("_", "-")
            raise KvsimInputError(f"expected no {opt} with --trace: it acts on the requests "
                                  "of a request trace or profile as they are served, and an "
                                  "event file's requests were served when it was written; "
                                  f"serve the request trace instead (--request-trace FILE "
                                  f"{opt})", None, None, opt)
    if spec_method != "none" or spec_lookahead:
        what = "--spec-method" if spec_method != "none" else "--spec-lookahead"
        raise KvsimInputError(f"expected no {what} with --trace: an event file's steps and "
                              "block allocations were recorded before the replay, so the "
                              "drafter cannot change them; serve the request trace instead "
                              f"(--request-trace FILE {what}"
                              f"{' ' + spec_method if what == '--spec-method' else ''})",
                              None, None, what)
    if str(replicas) != "1" or router is not None:
        what = "--replicas" if str(replicas) != "1" else "--router"
        raise KvsimInputError(f"expected no {what} with --trace: an event file is one "
                              "engine's recorded schedule and cannot be re-routed or split "
                              "over replicas; serve the request trace instead (--request-trace "
                              "FILE --replicas N --router NAME)", None, None, what)


def check_is_event_file(trace) -> None:
    """``--trace`` given a request trace (Mooncake JSONL, agentic JSON, Azure CSV, ...):
    say so and point to ``--request-trace`` instead of a header error."""
    if trace is None:
        return
    from kvsim.events import open_events

    try:
        with open_events(trace) as reader:
            reader.header  # noqa: B018 - reading it is the check
        return
    except KvsimInputError as err:
        try:
            from kvsim.ingest.detect import detect_format

            fmt = detect_format(trace)
            if fmt == "generic" and str(trace).lower().endswith(".parquet"):
                import pyarrow.parquet as pq

                pq.read_schema(trace)  # named so, but not Parquet at all: the original error
        except Exception:  # noqa: BLE001 - not a request trace either: the original error
            raise err from None
        raise KvsimInputError(f"expected an event file, got a request trace ({fmt}): serve "
                              f"it with --request-trace {trace} (or convert it with `kvsim "
                              "import-request-trace`)", None, None, "--trace") from None

LinkModelOpt = Annotated[str, typer.Option(
    "--link-model", metavar="none|queue",
    help="none (default): each transfer timed alone, latency + bytes / slowest hop.  queue: "
         "every transfer occupies its tier's link, first in first out per direction, and "
         "waits for those issued before it; adds link utilisation and queueing delay to "
         "the summary (docs/cost-model.md, \"Links as queues\").")]
SharedTierGbOpt = Annotated[float | None, typer.Option(
    "--shared-tier-gb", min=0, metavar="GB",
    help="Closed loop: a KV store of GB shared by every replica, each over its own "
         "network link, in place of private DRAM/CXL/NVMe (docs/memory-model.md, "
         "\"Shared cluster tier\").", show_default=False)]
SharedTierPolicyOpt = Annotated[str, typer.Option(
    "--shared-tier-policy", metavar="NAME", help="The shared tier's eviction policy.")]
SharedLinkGbpsOpt = Annotated[float, typer.Option(
    "--shared-link-gbps", min=0.001, metavar="GBIT/S",
    help="Each replica's network link to the shared tier, in Gbit/s (default 100).")]
SharedLinkLatencyOpt = Annotated[float, typer.Option(
    "--shared-link-latency-us", min=0, metavar="US",
    help="Latency of one transfer batch to or from the shared tier (default 10 us).")]


def cluster_memory(config, link_model: str, shared_tier_gb, shared_tier_policy: str,
                   shared_link_gbps: float, shared_link_latency_us: float):
    """``config`` with the link model and the shared tier of the options above."""
    import dataclasses

    from kvsim.modes.closed.shared_tier import config_for

    out = dataclasses.replace(config, link_model=link_model, shared_tier_gb=shared_tier_gb,
                              shared_tier_policy=shared_tier_policy,
                              shared_link_bytes_per_s=shared_link_gbps * 1e9 / 8,
                              shared_link_latency_us=shared_link_latency_us)
    config_for(out)  # refused before any work: a shared tier beside private tiers
    return out


def lower_for(table, config, opts, tmpdir: Path) -> Path:
    """Lower ``table`` for this replay (``--schedule recorded`` of a Request table): the
    scheduler's KV budget is the replayed HBM pool (``SimConfig.lowering_options``; with
    ``--live-offload`` the whole GPU's, so the recorded batches oversubscribe the HBM)."""
    from kvsim.engine.lowering import lower_requests

    path = tmpdir / "lowered.parquet"
    lowering = config.lowering_options(opts.block_size_tokens, opts.model)
    lower_requests(table, path, max_num_seqs=opts.max_num_seqs,
                   max_num_batched_tokens=opts.max_num_batched_tokens, seed=config.seed,
                   timing=opts.timing, **lowering)
    return path


def single_replica(replicas: int) -> None:
    if replicas != 1:
        raise KvsimInputError("expected --replicas 1 with --schedule recorded (an event "
                              "file is one engine's steps)", None, None, "--replicas")


def request_table(profile, requests, seed, request_trace, fmt, model, block_size,
                   max_num_seqs, max_num_batched_tokens, config, sched, timing=None,
                   trace_block_size=None, salt_by_tenant=False, scheduler="auto",
                   spec_lookahead=False, spec_method="none", hybrid_pool="auto"):
    """The Request table a profile or request trace gives, and the engine options it is
    served with; says on stderr what is served how (a log line, not progress)."""
    import sys

    from kvsim.modes.closed.closed_loop import EngineOptions, resolve_scheduler
    from kvsim.spec.models import SPEC_METHODS

    if spec_method not in SPEC_METHODS:
        raise KvsimInputError(f"expected --spec-method {' | '.join(SPEC_METHODS)}, got "
                              f"{spec_method!r}", None, None, "--spec-method")
    if spec_method != "none" and sched != "closed":
        raise KvsimInputError(f"expected --spec-method only with the closed schedule, got "
                              f"--schedule {sched}", None, None, "--spec-method")
    table = load_table(profile, requests, seed, request_trace, fmt, trace_block_size,
                       salt_by_tenant)
    opts = EngineOptions(block_size_tokens=block_size, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens,
                         model=model or DEFAULT_MODEL, timing=timing or "auto",
                         scheduler=scheduler, spec_lookahead=bool(spec_lookahead),
                         spec_method=spec_method, hybrid_pool=hybrid_pool)
    if sched == "closed":  # auto: vllm unless the run needs what it does not model
        opts, why = resolve_scheduler(table, config, opts)
        if why is not None:
            sys.stderr.write(f"note: --scheduler auto: kvsim's scheduler, because vLLM's "
                             f"does not model {why}\n")  # one line, never wrapped
    opts_timing = timing_name(opts, config)  # before any work: --timing measured w/o data
    budget = config.lowering_options(block_size, opts.model).get("num_gpu_blocks")
    if budget and opts.spec_method != "none":  # the MTP layers' KV in every block
        from kvsim.engine.engine_model import build_cost_model
        from kvsim.modes.closed.closed_loop import hbm_pool_blocks

        budget = hbm_pool_blocks(config, build_cost_model(
            config.model or opts.model, config.hardware, block_size_tokens=block_size,
            spec_method=opts.spec_method))
    from kvsim.cli.sizing import stderr_line
    from kvsim.core.fsutil import shown_path

    stderr_line(f"note: {len(table):,} requests "
                + (f"from profile {profile} (seed {seed})" if profile else
                   f"from {shown_path(request_trace)}") + f", {sched} schedule"
                + (f", scheduler {opts.scheduler}" if sched == "closed" else "")
                + f", timing {opts_timing}"
                + (f", scheduler budget {budget:,} blocks = the HBM pool"
                   if budget else ""))  # one line, never wrapped
    return table, opts


PdOpt = Annotated[str | None, typer.Option(
    "--pd", metavar="P:D", show_default=False,
    help="Prefill/decode disaggregation (closed loop, vLLM's scheduler): P prefill and D "
         "decode replicas, the prompt's KV sent over a link (docs/disaggregation.md).")]
PdLinkGbpsOpt = Annotated[float, typer.Option(
    "--pd-link-gbps", help="Each prefill replica's link to the decode pool, Gbit/s "
    "(with --pd; inf: instant).")]
PdLinkLatencyOpt = Annotated[float, typer.Option(
    "--pd-link-latency-us", help="Latency of one P->D KV transfer, microseconds (with --pd).")]
PdMaxInflightOpt = Annotated[int, typer.Option(
    "--pd-max-inflight", help="Transfers in flight to one decode replica at most (with --pd; "
    "0: only its free blocks cap them).")]


def pd_options(pd: str | None, gbps: float, latency_us: float, max_inflight: int,
               replicas, sched: str):
    """``--pd`` and its link as :class:`kvsim.modes.closed.disagg.PdOptions` (None: off)."""
    from kvsim.modes.closed.disagg import PdOptions, parse_pd

    pq = parse_pd(pd)
    if pq is None:
        return None
    if str(replicas) != "1":
        raise KvsimInputError("expected --pd P:D or --replicas N, not both", None, None,
                              "--pd")
    if sched != "closed":
        raise KvsimInputError("expected --pd with the closed loop (a request trace or "
                              "--profile)", None, None, "--pd")
    from kvsim.core.limits import check_replicas_memory

    check_replicas_memory(pq[0] + pq[1], "--pd")  # before any replica is allocated
    return PdOptions(pq[0], pq[1], link_bytes_per_s=gbps * 1e9 / 8,
                     link_latency_us=latency_us, max_inflight=max_inflight)
