"""Serving metrics of the closed loop: cluster-wide and per replica.

Every key of :data:`kvsim.replay.metrics.SUMMARY_KEYS` (counters summed over replicas;
``makespan_us`` = the last replica's end; ``peak_*`` = sums of per-replica peaks), plus
:data:`SERVING_KEYS` (docs/simulate.md, "Serving metrics").
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.core.spill import streamed_stats
from kvsim.engine import scheduler as S
from kvsim.replay.metrics import (
    STEP_PERCENTILES,
    RequestLog,
    StepLog,
    _pct,
    step_table,
    summarize,
)

#: Keys the closed loop adds to the summary (docs/simulate.md).
SERVING_KEYS = ("schedule", "replicas", "router", "ttft_p90_us", "tpot_p90_us", "e2e_p90_us",
                "queue_p50_us", "queue_p99_us", "throughput_tokens_per_s",
                "throughput_requests_per_s", "slo_attainment", "prefill_tokens_saved",
                "lost_hit_tokens", "dropped_requests")
#: Per-replica rows (``SimResult.replicas``).
REPLICA_KEYS = ("replica", "requests", "steps", "ttft_p50_us", "ttft_p99_us", "tpot_p99_us",
                "queue_p99_us", "hbm_hit_rate", "prefix_hit_rate", "prefill_tokens_saved",
                "preemptions", "evictions_hbm", "throughput_tokens_per_s", "makespan_us")


def serving_keys(requests, span_us: float, schedule: str, replicas: int,
                 router: str, lost: int, dropped: int) -> dict:
    """The :data:`SERVING_KEYS` of the measured ``requests`` (a DataFrame, or columns:
    name -> numpy array, :class:`ClusterRequests`' ``cols``) over a window of ``span_us``
    (throughputs: finished requests' output tokens and count per second of it)."""
    requests = {k: np.asarray(requests[k]) for k in (
        "e2e_us", "admit_us", "arrival_us", "ttft_missed", "tpot_missed_tokens",
        "hbm_hit_tokens", "dram_hit_tokens", "cxl_hit_tokens", "nvme_hit_tokens", "ttft_us",
        "tpot_us", "output_tokens")}
    span_s = float(span_us) / 1e6
    done = ~np.isnan(requests["e2e_us"])
    queue = (requests["admit_us"] - requests["arrival_us"]).astype(np.float64)
    met = ~(requests["ttft_missed"] | (requests["tpot_missed_tokens"] > 0))
    n = len(met)
    saved = int(sum(int(requests[c].sum()) for c in ("hbm_hit_tokens", "dram_hit_tokens",
                                                     "cxl_hit_tokens", "nvme_hit_tokens")))
    return {
        "schedule": schedule,
        "replicas": int(replicas),
        "router": router,
        "ttft_p90_us": _pct(requests["ttft_us"], 90),
        "tpot_p90_us": _pct(requests["tpot_us"], 90),
        "e2e_p90_us": _pct(requests["e2e_us"], 90),
        "queue_p50_us": _pct(queue, 50),
        "queue_p99_us": _pct(queue, 99),
        "throughput_tokens_per_s": float(requests["output_tokens"][done].sum() / span_s)
        if span_s > 0 else float("nan"),
        "throughput_requests_per_s": float(int(done.sum()) / span_s) if span_s > 0
        else float("nan"),
        "slo_attainment": float(met.mean()) if n else float("nan"),
        "prefill_tokens_saved": saved,
        "lost_hit_tokens": int(lost),
        "dropped_requests": int(dropped),
    }


class ClusterSteps(StepLog):
    """The replicas' step tables, joined (``SimResult.steps``: the replica's index, then
    :func:`kvsim.replay.metrics.step_table`'s columns and ``in_system``), built as a
    DataFrame only when read (:meth:`frame`); the summary's step statistics come from the
    latency column alone (:meth:`latency_stats`), the same float64 values in the same
    order as the joined table's, so the figures are the same bits: held in memory while
    every replica's steps are (no replica's :class:`kvsim.core.spill.SpilledRows` spilled),
    else streamed chunk by chunk (:func:`kvsim.core.spill.streamed_stats`: bounded memory,
    exact).  ``parts``: one ``[replica, rows, in_system, block_bytes, keep]`` per replica
    (``rows``: its :class:`kvsim.core.spill.SpilledRows`; ``keep``: which steps are
    measured: None every step, an int the steps from that one on, False none)."""

    def __init__(self, parts: list, figures: bool = True) -> None:
        self.parts = parts
        self.figures = figures  # False: latency_stats counts the steps only

    def __len__(self) -> int:
        return sum(self._count(p, None) for p in self.parts)

    @staticmethod
    def _keep(p, step: np.ndarray) -> np.ndarray | None:
        keep = p[4]
        if keep is None:
            return None
        return step.astype(np.int64) >= keep if keep is not False else \
            np.zeros(len(step), dtype=bool)

    def _latencies(self, p, warm_step: int | None):
        """One replica's kept steps' latencies (from ``warm_step`` on: None all), a chunk
        at a time."""
        for c in p[1].iter_chunks():
            lat = c[:, L.S_LATENCY_US]
            keep = self._keep(p, c[:, L.S_STEP])
            if warm_step is not None:
                w = c[:, L.S_STEP].astype(np.int64) >= warm_step
                keep = w if keep is None else keep & w
            yield lat if keep is None else lat[keep]

    def _count(self, p, warm_step: int | None) -> int:
        if p[4] is None and warm_step is None:
            return len(p[1])
        return sum(len(v) for v in self._latencies(p, warm_step))

    def part_frame(self, p):
        """One replica's step table, as :func:`cluster_summary` joins it."""
        replica, rows, in_system, block_bytes = p[:4]
        st = step_table(rows.to_array(), block_bytes)
        st["in_system"] = np.asarray(in_system[:len(st)], dtype=np.int64)
        keep = self._keep(p, st["step"].to_numpy())
        if keep is not None:
            st = st[keep]
        st.insert(0, "replica", replica)
        return st

    def frame(self):
        import pandas

        return pandas.concat([self.part_frame(p) for p in self.parts], ignore_index=True)

    def latency_stats(self, warm_step: int | None) -> tuple[int, float, list[float]]:
        """As :func:`kvsim.replay.metrics.summarize` computes them from :meth:`frame`
        (the four percentiles from one partition: :func:`percentiles`)."""
        if not self.figures:
            n = sum(self._count(p, warm_step) for p in self.parts)
            return n, float("nan"), [float("nan")] * len(STEP_PERCENTILES)
        lats = (v for p in self.parts for v in self._latencies(p, warm_step))
        if any(p[1].spilled for p in self.parts):
            return streamed_stats(lats, STEP_PERCENTILES)
        lats = list(lats)
        lat = np.concatenate(lats) if lats else np.zeros(0)  # no step: no chunk
        mean = float(lat.mean()) if len(lat) else float("nan")
        return len(lat), mean, percentiles(lat, STEP_PERCENTILES)


def percentiles(x: np.ndarray, qs) -> list[float]:
    """``[_pct(x, q) for q in qs]`` (:func:`kvsim.replay.metrics._pct`: NaNs dropped,
    numpy's linear interpolation; NaN for an empty sample), the same values, from one
    ``np.percentile`` call (one copy and one partition for every ``q``)."""
    x = x[~np.isnan(x)]
    if not len(x):
        return [float("nan")] * len(qs)
    return [float(v) for v in np.percentile(x, list(qs))]


class ClusterRequests(RequestLog):
    """The closed loop's per-request table (``SimResult.requests``: ``replica``, then
    :data:`kvsim.replay.metrics.REQUEST_COLUMNS`, one row per request in ``request_id``
    order) held as numpy columns, one array each (about 190 bytes a request, no Python
    object per request); its DataFrame is built only when read (:meth:`frame`), and the
    summary's figures come from the columns (:meth:`figures`: the same values, bit for
    bit, as :func:`kvsim.replay.metrics.summarize` computes from the DataFrame)."""

    def __init__(self, cols: dict) -> None:
        self.cols = cols

    def __len__(self) -> int:
        return len(self.cols["request_id"])

    def frame(self):
        import pandas

        return pandas.DataFrame(self.cols)

    def select(self, measured: np.ndarray | None) -> dict:
        """The columns of the rows whose ``request_id`` is in ``measured`` (all: None)."""
        if measured is None:
            return self.cols
        keep = np.isin(self.cols["request_id"], measured)
        return {k: v[keep] for k, v in self.cols.items()}

    def figures(self, measured: np.ndarray | None, block_size_tokens: int) -> dict:
        r = self.select(measured)
        bs = block_size_tokens
        hit = [int(r[c].sum()) for c in ("hbm_hit_tokens", "dram_hit_tokens",
                                         "cxl_hit_tokens", "nvme_hit_tokens")]
        admitted = r["lookup_tokens"] > 0
        return {
            "requests": len(r["request_id"]),
            "lookup_tokens": int(r["lookup_tokens"].sum()),
            "hit": hit,
            "prompt_blocks": int(((r["prompt_tokens"][admitted] + bs - 1) // bs).sum()),
            "ttft_missed": int(r["ttft_missed"].sum()),
            "tpot_missed": int(r["tpot_missed_tokens"].sum()),
            "missed_any": int((r["ttft_missed"] | (r["tpot_missed_tokens"] > 0)).sum()),
            **{k: [_pct(r[k], q) for q in (50, 99)] for k in ("ttft_us", "tpot_us", "e2e_us")},
        }


def cluster_summary(pol, engines, costs, N: int, router: str, dropped: int,
                    warmup: int = 0, start_us: float = 0.0, lazy: bool = False):
    """(summary, requests, steps) of a closed-loop run over ``engines``, and per-replica
    rows in ``summary["replica_rows"]``.  With ``warmup`` > 0 the first ``warmup``
    requests (arrival order) are not measured, each replica's counters are differences
    from its snapshot at its first step after the warm-up, and only steps from there on
    are measured (the open-loop rule, docs/simulate.md); throughputs are over
    ``[start_us, makespan]`` (``start_us``: the first measured request's arrival, else 0).
    ``requests`` and ``steps`` are DataFrames, or with ``lazy`` a :class:`ClusterRequests`
    and a :class:`ClusterSteps` (each built as a DataFrame when read: ``SimResult``), so
    that a run nobody reads the tables of builds no DataFrame (and imports no pandas).
    The joined tables are built column by column in numpy, once (not a DataFrame per
    replica joined by pandas)."""
    parts, reqs = [], []
    C = np.zeros_like(engines[0].run.C)
    Cw = np.zeros_like(C)
    rows = []
    events = 0
    bs = int(engines[0].sched.ip[S.P_B])
    measured = np.arange(warmup, N, dtype=np.int64) if warmup > 0 else None
    for e in engines:
        run = e.run
        keep = None
        cw = None
        if warmup > 0:
            warm = run.C[L.C_WARM_DONE] != 0
            cw = run.Cw if warm else run.C  # no step after the warm-up: nothing measured
            keep = int(run.K[L.K_WARMUP_STEP]) if warm else False
        part = [e.replica, run.step_rows, e.in_system, e.block_bytes, keep]
        parts.append(part)
        cols = run.slots.columns(run, e.replica)  # the request slots' rows (closed_slots)
        rq = ClusterRequests({k: v for k, v in cols.items() if k != "replica"})
        # a replica's row has no step latency figure (REPLICA_KEYS): its steps counted only
        s1 = summarize(pol.name, pol.offline, run.C, cw, measured, -1,
                       ClusterSteps([part], figures=False), rq, costs, e.rows,
                       block_size_tokens=bs, warmup_requests=warmup)
        s1.update(serving_keys(rq.select(measured), run.C[L.C_CLOCK_US] - start_us, "closed",
                               1, router, e.lost_hit_tokens, 0))
        rows.append({"replica": e.replica, **{k: s1[k] for k in REPLICA_KEYS[1:]}})
        reqs.append(cols)
        C += run.C
        Cw += run.C if cw is None else cw
        events += e.rows
    C[L.C_CLOCK_US] = max(e.run.C[L.C_CLOCK_US] for e in engines)
    for k in range(4):
        C[L.C_PEAK + k] = sum(e.run.C[L.C_PEAK + k] for e in engines)
    # joined a column at a time, each replica's column dropped once copied (one replica:
    # its rows are in request_id order already, no copy)
    ids = np.concatenate([r["request_id"] for r in reqs])
    order = None
    if not (np.diff(ids) > 0).all():
        order = np.argsort(ids, kind="stable")  # as sort_values(kind="stable")
    joined = {}
    for k in list(reqs[0]):
        v = reqs[0].pop(k) if len(reqs) == 1 else np.concatenate([r.pop(k) for r in reqs])
        joined[k] = v if order is None else v[order]
    reqs.clear()
    requests = ClusterRequests(joined)
    steps = ClusterSteps(parts)
    summary = summarize(pol.name, pol.offline, C, Cw if warmup > 0 else None, measured, -1,
                        steps, requests, costs, events, block_size_tokens=bs,
                        warmup_requests=warmup)
    summary.update(serving_keys(requests.select(measured), C[L.C_CLOCK_US] - start_us,
                                "closed", len(engines), router,
                                sum(e.lost_hit_tokens for e in engines), dropped))
    summary["replica_rows"] = rows
    if lazy:
        return summary, requests, steps
    return summary, requests.frame(), steps.frame()


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
