"""Serving metrics of the closed loop: cluster-wide and per replica.

Every key of :data:`kvsim.replay.metrics.SUMMARY_KEYS` (counters summed over replicas;
``makespan_us`` = the last replica's end; ``peak_*`` = sums of per-replica peaks), plus
:data:`SERVING_KEYS` (docs/simulate.md, "Serving metrics").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.core import layout as L
from kvsim.engine import scheduler as S
from kvsim.replay.metrics import _pct, request_table, step_table, summarize

#: Keys the closed loop adds to the summary (docs/simulate.md).
SERVING_KEYS = ("schedule", "replicas", "router", "ttft_p90_us", "tpot_p90_us", "e2e_p90_us",
                "queue_p50_us", "queue_p99_us", "throughput_tokens_per_s",
                "throughput_requests_per_s", "slo_attainment", "prefill_tokens_saved",
                "lost_hit_tokens", "dropped_requests")
#: Per-replica rows (``SimResult.replicas``).
REPLICA_KEYS = ("replica", "requests", "steps", "ttft_p50_us", "ttft_p99_us", "tpot_p99_us",
                "queue_p99_us", "hbm_hit_rate", "prefix_hit_rate", "prefill_tokens_saved",
                "preemptions", "evictions_hbm", "throughput_tokens_per_s", "makespan_us")


def serving_keys(requests: pd.DataFrame, span_us: float, schedule: str, replicas: int,
                 router: str, lost: int, dropped: int) -> dict:
    """The :data:`SERVING_KEYS` of the measured ``requests`` over a window of ``span_us``
    (throughputs: finished requests' output tokens and count per second of it)."""
    span_s = float(span_us) / 1e6
    done = requests["e2e_us"].notna()
    queue = (requests["admit_us"] - requests["arrival_us"]).to_numpy(np.float64)
    met = ~(requests["ttft_missed"] | (requests["tpot_missed_tokens"] > 0))
    n = len(requests)
    saved = int(sum(requests[c].sum() for c in ("hbm_hit_tokens", "dram_hit_tokens",
                                                "cxl_hit_tokens", "nvme_hit_tokens")))
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
        "prefill_tokens_saved": saved,
        "lost_hit_tokens": int(lost),
        "dropped_requests": int(dropped),
    }


def cluster_summary(pol, engines, costs, N: int, router: str, dropped: int,
                    warmup: int = 0, start_us: float = 0.0):
    """(summary, requests, steps) of a closed-loop run over ``engines``, and per-replica
    rows in ``summary["replica_rows"]``.  With ``warmup`` > 0 the first ``warmup``
    requests (arrival order) are not measured, each replica's counters are differences
    from its snapshot at its first step after the warm-up, and only steps from there on
    are measured (the open-loop rule, docs/simulate.md); throughputs are over
    ``[start_us, makespan]`` (``start_us``: the first measured request's arrival, else 0)."""
    reqs, steps_all = [], []
    C = np.zeros_like(engines[0].run.C)
    Cw = np.zeros_like(C)
    rows = []
    events = 0
    bs = int(engines[0].sched.ip[S.P_B])
    measured = np.arange(warmup, N, dtype=np.int64) if warmup > 0 else None
    for e in engines:
        run = e.run
        st = step_table(run.steps(), e.block_bytes)
        st["in_system"] = np.asarray(e.in_system[:len(st)], dtype=np.int64)
        rq = request_table(run.R_i, run.R_f, len(e.sched.src))
        cw = None
        if warmup > 0:
            warm = run.C[L.C_WARM_DONE] != 0
            cw = run.Cw if warm else run.C  # no step after the warm-up: nothing measured
            st = st[st["step"] >= run.K[L.K_WARMUP_STEP]] if warm else st.iloc[:0]
        s1 = summarize(pol.name, pol.offline, run.C, cw, measured, -1, st, rq, costs,
                       e.rows, block_size_tokens=bs, warmup_requests=warmup)
        rq1 = rq if measured is None else rq[rq["request_id"].isin(measured)]
        s1.update(serving_keys(rq1, run.C[L.C_CLOCK_US] - start_us, "closed", 1, router,
                               e.lost_hit_tokens, 0))
        rows.append({"replica": e.replica, **{k: s1[k] for k in REPLICA_KEYS[1:]}})
        st.insert(0, "replica", e.replica)
        rq.insert(0, "replica", e.replica)
        reqs.append(rq)
        steps_all.append(st)
        C += run.C
        Cw += run.C if cw is None else cw
        events += e.rows
    C[L.C_CLOCK_US] = max(e.run.C[L.C_CLOCK_US] for e in engines)
    for k in range(4):
        C[L.C_PEAK + k] = sum(e.run.C[L.C_PEAK + k] for e in engines)
    requests = pd.concat(reqs, ignore_index=True).sort_values("request_id", kind="stable")
    requests = requests.reset_index(drop=True)
    steps = pd.concat(steps_all, ignore_index=True)
    summary = summarize(pol.name, pol.offline, C, Cw if warmup > 0 else None, measured, -1,
                        steps, requests, costs, events, block_size_tokens=bs,
                        warmup_requests=warmup)
    rq1 = requests if measured is None else requests[requests["request_id"].isin(measured)]
    summary.update(serving_keys(rq1, C[L.C_CLOCK_US] - start_us, "closed", len(engines),
                                router, sum(e.lost_hit_tokens for e in engines), dropped))
    summary["replica_rows"] = rows
    return summary, requests, steps


def count_dropped_as_misses(summary: dict, tokens: int, blocks: int) -> None:
    """Requests the closed loop drops (larger than HBM) were offered and got nothing from
    the cache: their ``tokens`` prompt tokens and ``blocks`` prompt blocks join the hit
    rates' denominators as misses, so a smaller HBM that cannot serve the longest requests
    does not look better for leaving them out (docs/simulate.md, "Metrics: hit rates")."""
    if tokens <= 0 and blocks <= 0:
        return
    lookup, prompt_blk = int(summary["lookup_tokens"]), int(summary["prompt_blocks"])
    for key in ("hbm_hit_rate", "dram_hit_rate", "cxl_hit_rate", "nvme_hit_rate",
                "prefix_hit_rate"):
        if key in summary and lookup + tokens > 0:
            summary[key] = float(summary[key]) * lookup / (lookup + tokens)
    for key in ("block_hit_rate", "hbm_block_hit_rate"):
        if key in summary and prompt_blk + blocks > 0:
            summary[key] = float(summary[key]) * prompt_blk / (prompt_blk + blocks)
    summary["lookup_tokens"] = lookup + tokens
    summary["prompt_blocks"] = prompt_blk + blocks
