"""Serving metrics of the closed loop: cluster-wide and per replica.

Every key of :data:`kvsim.sim.metrics.SUMMARY_KEYS` (counters summed over replicas;
``makespan_us`` = the last replica's end; ``peak_*`` = sums of per-replica peaks), plus
:data:`SERVING_KEYS` (docs/simulate.md, "Serving metrics").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.sim import layout as L
from kvsim.sim import scheduler as S
from kvsim.sim.metrics import _pct, request_table, step_table, summarize

#: Keys the closed loop adds to the summary (docs/simulate.md).
SERVING_KEYS = ("schedule", "replicas", "router", "ttft_p90_us", "tpot_p90_us", "e2e_p90_us",
                "queue_p50_us", "queue_p99_us", "throughput_tokens_per_s",
                "throughput_requests_per_s", "slo_attainment", "prefill_tokens_saved",
                "lost_hit_tokens", "dropped_requests")
#: Per-replica rows (``SimResult.replicas``).
REPLICA_KEYS = ("replica", "requests", "steps", "ttft_p50_us", "ttft_p99_us", "tpot_p99_us",
                "queue_p99_us", "hbm_hit_rate", "prefix_hit_rate", "prefill_tokens_saved",
                "preemptions", "evictions_hbm", "throughput_tokens_per_s", "makespan_us")


def serving_keys(summary: dict, requests: pd.DataFrame, C: np.ndarray, schedule: str,
                 replicas: int, router: str, lost: int, dropped: int) -> dict:
    """The :data:`SERVING_KEYS` of one run (or one replica) from its request table."""
    span_s = float(C[L.C_CLOCK_US]) / 1e6
    done = requests["e2e_us"].notna()
    queue = (requests["admit_us"] - requests["arrival_us"]).to_numpy(np.float64)
    met = ~(requests["ttft_missed"] | (requests["tpot_missed_tokens"] > 0))
    n = len(requests)
    return {
        "schedule": schedule,
        "replicas": int(replicas),
        "router": router,
        "ttft_p90_us": _pct(requests["ttft_us"].to_numpy(), 90),
        "tpot_p90_us": _pct(requests["tpot_us"].to_numpy(), 90),
        "e2e_p90_us": _pct(requests["e2e_us"].to_numpy(), 90),
        "queue_p50_us": _pct(queue, 50),
        "queue_p99_us": _pct(queue, 99),
        "throughput_tokens_per_s": float(requests.loc[done, "output_tokens"].sum() / span_s)
        if span_s > 0 else float("nan"),
        "throughput_requests_per_s": float(done.sum() / span_s) if span_s > 0 else float("nan"),
        "slo_attainment": float(met.mean()) if n else float("nan"),
        "prefill_tokens_saved": int(sum(C[L.M_HIT_TOK + t] for t in range(4))),
        "lost_hit_tokens": int(lost),
        "dropped_requests": int(dropped),
    }


def cluster_summary(pol, engines, costs, N: int, router: str, dropped: int):
    """(summary, requests, steps) of a closed-loop run over ``engines``; per-replica rows in
    ``summary["replicas_detail"]`` is *not* set: :func:`replica_rows` gives them."""
    reqs, steps_all = [], []
    C = np.zeros_like(engines[0].run.C)
    rows = []
    events = 0
    for e in engines:
        run = e.run
        st = step_table(run.steps(), e.block_bytes)
        rq = request_table(run.R_i, run.R_f, len(e.sched.src))
        s1 = summarize(pol.name, pol.offline, run.C, None, None, -1, st, rq, costs, e.rows,
                       block_size_tokens=int(e.sched.ip[S.P_B]))
        s1.update(serving_keys(s1, rq, run.C, "closed", 1, router, e.lost_hit_tokens, 0))
        rows.append({"replica": e.replica, **{k: s1[k] for k in REPLICA_KEYS[1:]}})
        st["in_system"] = np.asarray(e.in_system[:len(st)], dtype=np.int64)
        st.insert(0, "replica", e.replica)
        rq.insert(0, "replica", e.replica)
        reqs.append(rq)
        steps_all.append(st)
        C += run.C
        events += e.rows
    C[L.C_CLOCK_US] = max(e.run.C[L.C_CLOCK_US] for e in engines)
    requests = pd.concat(reqs, ignore_index=True).sort_values("request_id", kind="stable")
    requests = requests.reset_index(drop=True)
    steps = pd.concat(steps_all, ignore_index=True)
    summary = summarize(pol.name, pol.offline, C, None, None, -1, steps, requests, costs,
                        events, block_size_tokens=int(engines[0].sched.ip[S.P_B]))
    summary.update(serving_keys(summary, requests, C, "closed", len(engines), router,
                                sum(e.lost_hit_tokens for e in engines), dropped))
    summary["replica_rows"] = rows
    return summary, requests, steps
