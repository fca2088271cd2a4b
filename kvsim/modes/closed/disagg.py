"""Prefill/decode disaggregation (``--pd P:D``): a prefill pool and a decode pool of
closed-loop engines, the prompt's KV sent between them over a link (docs/disaggregation.md).

What vLLM 0.33 and NVIDIA Dynamo do, and what kvsim follows:

1. **Prefill.**  The request is routed to a prefill replica and run there with
   ``max_tokens = 1`` (vLLM's NIXL connector sets ``request.max_tokens = 1`` on the prefill
   side, vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py; Dynamo's
   prefill worker likewise): its prompt is computed, its prefix cache used, one token
   sampled.  Each pool is a cluster of :class:`~kvsim.modes.closed.closed_loop.Engine` behind
   the same ``--router`` as ``--replicas`` (:mod:`kvsim.modes.closed.cluster`).
2. **Transfer.**  When the prefill's step ends, a decode replica is chosen (the router, on
   the decode pool's state at that moment: Dynamo's ``PrefillRouter`` picks the decode worker
   after the prefill returns) and the prompt's KV is sent over the prefill replica's network
   link: ``latency + bytes / bandwidth``, FIFO behind the transfers before it on that link
   with ``--link-model queue`` (:mod:`kvsim.replay.kernel.links`, the same rule), alone
   otherwise.  Bytes: the prompt's blocks the decode replica does not hold in HBM
   (vLLM's ``get_num_new_matched_tokens`` on the decode side: ``prompt - local hit``).
3. **Staging.**  The decode replica reserves the prompt's blocks for the whole transfer:
   a transfer starts only when ``reserved + need <= free`` on that replica (vLLM's
   ``_inflight_prefill_reserved_blocks``: an async load is admitted only if it fits in
   the free blocks less the other in-flight reservations) and, with ``--pd-max-inflight K``,
   fewer than K transfers are in flight to it; else it waits, FIFO per decode replica.
   ``need = ceil(prompt / block)``; ``free`` = the decode scheduler's free blocks (vLLM's
   ``get_num_free_blocks``: empty and cached-unreferenced), and a reservation lasts until
   the decode scheduler admits the request.
4. **Decode.**  At the transfer's end the request joins the decode replica's waiting queue
   with its prompt's KV external (``K_EXT``, :func:`kvsim.engine.vllm_step._remote_tokens`):
   vLLM counts the loaded tokens as computed and, the whole prompt being loaded, recomputes
   its last token (``_update_waiting_for_remote_kv``: ``num_computed_tokens = num_tokens -
   1``), so its first decode-side step is a one-token step that samples the first token
   the client sees.  The prefill's own token is discarded: vLLM's P/D proxy
   (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) and Dynamo's frontend
   stream the decode worker's tokens (docs/design_docs/disagg_serving.md of ai-dynamo/dynamo:
   "Decode->>Decode: Generate tokens; Decode-->>Frontend: Stream tokens").

So the client's TTFT = prefill queueing + prefill + staging wait + transfer + the decode
replica's wait and one-token step; ``pd_prefill_ttft_*`` is the prefill's token alone
(what a proxy that streamed it would show); TPOT and ITL are the decode pool's.

Simplifications (docs/disaggregation.md): the prefill replica frees its blocks when its
step ends (vLLM's NIXL keeps them, ``delay_free_blocks``, until the decode side has read
them; they stay cached either way); the staged blocks are a reservation the gate counts,
not blocks taken from the decode pool before the admission.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from kvsim.core.errors import KvsimInputError
from kvsim.engine import scheduler as S
from kvsim.engine import vllm_step as V
from kvsim.engine.scheduler_blocks import _cached_prefix
from kvsim.engine.vllm_rows import VS_IP, with_external_tokens
from kvsim.replay.variants import TypedTuple
from kvsim.spec.sim_config import SHARED_LINK_BYTES_PER_S, SHARED_LINK_LATENCY_US

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas as pd

@dataclasses.dataclass(frozen=True)
class PdOptions:
    """``--pd P:D`` and its link (docs/disaggregation.md)."""

    prefill: int = dataclasses.field(metadata={"help": "prefill replicas"})
    decode: int = dataclasses.field(metadata={"help": "decode replicas"})
    #: one NIC per prefill replica, the shared tier's (kvsim.spec.sim_config: 100 Gb/s)
    link_bytes_per_s: float = dataclasses.field(default=SHARED_LINK_BYTES_PER_S, metadata={
        "help": "each prefill replica's link to the decode pool, bytes/s (inf: instant)"})
    #: one RDMA read's set-up, as the shared tier's link (kvsim.spec.sim_config: 10 us)
    link_latency_us: float = dataclasses.field(default=SHARED_LINK_LATENCY_US, metadata={
        "help": "latency of one KV transfer, microseconds"})
    max_inflight: int = dataclasses.field(default=0, metadata={
        "help": "transfers in flight to one decode replica at most (0: no cap)"})

    def __post_init__(self):
        if self.prefill < 1 or self.decode < 1:
            raise KvsimInputError(f"expected --pd P:D with P, D >= 1, got "
                                  f"{self.prefill}:{self.decode}", None, None, "--pd")
        if not self.link_bytes_per_s > 0 or not self.link_latency_us >= 0:
            raise KvsimInputError("expected --pd-link-gbps > 0 and --pd-link-latency-us >= 0, "
                                  f"got {self.link_bytes_per_s} B/s, {self.link_latency_us} us",
                                  None, None, "--pd-link-gbps")
        if self.max_inflight < 0:
            raise KvsimInputError(f"expected --pd-max-inflight >= 0, got {self.max_inflight}",
                                  None, None, "--pd-max-inflight")


def parse_pd(text: str | None) -> tuple[int, int] | None:
    """``--pd P:D`` -> (P, D); None for none."""
    if text is None:
        return None
    parts = str(text).split(":")
    try:
        p, d = (int(x) for x in parts)
    except ValueError:
        p = d = 0
    if len(parts) != 2 or p < 1 or d < 1:
        raise KvsimInputError(f"expected --pd P:D (two positive integers), got {text!r}",
                              None, None, "--pd")
    return p, d


def transfer_us(nbytes: float, pd: PdOptions) -> float:
    """One transfer alone: ``latency + bytes / bandwidth`` (0 bytes: nothing sent)."""
    if nbytes <= 0:
        return 0.0
    return pd.link_latency_us + nbytes * 1e6 / pd.link_bytes_per_s


@dataclasses.dataclass
class Transfers:
    """Per request (arrival order): prefill replica and its first token, decode replica,
    staging wait, link start / end, bytes; NaN / -1 where not served."""

    n: int
    p_rep: np.ndarray = None
    p_done_us: np.ndarray = None
    d_rep: np.ndarray = None
    start_us: np.ndarray = None  # staged: the transfer may start (<= link start)
    link_us: np.ndarray = None  # on the link
    end_us: np.ndarray = None
    nbytes: np.ndarray = None

    def __post_init__(self):
        nan = lambda: np.full(self.n, np.nan)  # noqa: E731
        self.p_rep = np.full(self.n, -1, np.int64)
        self.d_rep = np.full(self.n, -1, np.int64)
        self.p_done_us, self.start_us, self.link_us, self.end_us = nan(), nan(), nan(), nan()
        self.nbytes = np.zeros(self.n, np.int64)


def prefill_table(table):
    """The prefill pool's requests: each with one output token (``max_tokens = 1``) and no
    next turn of its own (the decode side finishes the request)."""
    df = table.df.assign(output_tokens=1)
    return dataclasses.replace(table, df=df)


def run_decode(table, engines, router: str, B: int, pb, tr: Transfers, pd: PdOptions,
               link_queue: bool, block_bytes: int, warmup: int = 0) -> None:
    """Transfers and the decode pool, in time order, after the prefill pool has run
    (the prefill pool does not wait for the decode side: module docstring).  With a
    warm-up, the decode pool measures from the first measured request's arrival there."""
    from kvsim.jit.disk_cache import setup_func
    from kvsim.modes.closed.routing import _route, prefix_scorer
    from kvsim.replay.variants import runs_interpreted as interpreted

    df = table.df
    prompt = df["prompt_tokens"].to_numpy(np.int64)
    session = df["session"].to_numpy(np.int64)
    nb_all = (prompt + B - 1) // B
    D = len(engines)
    for e in engines:  # every request's prompt KV comes from the prefill pool
        e.vs = TypedTuple(with_external_tokens(e.vs, prompt))
    arr = []  # arrival = the transfer's end (a writable copy of the column)
    for e in engines:
        ra = e.sched.req_args
        e.sched.req_args = (np.array(ra[0], dtype=ra[0].dtype), *ra[1:])
        e._args = None
        arr.append(e.sched.req_args[0])
    ngpu = [int(e.vs[VS_IP][V.P_NGPU]) for e in engines]
    order = np.argsort(tr.p_done_us, kind="stable")
    starts = deque(int(i) for i in order if not np.isnan(tr.p_done_us[i]))
    inflight: list = []  # (end, i)
    staged = [deque() for _ in range(D)]
    reserved = [0] * D  # blocks held for transfers in flight or queued unadmitted
    held_by: list[deque] = [deque() for _ in range(D)]  # (order position, blocks)
    n_inflight = [0] * D
    link_free = [0.0] * int(tr.p_rep.max() + 1 if len(tr.p_rep) else 1)
    sticky: dict = {}
    score = prefix_scorer(engines) if router == "prefix" else None
    # the interpreted engines while it is cold: the transfer's prefix lookup as Python
    cached_prefix = setup_func(_cached_prefix, interpreted(engines))

    def release(w):
        st = engines[w].sched.st
        while held_by[w] and held_by[w][0][0] < int(st[S.S_ADMIT]):
            reserved[w] -= held_by[w].popleft()[1]

    def try_start(w, t):
        st = engines[w].sched.st
        free = ngpu[w] - 1 - int(st[S.S_HELD])
        while staged[w]:
            i = staged[w][0]
            need = int(nb_all[i])
            if reserved[w] + need > free:
                return
            if pd.max_inflight and n_inflight[w] >= pd.max_inflight:
                return
            staged[w].popleft()
            reserved[w] += need
            n_inflight[w] += 1
            tr.start_us[i] = t
            p = int(tr.p_rep[i])
            begin = max(t, link_free[p]) if link_queue else t
            end = begin + transfer_us(float(tr.nbytes[i]), pd)
            if link_queue:
                link_free[p] = end
            tr.link_us[i], tr.end_us[i] = begin, end
            heapq.heappush(inflight, (end, i))

    inf = math.inf
    while starts or inflight or any(staged):
        t_s = tr.p_done_us[starts[0]] if starts else inf
        t_e = inflight[0][0] if inflight else inf
        t_b = min((engines[w].clock_us for w in range(D)
                   if staged[w] and engines[w].has_work()), default=inf)
        t = min(t_s, t_e)
        if t_b < t:  # a blocked transfer: run its replica one step, then try again
            w = min(w for w in range(D) if staged[w] and engines[w].has_work()
                    and engines[w].clock_us == t_b)
            engines[w].advance(t_b + 1e-3)
            release(w)
            try_start(w, engines[w].clock_us)
            continue
        if t == inf:
            raise KvsimInputError("--pd: a transfer can never be staged (the decode pool "
                                  "cannot hold its prompt)", None, None, "--pd")
        for w, e in enumerate(engines):
            if e.has_work() and e.clock_us < t:
                e.advance(t)
            release(w)
        while inflight and inflight[0][0] <= t:
            end, i = heapq.heappop(inflight)
            w = int(tr.d_rep[i])
            e = engines[w]
            a = int(math.ceil(end))
            arr[w][i] = a
            if not e.has_work() and e.clock_us < a:
                e.sched.stf[0] = float(a)
            held_by[w].append((int(e.sched.st[S.S_QN]), int(nb_all[i])))
            n_inflight[w] -= 1
            if warmup > 0 and i >= warmup:
                warmup = 0
                for x in engines:
                    x.start_measuring()
            e.enqueue(i)
        while starts and tr.p_done_us[starts[0]] <= t:
            i = starts.popleft()
            hb = pb.slice(i)
            waiting = [reserved[w] + sum(int(nb_all[j]) for j in staged[w]) for w in range(D)]
            w = _route(router, i, engines, hb, int(nb_all[i]), int(prompt[i]), B,
                       int(session[i]), sticky, waiting, score)
            sc = engines[w].sched
            phk, phv, tk = sc.lookup
            cached = cached_prefix(hb, int(nb_all[i]), int(prompt[i]), B, sc.slot_args[20],
                                   phk, phv, np.zeros(2, np.int64))
            tr.d_rep[i] = w
            tr.nbytes[i] = (int(nb_all[i]) - cached) * block_bytes
            staged[w].append(i)
        for w in range(D):
            try_start(w, t)
    for e in engines:
        e.advance(-1.0)


