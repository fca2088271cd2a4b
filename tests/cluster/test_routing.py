"""Routers, priority scheduling and the closed-loop CLI, on hand-built Request tables
(interpreted engine)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.core.errors import KvsimInputError
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig

B = 16
CONFIG = SimConfig(engine="interpreted")


def _table(arrival, prompt, output, ids, **cols):
    return build_request_table({"arrival_us": arrival, "prompt_tokens": prompt,
                                "output_tokens": output, "block_ids": ids,
                                "hashed_tokens": [min(len(x) * B, p) for x, p in
                                                  zip(ids, prompt)], **cols},
                               block_size_tokens=B)


def test_prefix_router_sends_a_repeated_prompt_to_the_replica_that_cached_it():
    # A (ids 1..20) and B (ids 101..120) first, far apart; then A again and B again
    a, b = list(range(1, 21)), list(range(101, 121))
    p = 20 * B
    t = _table([0, 1_000_000, 2_000_000, 3_000_000], [p] * 4, [2] * 4, [a, b, a, b])
    res = serve(t, "lru", CONFIG, replicas=2, router="prefix")
    rq = res.requests.sort_values("request_id")
    # both replicas idle and empty for the first two: A -> 0 (ties: lowest index), and B
    # -> 0 as well (no cache on either, equal load); then the repeats hit replica 0
    assert list(rq["replica"]) == [0, 0, 0, 0]
    assert list(rq["hbm_hit_tokens"]) == [0, 0, 19 * B, 19 * B]
    rr = serve(t, "lru", CONFIG, replicas=2, router="round_robin").requests
    assert list(rr.sort_values("request_id")["replica"]) == [0, 1, 0, 1]
    # a busy replica 0 loses to an idle replica 1 when the cached prefix saves less than
    # its active blocks: prompt C arrives while A runs a long decode on replica 0
    c = list(range(201, 203))
    t2 = _table([0, 10], [p, 2 * B], [400, 2], [a, c])
    r2 = serve(t2, "lru", CONFIG, replicas=2, router="prefix").requests
    assert list(r2.sort_values("request_id")["replica"]) == [0, 1]


def test_session_router_is_sticky_and_least_loaded_balances():
    ids = [[i] for i in range(1, 7)]
    t = _table([0, 1, 2, 3, 4, 5], [B] * 6, [50] * 6, ids, session=[7, 8, 7, 9, 8, 7])
    s = serve(t, "lru", CONFIG, replicas=3, router="session").requests
    rep = dict(zip(s["request_id"], s["replica"]))
    assert rep[0] == rep[2] == rep[5] and rep[1] == rep[4]
    assert len({rep[0], rep[1], rep[3]}) == 3  # new sessions go to the least-loaded
    ll = serve(t, "lru", CONFIG, replicas=3, router="least_loaded").requests
    assert list(ll.sort_values("request_id")["replica"]) == [0, 1, 2, 0, 1, 2]


def test_priority_scheduling_admits_the_highest_priority_waiting_request_first():
    ids = [[1], [2], [3]]
    # one sequence at a time; requests 1 and 2 wait while 0 decodes, 2 has priority 90
    t = _table([0, 10, 20], [B] * 3, [20] * 3, ids, request_priority=[50, 50, 90])
    opts = EngineOptions(max_num_seqs=1)
    fifo = serve(t, "lru", CONFIG, engine=opts).requests.sort_values("request_id")
    prio = serve(t, "lru", SimConfig(engine="interpreted", priority_scheduling=True),
                 engine=opts).requests.sort_values("request_id")
    f_first = (fifo["arrival_us"] + fifo["ttft_us"]).to_numpy()
    p_first = (prio["arrival_us"] + prio["ttft_us"]).to_numpy()
    assert f_first[1] < f_first[2]
    assert p_first[2] < p_first[1]
    np.testing.assert_allclose(p_first[0], f_first[0])


def test_bad_router_and_replicas_are_input_errors():
    t = _table([0], [B], [1], [[1]])
    with pytest.raises(KvsimInputError, match="--router"):
        serve(t, "lru", CONFIG, replicas=2, router="random")
    with pytest.raises(KvsimInputError, match="--replicas"):
        serve(t, "lru", CONFIG, replicas=0)


def test_cli_compare_profile_is_closed_loop_and_json_says_so():
    r = CliRunner().invoke(app, ["compare", "--profile", "deadline_pressure", "--requests", "8",
                                 "--hbm-gb", "8", "--policies", "lru", "--engine",
                                 "interpreted", "--replicas", "2", "--router", "prefix",
                                 "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    row = d["policies"][0]
    assert (row["schedule"], row["replicas"], row["router"]) == ("closed", 2, "prefix")
    for k in ("ttft_p50_us", "ttft_p90_us", "ttft_p99_us", "tpot_p50_us", "tpot_p90_us",
              "tpot_p99_us", "e2e_p50_us", "e2e_p99_us", "throughput_tokens_per_s",
              "throughput_requests_per_s", "queue_p99_us", "slo_attainment",
              "prefill_tokens_saved", "hbm_hit_rate"):
        assert k in row
    assert row["requests"] == 8


def test_cli_schedule_closed_needs_a_request_table(tmp_path):
    r = CliRunner().invoke(app, ["simulate", "--trace", str(tmp_path / "x.parquet"),
                                 "--schedule", "closed"])
    assert r.exit_code == 2
    assert "--schedule" in r.output and "Traceback" not in r.output


def test_decision_log_one_file_per_replica_records_the_replica(tmp_path):
    import pyarrow.parquet as pq

    a, b = list(range(1, 21)), list(range(101, 121))
    t = _table([0, 10], [20 * B, 20 * B], [2, 2], [a, b])
    serve(t, "lru", CONFIG, replicas=2, router="round_robin",
          decision_log=tmp_path / "log.parquet")
    for k in (0, 1):
        f = pq.ParquetFile(tmp_path / f"log.replica{k}.parquet")
        meta = json.loads(f.schema_arrow.metadata[b"kvsim.decision_log"])
        assert meta["config"]["replica"] == k
        assert meta["config"]["schedule"] == "closed"


@pytest.mark.parametrize("replicas", [3, 5])
def test_prefix_router_skipping_replicas_that_cannot_win_picks_as_full_scoring(monkeypatch,
                                                                               replicas):
    """The prefix router skips a replica whose cost cannot beat the best one even with
    every block cached, in one compiled call for every replica
    (kvsim.engine.scheduler_blocks._route_prefix): at every arrival its choice is the
    replica a full scoring of every replica in Python picks (Dynamo's cost, ties: load,
    index)."""
    from kvsim.engine import scheduler as S
    from kvsim.engine.scheduler_blocks import _cached_prefix
    from kvsim.modes.closed import routing

    def full(engines, hb, nb, prompt_tokens, waiting_blocks):
        keys = []
        for w, e in enumerate(engines):
            sc = e.sched
            cached = _cached_prefix(hb, nb, prompt_tokens, B, sc.slot_args[20], *sc.lookup)
            active = int(sc.st[S.S_HELD]) + waiting_blocks[w]
            keys.append((routing.PREFIX_OVERLAP_WEIGHT * (nb - cached) + active,
                         e.outstanding(), w))
        return min(keys)[2]

    real = routing._route
    seen = []

    def checked(router, i, engines, hb, nb, prompt_tokens, B_, session, sticky, waiting,
                prefix=None):
        w = real(router, i, engines, hb, nb, prompt_tokens, B_, session, sticky, waiting,
                 prefix)
        assert w == full(engines, hb, nb, prompt_tokens, [int(x) for x in waiting])
        seen.append(w)
        return w

    monkeypatch.setattr(routing, "_route", checked)
    rng = np.random.default_rng(3)
    n = 48
    prefixes = [list(range(1000 * k, 1000 * k + 12)) for k in range(4)]
    ids, prompts = [], []
    for _ in range(n):
        k = int(rng.integers(0, 12))
        x = prefixes[int(rng.integers(0, 4))][:k] + list(rng.integers(10**6, 10**7, 6))
        ids.append(x)
        prompts.append(len(x) * B - int(rng.integers(0, B)))
    arr = np.cumsum(rng.integers(1_000, 40_000, n)).tolist()
    t = _table(arr, prompts, rng.integers(1, 40, n).tolist(), ids)
    serve(t, "lru", CONFIG, replicas=replicas, router="prefix")
    assert len(seen) == n and len(set(seen)) > 1  # every arrival checked, spread out
