"""The closed loop's set-up in Python, made cheaper without changing a bit (issue 34, the
per-process floor): ``estimate_load`` over numpy equals its per-request loop exactly, and a
run that is not a hybrid model's imports nothing of the hybrid pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest


def _loop(table, model, hardware, max_num_seqs, max_num_batched_tokens, hbm_blocks,
          block_size_tokens):
    """``kvsim.analysis.sizing.estimate_load`` as it was written before (one request at a
    time, ``prefill_us`` per request, sums in request order)."""
    import math

    from kvsim.analysis.sizing import LoadEstimate
    from kvsim.engine.engine_model import build_cost_model

    cost = build_cost_model(model, hardware)
    N = len(table)
    bs = int(table.block_size_tokens)
    prefill, compute_us, cold_us = 0, 0.0, 0.0
    prompts = np.asarray(table.column("prompt_tokens"), dtype=np.int64)
    outputs = np.asarray(table.column("output_tokens"), dtype=np.int64)
    off, ids = table.flat_block_ids()
    lens = np.diff(off)
    news = np.zeros(N, dtype=np.int64)
    if len(ids):
        first = np.unique(ids, return_index=True)[1]
        owner = np.repeat(np.arange(N, dtype=np.int64), lens)
        news = np.bincount(owner[first], minlength=N)
    for prompt, nids, new in zip(prompts.tolist(), lens.tolist(), news.tolist()):
        fresh = min(int(prompt), new * bs) + max(int(prompt) - nids * bs, 0)
        prefill += fresh
        compute_us += cost.prefill_us(int(prompt) - fresh, fresh)
        cold_us += cost.prefill_us(0, int(prompt))
    out = int(outputs.sum())
    step_us = cost.weight_bytes / cost.hbm_bytes_per_us + cost.step_overhead_us
    batches = max(max_num_batched_tokens, 1)
    prefill_us = compute_us + math.ceil(prefill / batches) * step_us
    cold_prefill_us = cold_us + math.ceil(int(prompts.sum()) / batches) * step_us
    mean_ctx = float(np.mean(prompts + outputs / 2.0)) if N else 1.0
    batch = float(max(max_num_seqs, 1))
    if hbm_blocks:
        batch = min(batch, max(1.0, hbm_blocks * block_size_tokens / max(mean_ctx, 1.0)))
    kv_read_us = batch * mean_ctx * cost.kv_bytes_per_token / cost.hbm_bytes_per_us
    decode_us = math.ceil(out / batch) * (step_us + kv_read_us)
    arr = np.asarray(table.column("arrival_us"), dtype=np.int64)
    span_s = float(arr.max() - arr.min()) / 1e6 if len(arr) else 0.0
    busy_s = (prefill_us + decode_us) / 1e6
    util = busy_s / span_s if span_s > 0 else float("inf")
    upper_s = (cold_prefill_us + decode_us) / 1e6
    replicas = max(1, math.ceil(upper_s / (span_s * 0.7))) if span_s > 0 else 1
    return LoadEstimate(N, span_s, int(prefill), out, busy_s, util, replicas, upper_s, batch)


@pytest.mark.parametrize("chunk_ids", [None, 1, 7])
def test_estimate_load_equals_its_loop_bit_for_bit(chunk_ids, monkeypatch):
    from kvsim.analysis import sizing

    if chunk_ids is not None:  # the first-seen count read a few ids at a time
        monkeypatch.setattr(sizing, "FIRST_SEEN_CHUNK_IDS", chunk_ids)
    from kvsim.ingest.requests import RequestTable

    assert sizing.TARGET_UTILISATION == 0.7  # as _loop has it
    rng = np.random.default_rng(11)
    for n, model in ((2000, "llama-3.1-8b"), (700, "qwen3-32b"), (1, "llama-3-8b")):
        ids = [[int(x) for x in rng.integers(0, 400, size=int(rng.integers(0, 12)))]
               for _ in range(n)]
        df = pd.DataFrame({"request_id": np.arange(n), "arrival_us": np.arange(n) * 1013,
                           "prompt_tokens": rng.integers(1, 30000, size=n),
                           "output_tokens": rng.integers(1, 900, size=n), "block_ids": ids})
        table = RequestTable(df, 512)
        for hbm in (None, 900):
            got = sizing.estimate_load(table, model, "h100-sxm", 256, 8192, hbm, 512)
            want = _loop(table, model, "h100-sxm", 256, 8192, hbm, 512)
            assert repr(got) == repr(want)  # every float to the last bit


def test_prefill_us_many_is_prefill_us_per_pair():
    from kvsim.engine.engine_model import build_cost_model

    cost = build_cost_model("llama-3.1-8b", "h100-sxm")
    rng = np.random.default_rng(3)
    start = rng.integers(0, 200_000, size=500)
    tokens = rng.integers(0, 200_000, size=500)
    many = cost.prefill_us_many(start, tokens)
    assert [float(x) for x in many] == [cost.prefill_us(int(s), int(t))
                                        for s, t in zip(start, tokens)]


def test_a_closed_loop_run_of_a_plain_model_imports_no_hybrid_pool():
    """The hybrid-pool decision (``kvsim.modes.closed.hybrid_check``) imports nothing of
    the hybrid closed loop: vLLM's Python scheduler and the hybrid pool (~8 ms a run) are
    imported by a hybrid model's run only."""
    code = ("import sys, json\n"
            "from types import SimpleNamespace as N\n"
            "from kvsim.modes.closed import cluster, hybrid_check\n"
            "print(json.dumps([hybrid_check.wanted(N(model='llama-3.1-8b'), "
            "N(hybrid_pool='auto', model='llama-3.1-8b')), hybrid_check.wanted("
            "N(model='gpt-oss-20b'), N(hybrid_pool='auto', model='gpt-oss-20b')), "
            "sorted(m for m in ('kvsim.engine.vllm_scheduler', 'kvsim.engine.vllm_hybrid', "
            "'kvsim.memory.hybrid', 'kvsim.modes.closed.hybrid_serve') "
            "if m in sys.modules)]), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ), timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stderr.strip().splitlines()[-1]) == [False, True, []]
