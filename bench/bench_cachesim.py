"""Single-tier policies: kvsim's cache simulator vs libCacheSim 0.3.5, same streams, one run.

For each stream, capacity and algorithm it prints the miss counts of both (they must be
IDENTICAL: the script exits 1 otherwise), the accesses/s of both and their ratio, and
writes the same as JSON (``--out``).

Streams: (a) a seeded Zipf(alpha) stream over a finite universe (10 M accesses by
default) at a small and a large cache; (b) the Mooncake conversation trace's block
accesses (``hash_ids`` of every request, in order), skipped with a message when the file
is absent.

Timing (wall clock, best of ``--repeat`` runs, measured here and never stored in kvsim
outputs): kvsim is warmed up first (numba compile time is EXCLUDED); its "replay" rate
times ``simulate_cache`` on a prepared stream (keys already remapped to dense ids), its
"end-to-end" rate includes the remap and the next-use pass.  libCacheSim's rate times
``process_trace`` over an ``oracleGeneral`` binary trace file (its C loop, including the
reader and its hash table), the format that carries next-access times for its Belady.

    python bench/bench_cachesim.py                 # full run (10-30 minutes on 2 cores)
    python bench/bench_cachesim.py --accesses 1000000 --repeat 1   # quick
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import types
from collections import OrderedDict
from pathlib import Path

import numpy as np

from kvsim.fsutil import atomic_output
from kvsim.policy_registry import policy_from_module
from kvsim.sim.cachesim import PreparedKeys, prepare_keys, simulate_cache

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / \
    "conversation_trace.jsonl"
LCS_CLASSES = {"lru": "LRU", "fifo": "FIFO", "lfu": "LFU", "arc": "ARC", "sieve": "Sieve",
               "s3fifo": "S3FIFO", "belady": "Belady"}
ORACLE_DTYPE = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                         ("next_access_vtime", "<i8")])


def zipf_stream(n: int, universe: int, alpha: float, seed: int) -> np.ndarray:
    """``n`` draws of object ranks with P(k) ~ 1/k^alpha over ``universe`` objects (alpha may
    be 1.0, unlike numpy's zipf), mapped through a seeded permutation to object ids."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, universe + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n), side="right")
    return rng.permutation(universe).astype(np.int64)[np.minimum(ranks, universe - 1)]


def mooncake_stream(path: Path) -> np.ndarray:
    ids: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ids.extend(json.loads(line)["hash_ids"])
    return np.array(ids, np.int64)


def write_oracle(prep: PreparedKeys, path: Path) -> None:
    rec = np.zeros(prep.ids.shape[0], ORACLE_DTYPE)
    rec["clock_time"] = np.arange(prep.ids.shape[0]) // 1000
    rec["obj_id"] = prep.keys_by_id[prep.ids].astype(np.uint64) + 1
    rec["obj_size"] = 1
    rec["next_access_vtime"] = np.where(prep.next_use == np.iinfo(np.int64).max, -1,
                                        prep.next_use)
    rec.tofile(path)


def best_of(repeat: int, fn):
    best, value = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def run_lcs(lcs, trace: Path, n: int, capacity: int, policy: str) -> tuple[float, int]:
    """(seconds, misses) of one libCacheSim run; reader and cache built outside the timer."""
    reader = lcs.TraceReader(str(trace), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(lcs, LCS_CLASSES[policy])(capacity)
    t0 = time.perf_counter()
    miss_ratio, _ = cache.process_trace(reader)
    return time.perf_counter() - t0, round(miss_ratio * n)


def python_lru_policy():
    """A plain-Python LRU as a user would prototype it (OrderedDict), for the
    compiled/interpreted ratio."""
    mod = types.ModuleType("py_lru_bench")
    mod.NAME, mod.DESCRIPTION, mod.REASONS = "py_lru_bench", "plain-Python LRU", ("lru",)
    mod.init = lambda capacity_blocks, num_slots, params: (OrderedDict(),)

    def on_insert(state, view, b, now_us):
        state[0][b] = None

    def on_hit(state, view, b, now_us):
        state[0].move_to_end(b)

    def on_remove(state, view, b):
        del state[0][b]

    def victim(state, view, now_us, alt_blocks, alt_scores):
        return (next(iter(state[0])), 0, 0) if state[0] else (-1, 0, 0)

    mod.on_insert, mod.on_hit, mod.on_remove, mod.victim = on_insert, on_hit, on_remove, victim
    return policy_from_module(mod, "bench")


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "L2 cache",
                               "L3 cache"):
                info[key.strip()] = val.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        info["load_average_at_start"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=10_000_000, help="Zipf stream length")
    ap.add_argument("--universe", type=int, default=1_000_000, help="Zipf objects")
    ap.add_argument("--alpha", type=float, default=1.0, help="Zipf exponent")
    ap.add_argument("--seed", type=int, default=42, help="Zipf generator seed")
    ap.add_argument("--small", type=int, default=1_000, help="small cache (objects)")
    ap.add_argument("--large", type=int, default=100_000, help="large cache (objects)")
    ap.add_argument("--mooncake-caps", type=int, nargs="+", default=[1_000, 10_000],
                    help="cache sizes (blocks) for the Mooncake trace")
    ap.add_argument("--policies", nargs="+", default=list(LCS_CLASSES), help="algorithms")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per cell (best kept)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/cachesim.json"),
                    help="JSON result file")
    args = ap.parse_args(argv)

    info = machine()  # here: its load average is the one at the start of the run
    try:
        import libcachesim as lcs
    except ImportError:
        print("libcachesim is not installed (pip install 'kvsim[test]'); nothing to compare",
              file=sys.stderr)
        return 1

    streams = {f"zipf{args.alpha}-{args.accesses}": (zipf_stream(args.accesses, args.universe,
                                                                 args.alpha, args.seed),
                                                     [args.small, args.large])}
    if MOONCAKE.is_file():
        streams["mooncake-conversation"] = (mooncake_stream(MOONCAKE), args.mooncake_caps)
    else:
        print(f"skipping Mooncake: {MOONCAKE} not found (it lives in ../shared/traces)",
              file=sys.stderr)

    # warm-up: compile every policy's loop once, outside the timers
    tiny = prepare_keys(np.arange(100, dtype=np.int64) % 7)
    for p in args.policies:
        simulate_cache(tiny, 3, p)

    rows, ok = [], True
    header = (f"{'stream':<26}{'cap':>8} {'policy':<8}{'kvsim misses':>14}{'lcs misses':>14}"
              f"{'kvsim M/s':>11}{'e2e M/s':>9}{'lcs M/s':>9}{'ratio':>7}")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for sname, (keys, caps) in streams.items():
            n = int(keys.shape[0])
            prep_s, prep = best_of(1, lambda: prepare_keys(keys))
            trace = Path(tmp) / f"{sname}.oracleGeneral.bin"
            write_oracle(prep, trace)
            for cap in caps:
                for p in args.policies:
                    t_kv, res = best_of(args.repeat, lambda: simulate_cache(prep, cap, p))
                    lcs_runs = [run_lcs(lcs, trace, n, cap, p) for _ in range(args.repeat)]
                    t_lcs = min(t for t, _ in lcs_runs)
                    lcs_misses = lcs_runs[0][1]
                    same = res.misses == lcs_misses
                    ok &= same
                    row = {"stream": sname, "accesses": n, "unique": int(prep.keys_by_id.shape[0]),
                           "capacity_blocks": cap, "policy": p, "kvsim_misses": res.misses,
                           "libcachesim_misses": lcs_misses, "identical": same,
                           "kvsim_replay_per_s": n / t_kv,
                           "kvsim_end_to_end_per_s": n / (t_kv + prep_s),
                           "libcachesim_per_s": n / t_lcs,
                           "ratio_replay": t_lcs / t_kv,
                           "ratio_end_to_end": t_lcs / (t_kv + prep_s)}
                    rows.append(row)
                    print(f"{sname:<26}{cap:>8} {p:<8}{res.misses:>14}{lcs_misses:>14}"
                          f"{row['kvsim_replay_per_s'] / 1e6:>11.2f}"
                          f"{row['kvsim_end_to_end_per_s'] / 1e6:>9.2f}"
                          f"{row['libcachesim_per_s'] / 1e6:>9.2f}{row['ratio_replay']:>6.2f}x"
                          + ("" if same else "  MISMATCH"), flush=True)

    # compiled vs plain-Python policy: the same loop, compiled vs its interpreted twin
    first_keys = next(iter(streams.values()))[0][:1_000_000]
    prep1 = prepare_keys(first_keys)
    py_pol = python_lru_policy()
    t_py, r_py = best_of(1, lambda: simulate_cache(prep1, args.small, py_pol))
    t_c, r_c = best_of(args.repeat, lambda: simulate_cache(prep1, args.small, "lru"))
    ok &= r_py.misses == r_c.misses
    python_vs_compiled = {"accesses": int(first_keys.shape[0]), "capacity_blocks": args.small,
                          "compiled_per_s": len(first_keys) / t_c,
                          "python_per_s": len(first_keys) / t_py, "speedup": t_py / t_c,
                          "identical_misses": r_py.misses == r_c.misses}
    print(f"plain-Python LRU (OrderedDict hooks, interpreted loop): "
          f"{python_vs_compiled['python_per_s'] / 1e6:.3f} M/s vs compiled "
          f"{python_vs_compiled['compiled_per_s'] / 1e6:.2f} M/s "
          f"-> compiled is {python_vs_compiled['speedup']:.0f}x faster")

    try:  # other jobs on a shared machine depress both tools' rates: record it
        info["load_average_at_end"] = open("/proc/loadavg").read().split()[:3]
    except OSError:
        pass
    result = {"command": " ".join(["python", "bench/bench_cachesim.py"] + (argv or sys.argv[1:])),
              "machine": info, "libcachesim_version": getattr(lcs, "__version__", "?"),
              "timing": "wall clock, best of --repeat; numba compile excluded (warm-up)",
              "rows": rows, "python_vs_compiled": python_vs_compiled,
              "all_identical": bool(ok)}
    with atomic_output(args.out) as tmp_path:
        tmp_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}; miss counts identical: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
