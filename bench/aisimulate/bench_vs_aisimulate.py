"""kvsim's closed loop vs NVIDIA AISimulate's replay core on the same work, in one run.

    python bench/aisimulate/bench_vs_aisimulate.py --peer-python /work/venvs/dynamo/bin/python \
        --cases 512:1 512:8 --repeat 3 --out bench/results/vs_aisimulate.json

The peer is ``ai-dynamo-runtime`` 1.6.1 from PyPI (``pip install ai-dynamo-runtime==1.6.1`` in
its own virtual environment, never a kvsim dependency): ``dynamo.replay.run_trace_replay``
(ai-dynamo's thin wrapper of ``dynamo._core.run_mocker_trace_replay``, the Rust
``aisimulate-core`` engine), run by ``peer_run.py`` in that environment.  kvsim runs its own
command (``kvsim simulate --request-trace``) through ``kvsim_run.py`` with this interpreter.

The work: the Mooncake conversation trace (12,031 requests, hash ids at 512 tokens), one
engine per replica with ``--hbm-blocks`` GPU blocks of ``block`` tokens (900 x 512 tokens,
or the same bytes in 64-token blocks: 7,200), max_num_seqs 256, max_num_batched_tokens 8192,
chunked prefill and prefix caching on, LRU; 1 replica, or N replicas behind the peer's KV
router (``router_mode="kv_router"``, its default ``KvRouterConfig``) and kvsim's ``prefix``
router (Dynamo's cost function, kvsim/modes/closed/cluster.py); optionally a host tier of
``--host-blocks`` blocks (the peer's ``native_host_offload``; kvsim's DRAM tier of the same
bytes, CXL and NVMe off).  Without a host tier kvsim's lower tiers are all off.

Each case is run ``--repeat`` times per simulator, alternating kvsim and the peer, each run
a fresh child process; the figure is the minimum CPU seconds (user + sys of the whole
child, all threads, interpreter start and imports included: ``process``), and of the
replay call alone (``call``: kvsim's command after its import, the peer's
``run_mocker_trace_replay``).  ``warm``: kvsim's numba cache already filled by an untimed
run; ``--cold``: kvsim's every run starts from an empty NUMBA_CACHE_DIR / KVSIM_CACHE_DIR
(the peer compiles nothing at run time, so its runs are the same).  Requests per CPU-second
= requests / CPU seconds.  /proc/loadavg is read before and after every run.  Both sides
start from compiled bytecode (:func:`compile_bytecode`: kvsim's modules compiled first, as
``pip install .`` compiles them; the peer's wheel was compiled by pip at its install).

``--calls N`` (N >= 2) also runs the same replay N times inside each child, as a sweep through
either tool's Python API does, and reports the later calls' CPU (``later``: the minimum over
runs of each run's calls after its first): what a replay costs once the process has paid
its imports and, for kvsim, numba's set-up and cache loads.  The ``process`` and ``call``
figures stay those of a one-replay process: ``process`` is the child's CPU less its later
calls' (what the same child would have cost had it stopped after its first replay).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: ../shared/traces beside the checkout (or beside a worktree's parent folder)
MOONCAKE = next((p for p in (HERE.parents[d] / "shared" / "traces" / "mooncake" /
                             "conversation_trace.jsonl" for d in (2, 3)) if p.exists()),
                HERE.parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl")
#: Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes
#: (meta-llama/Llama-3.1-8B config.json); the peer needs it to size host blocks.
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
#: the Mooncake trace's hash ids cover 512 tokens each (its README)
TRACE_BLOCK_TOKENS = 512
GPU_TOKENS = 900 * 512  # 900 GPU blocks of 512 tokens (the work), in tokens


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(argv: list[str], env: dict | None = None):
    load0 = _load()
    c0 = _child_cpu()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    cpu = _child_cpu() - c0
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-3000:]}")
    return p, cpu, load0, _load()


def compile_bytecode() -> int:
    """Compile kvsim's Python sources to bytecode, as ``pip install .`` does at install
    (pip compiles every installed module): an editable checkout under
    ``PYTHONDONTWRITEBYTECODE=1`` (this VM sets it) would otherwise recompile ~200 modules
    from source in every timed child (~0.9 CPU-s), a cost no installed user pays and the
    peer (a pip-installed wheel, its bytecode compiled at install) does not pay either.
    Returns how many modules were compiled now."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("kvsim")
    root = Path(next(iter(spec.submodule_search_locations)))
    before = sum(1 for _ in root.rglob("*.pyc"))
    compileall.compile_dir(str(root), quiet=1)
    return sum(1 for _ in root.rglob("*.pyc")) - before


