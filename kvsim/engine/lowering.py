"""Lowering: a Request table becomes a MemoryIntent event file (streamed, deterministic).

:func:`lower_requests` prepares flat numpy arrays from the Request table, drives the
compiled step loop (:mod:`kvsim.engine.scheduler`) chunk by chunk and streams each chunk to
:class:`kvsim.events.EventWriter`.  Peak memory is the Request table plus one chunk of
rows plus the hashes needed for the reuse figure, never the whole event table.

Block-size mapping (trace block ``T`` tokens -> kvsim block ``B`` tokens): kvsim block
``k`` covers tokens ``[kB, (k+1)B)``; its hash chains the previous block's hash with the
content ids of every native block it overlaps and its start offset inside the first one
(:func:`kvsim.ingest.hashing.chain_hash`).  So a 512-token Mooncake block ``j`` becomes
``512/B`` blocks hashed from (parent, id ``j``, sub-offset); with ``B = 512`` each hash id
maps to exactly one ``ALLOCATE`` row.  A block is hashed only while every token it holds is
identified (``hashed_tokens``): Mooncake's partial last block gets its id's hash tagged
with its token count (:func:`kvsim.ingest.hashing.partial_hash`: it matches no full block
with that id; schema rule 4: the replay never shares it, ``kvsim inspect`` counts it); an
agentic prompt's tail beyond its last full 64-token block has no hash.

KV block budget: ``num_gpu_blocks`` (default: the replay's default HBM pool for the same
model and hardware, :func:`kvsim.engine.engine_model.default_num_gpu_blocks`).  A request whose
prompt alone needs more than ``num_gpu_blocks - watermark`` blocks could never be admitted:
it is dropped before lowering (vLLM v0's ``AllocStatus.NEVER``: the scheduler ignores it
with a warning) and counted in ``dropped_requests`` with its reason; the remaining requests
keep dense ids in arrival order.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.schema import EventHeader, EventKind, Phase
from kvsim.engine import scheduler as S
from kvsim.engine.engine_model import (
    DEFAULT_STEP_OVERHEAD_US,
    EngineConfig,
    build_cost_model,
    resolve_num_gpu_blocks,
)
from kvsim.engine.scheduler_state import new_schedule
from kvsim.events.import_summary import ImportSummary
from kvsim.events.prefix_reuse import PrefixReuse
from kvsim.ingest.requests import RequestTable
from kvsim.spec.models.catalog import DEFAULT_MODEL

#: Rows buffered before a chunk is handed to the writer (and Parquet row-group size).
FLUSH_ROWS = 1 << 20
#: ``dropped_requests_by_reason`` key of a request whose prompt can never fit the budget.
DROP_PROMPT_EXCEEDS_KV = "prompt_exceeds_kv_blocks"


def lower_requests(requests: RequestTable, out_path: str | Path, *, model: str = DEFAULT_MODEL,
                   hardware: str = "h100-sxm", block_size_tokens: int = 16,
                   max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                   step_overhead_us: float | None = None, kv_dtype: str | None = None,
                   seed: int = 0, num_gpu_blocks: int | None = None,
                   gpu_memory_utilization: float | None = None,
                   source: dict[str, Any] | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   flush_rows: int = FLUSH_ROWS, timing: str | None = "auto",
                   engine: str = "auto") -> ImportSummary:
    """Lower ``requests`` through the engine model into the event file ``out_path``.

    Parquet unless ``out_path`` ends in ``.jsonl`` (``.jsonl.gz``).  ``progress(done,
    total)`` is called after each chunk with finished requests.  Deterministic: the same
    table and arguments give a byte-identical file.  Raises :class:`KvsimInputError` for
    bad options (unknown model or hardware, block size not >= 1, ...).

    ``num_gpu_blocks`` None = derived (``gpu_memory_utilization``, default vLLM's 0.9),
    exactly as ``kvsim simulate`` sizes its default HBM pool.  ``timing``: the step-time
    model (``auto``: measured tables where bundled for the pair, else the roofline;
    :mod:`kvsim.engine.timing.select`), recorded in the header's ``source.engine``.
    ``engine``: how the scheduler's steps run, ``auto`` (:func:`_small_and_cold`),
    ``compiled`` or ``interpreted`` (as Python); the same file either way.
    """
    from kvsim.core.fsutil import check_output_path, check_output_suffix
    from kvsim.events import EventWriter
    from kvsim.spec.sim_config import ENGINES

    check_output_suffix(check_output_path(out_path, "--out"), "events", "--out")
    if engine not in ENGINES:
        raise bad_value(None, None, "engine", " | ".join(ENGINES), engine)
    extra = {} if gpu_memory_utilization is None else {
        "gpu_memory_utilization": gpu_memory_utilization}
    cfg = EngineConfig(block_size_tokens=block_size_tokens, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens,
                       step_overhead_us=(DEFAULT_STEP_OVERHEAD_US if step_overhead_us is None
                                         else float(step_overhead_us)), seed=seed,
                       num_gpu_blocks=num_gpu_blocks, **extra)
    cost = build_cost_model(model, hardware, kv_dtype, cfg.step_overhead_us,
                            cfg.block_size_tokens, timing=timing)
    ngpu = resolve_num_gpu_blocks(cfg, cost)
    wmark = cfg.watermark_blocks(ngpu)
    total_requests = len(requests)
    requests, dropped = _drop_unadmittable(requests, cfg.block_size_tokens, ngpu - wmark)
    df = requests.df
    N = len(df)
    if N == 0 and total_requests:
        raise KvsimInputError(
            f"every one of the {total_requests:,} requests has a prompt longer than the "
            f"scheduler's KV budget ({ngpu - wmark:,} blocks of {cfg.block_size_tokens} "
            "tokens after the watermark), so the trace would be empty; expected a larger "
            "--num-gpu-blocks / GPU, or shorter prompts", None, None, "num_gpu_blocks")
    spk = df["spec_draft_tokens"].to_numpy(np.int64)
    if N and int(spk.max()) + 1 > cfg.max_num_batched_tokens:
        raise KvsimInputError("expected spec_draft_tokens + 1 <= --max-num-batched-tokens",
                              None, None, "spec_draft_tokens")
    block_bytes = cost.kv_bytes_per_token * cfg.block_size_tokens
    header = EventHeader(block_size_tokens=cfg.block_size_tokens,
                         kv_bytes_per_token=cost.kv_bytes_per_token, model=cost.model,
                         hardware=cost.hardware,
                         source={**(source or requests.source),
                                 "engine": {"max_num_seqs": cfg.max_num_seqs,
                                            "max_num_batched_tokens": cfg.max_num_batched_tokens,
                                            "step_overhead_us": cfg.step_overhead_us,
                                            "timing_model": cost.timing_model,
                                            "timing_profile": cost.timing.profile,
                                            "seed": cfg.seed,
                                            "num_gpu_blocks": ngpu,
                                            "num_gpu_blocks_given": cfg.num_gpu_blocks is not None,
                                            "gpu_memory_utilization": cfg.gpu_memory_utilization,
                                            "watermark_blocks": wmark,
                                            "dropped_requests": dropped}})
    off, ids = requests.flat_block_ids()
    sched = new_schedule(requests.columns(), off, ids, requests.block_size_tokens, cfg, cost,
                         ngpu, wmark, flush_rows)
    st, stf, src = sched.st, sched.stf, sched.src
    prompt = sched.req_args[1]
    out = sched.req_args[2]
    sched.python = _small_and_cold(int(prompt.sum()) // cfg.block_size_tokens + int(out.sum()),
                                   engine)
    # per-row lookups filled in numpy: owner table row of every sequence slot
    rprio_tab = np.asarray(df["request_priority"].to_numpy(), dtype=np.int8)
    tenant_tab = np.asarray(df["tenant"].to_numpy(), dtype=np.int32)
    reuse_count = PrefixReuse(sched.python)  # the one definition, shared with `kvsim inspect`
    prompt_rows = hashed_rows = num_events = num_forks = 0
    with EventWriter(out_path, header, row_group_rows=flush_rows) as writer:
        while st[S.S_FINISHED] == 0:
            n = sched.step()
            if n == 0:
                break
            cols = _columns(sched.I, sched.F, n, src, N, rprio_tab, tenant_tab, block_bytes)
            alloc = cols["kind"] == EventKind.ALLOCATE
            is_prompt = cols["phase"][alloc] == Phase.PREFILL
            h = cols["content_hash"][alloc]
            prompt_rows += int(is_prompt.sum())
            hashed_rows += int(np.count_nonzero(h[is_prompt] != 0))
            reuse_count.add(h, is_prompt)
            num_forks += int((cols["kind"] == EventKind.FORK).sum())
            writer.write(cols)
            num_events += n
            if progress is not None:
                progress(int(st[S.S_DONE]), N)
    reuse = reuse_count.fraction
    return ImportSummary(
        out_path=str(out_path), format=str((source or requests.source).get("format", "")),
        num_requests=N, skipped_rows=requests.skipped, num_events=num_events,
        num_steps=int(st[S.S_STEP]), num_forks=num_forks,
        block_size_tokens=cfg.block_size_tokens, model=cost.model, hardware=cost.hardware,
        kv_bytes_per_token=cost.kv_bytes_per_token, block_bytes=block_bytes,
        total_prompt_tokens=int(prompt.sum()), total_output_tokens=int(out.sum()),
        prompt_blocks=prompt_rows, hashed_prompt_blocks=hashed_rows,
        prefix_reuse_fraction=reuse, makespan_us=int(stf[0]),
        timing_model=cost.timing_model, timing_profile=cost.timing.profile,
        num_gpu_blocks=ngpu, watermark_blocks=wmark, max_held_blocks=int(st[S.S_MAXHELD]),
        max_running_seqs=int(st[S.S_MAXRUN]), decode_stalls=int(st[S.S_STALLS]),
        admission_blocked_steps=int(st[S.S_BLOCKED]), forced_decodes=int(st[S.S_FORCED]),
        dropped_requests=dropped,
        dropped_requests_by_reason={DROP_PROMPT_EXCEEDS_KV: dropped} if dropped else {})


def _small_and_cold(rows: int, engine: str = "auto") -> bool:
    """True when a lowering of about ``rows`` events runs the scheduler's steps as Python:
    THE engine rule (:func:`kvsim.spec.sim_config.resolve_engine`) picks the interpreted
    engine for it (``auto``: the compiled scheduler is not in numba's disk cache and
    ``rows`` is too few to pay for its compile, ~10-20 CPU-s: the README sample's import,
    2026-11-30; or ``engine`` says so)."""
    from kvsim.jit.disk_cache import cold
    from kvsim.spec.sim_config import resolve_engine

    return resolve_engine(engine, rows, 1, lambda: not cold(S.run_steps)) == "interpreted"


def _drop_unadmittable(requests: RequestTable, block_size_tokens: int, max_prompt_blocks: int,
                       whole_sequence: bool = False) -> tuple[RequestTable, int]:
    """``requests`` without the rows whose prompt needs more than ``max_prompt_blocks``
    blocks (never admissible), re-numbered densely in arrival order; and how many went.
    ``whole_sequence``: the rows whose prompt and output (all but the last sampled token,
    which is never computed) need more: vLLM's scheduler preempts such a request when it
    grows past the pool and can never re-admit it."""
    tokens = np.asarray(requests.column("prompt_tokens"), dtype=np.int64)
    if whole_sequence:
        tokens = tokens + np.asarray(requests.column("output_tokens"), dtype=np.int64) - 1
    nb = (tokens + block_size_tokens - 1) // block_size_tokens
    keep = nb <= max_prompt_blocks
    dropped = int((~keep).sum())
    if not dropped:
        return requests, 0
    return requests.take(keep), dropped


def _columns(I: np.ndarray, F: np.ndarray, n: int, src: np.ndarray, N: int,
             rprio_tab: np.ndarray, tenant_tab: np.ndarray, block_bytes: int,
             ) -> dict[str, np.ndarray]:
    """Event columns of the first ``n`` buffered rows (dtypes of kvsim.core.schema)."""
    cols: dict[str, np.ndarray] = {}
    dtypes = {"step": np.int64, "time_us": np.int64, "kind": np.int8, "request_id": np.int64,
              "block_index": np.int32, "content_hash": np.int64, "parent_request_id": np.int64,
              "num_tokens": np.int32, "phase": np.int8, "priority": np.int8,
              "deadline_us": np.int64, "slack_us": np.int64, "target_decode_step": np.int64}
    for i, name in enumerate(S.INT_COLUMN_NAMES):
        if name == "pin_requested":
            cols[name] = I[i, :n] != 0
        else:
            cols[name] = I[i, :n].astype(dtypes[name])
    cols["duration_us"] = F[S.F_DUR, :n].copy()
    cols["recompute_cost_us"] = F[S.F_RC, :n].copy()
    rid = cols["request_id"]
    owner = np.where(rid >= N, src[np.clip(rid, 0, None)], rid)
    has = owner >= 0
    safe = np.where(has, owner, 0)
    cols["request_priority"] = np.where(has, rprio_tab[safe] if N else 50, 50).astype(np.int8)
    cols["tenant"] = np.where(has, tenant_tab[safe] if N else 0, 0).astype(np.int32)
    cols["size_bytes"] = np.where(cols["block_index"] >= 0, block_bytes, 0).astype(np.int64)
    return cols


def import_request_trace(path: str | Path, out_path: str | Path, *, format: str | None = None,
                         mapping: str | dict[str, str] | None = None,
                         skip_bad_rows: bool = False, model: str = DEFAULT_MODEL,
                         hardware: str = "h100-sxm", block_size_tokens: int = 16,
                         max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                         arrival_rate: float | None = None, concurrency: int | None = None,
                         seed: int = 0, trace_block_tokens: int = 16,
                         kvmi_step_us: int | None = None,
                         num_gpu_blocks: int | None = None,
                         gpu_memory_utilization: float | None = None,
                         progress: Callable[[int, int], None] | None = None,
                         strict: bool = False, timing: str | None = "auto",
                         output_tokens: int | None = None,
                         submission_rate: float | None = None,
                         salt_by_tenant: bool = False) -> ImportSummary:
    """Read ``path`` and write its MemoryIntent events to ``out_path`` (Parquet, or JSONL
    when the name ends in .jsonl).  Same inputs and arguments -> byte-identical output.
    ``num_gpu_blocks`` / ``gpu_memory_utilization``: the scheduler's KV block budget
    (:func:`lower_requests`); kvmi files are translated, not scheduled, and ignore them.
    ``timing``: the step-time model (``auto``, ``roofline``, ``measured`` or a timing
    profile path; :mod:`kvsim.engine.timing.select`).  ``output_tokens``,
    ``submission_rate``, ``salt_by_tenant``: :func:`kvsim.ingest.read_requests`."""
    from kvsim.core.fsutil import check_output_path, check_output_suffix
    from kvsim.ingest import read_requests
    from kvsim.ingest.detect import detect_format

    check_output_suffix(check_output_path(out_path, "--out"), "events", "--out")
    fmt = format or ("generic" if mapping else detect_format(path))
    if fmt == "kvmi":
        from kvsim.ingest.kvmi import KVMI_STEP_US, convert_kvmi
        return convert_kvmi(path, out_path, block_size_tokens=block_size_tokens,
                            step_us=kvmi_step_us or KVMI_STEP_US, skip_bad_rows=skip_bad_rows)
    table = read_requests(path, fmt, mapping, skip_bad_rows, arrival_rate=arrival_rate,
                          concurrency=concurrency, seed=seed,
                          trace_block_tokens=trace_block_tokens, strict=strict,
                          output_tokens=output_tokens, submission_rate=submission_rate,
                          salt_by_tenant=salt_by_tenant)
    return lower_requests(table, out_path, model=model, hardware=hardware,
                          block_size_tokens=block_size_tokens, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, seed=seed,
                          num_gpu_blocks=num_gpu_blocks,
                          gpu_memory_utilization=gpu_memory_utilization, progress=progress,
                          timing=timing)
