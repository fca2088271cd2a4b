"""Request slots (kvsim.replay.slots; issue 38, "Memory"): the replay core's request tables
follow the requests in flight, not the trace, and every output is the same as with one row
per request id (slots not recycled): summary, per-request and per-step tables, decision
log, link metrics, under every write policy and batch size, with the folded rows in memory
or spilled to a file."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.core.schema import EventKind
from kvsim.replay import slots as slots_mod
from kvsim.replay.driver import execute, replay
from kvsim.replay.id_map import IdMap
from kvsim.replay.prepass import scan_trace
from kvsim.spec.sim_config import SimConfig

_CONFTEST = Path(__file__).with_name("conftest.py")
_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_slots", _CONFTEST)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)

N_REQUESTS = 150


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("slots")
    return _helpers.random_trace(_helpers.TraceBuilder, 11, n_requests=N_REQUESTS).write(
        d / "t.parquet")


def _replay(trace, config, recycle: bool, log):
    facts = scan_trace(trace, _helpers.BLOCK_TOKENS, config.batch_rows)
    assert facts.ids_final  # no row names a request after its FREE row
    facts.ids_final = recycle
    return replay(trace, "lru", config, log, facts=facts)


CONFIGS = {
    "plain": dict(hbm_blocks=8, dram_gb=0),
    "tiers_queue_warmup": dict(hbm_blocks=8, link_model="queue", warmup_fraction=0.3,
                               log_candidates=3),
    "offload": dict(hbm_blocks=10, write_policy="vllm_offload"),
    "swap_priority": dict(hbm_blocks=6, preemption="swap", priority_scheduling=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("batch_rows", [1 << 20, 7])
@pytest.mark.parametrize("mem_rows", [slots_mod.FOLD_MEM_ROWS, 4])
def test_recycled_slots_give_identical_outputs(trace, tiny_hw, tmp_path, monkeypatch, name,
                                               batch_rows, mem_rows):
    monkeypatch.setattr(slots_mod, "FOLD_MEM_ROWS", mem_rows)  # 4: the folded rows spill
    cfg = SimConfig(hardware=tiny_hw, engine="interpreted", batch_rows=batch_rows,
                    **CONFIGS[name])
    got = {}
    for recycle in (False, True):
        log = tmp_path / f"log_{recycle}.parquet"
        r = _replay(trace, cfg, recycle, log)
        got[recycle] = (json.dumps(r.summary, sort_keys=True), r.requests, r.steps,
                        pd.read_parquet(log))
    a, b = got[False], got[True]
    assert a[0] == b[0]
    pd.testing.assert_frame_equal(a[1], b[1], check_exact=True)
    pd.testing.assert_frame_equal(a[2], b[2], check_exact=True)
    pd.testing.assert_frame_equal(a[3], b[3], check_exact=True)
    assert len(a[1]) == N_REQUESTS and a[1]["request_id"].tolist() == list(range(N_REQUESTS))
    assert len(a[3]) > 100  # the log names requests (translated back from slots)


def test_request_tables_follow_requests_in_flight(trace, tiny_hw):
    """150 requests, at most 3 running at once: the core's request tables hold a few dozen
    slots (live requests and the owners of cached blocks), not one row per request id."""
    from kvsim.policy.registry import resolve_policy

    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=8, dram_gb=0, engine="interpreted",
                    batch_rows=16)
    ex = execute(trace, resolve_policy("lru"), cfg)
    sl = ex.run.slots
    assert sl.recycle and sl.closed
    assert sl.top <= 8 + 3 + 2  # owners of the 8 HBM blocks, the running ones, slot 0
    assert len(sl.folded.rows) == N_REQUESTS
    assert ex.run.R_i.shape[0] == 0  # dropped once folded


def _tb_two_requests(reuse: str):
    tb = _helpers.TraceBuilder()
    tb.STEP(0, 100.0)
    for r in (0, 1):
        tb.ARRIVE(r, 4)
        tb.ALLOC(r, 0, 7 + r, 4)
        tb.ACCESS(r, 4)
    tb.FREE(0)
    tb.STEP(1, 100.0)
    if reuse == "again":  # request 0 named after its FREE row
        tb.ALLOC(0, 0, 9, 4)
        tb.ACCESS(0, 4)
        tb.FREE(0)
    elif reuse == "parent":  # a fork from a finished parent
        tb.add(kind=EventKind.FORK, request_id=2, parent_request_id=0)
        tb.FREE(2)
    tb.FREE(1)
    return tb


@pytest.mark.parametrize("reuse,final", [("none", True), ("again", False),
                                         ("parent", False)])
def test_prepass_knows_when_ids_are_final(tmp_path, reuse, final):
    trace = _tb_two_requests(reuse).write(tmp_path / "t.parquet")
    for batch in (1, 3, 1 << 20):
        facts = scan_trace(trace, _helpers.BLOCK_TOKENS, batch)
        assert facts.ids_final is final
        assert facts.max_concurrent_requests == 2


def test_id_map_matches_a_dict():
    """The id -> slot hash map (deletion by backward shift) against a dict, through
    growth, colliding ids (a 1,024-slot table: ids apart by multiples of 1,024 share a
    home slot more often than not) and removals that shift later keys back."""
    rng = np.random.default_rng(0)
    m, want = IdMap(), {}
    for step in range(400):
        pool = rng.integers(0, 5000, 64) * (1024 if step % 3 == 0 else 1)
        new = np.unique([i for i in pool if int(i) not in want])
        vals = rng.integers(0, 1 << 40, len(new))
        m.put(new, vals)
        want.update(zip(new.tolist(), vals.tolist()))
        if want and step % 2:
            keys = np.array(sorted(want))
            gone = rng.choice(keys, size=min(len(keys), 40), replace=False)
            m.drop(np.concatenate([gone, [10 ** 9]]))  # an absent id is ignored
            for g in gone.tolist():
                del want[g]
        probe = np.concatenate([rng.integers(-2, 5000 * 1024, 200), list(want)[:300]])
        got = m.get(probe)
        assert got.tolist() == [want.get(int(i), -1) if i >= 0 else -1 for i in probe]
        assert m.n == len(want)
        # map_into (the driver's per-batch mapping): runs of one id (a request's rows)
        # looked up once, negative ids kept as they are, the absent ids >= 0 counted
        runs = np.repeat(probe, rng.integers(1, 4, len(probe)))
        out = np.empty(len(runs), np.int64)
        absent = m.map_into(runs, out)
        assert out.tolist() == [want.get(int(i), -1) if i >= 0 else int(i) for i in runs]
        assert absent == sum(1 for i in runs.tolist() if i >= 0 and i not in want)


@pytest.mark.parametrize("in_place", [True, False])
def test_pack_records_packs_live_records_as_numpys_gather(in_place):
    """The arena compaction's copy (kvsim.replay.kernel.bookkeeping.pack_records): the
    live requests' records, each with its whole room, back to back from row 0 in the
    order of their starts, in place or into a larger arena, as the numpy gather it
    replaced."""
    from kvsim.core import layout as L
    from kvsim.replay.kernel.bookkeeping import pack_records

    rng = np.random.default_rng(1)
    A_i = rng.integers(0, 1 << 40, (200, L.NAI))
    A_f = rng.random(200)
    R_i, _ = L.new_request_tables(8)
    spans = {1: (0, 10), 3: (10, 6), 4: (30, 20), 6: (80, 4), 7: (100, 50)}  # 4, 6 dead
    for r, (start, cap) in spans.items():
        R_i[r, L.RI_BT_START], R_i[r, L.RI_BT_CAP] = start, cap
    live = np.array([1, 7, 3], np.int64)  # by request: sorted by start below
    live = live[np.argsort(R_i[live, L.RI_BT_START], kind="stable")]
    caps = R_i[live, L.RI_BT_CAP]
    starts = np.concatenate(([0], np.cumsum(caps)[:-1]))
    src = np.repeat(R_i[live, L.RI_BT_START] - starts, caps) + np.arange(int(caps.sum()))
    want_i, want_f = A_i[src].copy(), A_f[src].copy()
    if in_place:
        new_i, new_f = A_i, A_f
    else:
        new_i, new_f = np.zeros((400, L.NAI), np.int64), np.zeros(400)
    used = pack_records(A_i, A_f, new_i, new_f, R_i, live, in_place)
    assert used == int(caps.sum()) == 66
    assert np.array_equal(new_i[:used], want_i) and np.array_equal(new_f[:used], want_f)
    assert R_i[live, L.RI_BT_START].tolist() == starts.tolist() == [0, 10, 16]

