#!/usr/bin/env python3
"""Record what vLLM's own v1 Scheduler and KVCacheManager do over a request trace.

Runs ``vllm.v1.core.sched.scheduler.Scheduler`` (synchronous, not the async one) with
its real ``KVCacheManager`` / ``BlockPool`` on the CPU: no model weights, no worker, no
GPU.  A fake model runner returns, after each step, one deterministic output token for
every request whose scheduled chunk reaches the end of its known tokens (a finished
prefill or a decode) and nothing for a partial prefill chunk, exactly as vLLM's own
scheduler tests do.  Every engine step is written down: the scheduled requests and
their token counts, new and resumed admissions with their prefix-hit tokens, the
preemptions in the order vLLM made them, the finished requests, the free blocks, and
the KV events the scheduler published that step.

Imports only vLLM and the standard library.  Needs its own environment (see
docs/vllm-recordings.md)::

    python3 -m venv /work/venvs/vllm033
    /work/venvs/vllm033/bin/pip install vllm==0.33.0
    HF_HUB_OFFLINE=1 /work/venvs/vllm033/bin/python bench/vllm/record_scheduler.py \\
        --case mooncake200 --out tests/fixtures/vllm_sched/mooncake200.jsonl.gz

``--case NAME`` records a built-in case (``--list`` names them, ``--dump-spec NAME``
prints its spec); ``--spec FILE.json`` records a spec of your own; ``--all DIR``
records every built-in case into DIR.  The recording format is described in
docs/vllm-recordings.md (schema ``kvsim-vllm-sched`` version 1).

It is never a CI dependency: kvsim's tests read the committed recordings.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")

SCHEMA = "kvsim-vllm-sched"
SCHEMA_VERSION = 1

# ---------------------------------------------------------------------------
# Token mapping (documented in docs/vllm-recordings.md; kvsim must reproduce it)
# ---------------------------------------------------------------------------
NS_STRIDE = 1 << 27            # token id space per namespace of block ids
FILLER_NS = 10                 # namespace of per-request filler blocks
OUTPUT_BASE = 1_500_000_000    # default output tokens: OUTPUT_BASE + OUTPUT_STRIDE*idx + k
OUTPUT_STRIDE = 32768


def blk_tokens(ns: int, bs: int, h: int, n: int) -> list[int]:
    """Tokens of block id ``h`` (of ``bs`` tokens) in namespace ``ns``: first ``n``."""
    base = 1 + ns * NS_STRIDE + bs * h
    return list(range(base, base + n))


def default_output_base(idx: int) -> int:
    return OUTPUT_BASE + OUTPUT_STRIDE * idx


def expand_prompt(segments: list[dict], reqs: list[dict]) -> list[int]:
    """Expand a prompt's segment list (see the docs) into token ids."""
    out: list[int] = []
    for seg in segments:
        if "tok" in seg:
            out.extend(int(t) for t in seg["tok"])
        elif "rep" in seg:
            tok, n = seg["rep"]
            out.extend([int(tok)] * int(n))
        elif "range" in seg:
            start, n = seg["range"]
            out.extend(range(int(start), int(start) + int(n)))
        elif "blk" in seg:
            out.extend(blk_tokens(*(int(x) for x in seg["blk"])))
        elif "prompt_of" in seg:
            j = int(seg["prompt_of"])
            out.extend(expand_prompt(reqs[j]["prompt"], reqs))
        elif "output_of" in seg:
            j = int(seg["output_of"])
            r = reqs[j]
            n = int(seg.get("n", r["output_len"]))
            b = int(r["output_base"])
            out.extend(range(b, b + n))
        else:
            raise ValueError(f"unknown prompt segment {seg!r}")
    return out


