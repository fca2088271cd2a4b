"""Peak memory of ``simulate`` on a long synthetic 16-token trace: does it grow with the
trace length or with what is resident?

    python bench/bench_stream_memory.py --events 100000000 --trace /tmp/synth100m.parquet
    python bench/bench_stream_memory.py --events 10000000 --trace /tmp/synth10m.parquet

Step 1 writes the trace, streamed to Parquet wave by wave (the generator holds one wave).
Step 2 runs ``kvsim.api.simulate`` (lru, compiled engine) on it in a child process and
reads the child's peak resident set (``ru_maxrss`` of ``RUSAGE_CHILDREN``), its CPU
seconds and wall time; ``/proc/loadavg`` is recorded before and after.  The compile is
excluded by a warm-up run on a small trace first (same policies, same column types, so the
disk cache then holds the core).  Results go to ``--out`` as JSON.

The workload (deterministic for ``--seed``): waves of ``--wave`` requests arrive in the
same engine step and are admitted together; each prompt is 64 full blocks of 16 tokens
(1,024 tokens): 4 blocks of one of 100 system prompts, then 60 blocks of one of
``--docs`` documents drawn Zipf(1.0) (the document fixes the system prompt, so equal hashes
mean equal prefixes).  Then 16 decode steps of one token, the first allocating one decode
block (no content hash), then a request-level FREE.  About 21,500 rows per wave of 256
requests, 77% of them ALLOCATE rows: the shape of a 16-token import (Mooncake at 16 tokens
is 68% ALLOCATE).  The content universe is bounded (``--docs`` x 60 + 400 hashes), so
whatever grows with the length is per-row or per-request state.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kvsim.core.fsutil import atomic_output
from kvsim.core.schema import COLUMN_NAMES, DEFAULTS, EventHeader, EventKind, Phase
from kvsim.events import EventWriter

BLOCK_TOKENS = 16
PROMPT_BLOCKS = 64
SYSTEM_BLOCKS = 4
SYSTEMS = 100
DECODE_STEPS = 16
KV_BYTES_PER_TOKEN = 131_072  # Llama-3-8B bf16: 32 layers x 8 KV heads x 128 x 2 (K,V) x 2 B
STEP_US = 40_000


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: distinct non-negative inputs -> distinct non-zero hashes."""
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    out = x.view(np.int64)
    out[out == 0] = 1
    return out


