"""``serve(..., pd=PdOptions)``: the two pools of :mod:`kvsim.modes.closed.disagg` built,
run and summarised (docs/disaggregation.md)."""

from __future__ import annotations

import numpy as np

from kvsim.core.errors import KvsimInputError
from kvsim.modes.closed import disagg
from kvsim.modes.closed.closed_loop import Engine, resolve_scheduler, vllm_hashes


def serve_pd(table, pol, config, pd: disagg.PdOptions, router, opts, cost, hbm_blocks,
             costs, block_bytes, off, ids, dropped, cfg_dict, on_progress=None,
             keep_pools: bool = False, python: bool = False):
    """Prefill pool, transfers, decode pool; a :class:`kvsim.replay.driver.SimResult` whose
    summary is the decode pool's with the client-level TTFT / E2E and the ``pd_*`` keys
    (``pools``: the two pools' (engines, requests, steps) when ``keep_pools``; ``python``:
    the set-up's passes for the interpreted engine, :func:`kvsim.jit.disk_cache.setup_func`)."""
    from kvsim.modes.closed import shared_tier
    from kvsim.modes.closed.closed_facts import PromptHashes, block_facts
    from kvsim.modes.closed.routing import _run_cluster
    from kvsim.modes.closed.serving_metrics import cluster_summary
    from kvsim.replay.driver import SimResult

    if opts.scheduler != "vllm":
        raise KvsimInputError("expected --scheduler vllm (or auto) with --pd: the decode side "
                              "admits the transferred KV as vLLM's KV connector does", None,
                              None, "--pd")
    if shared_tier.enabled(config):
        raise KvsimInputError("--pd with --shared-tier-gb is not supported", None, None,
                              "--pd")
    N = len(table)
    warmup = config.warmup_count(N)
    B = opts.block_size_tokens
    tp = disagg.prefill_table(table)
    # each pool gets its own copy of the arrival column: the decode pool's are overwritten
    # with the transfers' ends
    td = disagg.dataclasses.replace(table, df=table.df.copy())
    pools = []
    for k, (tab, n) in enumerate(((tp, pd.prefill), (td, pd.decode))):
        order = np.zeros(max(N, 1), dtype=np.int64)
        hashes = vllm_hashes(tab, off, ids, resolve_scheduler(tab, config, opts)[0], python)
        pools.append([Engine(tab, off, ids, pol, config, opts, cost, hbm_blocks, costs,
                             block_bytes, None, order=order, replica=w, hashes=hashes)
                      for w in range(n)])
    facts_pb = block_facts(table, off, ids, B, next_use=pol.offline, python=python)
    for e in pools[0] + pools[1]:
        e.set_block_facts(facts_pb)
    pb = PromptHashes(table, off, ids, B, python)
    _run_cluster(tp, pools[0], router, B, pb, warmup, on_progress)
    for e in pools[0]:
        e.finish()
    measured = np.arange(warmup, N) if warmup > 0 else None
    start_us = float(table.df["arrival_us"].iat[warmup]) if warmup > 0 else 0.0
    sp, rp, stp = cluster_summary(pol, pools[0], costs, N, router, dropped, warmup, start_us)
    tr = disagg.Transfers(N)
    ids_p = rp["request_id"].to_numpy(np.int64)
    tr.p_rep[ids_p] = rp["replica"].to_numpy(np.int64)
    tr.p_done_us[ids_p] = (rp["arrival_us"] + rp["ttft_us"]).to_numpy(np.float64)
    disagg.run_decode(td, pools[1], router, B, pb, tr, pd, config.link_model == "queue",
                      block_bytes, warmup)
    for e in pools[1]:
        e.finish()
    sd, rd, std = cluster_summary(pol, pools[1], costs, N, router, dropped, warmup, 0.0)
    summary = dict(sd)
    summary.update(disagg.pd_keys(tr, rd, std, table.df["arrival_us"].to_numpy(np.int64),
                                  table.df["output_tokens"].to_numpy(np.int64), measured))
    summary.update(disagg.pool_keys("pd_prefill", sp, stp, pd.prefill))
    summary.update(disagg.pool_keys("pd_decode", sd, std, pd.decode))
    summary.update(pd=f"{pd.prefill}:{pd.decode}", replicas=pd.prefill + pd.decode,
                   pd_link_bytes_per_s=pd.link_bytes_per_s,
                   pd_link_latency_us=pd.link_latency_us, pd_max_inflight=pd.max_inflight)
    summary["replica_rows"] = ([{"pool": "prefill", **r} for r in sp["replica_rows"]]
                               + [{"pool": "decode", **r, "ttft_p50_us": float("nan"),
                                   "ttft_p99_us": float("nan")} for r in sd["replica_rows"]])
    summary["timing_model"] = cost.timing_model
    summary["scheduler"] = opts.scheduler
    k = rd["request_id"].to_numpy(np.int64)
    first, _fin = disagg.first_tokens(rd, std, N)
    rd = rd.assign(pool="decode", pd_prefill_replica=tr.p_rep[k],
                   pd_prefill_done_us=tr.p_done_us[k], pd_transfer_start_us=tr.start_us[k],
                   pd_link_start_us=tr.link_us[k], pd_transfer_end_us=tr.end_us[k],
                   pd_bytes=tr.nbytes[k], pd_first_token_us=first[k])
    res = SimResult(pol.name, bool(pol.offline), summary, rd, std.assign(pool="decode"),
                    {**cfg_dict, "pd": summary["pd"]}, "requests", costs, {})
    if keep_pools:
        res.pools = {"prefill": (pools[0], rp, stp), "decode": (pools[1], rd, std),
                     "transfers": tr}
    return res
