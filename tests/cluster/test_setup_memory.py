"""Closed-loop set-up memory (issue 38, "Memory"): the whole-trace block facts are made
only as far as the run reads them (next_use only under an OFFLINE policy), a chunk of
blocks at a time, and the router's prompt hashes a chunk of requests at a time; the
values are those of the one-pass computation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import kvsim.modes.closed.closed_facts as cf
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig

B = 16
CONFIG = SimConfig(engine="interpreted", hbm_blocks=96, dram_gb=0, cxl_gb=0, nvme_gb=0)


def _table(copies: int = 1, n: int = 40, blocks: int = 40):
    """``n`` requests (5 shared prefixes of 8 blocks, then their own blocks; some prompts
    end in a partial block, some ids are unhashed), repeated ``copies`` times back to back:
    the same contents, a longer trace."""
    rng = np.random.default_rng(7)
    ids, prompt, output, hashed = [], [], [], []
    for r in range(n):
        own = int(rng.integers(0, blocks - 8))
        x = list(range(100 * (r % 5), 100 * (r % 5) + 8)) + \
            list(range(10_000 + 100 * r, 10_000 + 100 * r + own))
        p = len(x) * B - int(rng.integers(0, B))
        ids.append(x)
        prompt.append(p)
        output.append(int(rng.integers(1, 3 * B)))
        hashed.append(p if r % 7 else p // 2)  # every 7th: half its content unknown
    k = copies * n
    return build_request_table({"arrival_us": [50_000 * i for i in range(k)],
                                "prompt_tokens": prompt * copies,
                                "output_tokens": output * copies, "block_ids": ids * copies,
                                "hashed_tokens": hashed * copies}, block_size_tokens=B)


def _facts(table, next_use=True):
    off, ids = table.flat_block_ids()
    return cf.block_facts(table, off, ids, B, next_use=next_use)


def _reference(table):
    """next_use / seen by their definitions, in plain Python over the whole trace's block
    hashes: seen = an earlier block has the hash; next_use = the next looked-up (full)
    block with it (NEVER when none; unhashed blocks: 0 and NEVER)."""
    off, ids = table.flat_block_ids()
    prompt, hashed, output = (np.ascontiguousarray(table.column(c), dtype=np.int64) for c in (
        "prompt_tokens", "hashed_tokens", "output_tokens"))  # as block_facts: its types
    nb = np.maximum((prompt + B - 1) // B,
                    np.minimum((prompt + np.maximum(output - 1, 0) + B - 1) // B, hashed // B))
    pb_off = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
    h = np.zeros(int(pb_off[-1]), dtype=np.int64)
    full = np.zeros(h.shape[0], dtype=np.int8)
    with np.errstate(over="ignore"):
        cf._all_block_hashes(B, table.block_size_tokens, prompt, hashed, nb, off, ids, pb_off,
                             h, full)
    seen, nu, first, nxt = np.zeros(h.shape[0], np.int8), [cf.NEVER] * h.shape[0], set(), {}
    for p, x in enumerate(h.tolist()):
        if x != 0:
            seen[p] = x in first
            first.add(x)
    for p in range(h.shape[0] - 1, -1, -1):
        x = int(h[p])
        if x != 0:
            nu[p] = nxt.get(x, cf.NEVER)
            if full[p]:
                nxt[x] = p
    return pb_off, np.array(nu, dtype=np.int64), seen


@pytest.mark.parametrize("chunk,first_keys", [(1, 4), (3, 8), (64, 1 << 16), (1000, 4),
                                              (1 << 40, 1 << 16)])
def test_block_facts_equal_their_definitions(monkeypatch, chunk, first_keys):
    """next_use / seen made a chunk at a time (forward for seen, backward for next_use)
    with hash tables grown from ``first_keys`` entries equal their definitions over the
    whole trace; seen is a bit array (1 bit a block, little bit order); without next_use:
    the same seen and an empty next_use (integ6: no ``next_use`` option, every run made
    both)."""
    t = _table(copies=3)
    off1, nu1, seen1 = _reference(t)
    assert 0 < np.count_nonzero(nu1 != cf.NEVER) < nu1.shape[0]
    assert 0 < np.count_nonzero(seen1) < seen1.shape[0]
    monkeypatch.setattr(cf, "CHUNK_BLOCKS", chunk)
    monkeypatch.setattr(cf, "FIRST_KEYS", first_keys)
    off2, nu2, bits2 = _facts(t)
    m = seen1.shape[0]
    assert bits2.dtype == np.uint8 and bits2.shape == ((m + 7) // 8,)
    seen2 = np.unpackbits(bits2, count=m, bitorder="little")
    assert np.array_equal(off1, off2) and np.array_equal(nu1, nu2)
    assert np.array_equal(seen1, seen2) and nu2.dtype == np.int64
    off3, nu3, bits3 = _facts(t, next_use=False)
    assert np.array_equal(off3, off1) and np.array_equal(bits3, bits2)
    assert nu3.shape == (0,) and nu3.dtype == np.int64


def test_block_facts_peak_grows_by_the_results_only(monkeypatch):
    """8 copies of a trace (the same contents) against 1: the peak of the set-up grows by
    the results' bytes per block (seen: 1 bit; with next_use: 8 bytes more) plus a few per
    request (~0.7 a block here), not by every block's hash, position and sort order
    (integ6: ~58 bytes a block) nor by a byte a block of seen (s18: 1.95 and 10.6)."""
    monkeypatch.setattr(cf, "CHUNK_BLOCKS", 256, raising=False)
    t1, t8 = _table(copies=1), _table(copies=8)

    def peak(t, next_use):
        off, ids = t.flat_block_ids()
        t.column("prompt_tokens")  # the table's own columns are not the set-up's
        kw = {} if next_use else {"next_use": False}
        cf.block_facts(t, off, ids, B, **kw)  # compiled before measuring
        tracemalloc.start()
        cf.block_facts(t, off, ids, B, **kw)
        p = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return p

    m1, m8 = (int(cf.block_facts(t, *t.flat_block_ids(), B)[0][-1]) for t in (t1, t8))
    for next_use, bound in ((True, 9.5), (False, 1.2)):
        per_block = (peak(t8, next_use) - peak(t1, next_use)) / (m8 - m1)
        assert per_block < bound, (next_use, per_block)


def test_online_policy_skips_next_use_and_router_hashes_are_equal(monkeypatch):
    """An lru closed-loop run (2 replicas, prefix router) asks for no next_use (its core
    never reads it); belady (OFFLINE) gets it.  The router's chunked prompt hashes equal
    :func:`prompt_block_hashes`' and the routed run is the same with any chunk size."""
    t = _table(copies=2, n=12, blocks=12)
    got = []
    real = cf.block_facts

    def spy(*a, **k):
        r = real(*a, **k)
        got.append(r[1].shape[0])
        return r

    monkeypatch.setattr(cf, "block_facts", spy)
    lru = serve(t, "lru", CONFIG, replicas=2, router="prefix").requests
    serve(t, "belady", CONFIG, replicas=2, router="prefix")
    assert got[0] == 0 and got[1] > 0
    off, ids = t.flat_block_ids()
    pb_off, ref = cf.prompt_block_hashes(t, off, ids, B)
    monkeypatch.setattr(cf, "ROUTER_CHUNK", 5)
    monkeypatch.setattr(cf, "ROUTER_KEEP", 1)
    ph = cf.PromptHashes(t, off, ids, B)
    for i in [0, 7, 3, 23, 11, 12, 1]:  # out of order: chunks made again
        assert np.array_equal(ph.slice(i), ref[pb_off[i]:pb_off[i + 1]])
    again = serve(t, "lru", CONFIG, replicas=2, router="prefix").requests
    assert again.equals(lru)
