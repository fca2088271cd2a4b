"""Spike: can ONE compiled replay loop, cached on disk, run any policy's hooks passed as
numba first-class functions, and what does an indirect hook call cost against an inlined
one?  (The experiment behind kvsim's one compiled core, docs/architecture.md; kept as the
record of its measurement in docs/benchmarks.md; kvsim does not use it.)

    python bench/spike_fnptr.py --fresh          # new numba cache folder: cold process
    python bench/spike_fnptr.py                  # second process: same cache folder

Each run is ONE process; run it twice (the second reuses the cache folder of the first) to
see what survives a new process.  It prints and writes JSON (``--out``): CPU seconds to
obtain each compiled object (compile, or load from numba's cache), whether numba loaded it
from the cache (``stats.cache_hits``), and M accesses/s of the single-tier loop on a Zipf
1.0 stream (``--accesses``, default 10 M, 1,000-key cache by default) for:

* ``inlined``: the loop calls LRU's hooks as module globals (kvsim's architecture before
  the one core: the hooks compiled into the loop, one loop per policy);
* ``indirect-cfunc``: the loop takes its hooks as arguments typed
  ``numba.types.FunctionType(sig)`` and calls them through C function pointers; the hooks
  are ``numba.cfunc(sig, cache=True)`` objects;
* ``indirect-njit``: the same loop (same compiled code), the hooks ``njit(sig, cache=True)``
  dispatchers passed as first-class functions.

The uniform hook signature: state = one int64 array and one float64 array (a policy lays
its lists and counters out in them), ``on_hit(I, F, b, now)``, ``on_insert(I, F, b, now)``,
``on_remove(I, F, b)``, ``victim(I, F, now) -> block``.  Policies here: lru, fifo, sieve
(all exact; their miss counts are compared with each other's known properties and with the
inlined lru).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(tempfile.gettempdir()) / "kvsim-spike-fnptr-cache"


def _setup_cache(fresh: bool) -> None:
    import shutil

    if fresh and CACHE.exists():
        shutil.rmtree(CACHE)
    CACHE.mkdir(parents=True, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(CACHE)  # before numba is imported


def build(out: dict):
    """Define (and time the compile or cache load of) every function; returns them."""
    import numpy as np
    from numba import cfunc, float64, int64, njit, types, void

    arr_i = types.Array(int64, 1, "C")
    arr_f = types.Array(float64, 1, "C")
    sig_hit = void(arr_i, arr_f, int64, float64)  # on_hit and on_insert
    sig_rem = void(arr_i, arr_f, int64)
    sig_vic = int64(arr_i, arr_f, float64)
    FT_hit, FT_rem, FT_vic = (types.FunctionType(s) for s in (sig_hit, sig_rem, sig_vic))

    # ---- state layout shared by the three policies: a doubly linked list + a flag array
    # I[0] = n slots, I[1] = head (oldest), I[2] = tail (newest), I[3] = sieve hand,
    # I[4:4+n] prev, I[4+n:4+2n] next, I[4+2n:4+3n] visited (sieve)
    def _bodies():
        @njit(inline="always")
        def unlink(I, b):
            n = I[0]
            p = I[4 + b]
            q = I[4 + n + b]
            if p >= 0:
                I[4 + n + p] = q
            else:
                I[1] = q
            if q >= 0:
                I[4 + q] = p
            else:
                I[2] = p

        @njit(inline="always")
        def append(I, b):
            n = I[0]
            t = I[2]
            I[4 + b] = t
            I[4 + n + b] = -1
            if t >= 0:
                I[4 + n + t] = b
            else:
                I[1] = b
            I[2] = b

        return unlink, append

    unlink, append = _bodies()

    def lru_hit(I, F, b, now):
        unlink(I, b)
        append(I, b)

    def lru_insert(I, F, b, now):
        append(I, b)

    def lru_remove(I, F, b):
        unlink(I, b)

    def lru_victim(I, F, now):
        return I[1]

    def fifo_hit(I, F, b, now):
        pass

    def sieve_hit(I, F, b, now):
        I[4 + 2 * I[0] + b] = 1

    def sieve_insert(I, F, b, now):
        I[4 + 2 * I[0] + b] = 0
        append(I, b)

    def sieve_remove(I, F, b):
        if I[3] == b:
            I[3] = I[4 + b]  # hand moves towards the head (newer -> older)
        unlink(I, b)

    def sieve_victim(I, F, now):
        n = I[0]
        h = I[3] if I[3] >= 0 else I[2]
        while I[4 + 2 * n + h] != 0:
            I[4 + 2 * n + h] = 0
            h = I[4 + h] if I[4 + h] >= 0 else I[2]
        I[3] = h
        return h

    hooks_py = {"lru": (lru_hit, lru_insert, lru_remove, lru_victim),
                "fifo": (fifo_hit, lru_insert, lru_remove, lru_victim),
                "sieve": (sieve_hit, sieve_insert, sieve_remove, sieve_victim)}
    sigs = (sig_hit, sig_hit, sig_rem, sig_vic)

    timings = out.setdefault("obtain_cpu_s", {})
    hits = out.setdefault("cache_hits", {})

    def timed(name, make, warm=None):
        c0 = time.process_time()
        obj = make()
        if warm is not None:
            warm(obj)
        timings[name] = time.process_time() - c0
        return obj

    cf, nj = {}, {}
    for pol, fns in hooks_py.items():
        # njit first: a cfunc of the same function writes the same cache index, so the
        # second of the two would load what the first compiled
        nj[pol] = timed(f"njit_hooks_{pol}",
                        lambda: tuple(njit(s, cache=True)(f) for s, f in zip(sigs, fns)))
        cf[pol] = timed(f"cfunc_hooks_{pol}",
                        lambda: tuple(cfunc(s, cache=True)(f) for s, f in zip(sigs, fns)))
        hits[f"njit_hooks_{pol}"] = [sum(d.stats.cache_hits.values()) for d in nj[pol]]
        hits[f"cfunc_hooks_{pol}"] = [c.cache_hits for c in cf[pol]]

    loop_sig = int64(types.Array(int64, 1, "C", readonly=False), int64, arr_i, arr_f,
                     FT_hit, FT_hit, FT_rem, FT_vic, types.Array(types.boolean, 1, "C"))

    def loop(ids, capacity, I, F, on_hit, on_insert, on_remove, victim, resident):
        misses = 0
        n_res = 0
        for i in range(ids.shape[0]):
            b = ids[i]
            now = float(i)
            if resident[b]:
                on_hit(I, F, b, now)
                continue
            misses += 1
            while n_res >= capacity:
                v = victim(I, F, now)
                on_remove(I, F, v)
                resident[v] = False
                n_res -= 1
            on_insert(I, F, b, now)
            resident[b] = True
            n_res += 1
        return misses

    indirect = timed("indirect_loop", lambda: njit(loop_sig, cache=True)(loop))
    hits["indirect_loop"] = sum(indirect.stats.cache_hits.values())

    # the inlined loop: LRU's hooks as globals (what kvsim's templates do per policy)
    g_hit, g_ins, g_rem, g_vic = (njit(f) for f in hooks_py["lru"])

    def loop_inlined(ids, capacity, I, F, resident):
        misses = 0
        n_res = 0
        for i in range(ids.shape[0]):
            b = ids[i]
            now = float(i)
            if resident[b]:
                g_hit(I, F, b, now)
                continue
            misses += 1
            while n_res >= capacity:
                v = g_vic(I, F, now)
                g_rem(I, F, v)
                resident[v] = False
                n_res -= 1
            g_ins(I, F, b, now)
            resident[b] = True
            n_res += 1
        return misses

    inl_sig = int64(types.Array(int64, 1, "C"), int64, arr_i, arr_f,
                    types.Array(types.boolean, 1, "C"))
    inlined = timed("inlined_loop_lru", lambda: njit(inl_sig, cache=True)(loop_inlined))
    hits["inlined_loop_lru"] = sum(inlined.stats.cache_hits.values())
    return np, indirect, inlined, cf, nj


def zipf_ids(np, n: int, universe: int, seed: int):
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, universe + 1, dtype=np.float64)
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), universe - 1)
    perm = rng.permutation(universe).astype(np.int64)
    keys = perm[ranks]
    # dense ids in order of first appearance (as kvsim's remap)
    table = np.full(universe, -1, np.int64)
    first = np.unique(keys, return_index=True)[1]
    order = keys[np.sort(first)]
    table[order] = np.arange(order.shape[0])
    return table[keys], order.shape[0]


def fresh_state(np, n: int):
    I = np.zeros(4 + 3 * n, np.int64)
    I[0] = n
    I[1] = I[2] = I[3] = -1
    return I, np.zeros(1, np.float64), np.zeros(n, np.bool_)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fresh", action="store_true", help="empty the numba cache folder first")
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--universe", type=int, default=1_000_000)
    ap.add_argument("--capacity", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    _setup_cache(args.fresh)
    out: dict = {"command": " ".join(["python", "bench/spike_fnptr.py"] + sys.argv[1:]),
                 "load_average_at_start": open("/proc/loadavg").read().split()[:3],
                 "numba_cache_dir": str(CACHE)}
    c0 = time.process_time()
    import numba

    out["numba"] = numba.__version__
    out["import_numba_cpu_s"] = time.process_time() - c0
    np, indirect, inlined, cf, nj = build(out)
    ids, n_ids = zipf_ids(np, args.accesses, args.universe, 42)
    rates, misses = {}, {}

    def bench(name, fn):
        best = float("inf")
        for _ in range(args.repeat):
            I, F, res = fresh_state(np, n_ids)
            t0 = time.perf_counter()
            m = fn(I, F, res)
            best = min(best, time.perf_counter() - t0)
        rates[name] = args.accesses / best / 1e6
        misses[name] = int(m)

    bench("inlined lru", lambda I, F, r: inlined(ids, args.capacity, I, F, r))
    for pol in ("lru", "fifo", "sieve"):
        bench(f"indirect-cfunc {pol}",
              lambda I, F, r: indirect(ids, args.capacity, I, F, *cf[pol], r))
        bench(f"indirect-njit {pol}",
              lambda I, F, r: indirect(ids, args.capacity, I, F, *nj[pol], r))
    out["indirect_loop_signatures"] = len(indirect.signatures)  # 1: no recompile per policy
    out["indirect_loop_overloads"] = len(indirect.overloads)
    out["M_accesses_per_s"] = rates
    out["misses"] = misses
    out["load_average_at_end"] = open("/proc/loadavg").read().split()[:3]
    assert misses["inlined lru"] == misses["indirect-cfunc lru"] == misses["indirect-njit lru"]
    assert misses["indirect-cfunc sieve"] == misses["indirect-njit sieve"]
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
