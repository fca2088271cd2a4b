"""The closed loop over the hybrid pool: a request trace served by vLLM 0.33's scheduler
whose KV-cache manager keeps one manager per layer group (full attention, sliding window,
Mamba), with arrivals over time and the step-time clock (docs/memory-model.md, "Hybrid
models in the closed loop").

``kvsim simulate --request-trace T --model gpt-oss-20b`` comes here (``--hybrid-pool
auto``, the default, for a model whose layers are not all full attention;
``--hybrid-pool off``: the compiled closed loop, every layer alike).  It is interpreted
Python (:class:`kvsim.engine.vllm_hybrid.HybridVllmScheduler` over
:class:`kvsim.memory.hybrid.HybridPool`), driven by the clock rules of the compiled loop
(:func:`kvsim.engine.vllm_rows.vllm_rows`): arrivals up to the step's start are added
before ``schedule()``; an idle engine jumps to the next arrival; a step lasts the
step-time model's duration of its prefill chunks and decodes, in scheduling order; a
request's first token comes at the end of the step that computes its last prompt token.
HBM only: no lower tiers, replicas, P/D, decision log, warm-up, tenant salt or
speculative drafts (each refused with one line, :func:`check_supported`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.core.errors import KvsimInputError
from kvsim.engine.vllm_hybrid import HybridVllmScheduler
from kvsim.engine.vllm_scheduler import EngineConfig as VllmConfig
from kvsim.engine.vllm_scheduler import SimRequest
from kvsim.memory.hybrid import FULL, MAMBA, SLIDING_WINDOW, HybridPool, HybridRequest
from kvsim.modes.closed.hybrid_check import HYBRID_POOL, check_supported, is_hybrid, wanted

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    pass

class CountingPool(HybridPool):
    """:class:`HybridPool` that counts, per group, the blocks held (ref count > 0), the
    hit blocks adopted and the blocks freed outside a window / past a Mamba state."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        n = len(self.groups)
        self.held = [0] * n
        self.freed = [0] * n
        self._g = 0

    def _get_new_blocks(self, n):
        self.held[self._g] += n
        return super()._get_new_blocks(n)

    def _touch(self, blocks):
        self.held[self._g] += sum(b.ref_cnt == 0 and not b.is_null for b in blocks)
        super()._touch(blocks)

    def _free_blocks(self, ordered):
        self.held[self._g] -= sum(b.ref_cnt == 1 and not b.is_null for b in ordered)
        super()._free_blocks(ordered)

    def _remove_skipped(self, g, rid, num_computed):
        self._g, before = g, self.freed_by_window
        super()._remove_skipped(g, rid, num_computed)
        self.freed[g] += self.freed_by_window - before

    def _add_computed(self, g, rid, new, num_computed):
        self._g = g
        super()._add_computed(g, rid, new, num_computed)

    def _allocate_new(self, g, rid, num_tokens):
        self._g = g
        super()._allocate_new(g, rid, num_tokens)

    def _free_group(self, g, rid):
        self._g = g  # the group whose blocks _free_blocks counts
        super()._free_group(g, rid)


class _TraceRequest(HybridRequest):
    """A trace request: its tokens are positions (``range``), its hashes the trace's."""

    def __init__(self, rid: str, num_prompt: int, hashes: np.ndarray):
        super().__init__(rid, range(0), num_prompt)
        self._all = hashes.tolist()

    def hashes(self, hash_block_size: int) -> list[int]:
        n = len(self.tokens) // hash_block_size
        if len(self._hashes) != n:
            self._hashes = self._all[:n]
        return self._hashes


class TraceScheduler(HybridVllmScheduler):
    """:class:`HybridVllmScheduler` over a :class:`CountingPool`; records each scheduled
    request's (idx, tokens before, tokens after, prompt, outputs) before the outputs."""

    def __init__(self, config: VllmConfig, groups, watermark_blocks: int):
        super().__init__(config, groups)
        self.pool = CountingPool(groups, config.num_gpu_blocks - 1, config.max_model_len,
                                 max_in_flight_tokens=config.max_num_batched_tokens)
        self.watermark_blocks = watermark_blocks
        self.hit_blocks = [0] * len(groups)
        self.sched_facts: list[tuple[int, int, int, int, int]] = []

    def _allocate_slots(self, r, num_new, hits=None, full_sequence_must_fit=False,
                        has_scheduled_reqs=True):
        got = super()._allocate_slots(r, num_new, hits, full_sequence_must_fit,
                                      has_scheduled_reqs)
        if got is not None and hits:
            for g, lst in enumerate(hits):
                self.hit_blocks[g] += sum(not b.is_null for b in lst)
        return got

    def _update_from_output(self, res):
        self.sched_facts = [(i, self.requests[i].num_computed - n, self.requests[i].num_computed,
                             self.requests[i].prompt_len, self.requests[i].num_output)
                            for i, n in res.sched]
        super()._update_from_output(res)


