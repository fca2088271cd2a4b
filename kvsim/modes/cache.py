"""Cache mode: the trace's requests one at a time, through the same tiered replay.

:func:`simulate_cache` lowers the requests to a serialized event stream
(:mod:`kvsim.engine.serial_lowering`: one request per step, lookup then insert, then release),
replays it with :func:`kvsim.replay.driver.execute` (the same pool, tiers and policy hooks as
engine mode) and summarizes per source request: hit tokens of its prompt over its prompt
tokens (kvcache-simulator's ``hitRate``), hit blocks over prompt blocks.  Latency keys are
absent from the summary (there is no engine timing), and ``mode`` says ``cache``.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.core import layout as L
from kvsim.engine.serial_lowering import (
    CacheLowering,
    CacheStream,
    stream_from_events,
    write_cache_events,
)
from kvsim.replay.metrics import summarize
from kvsim.spec.sim_config import SimConfig

_HIT_COLUMNS = ("hbm_hit_tokens", "dram_hit_tokens", "cxl_hit_tokens", "nvme_hit_tokens",
                "recompute_tokens", "preemptions")


#: The name of the offline optimum (:mod:`kvsim.bounds.optimal`) in cache mode.
OPTIMAL = "optimal"


def _optimal_result(source, config: SimConfig, lowering: CacheLowering | None):
    """``optimal`` in cache mode: the exact solver, HBM only (capacity = the HBM pool)."""
    from kvsim.bounds.optimal import optimum_summary
    from kvsim.replay.driver import SimResult, resolve_tiers, scan_trace
    from kvsim.replay.metrics import summary_keys

    stream = lowering.stream if lowering is not None else (
        source if isinstance(source, CacheStream) else stream_from_events(source))
    with tempfile.TemporaryDirectory(prefix="kvsim-cache-") as tmp:
        low = lowering or write_cache_events(stream, Path(tmp) / "c.parquet", "prefix")
        facts = scan_trace(low.path, stream.block_size_tokens)
        _, costs = resolve_tiers(config, low.stream.header, facts)
    cap = costs[0].capacity_blocks
    warmup = config.warmup_count(stream.num_requests)
    opt = optimum_summary(stream, cap, warmup)
    summary = {k: float("nan") for k in summary_keys("cache")}
    for k in summary:
        if k.startswith(("evictions", "spills", "bytes", "peak", "promotions", "prefetch",
                         "write_throughs", "preemptions", "swap", "cow", "overflow",
                         "recompute", "first_compute", "preempt", "decode_critical")):
            summary[k] = 0
    summary.update(opt)
    summary.update(policy=OPTIMAL, offline=True, mode="cache", events=facts.num_rows,
                   hbm_capacity_blocks=cap, dram_capacity_blocks=0, cxl_capacity_blocks=0,
                   nvme_capacity_blocks=0)
    cfg = config.to_dict()
    cfg.update(hbm_capacity_blocks=cap, optimum="Belady with bypass, HBM only "
               "(kvsim.bounds.optimal): exact for unit-size blocks in cache mode")
    return SimResult(OPTIMAL, True, summary, pd.DataFrame(), pd.DataFrame(), cfg,
                     str(source) if not isinstance(source, CacheStream) else
                     "<cache stream>", costs, {})


def lower_for_cache(source, variant: str, out_dir: str | Path) -> CacheLowering:
    """``source``: an event file path or a :class:`CacheStream`; writes
    ``out_dir/cache-<variant>.parquet``."""
    stream = source if isinstance(source, CacheStream) else stream_from_events(source)
    return write_cache_events(stream, Path(out_dir) / f"cache-{variant}.parquet", variant)


def _source_requests(low: CacheLowering, pseudo: pd.DataFrame) -> pd.DataFrame:
    """One row per source request (arrival order): its prompt, and the sums of its pseudo
    requests' hits.  ``lookup_tokens`` = the prompt: every prompt is looked up.  A hit on
    an identified partial last block is worth its real tokens (the replay counted a full
    block): taken off the last tier column that has hits (nvme, cxl, dram, hbm)."""
    st = low.stream
    bs = st.block_size_tokens
    out = pd.DataFrame({"request_id": st.request_id, "arrival_us": st.arrival_us,
                        "prompt_tokens": st.prompt_tokens,
                        "lookup_tokens": st.prompt_tokens})
    cols = list(_HIT_COLUMNS)
    n = st.num_requests
    sums = np.zeros((n, len(cols)), np.int64)
    if len(pseudo):
        orig = low.orig_of[pseudo["request_id"].to_numpy()]
        g = pseudo[cols].groupby(orig).sum().reindex(st.request_id, fill_value=0)
        sums = g.to_numpy().astype(np.int64)
    hit_tok = sums[:, :4]
    out["hit_blocks"] = hit_tok.sum(axis=1) // bs
    out["hbm_hit_blocks"] = hit_tok[:, 0] // bs
    tails = st.tails()
    lengths = np.diff(st.offsets)
    for k in np.flatnonzero((tails > 0) & (out["hit_blocks"].to_numpy() == lengths)):
        for t in (3, 2, 1, 0):
            if hit_tok[k, t] >= bs:
                hit_tok[k, t] -= bs - tails[k]
                break
    for j, c in enumerate(cols):
        out[c] = hit_tok[:, j] if j < 4 else sums[:, j]
    # per-request columns the summary reads that cache mode does not have
    out["ttft_missed"] = False
    out["tpot_missed_tokens"] = 0
    for c in ("ttft_us", "tpot_us", "e2e_us"):
        out[c] = np.nan
    return out


def simulate_cache(source, policy, config: SimConfig, decision_log=None, *,
                   lowering: CacheLowering | None = None, on_progress=None):
    """Replay ``source`` (an event file or a :class:`CacheStream`) in cache mode under
    ``policy``.  Returns a :class:`kvsim.replay.driver.SimResult` whose summary has the keys
    of :func:`kvsim.replay.metrics.summary_keys` ``("cache")``."""
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.driver import SimResult, execute

    if policy == OPTIMAL:
        return _optimal_result(source, config, lowering)
    pol = resolve_policy(policy)
    with tempfile.TemporaryDirectory(prefix="kvsim-cache-") as tmp:
        low = lowering or lower_for_cache(source, config.cache_variant, tmp)
        n = low.stream.num_requests
        warmup = config.warmup_count(n)
        n_pseudo = len(low.orig_of)
        first = int(low.first_pseudo[warmup]) if 0 < warmup < n else 0
        inner = dataclasses.replace(config, mode="engine", warmup_fraction=0.0,
                                    warmup_requests=first if 0 < first < n_pseudo else None)
        ex = execute(low.path, pol, inner, decision_log, None, on_progress)
    warm = ex.run.C[L.C_WARM_DONE] != 0
    requests = _source_requests(low, ex.requests.frame())
    measured = low.stream.request_id[warmup:] if warmup > 0 else None
    summary = summarize(pol.name, pol.offline, ex.run.C, ex.run.Cw if warm else None,
                        measured, int(ex.run.K[L.K_WARMUP_STEP]), ex.steps, requests,
                        ex.costs, ex.facts.num_rows, block_size_tokens=ex.block_size_tokens,
                        mode="cache", warmup_requests=warmup)
    cfg = dict(ex.config)
    cfg.update(mode="cache", cache_variant=low.variant,
               warmup_fraction=config.warmup_fraction, warmup_requests=config.warmup_requests)
    return SimResult(pol.name, bool(pol.offline), summary, requests, ex.steps.empty_frame(),
                     cfg, str(source) if not isinstance(source, CacheStream) else
                     "<cache stream>", ex.costs, ex.checks)