def _wave(w: int, first_req: int, step0: int, docs: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of one wave: ``len(docs)`` requests admitted at ``step0``."""
    n = len(docs)
    req = first_req + np.arange(n, dtype=np.int64)
    bs = BLOCK_TOKENS
    prompt_tok = PROMPT_BLOCKS * bs
    cols: dict[str, list] = {k: [] for k in ("step", "kind", "request_id", "block_index",
                                             "content_hash", "num_tokens", "duration_us",
                                             "phase")}

    def add(step, kind, rid, bidx, h, ntok, dur, phase):
        m = len(rid) if hasattr(rid, "__len__") else 1
        cols["step"].append(np.full(m, step, np.int64))
        cols["kind"].append(np.full(m, int(kind), np.int8))
        cols["request_id"].append(np.broadcast_to(np.asarray(rid, np.int64), m))
        cols["block_index"].append(np.broadcast_to(np.asarray(bidx, np.int32), m))
        cols["content_hash"].append(np.broadcast_to(np.asarray(h, np.int64), m))
        cols["num_tokens"].append(np.broadcast_to(np.asarray(ntok, np.int32), m))
        cols["duration_us"].append(np.full(m, dur, np.float64))
        cols["phase"].append(np.broadcast_to(np.asarray(int(phase), np.int8), m))

    # admission step: STEP, ARRIVE x n, then per request its 64 ALLOCATE rows and ACCESS
    add(step0, EventKind.STEP, -1, -1, 0, n * prompt_tok, 30_000.0, Phase.PREFILL)
    add(step0, EventKind.ARRIVE, req, -1, 0, prompt_tok, 0.0, Phase.PREFILL)
    j = np.arange(PROMPT_BLOCKS, dtype=np.int64)
    system = docs % SYSTEMS
    sys_h = _mix(system[:, None] * 1000 + j[None, :SYSTEM_BLOCKS])
    doc_h = _mix(10**9 + docs[:, None] * 100 + j[None, SYSTEM_BLOCKS:])
    hashes = np.concatenate([sys_h, doc_h], axis=1)  # (n, 64)
    per = PROMPT_BLOCKS + 1
    rid = np.repeat(req, per)
    kind = np.tile(np.r_[np.full(PROMPT_BLOCKS, int(EventKind.ALLOCATE)),
                         int(EventKind.ACCESS)], n).astype(np.int8)
    bidx = np.tile(np.r_[j, -1], n).astype(np.int32)
    h = np.concatenate([hashes, np.zeros((n, 1), np.int64)], axis=1).ravel()
    ntok = np.tile(np.r_[np.full(PROMPT_BLOCKS, bs), prompt_tok], n).astype(np.int32)
    m = len(rid)
    cols["step"].append(np.full(m, step0, np.int64))
    cols["kind"].append(kind)
    cols["request_id"].append(rid)
    cols["block_index"].append(bidx)
    cols["content_hash"].append(h)
    cols["num_tokens"].append(ntok)
    cols["duration_us"].append(np.zeros(m))
    cols["phase"].append(np.full(m, int(Phase.PREFILL), np.int8))
    # decode steps: the first allocates block 64 (no hash: its content is not identified)
    for t in range(DECODE_STEPS):
        s = step0 + 1 + t
        add(s, EventKind.STEP, -1, -1, 0, n, 12_000.0, Phase.DECODE)
        if t == 0:
            rid = np.repeat(req, 2)
            kind = np.tile([int(EventKind.ALLOCATE), int(EventKind.ACCESS)], n)
            m = len(rid)
            cols["step"].append(np.full(m, s, np.int64))
            cols["kind"].append(kind.astype(np.int8))
            cols["request_id"].append(rid)
            cols["block_index"].append(np.tile([PROMPT_BLOCKS, -1], n).astype(np.int32))
            cols["content_hash"].append(np.zeros(m, np.int64))
            cols["num_tokens"].append(np.tile([bs, 1], n).astype(np.int32))
            cols["duration_us"].append(np.zeros(m))
            cols["phase"].append(np.full(m, int(Phase.DECODE), np.int8))
        else:
            add(s, EventKind.ACCESS, req, -1, 0, 1, 0.0, Phase.DECODE)
    add(step0 + DECODE_STEPS, EventKind.FREE, req, -1, 0, 0, 0.0, Phase.DECODE)
    out = {k: np.concatenate(v) for k, v in cols.items()}
    k = len(out["step"])
    out["time_us"] = out["step"] * STEP_US
    kind = out["kind"]
    alloc = kind == int(EventKind.ALLOCATE)
    out["size_bytes"] = np.where(alloc, BLOCK_TOKENS * KV_BYTES_PER_TOKEN, 0).astype(np.int64)
    out["recompute_cost_us"] = np.where(alloc, 250.0, 0.0)
    for name in COLUMN_NAMES:
        if name not in out:
            out[name] = np.full(k, DEFAULTS[name])
    return out


def write_trace(path: Path, events: int, wave: int, n_docs: int, seed: int) -> dict:
    """Stream waves to ``path`` until at least ``events`` rows; returns counts."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_docs + 1, dtype=np.float64)  # Zipf(1.0)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    perm = rng.permutation(n_docs).astype(np.int64)
    header = EventHeader(block_size_tokens=BLOCK_TOKENS, kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                         source={"generator": "bench/bench_stream_memory.py", "seed": seed,
                                 "wave": wave, "docs": n_docs})
    rows = allocs = requests = 0
    step = 0
    t0 = time.process_time()
    with EventWriter(path, header, row_group_rows=1 << 20) as w:
        while rows < events:
            ranks = np.minimum(np.searchsorted(cdf, rng.random(wave), side="right"),
                               n_docs - 1)
            cols = _wave(wave, requests, step, perm[ranks])
            w.write(cols)
            rows += len(cols["step"])
            allocs += int(np.count_nonzero(cols["kind"] == int(EventKind.ALLOCATE)))
            requests += wave
            step += DECODE_STEPS + 1
    return {"rows": rows, "allocate_rows": allocs, "requests": requests, "steps": step,
            "generate_cpu_s": time.process_time() - t0}


CHILD = """
import json, sys, time, resource
from kvsim.api import SimConfig, simulate
trace, policy, hbm, dram = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
cfg = SimConfig(hbm_blocks=hbm, dram_gb=dram, cxl_gb=0, nvme_gb=0, engine="compiled")
t0, c0 = time.perf_counter(), time.process_time()
r = simulate(trace, policy, cfg)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "hbm_hit_rate": r.summary["hbm_hit_rate"],
                  "requests": r.summary["requests"],
                  "maxrss_self_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def measure(trace: Path, policy: str, hbm_blocks: int, dram_gb: float) -> dict:
    """simulate in a fresh child process: its own figures plus peak RSS from the parent."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run([sys.executable, "-c", CHILD, str(trace), policy, str(hbm_blocks),
                          str(dram_gb)], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["peak_rss_bytes"] = res.pop("maxrss_self_kib") * 1024
    res["children_maxrss_bytes"] = max(before, resource.getrusage(
        resource.RUSAGE_CHILDREN).ru_maxrss) * 1024
    return res