# ---------------------------------------------------------------------------
# Sources: expand a trace reference in a spec into explicit requests
# ---------------------------------------------------------------------------
def _sha256_lines(lines: list[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode())
    return h.hexdigest()


def mooncake_requests(path: str, first: int, skip: int = 0) -> tuple[list[dict], dict]:
    """Mooncake JSONL -> requests.  Hash id h (512 tokens) -> blk(0, 512, h, n), the
    last block taking the first ``input_length - 512*(k-1)`` tokens of its id."""
    lines = []
    with open(path) as fh:
        for i, line in enumerate(fh):
            if i < skip:
                continue
            if len(lines) >= first:
                break
            lines.append(line)
    reqs = []
    for line in lines:
        r = json.loads(line)
        ids = r["hash_ids"]
        n_in = int(r["input_length"])
        if len(ids) != -(-n_in // 512):
            raise ValueError(f"hash_ids/input_length mismatch: {line[:80]}")
        segs = []
        for k, h in enumerate(ids):
            n = 512 if k < len(ids) - 1 else n_in - 512 * (len(ids) - 1)
            segs.append({"blk": [0, 512, int(h), n]})
        reqs.append({"arrival_ms": float(r["timestamp"]), "prompt": segs,
                     "output_len": int(r["output_length"])})
    prov = {"kind": "mooncake", "lines": [skip, skip + len(lines)],
            "sha256_of_lines": _sha256_lines(lines)}
    return reqs, prov


def agentic_requests(path: str, ns: int = 1) -> tuple[list[dict], dict]:
    """kv-cache-tester agentic JSON -> requests (parent and sub-agent requests, by
    start time).  64-token hash id h -> blk(ns, 64, h, 64); the ``in % 64`` tail tokens
    are private to the request: blk(FILLER_NS, 64, idx, in % 64)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    doc = json.loads(raw)
    bs = int(doc.get("block_size", 64))
    flat: list[tuple[float, dict]] = []

    def walk(rs, t0):
        for r in rs:
            if r.get("type") == "subagent":
                walk(r.get("requests", []), t0 + float(r.get("t", 0.0)))
            elif r.get("type") in ("n", "s"):
                flat.append((t0 + float(r["t"]), r))

    walk(doc["requests"], 0.0)
    flat.sort(key=lambda x: x[0])
    reqs = []
    for idx, (t, r) in enumerate(flat):
        n_in = int(r["in"])
        ids = r["hash_ids"]
        if len(ids) != n_in // bs:
            raise ValueError(f"hash_ids/in mismatch in request {idx}")
        segs = [{"blk": [ns, bs, int(h), bs]} for h in ids]
        if n_in % bs:
            segs.append({"blk": [FILLER_NS, bs, idx, n_in % bs]})
        reqs.append({"arrival_ms": round(t * 1000.0, 3), "prompt": segs,
                     "output_len": max(1, int(r["out"]))})
    prov = {"kind": "agentic", "file": os.path.basename(path),
            "sha256": hashlib.sha256(raw).hexdigest(), "block_size": bs}
    return reqs, prov


# ---------------------------------------------------------------------------
# Built-in cases (the committed fixtures)
# ---------------------------------------------------------------------------
_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser (the draw kvsim.engine.vllm_spec makes, written again here:
    the recorder imports nothing of kvsim)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _draft_uniform_m(seed: int, i: int, gen: int, j: int) -> int:
    """Draft j of request i after gen output tokens is accepted when this < p * 2**53."""
    return _mix64(seed ^ _mix64(i ^ _mix64(gen * 64 + j))) >> 11


def _engine(**kw) -> dict:
    e = {
        "block_size": 16,
        "num_gpu_blocks": 10001,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "policy": "fcfs",
        "enable_prefix_caching": True,
        "scheduler_reserve_full_isl": True,
        "watermark": 0.0,
        "max_model_len": None,
    }
    e.update(kw)
    return e


DEFAULT_CLOCK = {"step_base_ms": 10.0, "per_token_ms": 0.05, "ignore_timestamps": False}


def _clock(**kw) -> dict:
    c = dict(DEFAULT_CLOCK)
    c.update(kw)
    return c


def _distinct(idx: int, n: int, ns: int = 3, bs: int = 16) -> list[dict]:
    """n tokens private to request idx (namespace ns, one block id per request)."""
    return [{"blk": [ns, 1 << 16, idx, n]}]


def case_mooncake200() -> dict:
    return {
        "name": "mooncake200",
        "description": "First 200 requests of the Mooncake conversation trace at their "
                       "real lengths, arriving per their timestamps on the step clock.",
        "engine": _engine(),
        "clock": _clock(),
        "source": {"kind": "mooncake", "trace": "mooncake/conversation_trace.jsonl",
                   "first": 200},
    }


def case_agentic() -> dict:
    return {
        "name": "agentic_0505",
        "description": "One Claude Code agentic session (kv-cache-tester trace_0505: "
                       "8 turns, 11k-45k-token prompts, 64-token hash blocks) on 16-token "
                       "vLLM blocks, arrivals at the trace's seconds.",
        "engine": _engine(num_gpu_blocks=4651),
        "clock": _clock(),
        "source": {"kind": "agentic", "trace": "claude-code-agentic/trace_0505.json"},
    }


def case_overload() -> dict:
    # 48 requests, 200-token prompts sharing a 64-token system prompt, 60-token
    # outputs, all at t=0, on 64 usable blocks: admission blocks, decode preempts.
    reqs = []
    for i in range(48):
        reqs.append({"arrival_ms": 0.0,
                     "prompt": [{"blk": [2, 64, 0, 64]}] + _distinct(i, 136),
                     "output_len": 60})
    return {
        "name": "overload",
        "description": "Synthetic overload: 48 requests (64 shared + 136 private prompt "
                       "tokens, 60 output tokens) at once on 64 usable 16-token blocks.",
        "engine": _engine(num_gpu_blocks=65, max_num_seqs=16, max_num_batched_tokens=512,
                          max_model_len=512),
        "clock": _clock(),
        "requests": reqs,
    }


def case_chunked() -> dict:
    reqs = []
    lens = [3000, 2500, 4000, 1200, 3500, 800]
    for i, n in enumerate(lens):
        shared = [{"blk": [2, 1024, 7, 1024]}] if i % 2 == 0 else []
        reqs.append({"arrival_ms": 20.0 * i,
                     "prompt": shared + _distinct(i, n - (1024 if shared else 0)),
                     "output_len": 24})
    return {
        "name": "chunked_prefill",
        "description": "Long prompts (0.8k-4k tokens, every other one starting with the "
                       "same 1024 tokens) through a 1024-token step budget with "
                       "long_prefill_token_threshold 512: every prompt is chunked.",
        "engine": _engine(num_gpu_blocks=2001, max_num_seqs=8, max_num_batched_tokens=1024,
                          long_prefill_token_threshold=512, max_model_len=8192),
        "clock": _clock(),
        "requests": reqs,
    }


def case_priority() -> dict:
    reqs = []
    prio = [2, 2, 2, 2, 1, 0, 1, 0, 2, 0]
    for i, p in enumerate(prio):
        arrival = [0.0, 0.0, 1.0, 1.0][i] if i < 4 else 40.0 + 15.0 * (i - 4)
        reqs.append({"arrival_ms": arrival,
                     "prompt": [{"blk": [2, 64, 1, 64]}] + _distinct(i, 96 + 16 * (i % 3)),
                     "output_len": 40, "priority": p})
    return {
        "name": "priority",
        "description": "Priority scheduling: four priority-2 requests start (two at "
                       "0 ms, two at 1 ms), then priority 0/1 requests arrive on a pool "
                       "too small for all.  A waiting request never preempts; when a "
                       "running request cannot grow, the victim is the running request "
                       "with the largest (priority, arrival_time), ties going to the "
                       "earliest in the running list.",
        "engine": _engine(num_gpu_blocks=61, max_num_seqs=8, max_num_batched_tokens=512,
                          policy="priority", max_model_len=512),
        "clock": _clock(),
        "requests": reqs,
    }


def case_salted() -> dict:
    reqs = []
    # two tenants send the same three prompts; tenant B a little later
    for tenant, salt, t0 in (("A", "tenant-a", 0.0), ("B", "tenant-b", 400.0)):
        for j in range(3):
            reqs.append({"arrival_ms": t0 + 100.0 * j,
                         "prompt": [{"blk": [2, 256, 3, 256]}, {"blk": [4, 64, j, 40]}],
                         "output_len": 8, "cache_salt": salt})
    # and an unsalted client with the same prompt
    reqs.append({"arrival_ms": 800.0,
                 "prompt": [{"blk": [2, 256, 3, 256]}, {"blk": [4, 64, 0, 40]}],
                 "output_len": 8})
    return {
        "name": "salted_tenants",
        "description": "Two tenants (cache_salt 'tenant-a' / 'tenant-b') send the same "
                       "three prompts (a shared 256-token prefix): each tenant hits only "
                       "its own blocks; a final unsalted request hits neither.",
        "engine": _engine(num_gpu_blocks=1001, max_num_seqs=8, max_num_batched_tokens=1024,
                          max_model_len=1024),
        "clock": _clock(),
        "requests": reqs,
    }


def case_reset() -> dict:
    reqs = []
    for i in range(4):
        reqs.append({"arrival_ms": 10.0 * i,
                     "prompt": [{"blk": [2, 128, 5, 128]}] + _distinct(i, 40),
                     "output_len": 20})
    # the same four prompts again, well after the first wave finished
    for i in range(4):
        reqs.append({"arrival_ms": 5000.0 + 10.0 * i,
                     "prompt": [{"prompt_of": i}], "output_len": 20})
    # and again after an idle reset
    for i in range(2):
        reqs.append({"arrival_ms": 10000.0 + 10.0 * i,
                     "prompt": [{"prompt_of": i}], "output_len": 20})
    return {
        "name": "reset",
        "description": "reset_prefix_cache: refused at step 3 (requests hold blocks), "
                       "forced at step 25 with reset_running_requests=True (all running "
                       "requests preempted, cache cleared), and accepted when idle "
                       "before the third wave (no hits after it).",
        "engine": _engine(num_gpu_blocks=501, max_num_seqs=8, max_num_batched_tokens=512,
                          max_model_len=1024),
        "clock": _clock(),
        "requests": reqs,
        "actions": [
            {"at_step": 3, "do": "reset_prefix_cache", "reset_running_requests": False},
            {"at_step": 25, "do": "reset_prefix_cache", "reset_running_requests": True},
            {"before_arrival_of": 8, "do": "reset_prefix_cache",
             "reset_running_requests": False},
        ],
    }


def case_multiturn() -> dict:
    reqs = [
        # conversation 0: 40-token prompt, 10 output tokens
        {"arrival_ms": 0.0, "prompt": [{"blk": [5, 64, 0, 40]}], "output_len": 10},
        # turn 2: whole turn 1 (prompt + output) + 8 new tokens -> hits 48 tokens
        {"after": {"req": 0, "delay_ms": 100.0},
         "prompt": [{"prompt_of": 0}, {"output_of": 0}, {"blk": [5, 64, 1, 8]}],
         "output_len": 12},
        # turn 3 on top of turn 2
        {"after": {"req": 1, "delay_ms": 100.0},
         "prompt": [{"prompt_of": 1}, {"output_of": 1}, {"blk": [5, 64, 2, 30]}],
         "output_len": 5},
        # conversation 1: 100-token prompt, 60 output tokens (decode fills blocks)
        {"arrival_ms": 0.0, "prompt": [{"blk": [5, 128, 3, 100]}], "output_len": 60},
        {"after": {"req": 3, "delay_ms": 50.0},
         "prompt": [{"prompt_of": 3}, {"output_of": 3}, {"blk": [5, 64, 4, 20]}],
         "output_len": 4},
        # the same block-aligned 64-token prompt twice: the hit stops at 48 tokens (at
        # most num_tokens - 1, whole blocks), so block 3 is computed again and stored
        # under a hash that is already cached (vLLM does not deduplicate)
        {"arrival_ms": 0.0, "prompt": [{"blk": [5, 64, 9, 64]}], "output_len": 3},
        {"after": {"req": 5, "delay_ms": 10.0}, "prompt": [{"prompt_of": 5}],
         "output_len": 3},
    ]
    return {
        "name": "multiturn_output_reuse",
        "description": "Multi-turn chats whose next prompt is the previous prompt + the "
                       "previous output + new user tokens: the output tokens' KV (hashed "
                       "as decode fills blocks) is reused; turn 2 of the first chat hits "
                       "48 tokens (the last sampled token is never computed).  Also one "
                       "block-aligned 64-token prompt sent twice: the repeat hits 48 "
                       "tokens and stores block 3 again under a hash already cached.",
        "engine": _engine(num_gpu_blocks=201, max_num_seqs=8, max_num_batched_tokens=512,
                          max_model_len=1024),
        "clock": _clock(),
        "requests": reqs,
    }


def case_preempt_heavy() -> dict:
    reqs = []
    for i in range(12):
        reqs.append({"arrival_ms": 5.0 * i,
                     "prompt": [{"blk": [2, 32, 9, 32]}] + _distinct(i, 24 + 8 * (i % 4)),
                     "output_len": 120 + 10 * (i % 3)})
    return {
        "name": "preempt_heavy",
        "description": "Long decodes on a tiny pool: 12 requests with 56-80-token prompts "
                       "and 120-140 output tokens on 40 usable blocks; running requests "
                       "keep preempting the newest one, which recomputes on resume.",
        "engine": _engine(num_gpu_blocks=41, max_num_seqs=8, max_num_batched_tokens=256,
                          max_model_len=512),
        "clock": _clock(),
        "requests": reqs,
    }


def case_spec_decode() -> dict:
    reqs = []
    for i in range(12):
        reqs.append({"arrival_ms": 5.0 * i,
                     "prompt": [{"blk": [2, 32, 9, 32]}] + _distinct(i, 25 + 8 * (i % 4)),
                     "output_len": 120 + 10 * (i % 3)})
    return {
        "name": "spec_decode",
        "description": "Speculative decoding (n-gram, k = 3 drafts, acceptance 0.7 drawn "
                       "as kvsim draws it, seed 0) on preempt_heavy's tiny pool: 12 "
                       "requests with 57-81-token prompts and 120-140 output tokens on 40 "
                       "usable blocks; drafts take budget and blocks, preemptions drop them.",
        "engine": _engine(num_gpu_blocks=41, max_num_seqs=8, max_num_batched_tokens=256,
                          max_model_len=512, num_speculative_tokens=3,
                          spec_acceptance_rate=0.7, spec_seed=0),
        "clock": _clock(),
        "requests": reqs,
    }


def case_offload(policy: str = "lru", name: str = "offload_lru") -> dict:
    """vLLM's native CPU offloading (OffloadingConnector, CPU tier of 20 chunks)."""
    docs = [0, 1, 2, 3, 4, 5, 0, 6, 1, 7, 2, 3, 8, 0, 4, 9, 5, 1, 6, 2, 7, 0, 3, 8,
            4, 1, 9, 5, 2, 6, 0, 7, 3, 1, 8, 4]
    reqs = []
    for i, d in enumerate(docs):
        # a 64-token shared document (4 blocks) + a private question of 10-40 tokens
        reqs.append({"arrival_ms": 15.0 * i,
                     "prompt": [{"blk": [6, 64, d, 64]}] + _distinct(i, 10 + 10 * (i % 4)),
                     "output_len": 3 + (i % 3)})
    # two follow-up turns: the previous prompt + output + new tokens
    for j, src in enumerate((0, 5)):
        reqs.append({"after": {"req": src, "delay_ms": 400.0},
                     "prompt": [{"prompt_of": src}, {"output_of": src},
                                {"blk": [7, 32, j, 20]}], "output_len": 4})
    return {
        "name": name,
        "description": f"vLLM's native CPU offloading ({policy}): 38 requests over 10 "
                       "shared 64-token documents on a 24-block GPU pool and a 36-chunk "
                       "CPU tier; chunked prefill (64-token budget), 3 sequences at once: "
                       "stores as blocks are computed, CPU evictions, loads on a CPU hit.",
        "engine": _engine(num_gpu_blocks=25, max_num_seqs=3, max_num_batched_tokens=64,
                          max_model_len=256),
        "clock": _clock(),
        "requests": reqs,
        "offload": {"cpu_blocks": 36, "eviction_policy": policy, "store_threshold": 0},
    }


def case_offload_mooncake() -> dict:
    """vLLM's native CPU offloading on the first 150 Mooncake requests (512-token blocks)."""
    return {
        "name": "offload_mooncake150",
        "description": "vLLM's native CPU offloading (lru) on the first 150 requests of the "
                       "Mooncake conversation trace at their real lengths and timestamps: "
                       "512-token blocks (the trace's), 260 GPU blocks, a 1,000-chunk CPU "
                       "tier; preemptions, GPU and CPU evictions, loads on CPU hits.",
        "engine": _engine(block_size=512, num_gpu_blocks=261, max_num_seqs=16),
        "clock": _clock(),
        "source": {"kind": "mooncake", "trace": "mooncake/conversation_trace.jsonl",
                   "first": 150},
        "offload": {"cpu_blocks": 1000, "eviction_policy": "lru", "store_threshold": 0},
    }


CASES = {
    "offload_lru": case_offload,
    "offload_mooncake150": case_offload_mooncake,
    "offload_arc": lambda: case_offload("arc", "offload_arc"),
    "mooncake200": case_mooncake200,
    "agentic_0505": case_agentic,
    "overload": case_overload,
    "chunked_prefill": case_chunked,
    "priority": case_priority,
    "salted_tenants": case_salted,
    "reset": case_reset,
    "multiturn_output_reuse": case_multiturn,
    "preempt_heavy": case_preempt_heavy,
    "spec_decode": case_spec_decode,
}

# Recordings whose stored blocks carry their token ids inline ("t"); the others
# reference the request's tokens ("r", "b") to stay small.
INLINE_TOKEN_LIMIT = 20000


# ---------------------------------------------------------------------------
# Compact encodings
# ---------------------------------------------------------------------------
def runs(ids: list[int]) -> list:
    """[3,4,5,9,8,7,2] -> [[3,5],[9,7],2]: a run first..last stepping by +1 or -1."""
    out: list = []
    i = 0
    n = len(ids)
    while i < n:
        j = i
        if i + 1 < n and abs(ids[i + 1] - ids[i]) == 1:
            d = ids[i + 1] - ids[i]
            while j + 1 < n and ids[j + 1] - ids[j] == d:
                j += 1
        out.append([ids[i], ids[j]] if j > i else ids[i])
        i = j + 1
    return out


# ---------------------------------------------------------------------------
# The recorder
# ---------------------------------------------------------------------------
class _CapturePublisher:
    """Stands in for vLLM's event publisher: keeps the batches the scheduler publishes."""

    def __init__(self):
        self.batches = []

    def publish(self, batch):
        self.batches.append(batch)

    def shutdown(self):
        pass


TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 32000,
    "max_position_embeddings": 1 << 20, "torch_dtype": "float16",
    "rms_norm_eps": 1e-6,
}


def _offload_hooks(sched, off: dict) -> dict:
    """Observe the OffloadingConnector's manager (observation only): every prepare_load
    (request, chunks), every prepare_store's stored chunks and evictions, as vLLM's
    scheduler side makes them.  Keys are vLLM block hashes (the group index dropped)."""
    from vllm.utils.hashing import get_hash_fn_by_name  # noqa: F401 (vLLM imported)
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
    from vllm.v1.kv_offload.base import get_offload_block_hash

    mgr = sched.connector.connector_scheduler.manager
    if mgr._num_chunks != int(off["cpu_blocks"]):
        raise RuntimeError(f"the CPU tier has {mgr._num_chunks} chunks, wanted "
                           f"{off['cpu_blocks']}")
    log: dict = {"load": [], "store": [], "evict": []}

    def h(k):
        return maybe_convert_block_hash(get_offload_block_hash(k))

    def rid(ctx):
        return ctx.req_id

    orig_load, orig_store = mgr.prepare_load, mgr.prepare_store

    def prepare_load(keys, req_context):
        out = orig_load(keys, req_context)
        log["load"].append((rid(req_context), [h(k) for k in keys]))
        return out

    def prepare_store(keys, req_context):
        out = orig_store(keys, req_context)
        if out is not None:
            log["evict"].extend(h(k) for k in out.evicted_keys)
            if out.keys_to_store:
                log["store"].append((rid(req_context), [h(k) for k in out.keys_to_store]))
        return out

    mgr.prepare_load, mgr.prepare_store = prepare_load, prepare_store

    # scheduler_output.finished_req_ids is a set of request-id strings: vLLM iterates it
    # (stores, then on_request_finished re-ranks) in string-hash order, which Python seeds
    # per process.  Iterate it in the order the requests finished (as kvsim does), so
    # a recording with two requests finishing in one step is reproducible.
    finish_order: list[str] = []
    orig_free = sched._free_request

    def _free_request(request, *a, **kw):
        finish_order.append(request.request_id)
        return orig_free(request, *a, **kw)

    orig_meta = sched._build_kv_connector_meta

    def _build_kv_connector_meta(connector, so):
        fin = so.finished_req_ids
        if fin and len(fin) > 1:
            so.finished_req_ids = [r for r in finish_order if r in fin]
        finish_order[:] = [r for r in finish_order if not fin or r not in fin]
        return orig_meta(connector, so)

    sched._free_request = _free_request
    sched._build_kv_connector_meta = _build_kv_connector_meta
    return log


def _tiny_model_dir() -> str:
    """A local model folder holding only a config.json: no weights, no tokenizer."""
    d = tempfile.mkdtemp(prefix="kvsim-vllm-model-")
    cfg = TINY_MODEL
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return d


def resolve_spec(spec: dict, traces_dir: str) -> dict:
    """Expand the spec's source (if any) into explicit requests; fill defaults."""
    spec = copy.deepcopy(spec)
    src = spec.get("source")
    if src is not None:
        path = os.path.join(traces_dir, src["trace"])
        if src["kind"] == "mooncake":
            reqs, prov = mooncake_requests(path, int(src["first"]), int(src.get("skip", 0)))
        elif src["kind"] == "agentic":
            reqs, prov = agentic_requests(path, int(src.get("ns", 1)))
        else:
            raise ValueError(f"unknown source kind {src['kind']!r}")
        src["provenance"] = prov
        spec["requests"] = reqs
    for i, r in enumerate(spec["requests"]):
        r.setdefault("id", f"{i:05d}")
        r.setdefault("priority", 0)
        r.setdefault("cache_salt", None)
        r.setdefault("output_base", default_output_base(i))
        if r["output_len"] > OUTPUT_STRIDE and "output_base" not in r:
            raise ValueError("output_len too long for the default output tokens")
        if "after" in r and r["after"]["req"] >= i:
            raise ValueError("'after' must name an earlier request")
    spec.setdefault("actions", [])
    spec["clock"] = {**DEFAULT_CLOCK, **spec.get("clock", {})}
    spec["engine"] = {**_engine(), **spec.get("engine", {})}
    return spec


def record(spec: dict, out_path: str, traces_dir: str, check_every: int = 1,
           verbose: bool = True) -> dict:
    t_start = time.time()
    spec = resolve_spec(spec, traces_dir)
    eng = spec["engine"]
    clock = spec["clock"]
    reqs = spec["requests"]
    prompts = [expand_prompt(r["prompt"], reqs) for r in reqs]
    bs = int(eng["block_size"])

    max_model_len = eng.get("max_model_len")
    need = max(len(p) + r["output_len"] for p, r in zip(prompts, reqs))
    if max_model_len is None:
        max_model_len = -(-need // bs) * bs
    if need > max_model_len:
        raise ValueError(f"a request needs {need} tokens > max_model_len {max_model_len}")
    eng["max_model_len"] = max_model_len

    import torch
    import vllm
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (
        get_none_hash_seed,
        get_request_block_hasher,
        init_none_hash,
        maybe_convert_block_hash,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.kv_offload.base import get_offload_block_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    model_dir = _tiny_model_dir()
    try:
        model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                   dtype="float16", max_model_len=max_model_len, seed=0)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    # speculative decoding (n-gram drafts, no lookahead slots): the fake runner proposes
    # k drafts after every sampled token and accepts a prefix of them, drawn as kvsim
    # draws it (kvsim.engine.vllm_spec), so a recording checks the scheduler's handling
    # of drafts, not the drafter
    num_spec = int(eng.get("num_speculative_tokens") or 0)
    spec_kw = {}
    if num_spec:
        from vllm.config import SpeculativeConfig
        from vllm.v1.outputs import DraftTokenIds

        spec_kw["speculative_config"] = SpeculativeConfig(
            method="ngram", num_speculative_tokens=num_spec, prompt_lookup_max=num_spec,
            prompt_lookup_min=1)
        eng.setdefault("spec_acceptance_rate", 1.0)
        eng.setdefault("spec_seed", 0)
        eng["spec_lookahead"] = False
    sched_config = SchedulerConfig(
        max_num_seqs=eng["max_num_seqs"],
        max_num_batched_tokens=eng["max_num_batched_tokens"],
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=eng["enable_chunked_prefill"],
        long_prefill_token_threshold=eng["long_prefill_token_threshold"],
        policy=eng["policy"],
        scheduler_reserve_full_isl=eng["scheduler_reserve_full_isl"],
        watermark=eng["watermark"],
        async_scheduling=False,
    )
    cache_config = CacheConfig(block_size=bs,
                               enable_prefix_caching=eng["enable_prefix_caching"])
    off = spec.get("offload")  # vLLM's native CPU offloading (OffloadingConnector)
    kv_transfer = None
    if off is not None:
        from vllm.config import KVTransferConfig
        # one offloaded chunk = one GPU block (block_size = the GPU block size, vLLM's
        # default); its bytes as the CPU spec computes them (2 x bs x 1 head x 1 dim x
        # float32, one layer), rounded to 4 KiB, so that cpu_bytes_to_use gives exactly
        # off["cpu_blocks"] chunks (checked below)
        chunk_bytes = -(-(2 * bs * 4) // 4096) * 4096
        kv_transfer = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={
                "cpu_bytes_to_use": int(off["cpu_blocks"]) * chunk_bytes,
                "block_size": bs,
                "eviction_policy": off.get("eviction_policy", "lru"),
                "store_threshold": int(off.get("store_threshold", 0)),
                # loads inside the step that schedules them (no WAITING_FOR_REMOTE_KVS
                # round trip): kvsim counts loaded tokens as computed at admission
                "sync_load_budget_bytes": 1 << 50,
            })
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=sched_config, cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"),
        **spec_kw,
        kv_transfer_config=kv_transfer,
    )
    num_blocks = int(eng["num_gpu_blocks"])
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(
            ["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                         dtype=torch.float32))],
    )
    cache_config.num_gpu_blocks = num_blocks
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(vllm_config),
                      block_size=bs, hash_block_size=bs, log_stats=True)
    capture = _CapturePublisher()
    sched.kv_event_publisher = capture  # observe what update_from_output publishes
    off_log = _offload_hooks(sched, off) if off is not None else None

    preempt_order: list[str] = []
    _orig_preempt = sched._preempt_request

    def _recording_preempt(request, *a, **kw):  # observation only
        preempt_order.append(request.request_id)
        return _orig_preempt(request, *a, **kw)

    sched._preempt_request = _recording_preempt

    hash_algo = cache_config.prefix_caching_hash_algo
    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(bs, hash_fn)

    id_to_idx = {r["id"]: i for i, r in enumerate(reqs)}
    vreqs: dict[int, object] = {}
    req_hash_index: dict[int, dict[int, int]] = {}   # idx -> {external hash: block index}

    def make_request(i: int, arrival_ms: float):
        r = reqs[i]
        sp = SamplingParams(max_tokens=r["output_len"], ignore_eos=True, temperature=0.0)
        return Request(request_id=r["id"], prompt_token_ids=list(prompts[i]),
                       sampling_params=sp, pooling_params=None,
                       arrival_time=arrival_ms / 1000.0, cache_salt=r["cache_salt"],
                       priority=int(r["priority"]), block_hasher=block_hasher)

    # hash interning: vLLM's external (int64) hash -> small id, in order of appearance
    intern: dict[int, int] = {}
    hash_values: list[int] = []

    def hid(h) -> int:
        k = intern.get(h)
        if k is None:
            k = len(hash_values)
            intern[h] = k
            hash_values.append(h)
        return k

    def locate(first_hash: int, candidates: list[int]) -> tuple[int, int]:
        for i in candidates:
            idx_map = req_hash_index.setdefault(i, {})
            r = vreqs[i]
            if len(idx_map) < len(r.block_hashes):
                for k in range(len(idx_map), len(r.block_hashes)):
                    idx_map.setdefault(maybe_convert_block_hash(r.block_hashes[k]), k)
            k = idx_map.get(first_hash)
            if k is not None:
                return i, k
        raise RuntimeError("a BlockStored event matched no scheduled request")

    # arrivals
    pending = []          # (arrival_ms, idx) for known times
    dependents: dict[int, list[int]] = {}
    for i, r in enumerate(reqs):
        if "after" in r:
            dependents.setdefault(int(r["after"]["req"]), []).append(i)
        else:
            t = 0.0 if clock["ignore_timestamps"] else float(r.get("arrival_ms", 0.0))
            pending.append((t, i))
    pending.sort()
    arrival_ms: dict[int, float] = {i: t for t, i in pending}
    actions_by_step: dict[int, list[dict]] = {}
    actions_before: dict[int, list[dict]] = {}
    for a in spec["actions"]:
        if a.get("do") != "reset_prefix_cache":
            raise ValueError(f"unknown action {a!r}")
        if "at_step" in a:
            actions_by_step.setdefault(int(a["at_step"]), []).append(a)
        elif "before_arrival_of" in a:
            actions_before.setdefault(int(a["before_arrival_of"]), []).append(a)
        else:
            raise ValueError(f"action without a trigger: {a!r}")

    inline_tokens = sum(len(p) + r["output_len"] for p, r in zip(prompts, reqs)) \
        <= INLINE_TOKEN_LIMIT

    header = {
        "kind": "header", "schema": SCHEMA, "version": SCHEMA_VERSION,
        "case": spec["name"], "description": spec.get("description", ""),
        "vllm_version": vllm.__version__,
        "scheduler": "vllm.v1.core.sched.scheduler.Scheduler (synchronous)",
        "torch_version": torch.__version__, "device": "cpu",
        "model_config": {**TINY_MODEL, "note": "config.json only; no weights are "
                         "loaded and no model runs (a fake runner samples tokens)"},
        "engine": eng,
        "kv_cache": {"num_gpu_blocks": num_blocks, "usable_blocks": num_blocks - 1,
                     "null_block": 0, "hash_algo": hash_algo,
                     "event_hashes": "interned ids of vLLM's published int64 hashes "
                                     "(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)",
                     "none_hash_seed": get_none_hash_seed(),
                     "medium": "GPU", "group_idx": 0},
        "clock": {**clock, "definition":
                  "T_0 = 0; t_ms is written on the steps where requests arrive; "
                  "before step k's schedule() every request with arrival_ms <= "
                  "T_k is added (by arrival_ms, then index); T_{k+1} = T_k + step_base_ms "
                  "+ per_token_ms * tokens scheduled in step k; when the scheduler holds no "
                  "request, or a step schedules nothing, T moves on to the next arrival "
                  "(idle time is not a step); an 'after' request arrives at "
                  "T_{k+1} + delay_ms where k is the step its predecessor finished in; "
                  "ignore_timestamps puts every timed arrival at 0"},
        "token_mapping": {
            "blk": "blk [ns, bs, h, n] = tokens 1 + ns*2**27 + bs*h + o for o in 0..n-1",
            "ns_stride": NS_STRIDE, "filler_ns": FILLER_NS,
            "output": "output token k of a request = output_base + k",
            "default_output_base": f"{OUTPUT_BASE} + {OUTPUT_STRIDE}*index",
            "mooncake": "hash id h -> blk [0, 512, h, n], n = 512 except the last block "
                        "(input_length - 512*(len(hash_ids)-1))",
            "agentic": "64-token hash id h -> blk [1, 64, h, 64]; the in % 64 tail -> "
                       "blk [10, 64, index, in % 64]",
        },
        "stored_tokens": "inline" if inline_tokens else "by reference",
        "block_ids": True,
        "source": spec.get("source"),
        "actions": spec["actions"],
        "num_requests": len(reqs),
    }
    if off is not None:
        header["offload"] = {**off, "connector": "OffloadingConnector (scheduler side; "
                             "a fake worker completes every job in its step)",
                             "offload_block_tokens": bs, "offload_prompt_only": True,
                             "finished_req_ids": "iterated in finish order (a set in vLLM)",
                             "sync_load_budget_bytes": 1 << 50}

    lines_out: list[str] = [json.dumps(header, separators=(",", ":"))]
    for i, r in enumerate(reqs):
        rec = {"kind": "request", "idx": i, "id": r["id"], "prompt": r["prompt"],
               "prompt_len": len(prompts[i]), "output_len": r["output_len"],
               "output_base": r["output_base"], "priority": r["priority"],
               "cache_salt": r["cache_salt"]}
        if "after" in r:
            rec["after"] = r["after"]
        else:
            rec["arrival_ms"] = arrival_ms[i]
        lines_out.append(json.dumps(rec, separators=(",", ":")))

    T = 0.0
    step = 0
    pi = 0
    finished_count = 0
    totals = {"steps": 0, "preemptions": 0, "stored_events": 0, "stored_blocks": 0,
              "removed_blocks": 0, "cleared": 0, "scheduled_tokens": 0,
              "new_hit_tokens": 0, "new_query_tokens": 0, "resumed_hit_tokens": 0,
              "vllm_prefix_cache": {"requests": 0, "queries": 0, "hits": 0,
                                    "preempted_requests": 0, "preempted_queries": 0,
                                    "preempted_hits": 0},
              "resets": [], "duplicate_stores": 0}
    arrival_step: dict[int, int] = {}
    finish_step: dict[int, int] = {}
    live_cached = 0        # stored - removed since the last clear (for the self-check)
    live_count: dict = {}  # hash -> cached blocks with it (duplicates are possible)
    step_records: list[str] = []

    def run_actions(acts, rec):
        for a in acts:
            ok = sched.reset_prefix_cache(
                reset_running_requests=bool(a.get("reset_running_requests", False)))
            rec.setdefault("actions", []).append(
                {"do": "reset_prefix_cache",
                 "reset_running_requests": bool(a.get("reset_running_requests", False)),
                 "ok": bool(ok)})
            totals["resets"].append({"step": step, "ok": bool(ok)})

    n_total = len(reqs)
    while finished_count < n_total:
        rec: dict = {"kind": "step", "step": step}
        if not sched.has_requests():
            if pi < len(pending) and pending[pi][0] > T:
                T = pending[pi][0]
            elif pi >= len(pending):
                raise RuntimeError("no unfinished request and nothing left to arrive")
        arrived = []
        preempt_order.clear()
        while pi < len(pending) and pending[pi][0] <= T:
            i = pending[pi][1]
            pi += 1
            if i in actions_before:
                run_actions(actions_before.pop(i), rec)
            vr = make_request(i, arrival_ms[i])
            vreqs[i] = vr
            sched.add_request(vr)
            arrival_step[i] = step
            arrived.append(i)
        if arrived:
            rec["arrived"] = arrived
            rec["t_ms"] = round(T, 3)     # written on arrival steps only
        if step in actions_by_step:
            run_actions(actions_by_step.pop(step), rec)
        reset_preempted = [id_to_idx[x] for x in preempt_order]
        preempt_order.clear()

        # vLLM 0.33's SchedulerOutput lists resumed requests among the new ones (the V2
        # model runner path), so tell them apart by their status before schedule().
        was_preempted = {r.request_id for r in sched.requests.values()
                         if r.status == RequestStatus.PREEMPTED}
        so = sched.schedule()
        nst = so.num_scheduled_tokens
        sched_list = []
        for rid, n in nst.items():
            sched_list.append([id_to_idx[rid], n])
        rec["sched"] = sched_list
        blocks = []
        for nr in so.scheduled_new_reqs:        # new and resumed: the whole block table
            blocks.append([id_to_idx[nr.req_id], runs(list(nr.block_ids[0]))])
        cr = so.scheduled_cached_reqs
        for rid, nb in zip(cr.req_ids, cr.new_block_ids):
            if nb is not None and nb[0]:        # running: the blocks appended this step
                blocks.append([id_to_idx[rid], runs(list(nb[0]))])
        if blocks:
            rec["blocks"] = blocks
        admitted = {r.req_id for r in so.scheduled_new_reqs}
        admitted.update(so.scheduled_cached_reqs.resumed_req_ids)
        resumed_ids = admitted & was_preempted
        new_ids = admitted - resumed_ids
        new_rec, res_rec = [], []
        for rid in nst:                     # scheduling order
            if rid not in new_ids and rid not in resumed_ids:
                continue
            i = id_to_idx[rid]
            hit = vreqs[i].num_computed_tokens - nst[rid]
            if rid in new_ids:
                new_rec.append([i, hit])
                totals["new_hit_tokens"] += hit
                totals["new_query_tokens"] += vreqs[i].num_tokens
            else:
                res_rec.append([i, hit])
                totals["resumed_hit_tokens"] += hit
        if new_rec:
            rec["new"] = new_rec
        if res_rec:
            rec["resumed"] = res_rec
        preempted = reset_preempted + [id_to_idx[x] for x in preempt_order]
        preempt_order.clear()
        if preempted:
            rec["preempted"] = preempted
            totals["preemptions"] += len(preempted)
        rec["free_sched"] = sched.kv_cache_manager.block_pool.get_num_free_blocks()

        # fake model runner
        req_ids = list(nst.keys())
        sampled = []
        for rid in req_ids:
            i = id_to_idx[rid]
            vr = vreqs[i]
            if vr.num_computed_tokens >= vr.num_tokens:
                k = len(vr.output_token_ids)
                a = 0
                drafts = so.scheduled_spec_decode_tokens.get(rid) or []
                if drafts:
                    units = math.ceil(float(eng["spec_acceptance_rate"]) * (1 << 53))
                    while a < len(drafts) and _draft_uniform_m(
                            int(eng["spec_seed"]), i, k, a) < units:
                        a += 1
                    totals["spec_drafts"] = totals.get("spec_drafts", 0) + len(drafts)
                    totals["spec_accepted"] = totals.get("spec_accepted", 0) + a
                sampled.append([reqs[i]["output_base"] + k + t for t in range(a + 1)])
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={r: j for j, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        if off_log is not None:  # the fake worker finishes every transfer in the step
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
                OffloadingWorkerMetadata,
            )
            from vllm.v1.outputs import KVConnectorOutput
            meta = so.kv_connector_metadata
            done = {jid: 1 for jid in (*meta.load_jobs, *meta.store_jobs)}
            mro.kv_connector_output = KVConnectorOutput(
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done))
        ecos = sched.update_from_output(so, mro)
        if num_spec:  # the drafter: the next k output tokens of every scheduled request
            alive = [rid for rid in req_ids if rid in sched.requests]
            sched.update_draft_token_ids(DraftTokenIds(alive, [
                [reqs[id_to_idx[rid]]["output_base"] + len(vreqs[id_to_idx[rid]]
                                                              .output_token_ids) + t
                 for t in range(num_spec)] for rid in alive]))

        finished = []
        pcs = None
        for eco in ecos.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    finished.append(id_to_idx[o.request_id])
            if eco.scheduler_stats is not None:
                pcs = eco.scheduler_stats.prefix_cache_stats
        if finished:
            rec["finished"] = finished
            finished_count += len(finished)
        if pcs is not None and (pcs.requests or pcs.preempted_requests):
            vals = [pcs.requests, pcs.queries, pcs.hits, pcs.preempted_requests,
                    pcs.preempted_queries, pcs.preempted_hits]
            rec["pc"] = vals
            for key, v in zip(("requests", "queries", "hits", "preempted_requests",
                               "preempted_queries", "preempted_hits"), vals):
                totals["vllm_prefix_cache"][key] += v
        rec["free"] = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        if rec["free_sched"] == rec["free"]:
            del rec["free_sched"]

        # KV events published this step
        evs = []
        cand = [id_to_idx[r] for r in req_ids]
        for batch in capture.batches:
            for ev in batch.events:
                if getattr(ev, "medium", None) not in (None, "GPU"):
                    continue  # the offloading connector's CPU events (logged as "off")
                if isinstance(ev, BlockStored):
                    hs = list(ev.block_hashes)
                    if len(ev.token_ids) != len(hs) * ev.block_size or ev.block_size != bs:
                        raise RuntimeError("unexpected BlockStored shape")
                    i, k = locate(hs[0], cand)
                    toks = vreqs[i].all_token_ids[k * bs:(k + len(hs)) * bs]
                    if list(toks) != list(ev.token_ids):
                        raise RuntimeError("BlockStored tokens differ from the request's")
                    for h in hs:
                        if live_count.get(h, 0) > 0:
                            totals["duplicate_stores"] += 1
                        live_count[h] = live_count.get(h, 0) + 1
                    e = {"S": runs([hid(h) for h in hs]),
                         "p": None if ev.parent_block_hash is None
                         else hid(ev.parent_block_hash),
                         "r": i, "b": k}
                    if ev.extra_keys and any(x is not None for x in ev.extra_keys):
                        e["x"] = [list(x) if x is not None else None
                                  for x in ev.extra_keys]
                    if inline_tokens:
                        e["t"] = list(ev.token_ids)
                    evs.append(e)
                    totals["stored_events"] += 1
                    totals["stored_blocks"] += len(hs)
                    live_cached += len(hs)
                elif isinstance(ev, BlockRemoved):
                    ids = [hid(h) for h in ev.block_hashes]
                    for h in ev.block_hashes:
                        live_count[h] -= 1
                    totals["removed_blocks"] += len(ids)
                    live_cached -= len(ids)
                    if evs and "R" in evs[-1]:
                        evs[-1]["_r"].extend(ids)
                    else:
                        evs.append({"R": None, "_r": ids})
                elif isinstance(ev, AllBlocksCleared):
                    evs.append({"C": 1})
                    live_count.clear()
                    totals["cleared"] += 1
                    live_cached = 0
                else:
                    raise RuntimeError(f"unexpected event {type(ev).__name__}")
        capture.batches.clear()
        for e in evs:
            if "_r" in e:
                e["R"] = runs(e.pop("_r"))
        if evs:
            rec["ev"] = evs
        if off_log is not None and any(off_log.values()):
            # this step's offloading: loads (request, its chunks' interned hashes), stores
            # (request, hashes stored), CPU evictions (hashes), in the order vLLM made them
            rec["off"] = {k: ([[id_to_idx[r], runs([hid(h) for h in hs])] for r, hs in v]
                              if k != "evict" else runs([hid(h) for h in v]))
                          for k, v in off_log.items() if v}
            for k, v in off_log.items():
                totals.setdefault("offload", {"load": 0, "store": 0, "evict": 0})
                totals["offload"][k] += (len(v) if k == "evict"
                                         else sum(len(hs) for _, hs in v))
                v.clear()

        if check_every and step % check_every == 0:
            pool = sched.kv_cache_manager.block_pool
            n_cached = sum(1 if not isinstance(v, dict) else len(v)
                           for v in pool.cached_block_hash_to_block._cache.values())
            if n_cached != live_cached:
                raise RuntimeError(f"step {step}: events say {live_cached} cached blocks,"
                                   f" the pool has {n_cached}")

        for i in finished:
            finish_step[i] = step
        totals["scheduled_tokens"] += so.total_num_scheduled_tokens
        T_next = T + clock["step_base_ms"] + clock["per_token_ms"] * \
            so.total_num_scheduled_tokens
        for i in finished:
            for j in dependents.get(i, ()):
                t = T_next + float(reqs[j]["after"].get("delay_ms", 0.0))
                arrival_ms[j] = t
                # keep pending sorted by (time, index)
                pos = pi
                while pos < len(pending) and pending[pos] < (t, j):
                    pos += 1
                pending.insert(pos, (t, j))
        if so.total_num_scheduled_tokens == 0 and not preempted and not \
                rec.get("actions"):
            if pi < len(pending):
                T_next = max(T_next, pending[pi][0])
            else:
                raise RuntimeError(f"step {step}: nothing scheduled and nothing to arrive"
                                   " (a request can never be admitted)")
        step_records.append(json.dumps(rec, separators=(",", ":")))
        T = T_next
        step += 1
        if verbose and step % 500 == 0:
            print(f"  step {step}: {finished_count}/{n_total} finished, "
                  f"{totals['preemptions']} preemptions", file=sys.stderr)

    totals["steps"] = step
    totals["end_ms"] = round(T, 6)
    totals["per_request"] = {
        "arrival_step": [arrival_step[i] for i in range(n_total)],
        "finish_step": [finish_step[i] for i in range(n_total)],
        "num_preemptions": [vreqs[i].num_preemptions for i in range(n_total)],
    }
    totals["distinct_hashes"] = len(hash_values)
    if off_log is not None:
        mgr = sched.connector.connector_scheduler.manager
        totals.setdefault("offload", {"load": 0, "store": 0, "evict": 0})
        pol = mgr._policy
        keys = pol.chunks if hasattr(pol, "chunks") else [*pol.t1, *pol.t2]  # lru / arc
        totals["offload"]["resident"] = sorted(
            hid(maybe_convert_block_hash(get_offload_block_hash(k))) for k in keys)
        totals["offload"]["cpu_blocks"] = int(off["cpu_blocks"])
    lines_out.extend(step_records)
    # vLLM's own hash values (the int64 form its KV events carry), interned id -> value;
    # left out of by-reference recordings, where they would dominate the file.
    lines_out.append(json.dumps({"kind": "hashes", "count": len(hash_values),
                                 "values": hash_values if inline_tokens else None},
                                separators=(",", ":")))
    lines_out.append(json.dumps({"kind": "summary", **totals}, separators=(",", ":")))
    data = ("\n".join(lines_out) + "\n").encode()
    if out_path.endswith(".gz"):
        with open(out_path, "wb") as fh:
            # mtime 0 and no file name: byte-identical re-recordings
            with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0,
                               compresslevel=9) as gz:
                gz.write(data)
    else:
        with open(out_path, "wb") as fh:
            fh.write(data)
    totals["record_seconds"] = round(time.time() - t_start, 1)
    return totals


