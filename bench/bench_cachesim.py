"""Single-tier policies: kvsim's cache simulator vs libCacheSim 0.3.5, same streams, one run.

For each stream, capacity and algorithm it prints the miss counts of both (they must be
IDENTICAL: the script exits 1 otherwise), the accesses/s of kvsim and of libCacheSim with
its hash table at ``hashpower`` 16, 20 and 24 (2^k buckets; 24 is its default, whose fixed
cost dominates short streams), and kvsim's ratio to the FASTEST of the three (the bar), and
writes the same as JSON (``--out``) with ``/proc/loadavg`` at the start and the end.

Streams: (a) a seeded Zipf(alpha) stream over a finite universe (10 M accesses by
default) at a small and a large cache; (b) the Mooncake conversation trace's block
accesses (``hash_ids`` of every request, in order), skipped with a message when the file
is absent.

Timing: CPU time of this process (``time.process_time``: both tools run in it, libCacheSim's
C loop included; on a shared machine wall time counts other jobs' time slices, CPU time
does not), best of ``--repeat`` runs, measured here and never stored in kvsim outputs;
rates are accesses per CPU-second.  END TO END on both sides: kvsim's time is ``simulate_cache(keys, ...)`` on the
raw 64-bit keys, so it includes the remap of keys to dense ids (and the next-use pass of
the offline policy); libCacheSim's is ``process_trace`` over an ``oracleGeneral`` binary
trace file (its C loop, including the reader and its hash table: its "remap"), the format
that carries next-access times for its Belady.  kvsim is warmed up first (numba compile
time is EXCLUDED; it is a one-time cost per policy, cached on disk).  ``replay M/s`` is
kvsim on keys already remapped (``prepare_keys`` once, reused), for reference.

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

from kvsim.cachesim.simulator import PreparedKeys, prepare_keys, simulate_cache
from kvsim.core.fsutil import atomic_output
from kvsim.policy.registry import policy_from_module

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
    """(best CPU seconds of ``repeat`` calls, last value)."""
    best, value = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        value = fn()
        best = min(best, time.process_time() - t0)
    return best, value


HASHPOWERS = (16, 20, 24)


def run_lcs(lcs, trace: Path, n: int, capacity: int, policy: str,
            hashpower: int) -> tuple[float, int]:
    """(seconds, misses) of one libCacheSim run; reader and cache built outside the timer."""
    reader = lcs.TraceReader(str(trace), lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(lcs, LCS_CLASSES[policy])(capacity, hashpower=hashpower)
    t0 = time.process_time()
    miss_ratio, _ = cache.process_trace(reader)
    return time.process_time() - t0, round(miss_ratio * n)


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
    try:  # the code measured: commit, and whether the work tree differs from it
        root = Path(__file__).resolve().parents[1]
        info["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short",
                                         "HEAD"], capture_output=True, text=True,
                                        check=True).stdout.strip()
        info["work_tree_clean"] = not subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True).stdout.strip()
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
    info["started_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
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
        simulate_cache(np.arange(100, dtype=np.int64) % 7, 3, p)  # remap paths too
        simulate_cache(np.arange(100, dtype=np.int64) * (1 << 40), 3, p)

    rows, ok = [], True
    hp_cols = "".join(f"{'lcs' + str(h) + ' M/s':>12}" for h in HASHPOWERS)
    header = (f"{'stream':<24}{'cap':>8} {'policy':<8}{'misses':>10}{'same':>5}"
              f"{'replay M/s':>11}{'e2e M/s':>9}{hp_cols}{'e2e/best':>9}")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        for sname, (keys, caps) in streams.items():
            n = int(keys.shape[0])
            prep = prepare_keys(keys)
            trace = Path(tmp) / f"{sname}.oracleGeneral.bin"
            write_oracle(prep, trace)
            for cap in caps:
                for p in args.policies:
                    t_rep, res = best_of(args.repeat, lambda: simulate_cache(prep, cap, p))
                    t_e2e, res_e2e = best_of(args.repeat, lambda: simulate_cache(keys, cap, p))
                    lcs_t, lcs_m = {}, {}
                    for hp in HASHPOWERS:
                        runs = [run_lcs(lcs, trace, n, cap, p, hp) for _ in range(args.repeat)]
                        lcs_t[hp] = min(t for t, _ in runs)
                        lcs_m[hp] = runs[0][1]
                    best_hp = min(HASHPOWERS, key=lambda h: lcs_t[h])
                    same = res.misses == res_e2e.misses and all(
                        m == res.misses for m in lcs_m.values())
                    ok &= same
                    row = {"stream": sname, "accesses": n,
                           "unique": int(prep.keys_by_id.shape[0]),
                           "capacity_blocks": cap, "policy": p, "kvsim_misses": res.misses,
                           "libcachesim_misses": {str(h): lcs_m[h] for h in HASHPOWERS},
                           "identical": same,
                           "kvsim_replay_per_s": n / t_rep,
                           "kvsim_end_to_end_per_s": n / t_e2e,
                           "libcachesim_per_s": {str(h): n / lcs_t[h] for h in HASHPOWERS},
                           "libcachesim_best_hashpower": best_hp,
                           "ratio_end_to_end_vs_best": lcs_t[best_hp] / t_e2e}
                    rows.append(row)
                    lcs_txt = "".join(f"{n / lcs_t[h] / 1e6:>12.2f}" for h in HASHPOWERS)
                    print(f"{sname:<24}{cap:>8} {p:<8}{res.misses:>10}{'yes' if same else 'NO':>5}"
                          f"{n / t_rep / 1e6:>11.2f}{n / t_e2e / 1e6:>9.2f}{lcs_txt}"
                          f"{row['ratio_end_to_end_vs_best']:>8.2f}x", flush=True)

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
        info["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    except OSError:
        pass
    result = {"command": " ".join(["python", "bench/bench_cachesim.py"] + (argv or sys.argv[1:])),
              "machine": info, "libcachesim_version": getattr(lcs, "__version__", "?"),
              "timing": "CPU seconds (process_time), best of --repeat; end to end (kvsim remap "
                        "included); "
                        "numba compile excluded (warm-up)",
              "hashpowers": list(HASHPOWERS),
              "rows": rows, "python_vs_compiled": python_vs_compiled,
              "all_identical": bool(ok)}
    with atomic_output(args.out) as tmp_path:
        tmp_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}; miss counts identical: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