def trace_hashes(table, hash_block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, hashes): request ``c``'s chain hashes of its full ``hash_block_size``
    blocks of prompt + output tokens, as the compiled loop forms them
    (:func:`kvsim.engine.vllm_rows.request_hashes`); a block whose content the trace does
    not know (outputs, unhashed prompt tails) has hash 0: never cached, never a hit (the
    compiled loop's rule; vLLM, knowing the tokens, would let a resumed request hit its
    own output blocks)."""
    from kvsim.engine.vllm_rows import request_hashes
    from kvsim.jit.disk_cache import compiled_call

    df = table.df
    off, ids = table.flat_block_ids()
    i64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731
    prompt = i64(df["prompt_tokens"].to_numpy())
    out = i64(df["output_tokens"].to_numpy())
    hoff = np.zeros(len(df) + 1, np.int64)
    hoff[1:] = np.cumsum((prompt + out) // hash_block_size)
    hh = np.zeros(max(int(hoff[-1]), 1), np.int64)
    with np.errstate(over="ignore"):  # compiled by one process at a time (compiled_call)
        compiled_call(request_hashes, len(df), hash_block_size, table.block_size_tokens,
                      prompt, out, i64(df["hashed_tokens"].to_numpy()),
                      np.zeros(len(df), np.int64), i64(off), i64(ids), hoff, hh)
    return hoff, hh


def request_blocks(groups, pool: HybridPool, tokens: np.ndarray) -> np.ndarray:
    """Blocks a request of ``tokens`` tokens needs at once over every group (a sliding
    window at its admission cap, a Mamba state 1 block)."""
    need = np.zeros(len(tokens), np.int64)
    for g, spec in enumerate(groups):
        nb = -(-tokens // spec.block_size)
        if spec.kind == SLIDING_WINDOW:
            nb = np.minimum(nb, pool.admission_cap_blocks(g))
        elif spec.kind == MAMBA:
            nb = np.minimum(nb, 1)
        need += nb
    return need


def _group_label(spec) -> str:
    if spec.kind == SLIDING_WINDOW:
        return f"{spec.kind}({spec.sliding_window})/{spec.block_size}"
    return f"{spec.kind}/{spec.block_size}"


def serve_hybrid_trace(table, config, opts, groups=None, block_bytes: int | None = None,
                       on_progress=None, hashes=None, on_step=None):
    """Serve ``table`` closed loop through the hybrid pool; a
    :class:`kvsim.replay.driver.SimResult` (docs/simulate.md keys, ``hybrid_*`` keys and
    ``summary["group_rows"]``, one row per layer group).  ``groups`` / ``block_bytes``:
    the model's (:func:`kvsim.memory.hybrid.model_groups`) unless given; ``hashes``:
    ``(offsets, hashes)`` as :func:`trace_hashes` gives them, when the tokens are known (a
    recording's); ``on_step(step_result)`` is called after every engine step."""
    from kvsim.engine.cost_model import hbm_kv_capacity_bytes
    from kvsim.engine.engine_model import build_cost_model
    from kvsim.engine.timing.step_time import (
        NUM_ACC,
        acc_chunk,
        acc_decode,
        acc_reset,
        step_duration_us,
    )
    from kvsim.memory.hybrid import model_groups
    from kvsim.replay.driver import SimResult
    from kvsim.replay.metrics import _pct
    from kvsim.spec.kvsize import load_model

    model = config.model or opts.model
    cost = build_cost_model(model, config.hardware,
                            step_overhead_us=opts.engine_config(1, 0).step_overhead_us,
                            block_size_tokens=opts.block_size_tokens, timing=opts.timing)
    if groups is None:
        spec = load_model(model)
        dtype = spec.weights_dtype if spec.weights_dtype in ("fp16", "bf16") else "bf16"
        groups, _layers, block_bytes = model_groups(spec, opts.block_size_tokens, dtype)
    nblocks = config.explicit_hbm_blocks(block_bytes)
    if nblocks is None:
        nblocks = hbm_kv_capacity_bytes(cost.gpu_memory_bytes, int(cost.weight_bytes),
                                        config.gpu_memory_utilization) // block_bytes
    nblocks = int(nblocks)
    if nblocks < 1:
        raise KvsimInputError(f"HBM holds no hybrid KV block ({block_bytes} bytes each) "
                              "after the model weights; expected a larger GPU or --hbm-gb",
                              None, None, "hbm")
    ecfg = opts.engine_config(nblocks, config.seed)
    wmark = ecfg.watermark_blocks(nblocks)
    sizes = sorted({g.block_size for g in groups})
    # vLLM's count includes the null block: ``nblocks`` usable, as the compiled loop's
    vcfg = VllmConfig(block_size=int(np.lcm.reduce(sizes)), num_gpu_blocks=nblocks + 1,
                      max_num_seqs=opts.max_num_seqs,
                      max_num_batched_tokens=opts.max_num_batched_tokens,
                      long_prefill_token_threshold=opts.long_prefill_token_threshold,
                      policy="priority" if config.priority_scheduling else "fcfs",
                      scheduler_reserve_full_isl=opts.reserve_full_isl)
    sched = TraceScheduler(vcfg, groups, wmark)
    pool = sched.pool
    # requests whose prompt and output never fit (vLLM preempts them for ever): dropped
    df0 = table.df
    need = request_blocks(groups, pool, df0["prompt_tokens"].to_numpy(np.int64)
                          + df0["output_tokens"].to_numpy(np.int64) - 1)
    keep = need <= nblocks - wmark
    dropped = int((~keep).sum())
    if dropped and hashes is not None:
        raise ValueError("serve_hybrid_trace: given hashes, no request may be dropped")
    if dropped:
        kept = df0[keep].reset_index(drop=True)
        kept["request_id"] = np.arange(len(kept), dtype=kept["request_id"].dtype)
        table = type(table)(df=kept, block_size_tokens=table.block_size_tokens,
                            skipped=table.skipped, source=table.source)
    df = table.df
    N = len(df)
    hoff, hh = trace_hashes(table, pool.hash_block_size) if hashes is None else hashes
    arr = df["arrival_us"].to_numpy(np.int64)
    prompt = df["prompt_tokens"].to_numpy(np.int64)
    out = df["output_tokens"].to_numpy(np.int64)
    prio = df["request_priority"].to_numpy(np.int64) if "request_priority" in df else \
        np.zeros(N, np.int64)
    first = np.full(N, np.nan)  # times as the compiled loop keeps them: float us
    admit = np.full(N, np.nan)
    done = np.full(N, np.nan)
    hit_tok = np.zeros(N, np.int64)
    lookup_tok = prompt.copy()
    npre = np.zeros(N, np.int64)
    fp = cost.as_array()
    acc = np.empty(NUM_ACC, np.float64)
    ng = len(groups)
    peak = [0] * ng
    held_sum = [0] * ng
    step_rows = []
    now, a, steps, finished = 0.0, 0, 0, 0
    while True:
        if not sched.has_requests():
            if a >= N:
                break
            if arr[a] > now:
                now = float(arr[a])
        t_us = int(now)
        start = now
        while a < N and arr[a] <= t_us:
            n_all = int(prompt[a] + out[a])
            r = SimRequest(idx=a, request_id=str(a), all_tokens=range(n_all),
                           prompt_len=int(prompt[a]), output_len=int(out[a]),
                           priority=-int(prio[a]), arrival_time=float(arr[a]) / 1e6)
            sched._hreqs[a] = _TraceRequest(str(a), int(prompt[a]), hh[hoff[a]:hoff[a + 1]])
            sched.add_request(r)
            a += 1
        res = sched.step()
        if on_step is not None:
            on_step(res)
        acc_reset(acc)
        tokens = attended = kv_read = 0.0
        firsts = []
        tokens_at = {}  # each scheduled request's tokens before the step's output
        for i, before, after, plen, nout in sched.sched_facts:
            ntok = after - before
            tokens_at[i] = plen + nout
            tokens += ntok
            attended += ntok * float(before) + ntok * (ntok + 1.0) / 2.0
            kv_read += before + ntok
            if ntok == 1 and before == plen + nout - 1 and nout > 0:
                acc_decode(acc, float(ntok), float(before + ntok))
            else:
                acc_chunk(fp, acc, float(ntok), float(before))
                if after >= plen + nout and nout == 0:
                    firsts.append(i)
        dur = float(step_duration_us(fp, acc, tokens, attended, kv_read))
        now += dur
        for i, hit in res.new:
            admit[i] = start
            hit_tok[i] = hit
        for i, hit in res.resumed:  # a resumption looks its tokens up again (as the
            hit_tok[i] += hit           # compiled loop counts it: prompt and outputs)
            admit[i] = start            # and admit_us is the last admission
            lookup_tok[i] += tokens_at[i]
        for i in res.preempted:
            npre[i] += 1
        for i in firsts:
            if np.isnan(first[i]):
                first[i] = now
        for i in res.finished:
            done[i] = now
            sched.requests.pop(i, None)
            sched._hreqs.pop(i, None)
            sched._junction.pop(i, None)
        finished += len(res.finished)
        for g in range(ng):
            h = pool.held[g]
            held_sum[g] += h
            peak[g] = max(peak[g], h)
        step_rows.append((steps, t_us, dur, int(tokens), len(sched.running),
                          pool.num_free_blocks(), *pool.held))
        steps += 1
        if on_progress is not None and res.finished:
            on_progress(finished, N)
    ttft = first - arr
    e2e = done - arr
    tpot = np.where(out > 1, (done - first) / np.maximum(out - 1, 1), np.nan)
    import pandas as pd

    requests = pd.DataFrame({"request_id": np.arange(N), "arrival_us": arr,
                             "prompt_tokens": prompt, "output_tokens": out,
                             "admit_us": admit, "first_token_us": first, "finish_us": done,
                             "ttft_us": ttft, "tpot_us": tpot, "e2e_us": e2e,
                             "lookup_tokens": lookup_tok, "hbm_hit_tokens": hit_tok,
                             "preemptions": npre})
    cols = ["step", "time_us", "duration_us", "tokens", "running", "free_blocks"] + [
        f"held_blocks_g{g}" for g in range(ng)]
    steps_df = pd.DataFrame(step_rows, columns=cols)
    # dropped requests' prompts count as looked up and missed (docs/simulate.md, "Metrics:
    # hit rates"), as in the compiled loop
    lookup = int(lookup_tok.sum()) + int(df0["prompt_tokens"].to_numpy(np.int64)[~keep].sum())
    group_rows = [{"group": g, "kind": s.kind, "label": _group_label(s),
                   "block_size_tokens": s.block_size,
                   "sliding_window_tokens": s.sliding_window,
                   "held_blocks_peak": peak[g],
                   "held_blocks_mean": held_sum[g] / steps if steps else 0.0,
                   "hit_blocks": sched.hit_blocks[g], "freed_blocks": pool.freed[g]}
                  for g, s in enumerate(groups)]
    span_s = now / 1e6
    summary = {
        "policy": "lru", "schedule": "closed", "scheduler": "vllm", "replicas": 1,
        "router": "round_robin", "hybrid_pool": True, "timing_model": cost.timing_model,
        "requests": N, "steps": steps, "makespan_us": float(now),
        "hbm_hit_rate": float(hit_tok.sum() / lookup) if lookup else 0.0,
        "prefix_hit_rate": float(hit_tok.sum() / lookup) if lookup else 0.0,
        "prefill_tokens_saved": int(hit_tok.sum()), "lookup_tokens": lookup,
        "ttft_p50_us": _pct(ttft, 50), "ttft_p90_us": _pct(ttft, 90),
        "ttft_p99_us": _pct(ttft, 99), "tpot_p50_us": _pct(tpot, 50),
        "tpot_p99_us": _pct(tpot, 99), "e2e_p50_us": _pct(e2e, 50),
        "e2e_p99_us": _pct(e2e, 99),
        "queue_p50_us": _pct((admit - arr).astype(np.float64), 50),
        "queue_p99_us": _pct((admit - arr).astype(np.float64), 99),
        "preemptions": int(npre.sum()), "dropped_requests": dropped,
        "throughput_tokens_per_s": float(out[~np.isnan(done)].sum() / span_s) if span_s
        else 0.0,
        "hbm_pool_blocks": nblocks, "hbm_capacity_blocks": nblocks, "hybrid_block_bytes": int(block_bytes),
        "hybrid_groups": [r["label"] for r in group_rows],
        "hybrid_held_blocks_peak": peak,
        "hybrid_held_blocks_mean": [r["held_blocks_mean"] for r in group_rows],
        "hybrid_hit_blocks": list(sched.hit_blocks),
        "hybrid_freed_blocks": list(pool.freed),
        "hybrid_window_freed_blocks": int(sum(pool.freed[g] for g, s in enumerate(groups)
                                              if s.kind == SLIDING_WINDOW)),
        "group_rows": group_rows,
    }
    cfg = {"schedule": "closed", "scheduler": "vllm", "hybrid_pool": True, "model": model,
           "hardware": config.hardware, "hbm_blocks": nblocks,
           "block_bytes": int(block_bytes), "max_num_seqs": opts.max_num_seqs,
           "max_num_batched_tokens": opts.max_num_batched_tokens,
           "block_size_tokens": vcfg.block_size, "timing_model": cost.timing_model}
    return SimResult("lru", False, summary, requests, steps_df, cfg, "requests", [], {})


__all__ = ["FULL", "HYBRID_POOL", "CountingPool", "TraceScheduler", "check_supported",
           "is_hybrid", "request_blocks", "serve_hybrid_trace", "trace_hashes", "wanted"]
