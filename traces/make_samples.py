"""Regenerate the sample event traces: ``python traces/make_samples.py [OUT_DIR]``.

Writes (deterministically: same bytes on every run, seed 0):

- ``sample_chat.parquet`` and ``sample_chat.jsonl``: the same trace in both formats.
  32 requests: 8 chat sessions of 3 turns each (each turn's prompt = the previous turn's
  prompt + its answer + a new user message, behind a system prompt shared by the
  session's tenant) and 8 one-shot requests, through a continuous-batching engine with
  chunked prefill.  Lowered by the rules of :mod:`kvsim.core.schema`.
- ``sample_fork.jsonl``: a tiny hand-readable trace (two requests, one FORK for parallel
  sampling, block-level FREE of a pruned branch) used by docs/trace-format.md.

This is a self-contained miniature of the real lowering (``kvsim.ingest``), kept here so
the samples do not change when the engine model is refined.  Engine model constants:

- model: Llama-3.1-8B, 8.03e9 parameters (Meta model card), KV bytes per token
  32 layers x 8 KV heads x 128 dim x 2 (K and V) x 2 bytes (BF16) = 131,072
  (config.json of meta-llama/Llama-3.1-8B);
- hardware: H100 SXM, 989.4e12 dense BF16 FLOP/s and 3.35e12 B/s HBM (NVIDIA datasheet),
  achievable fractions 0.5 and 0.8 (assumptions, as in profiles/hardware);
- step time = STEP_OVERHEAD_US + max(weights read time, 2 * params * tokens / FLOP/s)
  (a roofline that ignores attention; enough for a sample).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.core.schema import NO_HASH, EventHeader, EventKind, Phase, Priority
from kvsim.events import EventWriter

HERE = Path(__file__).resolve().parent
SEED = 0
BLOCK_SIZE_TOKENS = 16
KV_BYTES_PER_TOKEN = 131_072  # Llama-3.1-8B, see module docstring
BLOCK_BYTES = BLOCK_SIZE_TOKENS * KV_BYTES_PER_TOKEN
PARAMS = 8.03e9  # Llama-3.1-8B model card
FLOPS_PER_S = 989.4e12 * 0.5  # H100 SXM dense BF16 (datasheet) x achievable (assumption)
HBM_BYTES_PER_S = 3.35e12 * 0.8  # H100 SXM HBM3 (datasheet) x achievable (assumption)
WEIGHTS_READ_US = PARAMS * 2 / HBM_BYTES_PER_S * 1e6  # BF16 weights read once per step
PREFILL_US_PER_TOKEN = 2 * PARAMS / FLOPS_PER_S * 1e6  # Kaplan et al. 2020: 2N FLOPs/token
STEP_OVERHEAD_US = 500.0  # assumption, same as kvsim.engine.engine_model.DEFAULT_STEP_OVERHEAD_US
MAX_NUM_SEQS = 8  # small on purpose: the sample should queue a little
MAX_BATCHED_TOKENS = 512  # chunked-prefill token budget per step
TTFT_SLO_US = 2_000_000  # sample SLOs: 2 s to first token, 100 ms per output token
TPOT_SLO_US = 100_000


def _hash(parent: int, tokens: np.ndarray) -> int:
    """Chain hash of a full block: H(parent, tokens) as a non-zero positive int63."""
    digest = hashlib.blake2b(parent.to_bytes(8, "little") + tokens.astype("<i4").tobytes(),
                             digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 1) or 1


@dataclass
class Request:
    rid: int
    arrival_us: int
    prompt: np.ndarray
    output_tokens: int
    tenant: int
    request_priority: int
    follow_up: bool  # another turn of the same session will come (blocks are HOT when done)
    prefilled: int = 0
    decoded: int = 0
    blocks: int = 0
    arrived: bool = False
    admitted: bool = False
    output: list[int] = field(default_factory=list)

    @property
    def context(self) -> int:
        return self.prefilled + self.decoded


def _workload(rng: np.random.Generator) -> tuple[list[Request], dict[int, list]]:
    """One-shot requests plus the first turn of each session; later turns are created
    when the previous turn finishes (their prompt contains its answer)."""
    system = {t: rng.integers(1, 32000, size=int(rng.integers(48, 97))) for t in range(3)}
    requests: list[Request] = []
    sessions: dict[int, list] = {}
    t_us = 0
    rid = 0
    for s in range(8):
        t_us += int(rng.exponential(150_000))
        tenant = s % 3
        prompt = np.concatenate([system[tenant], rng.integers(1, 32000, int(rng.integers(20, 120)))])
        requests.append(Request(rid, t_us, prompt, int(rng.integers(16, 96)), tenant,
                                int(rng.choice([30, 50, 90])), True))
        sessions[rid] = [s, 1]  # session id, turn number
        rid += 1
    for _ in range(8):
        t_us += int(rng.exponential(150_000))
        tenant = int(rng.integers(0, 3))
        prompt = np.concatenate([system[tenant], rng.integers(1, 32000, int(rng.integers(100, 400)))])
        requests.append(Request(rid, t_us, prompt, int(rng.integers(8, 48)), tenant, 50, False))
        rid += 1
    return requests, sessions


def chat_events() -> tuple[EventHeader, dict[str, list]]:
    """Simulate the sample engine and return the header and the event columns."""
    rng = np.random.default_rng(SEED)
    pending, sessions = _workload(rng)
    next_rid = len(pending)
    pending.sort(key=lambda r: (r.arrival_us, r.rid))
    cols: dict[str, list] = {k: [] for k in (
        "step", "time_us", "kind", "request_id", "block_index", "content_hash", "num_tokens",
        "duration_us", "phase", "priority", "request_priority", "deadline_us",
        "recompute_cost_us", "pin_requested", "size_bytes", "tenant")}

    def emit(**row) -> None:
        for k in cols:
            cols[k].append(row[k] if k in row else _ROW_DEFAULTS[k])

    running: list[Request] = []
    waiting: list[Request] = []
    step, now_us = 0, 0
    while pending or waiting or running:
        if not waiting and not running and pending[0].arrival_us > now_us:
            now_us = pending[0].arrival_us  # idle engine: jump to the next arrival
        arrivals = [r for r in pending if r.arrival_us <= now_us]
        pending = [r for r in pending if r.arrival_us > now_us]
        waiting.extend(arrivals)
        # schedule: running requests first (decode 1 token or continue prefill), then admit
        budget = MAX_BATCHED_TOKENS
        plan: list[tuple[Request, int]] = []
        for r in running:
            n = 1 if r.prefilled == len(r.prompt) else min(budget, len(r.prompt) - r.prefilled)
            if n <= budget and n > 0:
                plan.append((r, n))
                budget -= n
        while waiting and len(running) < MAX_NUM_SEQS and budget > 0:
            r = waiting.pop(0)
            n = min(budget, len(r.prompt))
            running.append(r)
            plan.append((r, n))
            budget -= n
        batched = sum(n for _, n in plan)
        duration = STEP_OVERHEAD_US + max(WEIGHTS_READ_US, PREFILL_US_PER_TOKEN * batched)
        emit(step=step, time_us=now_us, kind=EventKind.STEP, num_tokens=batched,
             duration_us=round(duration, 3))
        for r in arrivals:
            emit(step=step, time_us=now_us, kind=EventKind.ARRIVE, request_id=r.rid,
                 num_tokens=len(r.prompt), request_priority=r.request_priority,
                 deadline_us=r.arrival_us + TTFT_SLO_US, tenant=r.tenant, priority=Priority.HOT)
        finished: list[Request] = []
        for r, n in plan:
            common = dict(step=step, time_us=now_us, request_id=r.rid, tenant=r.tenant,
                          request_priority=r.request_priority)
            if not r.admitted:  # rule 2: all prompt blocks at admission, in order
                r.admitted = True
                parent = 0
                for b in range(0, len(r.prompt), BLOCK_SIZE_TOKENS):
                    toks = r.prompt[b:b + BLOCK_SIZE_TOKENS]
                    full = len(toks) == BLOCK_SIZE_TOKENS
                    h = _hash(parent, toks) if full else NO_HASH
                    parent = h
                    emit(kind=EventKind.ALLOCATE, block_index=r.blocks, content_hash=h,
                         num_tokens=len(toks), size_bytes=BLOCK_BYTES, priority=Priority.HOT,
                         recompute_cost_us=round(PREFILL_US_PER_TOKEN * len(toks), 3),
                         **common)
                    r.blocks += 1
            if r.prefilled < len(r.prompt):
                r.prefilled += n
                emit(kind=EventKind.ACCESS, num_tokens=n, priority=Priority.HOT,
                     deadline_us=r.arrival_us + TTFT_SLO_US, **common)
                if r.prefilled == len(r.prompt):
                    r.output.append(int(rng.integers(1, 32000)))  # first token
                    r.decoded = 1
            else:
                if r.context % BLOCK_SIZE_TOKENS == 0:  # rule 3: this token starts a block
                    emit(kind=EventKind.ALLOCATE, block_index=r.blocks, num_tokens=1,
                         size_bytes=BLOCK_BYTES, phase=Phase.DECODE,
                         priority=Priority.DECODE_CRITICAL, pin_requested=True,
                         recompute_cost_us=round(PREFILL_US_PER_TOKEN * BLOCK_SIZE_TOKENS, 3),
                         **common)
                    r.blocks += 1
                emit(kind=EventKind.ACCESS, num_tokens=1, phase=Phase.DECODE,
                     priority=Priority.DECODE_CRITICAL, pin_requested=True,
                     deadline_us=now_us + TPOT_SLO_US, **common)
                r.output.append(int(rng.integers(1, 32000)))
                r.decoded += 1
            if r.decoded >= r.output_tokens:
                finished.append(r)
        end_us = now_us + int(round(duration))
        for r in finished:
            running.remove(r)
            common = dict(step=step, time_us=now_us, request_id=r.rid, tenant=r.tenant,
                          request_priority=r.request_priority)
            if r.follow_up:  # the session will come back: keep its prefix HOT
                emit(kind=EventKind.INTENT, phase=Phase.IDLE, priority=Priority.HOT, **common)
                emit(kind=EventKind.FREE, phase=Phase.IDLE, priority=Priority.HOT, **common)
                s, turn = sessions[r.rid]
                prompt = np.concatenate([r.prompt, np.asarray(r.output),
                                         rng.integers(1, 32000, int(rng.integers(10, 80)))])
                nxt = Request(next_rid, end_us + int(rng.exponential(2_000_000)), prompt,
                              int(rng.integers(16, 96)), r.tenant, r.request_priority, turn < 2)
                sessions[next_rid] = [s, turn + 1]
                next_rid += 1
                pending.append(nxt)
                pending.sort(key=lambda q: (q.arrival_us, q.rid))
            else:
                emit(kind=EventKind.FREE, phase=Phase.DONE, priority=Priority.COLD, **common)
        step += 1
        now_us = end_us
    header = EventHeader(block_size_tokens=BLOCK_SIZE_TOKENS, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                         model="llama-3.1-8b", hardware="h100-sxm",
                         source={"generator": "traces/make_samples.py", "trace": "sample_chat",
                                 "seed": SEED})
    return header, cols


_ROW_DEFAULTS = {"content_hash": NO_HASH, "num_tokens": 0, "duration_us": 0.0,
                 "phase": Phase.PREFILL, "priority": Priority.WARM, "request_priority": 50,
                 "deadline_us": -1, "recompute_cost_us": 0.0, "pin_requested": False,
                 "size_bytes": 0, "tenant": 0, "block_index": -1, "request_id": -1}

#: The tiny FORK example (docs/trace-format.md), one event per line, readable as is.
FORK_LINES = [
    # step 0: request 0 arrives with a 20-token prompt: one full (hashed) block + a partial
    dict(step=0, kind="STEP", num_tokens=20, duration_us=6640.0),
    dict(step=0, kind="ARRIVE", request_id=0, num_tokens=20, deadline_us=2000000),
    dict(step=0, kind="ALLOCATE", request_id=0, block_index=0, content_hash=4242,
         num_tokens=16, size_bytes=BLOCK_BYTES, recompute_cost_us=520.0),
    dict(step=0, kind="ALLOCATE", request_id=0, block_index=1, num_tokens=4,
         size_bytes=BLOCK_BYTES, recompute_cost_us=130.0),
    dict(step=0, kind="ACCESS", request_id=0, num_tokens=20),
    # step 1: parallel sampling n=2: request 1 appears (ARRIVE, as every request does) as a
    # copy-on-write child of request 0 (FORK): it shares both blocks
    dict(step=1, time_us=6640, kind="STEP", num_tokens=2, duration_us=6500.0),
    dict(step=1, time_us=6640, kind="ARRIVE", request_id=1, num_tokens=20,
         deadline_us=2000000),
    dict(step=1, time_us=6640, kind="FORK", request_id=1, parent_request_id=0),
    dict(step=1, time_us=6640, kind="ACCESS", request_id=0, num_tokens=1, phase="DECODE",
         priority="DECODE_CRITICAL", pin_requested=True, deadline_us=106640),
    dict(step=1, time_us=6640, kind="ACCESS", request_id=1, num_tokens=1, phase="DECODE",
         priority="DECODE_CRITICAL", pin_requested=True, deadline_us=106640),
    # step 2: branch 1 is pruned: it releases its tail block (block-level FREE: the shared
    # partial block's ref count drops back to 1), then the rest (request-level FREE)
    dict(step=2, time_us=13140, kind="STEP", num_tokens=1, duration_us=6500.0),
    dict(step=2, time_us=13140, kind="ACCESS", request_id=0, num_tokens=1, phase="DECODE",
         priority="DECODE_CRITICAL", pin_requested=True, deadline_us=113140),
    dict(step=2, time_us=13140, kind="FREE", request_id=1, block_index=1, phase="DONE",
         priority="COLD"),
    dict(step=2, time_us=13140, kind="FREE", request_id=1, phase="DONE", priority="COLD"),
    # step 3: request 0 finishes
    dict(step=3, time_us=19640, kind="STEP", num_tokens=1, duration_us=6500.0),
    dict(step=3, time_us=19640, kind="ACCESS", request_id=0, num_tokens=1, phase="DECODE",
         priority="DECODE_CRITICAL", pin_requested=True, deadline_us=119640),
    dict(step=3, time_us=19640, kind="FREE", request_id=0, phase="DONE", priority="COLD"),
]


def fork_columns() -> dict[str, list]:
    names = sorted({k for line in FORK_LINES for k in line})
    defaults = {**_ROW_DEFAULTS, "time_us": 0, "parent_request_id": -1, "phase": "PREFILL",
                "priority": "WARM"}
    return {k: [line[k] if k in line else defaults[k] for line in FORK_LINES] for k in names}


def main(out_dir: Path = HERE) -> list[Path]:
    header, cols = chat_events()
    written = []
    for name in ("sample_chat.parquet", "sample_chat.jsonl"):
        with EventWriter(out_dir / name, header, row_group_rows=1024) as writer:
            writer.write(cols)
        written.append(out_dir / name)
    fork_header = EventHeader(block_size_tokens=BLOCK_SIZE_TOKENS,
                              kv_bytes_per_token=KV_BYTES_PER_TOKEN, model="llama-3.1-8b",
                              hardware="h100-sxm",
                              source={"generator": "traces/make_samples.py",
                                      "trace": "sample_fork"})
    with EventWriter(out_dir / "sample_fork.jsonl", fork_header) as writer:
        writer.write(fork_columns())
    written.append(out_dir / "sample_fork.jsonl")
    return written


if __name__ == "__main__":
    for path in main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
