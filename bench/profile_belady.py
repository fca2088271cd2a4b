"""Where Belady's time goes in the single-tier cache simulator (one Zipf stream).

Times, on the bench's Zipf stream (bench_cachesim.zipf_stream, same defaults): the key
remap and the next-use pre-pass, then the replay four ways, each a step away from the
next: (1) the generic loop with the hooks of policies/belady.py (``fast_path=False``);
(2) the hooks' own layout (``key[block]``, heap of blocks) inlined in one loop, no view;
(3) the dedicated loop (keys beside blocks in the heap array) plus the generic loop's
three per-access view writes; (4) the dedicated loop as ``simulate_cache`` runs it.
(1)-(2) is the cost of the hook calls and the ``resident`` array, (2)-(4) of the
``key[heap[i]]`` indirection, (3)-(4) of the view writes.  Miss counts are printed for
each (they must agree).  Wall clock, best of ``--repeat``, numba compile excluded.

    python bench/profile_belady.py                       # 10 M accesses, caches 1,000 and 100,000
    python bench/profile_belady.py --accesses 1000000 --caps 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cachesim import zipf_stream  # noqa: E402

from kvsim.cachesim.simulator import next_use_of, prepare_keys, remap_keys, simulate_cache  # noqa: E402
from kvsim.policy.api import new_block_view  # noqa: E402


@njit(cache=True)
def hooks_layout_inlined(ids, next_use, capacity, n_ids):
    """policies/belady.py's arrays (key per block, heap of block ids), hooks inlined."""
    key = np.zeros(n_ids, np.int64)
    heap = np.empty(capacity + 1, np.int64)
    pos = np.full(n_ids, -1, np.int64)
    n = 0
    misses = 0
    for t in range(ids.shape[0]):
        b = ids[t]
        k = next_use[t]
        i = pos[b]
        if i < 0:
            misses += 1
            if n >= capacity:
                pos[heap[0]] = -1
                n -= 1
                if n > 0:
                    last = heap[n]
                    lk = key[last]
                    j = 0
                    while True:
                        c = 2 * j + 1
                        if c >= n:
                            break
                        if c + 1 < n and key[heap[c + 1]] > key[heap[c]]:
                            c += 1
                        cb = heap[c]
                        if key[cb] <= lk:
                            break
                        heap[j] = cb
                        pos[cb] = j
                        j = c
                    heap[j] = last
                    pos[last] = j
            i = n
            n += 1
        key[b] = k
        while i > 0:
            p = (i - 1) >> 1
            pb = heap[p]
            if key[pb] >= k:
                break
            heap[i] = pb
            pos[pb] = i
            i = p
        heap[i] = b
        pos[b] = i
    return misses


@njit(cache=True)
def dedicated_with_view_writes(ids, next_use, capacity, n_ids, view):
    """cachesim._replay_belady plus the generic loop's per-access view writes."""
    hk = np.empty(capacity + 1, np.int64)
    hb = np.empty(capacity + 1, np.int64)
    pos = np.full(n_ids, -1, np.int64)
    n = 0
    misses = 0
    for t in range(ids.shape[0]):
        b = ids[t]
        k = next_use[t]
        view.next_use[b] = k
        view.last_access_us[b] = float(t)
        view.access_count[b] += 1
        i = pos[b]
        if i < 0:
            misses += 1
            if n >= capacity:
                pos[hb[0]] = -1
                n -= 1
                if n > 0:
                    lk = hk[n]
                    last = hb[n]
                    j = 0
                    while True:
                        c = 2 * j + 1
                        if c >= n:
                            break
                        if c + 1 < n and hk[c + 1] > hk[c]:
                            c += 1
                        ck = hk[c]
                        if ck <= lk:
                            break
                        cb = hb[c]
                        hk[j] = ck
                        hb[j] = cb
                        pos[cb] = j
                        j = c
                    hk[j] = lk
                    hb[j] = last
                    pos[last] = j
            i = n
            n += 1
        while i > 0:
            p = (i - 1) >> 1
            pk = hk[p]
            if pk >= k:
                break
            pb = hb[p]
            hk[i] = pk
            hb[i] = pb
            pos[pb] = i
            i = p
        hk[i] = k
        hb[i] = b
        pos[b] = i
    return misses


def best_of(repeat, fn):
    best, value = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--universe", type=int, default=1_000_000)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--caps", type=int, nargs="+", default=[1_000, 100_000])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)

    keys = zipf_stream(args.accesses, args.universe, args.alpha, args.seed)
    prep = prepare_keys(keys)
    n, n_ids = prep.ids.shape[0], prep.keys_by_id.shape[0]
    w = slice(0, 100)  # warm-up: compile everything outside the timers
    hooks_layout_inlined(prep.ids[w], prep.next_use[w], 3, n_ids)
    dedicated_with_view_writes(prep.ids[w], prep.next_use[w], 3, n_ids, new_block_view(n_ids))
    simulate_cache(prep, 3, "belady")
    simulate_cache(prep, 3, "belady", fast_path=False)
    t, _ = best_of(args.repeat, lambda: remap_keys(keys))
    print(f"key remap              {t:7.3f} s")
    t, _ = best_of(args.repeat, lambda: next_use_of(prep.ids, n_ids))
    print(f"next-use pre-pass      {t:7.3f} s")
    for cap in args.caps:
        steps = (
            ("(1) generic loop, belady hooks",
             lambda: simulate_cache(prep, cap, "belady", fast_path=False).misses),
            ("(2) hooks' layout inlined, no view",
             lambda: hooks_layout_inlined(prep.ids, prep.next_use, cap, n_ids)),
            ("(3) dedicated loop + view writes",
             lambda: dedicated_with_view_writes(prep.ids, prep.next_use, cap, n_ids,
                                                new_block_view(n_ids))),
            ("(4) dedicated loop (simulate_cache)",
             lambda: simulate_cache(prep, cap, "belady").misses))
        for name, fn in steps:
            t, misses = best_of(args.repeat, fn)
            print(f"cap {cap:>8}  {name:<38}{t:7.3f} s {n / t / 1e6:7.2f} M/s  "
                  f"misses {misses}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
