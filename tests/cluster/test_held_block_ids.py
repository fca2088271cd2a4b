"""The closed loop does not hold the trace's block ids for its run (issue 38, "Memory"):
vLLM's scheduler reads its block hashes, never the block ids, so an engine keeps none of
them, and a caller that hands its table over (the CLI: ``serve(release_block_ids=True)``)
has them dropped once the prompt-block facts are made (one replica, no router).  Main kept
them, ~200 bytes a Mooncake request, for the whole run.  The results are the same."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kvsim.modes.closed.closed_loop as cl
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig
from tests.helpers import shared_prefix_table

B = 16
CONFIG = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0)


def _table():
    return shared_prefix_table(seed=3, n=24, gap_us=20_000, block_size_tokens=B)


def _alive_at_run(monkeypatch, table) -> list:
    """Serve ``table`` (handed over) and say, at the first engine step, whether its block
    ids (both CSR arrays) are still alive anywhere."""
    refs = [weakref.ref(a) for a in table.flat_block_ids()]
    seen: list = []
    real = cl.Engine.advance

    def spy(self, *a, **k):
        if not seen:
            gc.collect()
            seen.append([r() is not None for r in refs])
        return real(self, *a, **k)

    monkeypatch.setattr(cl.Engine, "advance", spy)
    s = serve(table, "lru", CONFIG, release_block_ids=True).summary
    return seen[0], s


def test_handed_over_table_block_ids_are_not_held_by_the_run(monkeypatch):
    """Fails on main (no ``release_block_ids``; the engine's scheduler arguments and the
    table held the ids to the end)."""
    alive, released = _alive_at_run(monkeypatch, _table())
    assert alive == [False, False]
    kept = serve(_table(), "lru", CONFIG).summary  # the caller keeps its table: the same
    assert released == kept


def test_a_released_table_says_so():
    t = _table()
    off, ids = t.flat_block_ids()
    t.column("arrival_us")
    assert t.release_block_ids(("session", "n"))
    assert len(t) == 24 and t.column("prompt_tokens").shape == (24,)
    with pytest.raises(RuntimeError, match="'session' was released"):
        t.column("session")
    with pytest.raises(RuntimeError, match="released"):
        t.columns()
    with pytest.raises(RuntimeError, match="released"):
        t.flat_block_ids()
    with pytest.raises(RuntimeError, match="released"):
        _ = t.df
    t2 = _table()
    _ = t2.df  # a table held as a DataFrame keeps its ids
    assert not t2.release_block_ids()
    assert np.array_equal(t2.flat_block_ids()[1], ids)


def test_engine_under_vllm_holds_no_block_ids():
    """The engine's scheduler arguments keep one-entry placeholders for the block ids
    (vLLM's step reads the hashes) and a step's admission list sized by max_num_seqs."""
    from kvsim.modes.closed.closed_loop import EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy

    t = _table()
    opts = EngineOptions(scheduler="vllm", max_num_seqs=8)
    cost, hbm, costs, bb, off, ids, t, _ = prepare(t, CONFIG, opts)
    e = cl.Engine(t, off, ids, resolve_policy("lru"), CONFIG, opts, cost, hbm, costs, bb)
    assert [a.shape for a in e.sched.req_args[11:]] == [(1,)] * 5
    assert e.sched.adm.shape == (9,)


@pytest.mark.parametrize("router", ["prefix", "least_loaded"])
def test_routed_queues_and_router_lists_grow_with_what_is_routed(monkeypatch, router):
    """A routed replica's queue starts small and doubles (Engine.grow_order), the router
    holds a chunk of arrivals' values at a time (routing.ROUTE_CHUNK): the same results as
    with one queue and one list the size of the trace (main's)."""
    import kvsim.modes.closed.cluster as cluster
    import kvsim.modes.closed.routing as routing

    def run():
        r = serve(_table(), "lru", CONFIG, replicas=3, router=router)
        return r.summary, r.requests

    s0, f0 = run()
    monkeypatch.setattr(cluster, "ORDER_FIRST", 2)
    monkeypatch.setattr(routing, "ROUTE_CHUNK", 4)
    grown = []
    real = cl.Engine.grow_order
    monkeypatch.setattr(cl.Engine, "grow_order",
                        lambda self: grown.append(1) or real(self))
    s1, f1 = run()
    assert grown and s1 == s0
    assert f1.equals(f0)


def _long_table(copies: int):
    """40 requests of 48 block ids each (a long prompt, as Mooncake's), repeated ``copies``
    times back to back (the same contents: only the trace's length grows)."""
    n, k = 40, 48
    ids = [list(range(100 * (r % 4), 100 * (r % 4) + 8)) + list(range(5000 + 50 * r,
                                                                      5000 + 50 * r + k - 8))
           for r in range(n)]
    prompt = [k * B] * n
    m = n * copies
    return build_request_table({"arrival_us": [30_000 * i for i in range(m)],
                                "prompt_tokens": prompt * copies,
                                "output_tokens": [8] * m, "block_ids": ids * copies,
                                "hashed_tokens": prompt * copies}, block_size_tokens=B)


def test_bytes_held_at_the_run_per_request(monkeypatch):
    """The bytes the set-up keeps for the run (tracemalloc, at the first engine step, the
    table made under it: the caller hands it over), 32 copies of a trace against 8, per
    added request: the block ids (48 a request here, 392 bytes) are not among them, nor
    the table's columns the run does not read, nor a step's admission list per request.
    Main: ~640 bytes a request; here ~165 (what is left grows with the trace: the table's
    columns the engine reads, vLLM's h0/h1 and request constants, the block facts, a
    replica's slot map, queue and hit tokens: docs/benchmarks.md)."""
    import tracemalloc

    from kvsim.modes.closed.closed_loop import EngineOptions

    opts = EngineOptions(max_num_seqs=8)  # what is sized by the running set stays small

    def held(copies):
        got = []
        real = cl.Engine.advance

        def spy(self, *a, **k):
            if not got:
                gc.collect()
                got.append(tracemalloc.get_traced_memory()[0])
            return real(self, *a, **k)

        monkeypatch.setattr(cl.Engine, "advance", spy)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t = _long_table(copies)
        n = len(t)
        serve(t, "lru", CONFIG, engine=opts, release_block_ids=True)
        tracemalloc.stop()
        return got[0] - base, n

    serve(_long_table(1), "lru", CONFIG, engine=opts)  # imports, compiled code loaded
    (h1, n1), (h2, n2) = held(8), held(32)
    per_request = (h2 - h1) / (n2 - n1)
    assert per_request < 250, per_request
