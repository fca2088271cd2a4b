"""Serving metrics of the closed loop: cluster-wide and per replica.

Every key of :data:`kvsim.replay.metrics.SUMMARY_KEYS` (counters summed over replicas;
``makespan_us`` = the last replica's end; ``peak_*`` = sums of per-replica peaks), plus
:data:`SERVING_KEYS` (docs/simulate.md, "Serving metrics").
"""

from __future__ import annotations

import numpy as np

from kvsim.core import layout as L
from kvsim.engine import scheduler as S
from kvsim.replay.metrics import (
    REQUEST_COLUMNS,
    STEP_PERCENTILES,
    RequestLog,
    StepLog,
    step_table,
    summarize,
)
from kvsim.results.step_records import Float64Values, StepRecords, latency_stats

#: Keys the closed loop adds to the summary (docs/simulate.md).
SERVING_KEYS = ("schedule", "replicas", "router", "ttft_p90_us", "tpot_p90_us", "e2e_p90_us",
                "queue_p50_us", "queue_p99_us", "throughput_tokens_per_s",
                "throughput_requests_per_s", "slo_attainment", "prefill_tokens_saved",
                "lost_hit_tokens", "dropped_requests")
#: Per-replica rows (``SimResult.replicas``).
REPLICA_KEYS = ("replica", "requests", "steps", "ttft_p50_us", "ttft_p99_us", "tpot_p99_us",
                "queue_p99_us", "hbm_hit_rate", "prefix_hit_rate", "prefill_tokens_saved",
                "preemptions", "evictions_hbm", "throughput_tokens_per_s", "makespan_us")


#: The hit-token columns (HBM, DRAM, CXL, NVMe).
_HIT_COLUMNS = ("hbm_hit_tokens", "dram_hit_tokens", "cxl_hit_tokens", "nvme_hit_tokens")
#: The per-request columns whose percentiles the summary and serving keys print.
_PCT_COLUMNS = {"ttft_us": (50, 90, 99), "tpot_us": (50, 90, 99), "e2e_us": (50, 90, 99),
                "queue_us": (50, 99)}