def _load() -> list[str]:
    return open("/proc/loadavg").read().split()[:3]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=100_000_000, help="rows to generate")
    ap.add_argument("--trace", type=Path, default=Path("/tmp/kvsim-synth.parquet"))
    ap.add_argument("--wave", type=int, default=256, help="requests per wave")
    ap.add_argument("--docs", type=int, default=50_000, help="documents (content universe)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="lru")
    ap.add_argument("--hbm-blocks", type=int, default=40_000)
    ap.add_argument("--dram-gb", type=float, default=64.0)
    ap.add_argument("--reuse", action="store_true", help="keep an existing --trace file")
    ap.add_argument("--out", type=Path, default=Path("bench/results/stream_memory.json"))
    args = ap.parse_args(argv)

    result: dict = {"command": " ".join(["python", "bench/bench_stream_memory.py"] +
                                        (argv or sys.argv[1:])),
                    "load_average_at_start": _load(), "cpus": os.cpu_count()}
    if not (args.reuse and args.trace.is_file()):
        result["trace"] = write_trace(args.trace, args.events, args.wave, args.docs,
                                      args.seed)
        print("wrote", args.trace, result["trace"], flush=True)
    result["trace_file_bytes"] = args.trace.stat().st_size
    # warm-up: compile (or load) the core on a small trace of the same shape
    small = args.trace.with_name(args.trace.stem + ".warmup.parquet")
    write_trace(small, 50_000, 16, 100, args.seed)
    result["warmup"] = measure(small, args.policy, args.hbm_blocks, args.dram_gb)
    small.unlink()
    print("warm-up", result["warmup"], flush=True)
    result["simulate"] = measure(args.trace, args.policy, args.hbm_blocks, args.dram_gb)
    result["load_average_at_end"] = _load()
    s = result["simulate"]
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(args.trace).metadata.num_rows
    s["events"] = rows
    s["events_per_cpu_s"] = rows / s["cpu_s"]  # start-up, pre-pass and outputs included
    print(f"simulate {args.policy}: peak RSS {s['peak_rss_bytes'] / 2**30:.2f} GiB, "
          f"{s['cpu_s']:.1f} CPU-s ({s['events_per_cpu_s'] / 1e6:.3f} M events per "
          f"CPU-second), {s['wall_s']:.1f} s wall, load "
          f"{result['load_average_at_start']} -> {result['load_average_at_end']}")
    with atomic_output(args.out) as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