def kvsim_cmd(trace: str, block: int, gpu_blocks: int, host_blocks: int, replicas: int,
              model: str, write_policy: str = "write_back") -> list[str]:
    cmd = ["simulate", "--request-trace", trace, "--block-size", str(block),
           "--hbm-blocks", str(gpu_blocks), "--model", model, "--policy", "lru",
           "--cxl-gb", "0", "--nvme-gb", "0", "--engine", "compiled", "--json"]
    if host_blocks:
        cmd += ["--dram-mb", repr(host_blocks * block * KV_BYTES_PER_TOKEN / 2**20),
                "--write-policy", write_policy]
    else:
        cmd += ["--dram-gb", "0"]
    if replicas > 1:
        cmd += ["--replicas", str(replicas), "--router", "prefix"]
    return cmd


def run_kvsim(cmd: list[str], cache: Path, fresh: bool, calls: int = 1) -> dict:
    if fresh and cache.exists():
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache / "numba"),
               KVSIM_CACHE_DIR=str(cache / "kvsim"), COLUMNS="120")
    p, cpu, l0, l1 = _run([sys.executable, str(HERE / "kvsim_run.py"), "--calls", str(calls),
                           "--", *cmd], env)
    rec = json.loads(p.stderr.strip().splitlines()[-1])
    summ = json.loads(p.stdout)["policies"][0]
    cpu -= sum(rec["calls_cpu_s"][1:])  # a one-replay process (see --calls)
    return {"process_cpu_s": cpu, **rec, "load_before": l0, "load_after": l1,
            "hbm_hit_rate": summ["hbm_hit_rate"], "prefix_hit_rate": summ["prefix_hit_rate"],
            "completed": summ["requests"] - summ["dropped_requests"]}


