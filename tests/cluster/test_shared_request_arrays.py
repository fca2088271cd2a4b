"""Routed replicas share the per-request arrays each one indexes only at its own requests'
ids (issue 38, "Memory"): the tokens assumed cached at admission (``hitk``) and the
request -> row map (``smap``).  Main gave every replica its own, 8 bytes a request each
per replica (112 bytes a request more at 8 replicas).  The results are the same."""

from __future__ import annotations

import pytest

import kvsim.modes.closed.cluster as cluster
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig
from tests.helpers import shared_prefix_table

B = 16
CONFIG = SimConfig(mode="engine", hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0)


def _table():
    return shared_prefix_table(seed=5, n=30, gap_us=15_000, block_size_tokens=B)


def _engines_at_run(monkeypatch, **kw) -> list:
    got: list = []
    real = cluster._run_cluster

    def spy(table, engines, *a, **k):
        got.extend(engines)
        return real(table, engines, *a, **k)

    monkeypatch.setattr(cluster, "_run_cluster", spy)
    serve(_table(), "lru", CONFIG, **kw)
    return got


def test_routed_replicas_share_hit_tokens_and_row_map(monkeypatch):
    """Fails on main (one array per replica)."""
    engines = _engines_at_run(monkeypatch, replicas=4, router="prefix")
    assert len(engines) == 4
    for e in engines[1:]:
        assert e.sched.hitk is engines[0].sched.hitk
        assert e.slots.smap is engines[0].slots.smap
    # a request's row (or -1) is its own replica's: the one row map holds every request's
    for i, rid in enumerate(engines[0].slots.smap[:30]):
        assert rid >= 0 and sum(int(rid) < e.slots.rid_of.shape[0]
                                and e.slots.rid_of[rid] == i for e in engines) == 1


@pytest.mark.parametrize("router", ["prefix", "least_loaded", "round_robin"])
def test_shared_arrays_give_the_same_results(monkeypatch, router):
    def run():
        r = serve(_table(), "lru", CONFIG, replicas=3, router=router)
        return r.summary, r.requests

    s0, f0 = run()
    monkeypatch.setattr(cluster, "_share_per_request", lambda engines: None)
    s1, f1 = run()
    assert s1 == s0
    assert f1.equals(f0)


def test_no_decision_log_no_log_buffer(monkeypatch, tmp_path):
    """Without a decision log the core writes no log row: its one-row buffer is not grown
    when the engines finish (main grew it to 16 x the largest batch + 8192 rows, ~25 MB a
    replica at the Mooncake trace's batches).  Fails on main."""
    engines = _engines_at_run(monkeypatch, replicas=2, router="prefix")
    assert [e.run.G[0].shape[0] for e in engines] == [1, 1]
    logged = _engines_at_run(monkeypatch, replicas=2, router="prefix",
                             decision_log=tmp_path / "d.parquet")
    assert all(e.run.G[0].shape[0] > 8192 for e in logged[-2:])


@pytest.mark.parametrize("n", [1, 2])
def test_kvsim_scheduler_routed_same_results(monkeypatch, n):
    """kvsim's scheduler: with samples (n > 1) each replica numbers its children's slots
    from N up, so nothing is shared; without, the shared arrays give the same results."""
    from kvsim.modes.closed.closed_loop import EngineOptions

    def table():
        t = _table()
        if n > 1:
            d = {k: v.tolist() for k, v in t.columns().items()
                 if k in ("arrival_us", "prompt_tokens", "output_tokens", "hashed_tokens")}
            off, ids = t.flat_block_ids()
            d["block_ids"] = [ids[off[i]:off[i + 1]].tolist() for i in range(len(t))]
            d["n"] = [n] * len(t)
            t = build_request_table(d, block_size_tokens=B)
        return t

    def run():
        r = serve(table(), "lru", CONFIG, replicas=3, router="least_loaded",
                  engine=EngineOptions(scheduler="kvsim"))
        return r.summary, r.requests

    got: list = []
    real = cluster._run_cluster
    monkeypatch.setattr(cluster, "_run_cluster",
                        lambda t, engines, *a, **k: got.extend(engines) or real(t, engines, *a, **k))
    s0, f0 = run()
    assert (got[1].sched.hitk is got[0].sched.hitk) == (n == 1)
    monkeypatch.setattr(cluster, "_share_per_request", lambda engines: None)
    s1, f1 = run()
    assert s1 == s0
    assert f1.equals(f0)