def pool_keys(prefix: str, summary: dict, steps: pd.DataFrame, replicas: int) -> dict:
    """A pool's keys (``pd_prefill_*`` / ``pd_decode_*``): hit rates, TTFT / TPOT /
    queueing percentiles, steps, and utilisation = the replicas' step time over
    ``replicas x makespan``."""
    out = {f"{prefix}_{k}": summary[k] for k in (
        "hbm_hit_rate", "prefix_hit_rate", "queue_p50_us", "queue_p99_us", "steps",
        "preemptions", "makespan_us") if k in summary}
    span = float(summary.get("makespan_us", 0.0)) * replicas
    busy = float(steps["latency_us"].sum()) if len(steps) else 0.0
    out[f"{prefix}_utilisation"] = busy / span if span > 0 else float("nan")
    return out


def _pct(x, q):
    x = np.asarray(x, np.float64)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else float("nan")


def first_tokens(requests_d: pd.DataFrame, steps_d: pd.DataFrame, n: int):
    """(first token, last token) per request (NaN: not served): the first is the end of the
    decode step that admitted it (its one-token recompute samples it: module docstring;
    the replay, which does not see the transferred tokens as computed, would count the
    next step's), the last the replay's end."""
    first = np.full(n, np.nan)
    fin = np.full(n, np.nan)
    for w, rq in requests_d.groupby("replica"):
        st = steps_d[steps_d["replica"] == w]
        start = st["start_us"].to_numpy(np.float64)
        end = start + st["latency_us"].to_numpy(np.float64)
        ids = rq["request_id"].to_numpy(np.int64)
        adm = rq["admit_us"].to_numpy(np.float64)
        k = np.clip(np.searchsorted(start, adm, side="right") - 1, 0, max(len(start) - 1, 0))
        ok = ~np.isnan(adm) & (len(start) > 0)
        first[ids[ok]] = end[k[ok]]
        fin[ids] = (rq["arrival_us"] + rq["e2e_us"]).to_numpy(np.float64)
    return first, fin