def run_peer(py: str, spec: dict) -> dict:
    p, cpu, l0, l1 = _run([py, str(HERE / "peer_run.py"), json.dumps(spec)])
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    s = rec.pop("summary")
    cpu -= sum(rec["calls_cpu_s"][1:])  # a one-replay process (see --calls)
    return {"process_cpu_s": cpu, **rec, "load_before": l0, "load_after": l1,
            "prefix_cache_reused_ratio": s.get("prefix_cache_reused_ratio"),
            "first_admission_prefix_cache_reused_ratio":
                s.get("first_admission_prefix_cache_reused_ratio"),
            "completed": s.get("completed_requests")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-python", required=True)
    ap.add_argument("--trace", default=str(MOONCAKE))
    ap.add_argument("--requests", type=int, default=0, help="first N requests only (0: all)")
    ap.add_argument("--cases", nargs="+", default=["512:1", "512:8"],
                    help="BLOCK:REPLICAS[:HOST_BLOCKS] (GPU blocks: 900 x 512 tokens' bytes)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--write-policy", default="write_back",
                    help="kvsim's DRAM write rule with a host tier: write_back (kvsim's "
                         "default) or vllm_offload (vLLM's native CPU offloading, what the "
                         "peer's native_host_offload models)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="kvsim from empty caches every run")
    ap.add_argument("--cache", default=None, help="kvsim's cache folder (default: a temp dir)")
    ap.add_argument("--calls", type=int, default=1,
                    help="replays per child process (>= 2: also report the later calls' CPU)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kvsim_vs_ais_"))
    print(f"kvsim bytecode: {compile_bytecode()} modules compiled now (as pip install does)",
          flush=True)
    trace = a.trace
    if a.requests:
        trace = str(tmp / f"first{a.requests}.jsonl")
        with open(a.trace) as f, open(trace, "w") as g:
            for i, line in enumerate(f):
                if i >= a.requests:
                    break
                g.write(line)
    n_req = sum(1 for _ in open(trace))
    cache = Path(a.cache) if a.cache else tmp / "cache"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    rows = []
    for case in a.cases:
        parts = [int(x) for x in case.split(":")]
        block, replicas = parts[0], parts[1]
        host = parts[2] if len(parts) > 2 else 0
        gpu = GPU_TOKENS // block
        cmd = kvsim_cmd(trace, block, gpu, host, replicas, a.model, a.write_policy)
        spec = {"trace": trace, "block_size": block, "trace_block_size": TRACE_BLOCK_TOKENS,
                "gpu_blocks": gpu, "host_blocks": host,
                "kv_bytes_per_token": KV_BYTES_PER_TOKEN, "replicas": replicas,
                "max_num_seqs": 256, "max_num_batched_tokens": 8192, "calls": a.calls}
        if not a.cold:
            run_kvsim(cmd, cache, False)  # fill numba's cache (untimed)
        ks, ps = [], []
        for _ in range(a.repeat):
            ks.append(run_kvsim(cmd, cache, a.cold, a.calls))
            ps.append(run_peer(a.peer_python, spec))
            print(json.dumps({"case": case, "kvsim": ks[-1], "peer": ps[-1]}), flush=True)
        kp = min(r["process_cpu_s"] for r in ks)
        kc = min(r["call_cpu_s"] for r in ks)
        pp = min(r["process_cpu_s"] for r in ps)
        pc = min(r["call_cpu_s"] for r in ps)
        row = {"case": case, "block_tokens": block, "gpu_blocks": gpu, "host_blocks": host,
               "replicas": replicas, "requests": n_req, "cold": a.cold,
               "kvsim_process_cpu_s": kp, "kvsim_call_cpu_s": kc,
               "peer_process_cpu_s": pp, "peer_call_cpu_s": pc,
               "kvsim_req_per_cpu_s": n_req / kp, "peer_req_per_cpu_s": n_req / pp,
               "ratio_process": pp / kp, "ratio_call": pc / kc,
               "kvsim_hbm_hit_rate": ks[0]["hbm_hit_rate"],
               "kvsim_prefix_hit_rate": ks[0]["prefix_hit_rate"],
               "peer_prefix_cache_reused_ratio": ps[0]["prefix_cache_reused_ratio"],
               "peer_first_admission_reused_ratio":
                   ps[0]["first_admission_prefix_cache_reused_ratio"],
               "runs": {"kvsim": ks, "peer": ps}}
        if a.calls > 1:
            kl = min(min(r["calls_cpu_s"][1:]) for r in ks)
            pl = min(min(r["calls_cpu_s"][1:]) for r in ps)
            row.update({"calls": a.calls, "kvsim_later_call_cpu_s": kl,
                        "peer_later_call_cpu_s": pl, "ratio_later_calls": pl / kl})
        rows.append(row)
    print(f"\n{n_req} requests; kvsim {'cold' if a.cold else 'warm'}; min of {a.repeat}, "
          "CPU s of the whole child (the call alone)")
    print("| case | kvsim CPU s | peer CPU s | kvsim req/CPU-s | peer req/CPU-s | ratio | "
          "kvsim HBM hit / prefix hit | peer reused / first-admission |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['kvsim_process_cpu_s']:.2f} ({r['kvsim_call_cpu_s']:.2f}) | "
              f"{r['peer_process_cpu_s']:.2f} ({r['peer_call_cpu_s']:.2f}) | "
              f"{r['kvsim_req_per_cpu_s']:,.0f} | {r['peer_req_per_cpu_s']:,.0f} | "
              f"{r['ratio_process']:.2f}x ({r['ratio_call']:.2f}x) | "
              f"{100 * (r['kvsim_hbm_hit_rate'] or 0):.4f} % / "
              f"{100 * (r['kvsim_prefix_hit_rate'] or 0):.4f} % | "
              f"{100 * (r['peer_prefix_cache_reused_ratio'] or 0):.4f} % / "
              f"{100 * (r['peer_first_admission_reused_ratio'] or 0):.4f} % |")
    if a.calls > 1:
        print(f"\nthe later of {a.calls} replays in one process (min over runs and calls)")
        print("| case | kvsim CPU s | peer CPU s | kvsim req/CPU-s | peer req/CPU-s | ratio |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            kl, pl = r["kvsim_later_call_cpu_s"], r["peer_later_call_cpu_s"]
            print(f"| {r['case']} | {kl:.2f} | {pl:.2f} | {n_req / kl:,.0f} | "
                  f"{n_req / pl:,.0f} | {pl / kl:.2f}x |")
    print("load:", _load())
    if a.out:
        Path(a.out).write_text(json.dumps(
            {"rows": rows, "argv": sys.argv, "machine": platform.node(),
             "python": platform.python_version(), "started": started,
             "ended": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