def _headline(name: str, t: dict, path: str) -> str:
    pc = t["vllm_prefix_cache"]
    return (f"{name}: {t['steps']} steps, {t['preemptions']} preemptions, "
            f"{t['stored_blocks']} blocks stored ({t['stored_events']} events), "
            f"{t['removed_blocks']} removed, {t['cleared']} cleared, prefix hits "
            f"{pc['hits']}/{pc['queries']} tokens (+{pc['preempted_hits']} on resume), "
            f"{os.path.getsize(path)} bytes, {t['record_seconds']} s")


def _default_traces(repo: str) -> str:
    if os.environ.get("KVSIM_TRACES"):
        return os.environ["KVSIM_TRACES"]
    for up in (1, 2):
        d = repo
        for _ in range(up):
            d = os.path.dirname(d)
        cand = os.path.join(d, "shared", "traces")
        if os.path.isdir(cand):
            return cand
    return os.path.join(os.path.dirname(repo), "shared", "traces")


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--case", help="a built-in case (see --list)")
    g.add_argument("--spec", help="a case spec JSON file")
    g.add_argument("--all", metavar="DIR", help="record every built-in case into DIR")
    g.add_argument("--list", action="store_true", help="list the built-in cases")
    g.add_argument("--dump-spec", metavar="NAME", help="print a built-in case's spec")
    ap.add_argument("--out", help="output recording (.jsonl.gz or .jsonl)")
    ap.add_argument("--traces", default=_default_traces(repo),
                    help="folder of the shared traces (default: $KVSIM_TRACES, else the "
                         "first of ../shared/traces, ../../shared/traces that exists)")
    ap.add_argument("--check-every", type=int, default=1,
                    help="compare the event-derived cached-block count with the pool "
                         "every N steps (0: never)")
    ap.add_argument("--ignore-timestamps", action="store_true",
                    help="add every timed request at step 0 (overrides the spec)")
    args = ap.parse_args(argv)

    if args.list:
        for k, f in CASES.items():
            print(f"{k}: {f()['description']}")
        return 0
    if args.dump_spec:
        print(json.dumps(CASES[args.dump_spec](), indent=1))
        return 0
    if args.all:
        os.makedirs(args.all, exist_ok=True)
        for k, f in CASES.items():
            out = os.path.join(args.all, f"{k}.jsonl.gz")
            t = record(f(), out, args.traces, args.check_every)
            print(_headline(k, t, out))
        return 0
    spec = CASES[args.case]() if args.case else json.load(open(args.spec))
    if args.ignore_timestamps:
        spec.setdefault("clock", {})["ignore_timestamps"] = True
    if not args.out:
        ap.error("--out is required")
    t = record(spec, args.out, args.traces, args.check_every)
    print(_headline(spec["name"], t, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