def pd_keys(tr: Transfers, requests_d: pd.DataFrame, steps_d: pd.DataFrame,
            arrival_us: np.ndarray, out_tokens: np.ndarray, measured) -> dict:
    """The client-level and link keys (docs/disaggregation.md, "Metrics")."""
    n = tr.n
    first_d, fin_d = first_tokens(requests_d, steps_d, n)
    m = np.ones(n, bool) if measured is None else np.isin(np.arange(n), measured)
    a = arrival_us.astype(np.float64)
    ttft = (first_d - a)[m]
    e2e = (fin_d - a)[m]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tokens > 1, (fin_d - first_d) / (out_tokens - 1), np.nan)[m]
    wait_d = (first_d - tr.end_us)[m]
    p_ttft = (tr.p_done_us - a)[m]
    xfer = (tr.end_us - tr.start_us)[m]
    qwait = (tr.link_us - tr.start_us)[m]
    blocked = (tr.start_us - tr.p_done_us)[m]
    sent = ~np.isnan(tr.end_us) & m
    return {
        "ttft_p50_us": _pct(ttft, 50), "ttft_p90_us": _pct(ttft, 90),
        "ttft_p99_us": _pct(ttft, 99), "e2e_p50_us": _pct(e2e, 50),
        "e2e_p90_us": _pct(e2e, 90), "e2e_p99_us": _pct(e2e, 99),
        "tpot_p50_us": _pct(tpot, 50), "tpot_p90_us": _pct(tpot, 90),
        "tpot_p99_us": _pct(tpot, 99),
        "pd_decode_first_token_p50_us": _pct(wait_d, 50),
        "pd_decode_first_token_p99_us": _pct(wait_d, 99),
        "pd_prefill_ttft_p50_us": _pct(p_ttft, 50), "pd_prefill_ttft_p99_us": _pct(p_ttft, 99),
        "pd_link_bytes": int(tr.nbytes[sent].sum()), "pd_transfers": int(sent.sum()),
        "pd_transfer_p50_us": _pct(xfer, 50), "pd_transfer_p99_us": _pct(xfer, 99),
        "pd_link_queue_p50_us": _pct(qwait, 50), "pd_link_queue_p99_us": _pct(qwait, 99),
        "pd_staging_blocked_p50_us": _pct(blocked, 50),
        "pd_staging_blocked_p99_us": _pct(blocked, 99),
        "pd_staging_blocked_us": float(np.nansum(blocked)),
        "pd_staging_blocked_requests": int(np.sum(blocked > 0)),
    }