class RequestFigures:
    """What the summary (:meth:`kvsim.replay.metrics.RequestLog.figures`' keys) and the
    :data:`SERVING_KEYS` read of some requests, added a chunk of columns at a time
    (:meth:`add`): counts and sums (exact in any order), and the four columns whose
    percentiles are printed (``ttft_us``, ``tpot_us``, ``e2e_us``, and the queueing time
    ``admit_us - arrival_us``) kept as float64 values in bounded memory
    (:class:`kvsim.results.step_records.Float64Values`), their percentiles exact
    (numpy's, NaNs dropped: :func:`kvsim.replay.metrics._pct`).  ``parts``: figures to
    join (a cluster's, from its replicas'); then nothing is added."""

    def __init__(self, block_size_tokens: int, parts: list | None = None) -> None:
        self.bs = max(int(block_size_tokens), 1)
        self.parts = parts or []
        self.n = self.lookup = self.prompt_blocks = self.ttft_missed = 0
        self.tpot_missed = self.missed_any = self.done = self.done_tokens = 0
        self.hit = [0, 0, 0, 0]
        self.values = {k: Float64Values() for k in _PCT_COLUMNS}
        for p in self.parts:
            self.n += p.n
            self.lookup += p.lookup
            self.prompt_blocks += p.prompt_blocks
            self.ttft_missed += p.ttft_missed
            self.tpot_missed += p.tpot_missed
            self.missed_any += p.missed_any
            self.done += p.done
            self.done_tokens += p.done_tokens
            self.hit = [a + b for a, b in zip(self.hit, p.hit)]

    def add(self, r: dict) -> None:
        """A chunk of requests: columns of :data:`kvsim.replay.metrics.REQUEST_COLUMNS`."""
        look = r["lookup_tokens"]
        tm = r["ttft_missed"]
        pm = r["tpot_missed_tokens"]
        self.n += len(look)
        self.lookup += int(look.sum())
        self.hit = [h + int(r[c].sum()) for h, c in zip(self.hit, _HIT_COLUMNS)]
        self.prompt_blocks += int(((r["prompt_tokens"][look > 0] + self.bs - 1)
                                   // self.bs).sum())
        self.ttft_missed += int(tm.sum())
        self.tpot_missed += int(pm.sum())
        self.missed_any += int((tm | (pm > 0)).sum())
        done = ~np.isnan(r["e2e_us"])
        self.done += int(done.sum())
        self.done_tokens += int(r["output_tokens"][done].sum())
        for k in ("ttft_us", "tpot_us", "e2e_us"):
            self.values[k].append(r[k])
        self.values["queue_us"].append((r["admit_us"] - r["arrival_us"]).astype(np.float64))

    def percentiles(self) -> dict:
        """``{column: {q: value}}`` for :data:`_PCT_COLUMNS` (exact, bounded memory)."""
        out = {}
        for k, qs in _PCT_COLUMNS.items():
            vals = [p.values[k] for p in self.parts] or [self.values[k]]
            got = latency_stats((c for v in vals for c in v.chunks()), qs)[2]
            out[k] = dict(zip(qs, got))
        return out

    def figures(self, pcts: dict | None = None) -> dict:
        """As :meth:`kvsim.replay.metrics.RequestLog.figures` returns them."""
        pcts = pcts or self.percentiles()
        return {"requests": self.n, "lookup_tokens": self.lookup, "hit": list(self.hit),
                "prompt_blocks": self.prompt_blocks, "ttft_missed": self.ttft_missed,
                "tpot_missed": self.tpot_missed, "missed_any": self.missed_any,
                **{k: [pcts[k][50], pcts[k][99]] for k in ("ttft_us", "tpot_us", "e2e_us")}}

    def serving(self, span_us: float, schedule: str, replicas: int, router: str, lost: int,
                dropped: int, pcts: dict | None = None) -> dict:
        """The :data:`SERVING_KEYS` over a window of ``span_us`` (throughputs: finished
        requests' output tokens and count per second of it)."""
        pcts = pcts or self.percentiles()
        span_s = float(span_us) / 1e6
        met = self.n - self.missed_any
        return {
            "schedule": schedule,
            "replicas": int(replicas),
            "router": router,
            "ttft_p90_us": pcts["ttft_us"][90],
            "tpot_p90_us": pcts["tpot_us"][90],
            "e2e_p90_us": pcts["e2e_us"][90],
            "queue_p50_us": pcts["queue_us"][50],
            "queue_p99_us": pcts["queue_us"][99],
            "throughput_tokens_per_s": float(np.int64(self.done_tokens) / span_s)
            if span_s > 0 else float("nan"),
            "throughput_requests_per_s": float(self.done / span_s) if span_s > 0
            else float("nan"),
            "slo_attainment": float(np.float64(met) / self.n) if self.n else float("nan"),
            "prefill_tokens_saved": int(sum(self.hit)),
            "lost_hit_tokens": int(lost),
            "dropped_requests": int(dropped),
        }

    def close(self) -> None:
        for v in self.values.values():
            v.close()


def serving_keys(requests, span_us: float, schedule: str, replicas: int,
                 router: str, lost: int, dropped: int) -> dict:
    """The :data:`SERVING_KEYS` of the measured ``requests`` (a DataFrame, or columns:
    name -> numpy array, :class:`ClusterRequests`' ``cols``) over a window of ``span_us``
    (throughputs: finished requests' output tokens and count per second of it)."""
    f = RequestFigures(1)
    f.add({k: np.asarray(requests[k]) for k in REQUEST_COLUMNS if k in requests})
    return f.serving(span_us, schedule, replicas, router, lost, dropped)


class ClusterSteps(StepLog):
    """The replicas' step tables, joined (``SimResult.steps``: the replica's index, then
    :func:`kvsim.replay.metrics.step_table`'s columns and ``in_system``), built as a
    DataFrame only when read (:meth:`frame`); the summary's step statistics come from the
    latency column alone (:meth:`latency_stats`), the same float64 values in the same
    order as the joined table's, so the figures are the same bits
    (:func:`kvsim.results.step_records.latency_stats`: in one array up to 2^22 steps, else
    streamed, exact, in bounded memory).  ``parts``: one ``[replica, rows, in_system,
    block_bytes, keep]`` per replica (``rows``: its step rows, a
    :class:`kvsim.core.spill.SpilledRows`, or a :class:`kvsim.results.step_records.StepRecords`
    that kept the measured steps' latencies only (no table: its frame has no row);
    ``in_system``: an array, or a function returning it; ``keep``: which steps are
    measured: None every step, an int the steps from that one on (a ``StepRecords``
    applied it as they came), False none)."""

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
        if isinstance(p[1], StepRecords):  # the measured steps' latencies, as they came
            if warm_step is not None and warm_step >= 0:
                raise ValueError("StepRecords(table=False) kept no step numbers")
            if p[4] is not False:
                yield from p[1].measured_latencies()
            return
        for c in p[1].iter_chunks():
            lat = c[:, L.S_LATENCY_US]
            keep = self._keep(p, c[:, L.S_STEP])
            if warm_step is not None:
                w = c[:, L.S_STEP].astype(np.int64) >= warm_step
                keep = w if keep is None else keep & w
            yield lat if keep is None else lat[keep]

    def _count(self, p, warm_step: int | None) -> int:
        if isinstance(p[1], StepRecords):
            return 0 if p[4] is False else len(p[1].latency)
        if p[4] is None and warm_step is None:
            return len(p[1])
        return sum(len(v) for v in self._latencies(p, warm_step))

    def part_frame(self, p):
        """One replica's step table, as :func:`cluster_summary` joins it."""
        replica, rows, in_system, block_bytes = p[:4]
        table = not isinstance(rows, StepRecords)
        st = step_table(rows.to_array() if table else np.zeros((0, L.NS)), block_bytes)
        in_system = in_system() if callable(in_system) else in_system
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
        return latency_stats((v for p in self.parts for v in self._latencies(p, warm_step)),
                             STEP_PERCENTILES)


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
    order): numpy columns, one array each (``cols``; about 216 bytes a request, no Python
    object per request), or the replicas' folded rows (``parts``: ``[(replica,
    :class:`kvsim.replay.slots.FoldedRequests`)]``, each in bounded memory) joined into
    those columns only when read (:attr:`cols`, :meth:`frame`: ``--requests-out``, tenant
    rows, the Python API).  The summary's figures come from the columns, or from the parts
    chunk by chunk (:meth:`figures`, :class:`RequestFigures`: the same values, bit for bit,
    as :func:`kvsim.replay.metrics.summarize` computes from the DataFrame)."""

    def __init__(self, cols: dict | None = None, parts: list | None = None) -> None:
        self._cols = cols
        self.parts = parts or []

    @property
    def cols(self) -> dict:
        if self._cols is None:
            self._cols = _joined([_part_columns(w, f) for w, f in self.parts])
        return self._cols

    def __len__(self) -> int:
        if self._cols is None:
            return sum(len(f.rows) for _, f in self.parts)
        return len(self._cols["request_id"])

    def frame(self):
        import pandas

        return pandas.DataFrame(self.cols)

    def select(self, measured: np.ndarray | None) -> dict:
        """The columns of the rows whose ``request_id`` is in ``measured`` (all: None)."""
        if measured is None:
            return self.cols
        keep = np.isin(self.cols["request_id"], measured)
        return {k: v[keep] for k, v in self.cols.items()}

    def chunks(self, measured: np.ndarray | None):
        """The rows whose ``request_id`` is in ``measured`` (all: None), as column dicts,
        a chunk at a time (in no particular order)."""
        if self._cols is not None:
            yield self.select(measured)
            return
        for _, f in self.parts:
            for c in _coalesced(f.rows.iter_chunks()):
                if measured is not None:
                    c = c[np.isin(c.view(np.int64)[:, f.names.index("request_id")],
                                  measured)]
                yield {name: f._col(c, name) for name in f.names}

    def request_figures(self, measured: np.ndarray | None,
                        block_size_tokens: int) -> RequestFigures:
        f = RequestFigures(block_size_tokens)
        for c in self.chunks(measured):
            f.add(c)
        return f

    def figures(self, measured: np.ndarray | None, block_size_tokens: int) -> dict:
        return self.request_figures(measured, block_size_tokens).figures()


def _coalesced(chunks, rows: int = 1 << 13):
    """``chunks`` (row arrays) joined into arrays of at least ``rows`` rows (the last one
    may be shorter): a replica folds its finished requests a few at a time."""
    held, n = [], 0
    for c in chunks:
        held.append(c)
        n += len(c)
        if n >= rows:
            yield held[0] if len(held) == 1 else np.concatenate(held)
            held, n = [], 0
    if held:
        yield held[0] if len(held) == 1 else np.concatenate(held)


class _Figures(RequestLog):
    """Figures computed already, as :func:`kvsim.replay.metrics.summarize` reads them."""

    def __init__(self, figures: dict) -> None:
        self._figures = figures

    def figures(self, measured, block_size_tokens: int) -> dict:
        return self._figures


def _part_columns(replica: int, f) -> dict:
    """One replica's folded rows (:class:`kvsim.replay.slots.FoldedRequests`) as columns in
    request-id order, ``replica`` first."""
    a = f.rows.to_array()
    a = a[np.argsort(a.view(np.int64)[:, f.names.index("request_id")], kind="stable")]
    cols = {"replica": np.full(len(a), replica, dtype=np.int64)}
    cols.update({name: np.ascontiguousarray(f._col(a, name)) for name in f.names})
    return cols


def _joined(reqs: list[dict]) -> dict:
    """The replicas' columns joined in request-id order, a column at a time, each
    replica's column dropped once copied (one replica: its rows are in request_id order
    already, no copy)."""
    ids = np.concatenate([r["request_id"] for r in reqs])
    order = None
    if not (np.diff(ids) > 0).all():
        order = np.argsort(ids, kind="stable")  # as sort_values(kind="stable")
    joined = {}
    for k in list(reqs[0]):
        v = reqs[0].pop(k) if len(reqs) == 1 else np.concatenate([r.pop(k) for r in reqs])
        joined[k] = v if order is None else v[order]
    reqs.clear()
    return joined


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
    replica joined by pandas), and only when read; the figures come from each replica's
    folded rows, a chunk at a time (:class:`RequestFigures`)."""
    parts, reqs, figs = [], [], []
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
        rec = run.step_rows  # the engine's StepRecords: its in_system all taken (finish)
        part = [e.replica, rec.rows if rec.table else rec, rec.in_system, e.block_bytes, keep]
        parts.append(part)
        reqs.append((e.replica, run.slots.fold_all(run)))  # its rows, bounded memory
        f1 = ClusterRequests(parts=reqs[-1:]).request_figures(measured, bs)
        p1 = f1.percentiles()
        # a replica's row has no step latency figure (REPLICA_KEYS): its steps counted only
        s1 = summarize(pol.name, pol.offline, run.C, cw, measured, -1,
                       ClusterSteps([part], figures=False), _Figures(f1.figures(p1)), costs,
                       e.rows, block_size_tokens=bs, warmup_requests=warmup)
        s1.update(f1.serving(run.C[L.C_CLOCK_US] - start_us, "closed", 1, router,
                             e.lost_hit_tokens, 0, p1))
        rows.append({"replica": e.replica, **{k: s1[k] for k in REPLICA_KEYS[1:]}})
        figs.append(f1)
        C += run.C
        Cw += run.C if cw is None else cw
        events += e.rows
    C[L.C_CLOCK_US] = max(e.run.C[L.C_CLOCK_US] for e in engines)
    for k in range(4):
        C[L.C_PEAK + k] = sum(e.run.C[L.C_PEAK + k] for e in engines)
    requests = ClusterRequests(parts=reqs)  # joined only when read (ClusterRequests.cols)
    steps = ClusterSteps(parts)
    fc = RequestFigures(bs, parts=figs)  # every replica's: no request read again
    pc = fc.percentiles()
    summary = summarize(pol.name, pol.offline, C, Cw if warmup > 0 else None, measured, -1,
                        steps, _Figures(fc.figures(pc)), costs, events, block_size_tokens=bs,
                        warmup_requests=warmup)
    summary.update(fc.serving(C[L.C_CLOCK_US] - start_us, "closed", len(engines), router,
                              sum(e.lost_hit_tokens for e in engines), dropped, pc))
    for f in figs:
        f.close()
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
