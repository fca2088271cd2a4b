"""Metrics of a replay: per-step and per-request tables, and the summary with stable keys.

Every key of :func:`summarize` is documented in docs/simulate.md; ``kvsim compare --json``
prints exactly these keys (plus the gaps to belady).  Percentiles use numpy's default
(linear interpolation); an empty sample gives NaN (``null`` in JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.core import layout as L
from kvsim.core.spill import SpilledRows, exact_stats

if TYPE_CHECKING:  # pandas is imported only where a DataFrame is built
    import pandas as pd

#: The stable keys of a summary, in display order (docs/simulate.md explains each).
SUMMARY_KEYS = (
    "policy", "offline", "mode", "events", "steps", "requests", "warmup_requests",
    "p50_step_us", "p95_step_us", "p99_step_us", "p999_step_us", "mean_step_us",
    "ttft_p50_us", "ttft_p99_us", "tpot_p50_us", "tpot_p99_us", "e2e_p50_us", "e2e_p99_us",
    "deadline_misses", "ttft_deadline_misses", "tpot_deadline_misses",
    "decode_critical_misses",
    "hbm_hit_rate", "dram_hit_rate", "cxl_hit_rate", "nvme_hit_rate", "prefix_hit_rate",
    "block_hit_rate", "hbm_block_hit_rate", "lookup_tokens", "hit_tokens", "prompt_blocks",
    "hit_blocks",
    "bytes_moved", "bytes_dram_link", "bytes_cxl_link", "bytes_nvme_link",
    "recompute_tokens", "first_compute_tokens", "preempt_recompute_tokens",
    "evictions", "evictions_hbm", "evictions_dram", "evictions_cxl", "evictions_nvme",
    "spills", "spills_hbm", "spills_dram", "spills_cxl",
    "promotions", "prefetches", "prefetches_useful", "prefetches_wasted", "write_throughs",
    "preemptions", "swap_out_bytes", "swap_in_bytes", "cow_copies", "overflow_blocks",
    "peak_hbm_blocks", "peak_dram_blocks", "peak_cxl_blocks", "peak_nvme_blocks",
    "hbm_capacity_blocks", "dram_capacity_blocks", "cxl_capacity_blocks",
    "nvme_capacity_blocks",
    "stall_us", "saved_us", "makespan_us",
)

#: Keys that need engine timing: absent (not zero) from a cache-mode summary.
LATENCY_KEYS = (
    "steps", "p50_step_us", "p95_step_us", "p99_step_us", "p999_step_us", "mean_step_us",
    "ttft_p50_us", "ttft_p99_us", "tpot_p50_us", "tpot_p99_us", "e2e_p50_us", "e2e_p99_us",
    "deadline_misses", "ttft_deadline_misses", "tpot_deadline_misses", "stall_us",
    "saved_us", "makespan_us",
)


def summary_keys(mode: str = "engine") -> tuple[str, ...]:
    """The keys of a summary in ``mode`` (cache mode drops :data:`LATENCY_KEYS`)."""
    if mode == "cache":
        return tuple(k for k in SUMMARY_KEYS if k not in LATENCY_KEYS)
    return SUMMARY_KEYS


STEP_COLUMNS = ("step", "start_us", "latency_us", "stall_us", "saved_us", "duration_us",
                "extra_us")

#: Occupancy columns of the step table (blocks, as each step ends), in order, and the
#: step-buffer column each comes from.  ``hbm_used_blocks``: HBM blocks held by running
#: requests; ``hbm_cached_blocks``: HBM blocks cached as eviction candidates (ref count 0,
#: hashed); ``<tier>_used_blocks``: resident blocks of a lower tier.
OCCUPANCY_COLUMNS = ("hbm_used_blocks", "hbm_cached_blocks", "dram_used_blocks",
                     "cxl_used_blocks", "nvme_used_blocks")
_OCCUPANCY_SRC = (L.S_USED, L.S_HBM_CACHED, L.S_USED + 1, L.S_USED + 2, L.S_USED + 3)


def step_table(S: np.ndarray, block_bytes: int = 0) -> pd.DataFrame:
    """One row per engine step: start, latency and its parts (microseconds), then each
    tier's occupancy when the step ends (:data:`OCCUPANCY_COLUMNS`, int64 blocks) and,
    with ``block_bytes`` > 0, the same in bytes (``*_bytes`` = blocks x block_bytes, the
    allocation unit).  ``hbm_cached_blocks`` (and its bytes) is left out when the core did
    not record it (-1 in the step buffer: see kvsim.replay.kernel.bookkeeping._finalize_step)."""
    import pandas as pd

    df = pd.DataFrame(S[:, :len(STEP_COLUMNS)], columns=list(STEP_COLUMNS))
    df["step"] = df["step"].astype(np.int64)
    for name, col in zip(OCCUPANCY_COLUMNS, _OCCUPANCY_SRC):
        v = S[:, col].astype(np.int64)
        if name == "hbm_cached_blocks" and (v < 0).any():
            continue  # not recorded by this core
        df[name] = v
    if block_bytes > 0:
        for name in OCCUPANCY_COLUMNS:
            if name in df:
                df[name[: -len("blocks")] + "bytes"] = df[name] * np.int64(block_bytes)
    return df


class StepLog:
    """A replay's per-step table kept in bounded memory (:class:`kvsim.core.spill.SpilledRows`:
    the core's step-buffer rows, in memory up to ``MEM_ROWS`` steps, then in a temporary
    file), with the summary's step statistics computed exactly from it
    (:meth:`latency_stats`) and the :func:`step_table` DataFrame built only when asked for
    (``SimResult.steps``)."""

    def __init__(self, rows: SpilledRows, block_bytes: int = 0) -> None:
        self.rows = rows
        self.block_bytes = int(block_bytes)

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self) -> pd.DataFrame:
        """The whole :func:`step_table` (one row per step: memory grows with steps)."""
        return step_table(self.rows.to_array(), self.block_bytes)

    def empty_frame(self) -> pd.DataFrame:
        """The table's columns with no row."""
        head = self.rows.chunks[0][:1] if self.rows.chunks else np.zeros((0, L.NS))
        return step_table(head, self.block_bytes).iloc[0:0]

    def latency_stats(self, warm_step: int | None) -> tuple[int, float, list[float]]:
        """(steps, mean latency, latency p50 / p95 / p99 / p99.9) over the steps from
        ``warm_step`` on (every step for None), exactly as from :meth:`frame`."""
        keep = None if warm_step is None else \
            (lambda c: c[:, L.S_STEP].astype(np.int64) >= warm_step)
        return exact_stats(self.rows, L.S_LATENCY_US, STEP_PERCENTILES, keep)


#: The step-latency percentiles of a summary (``p50_step_us`` ... ``p999_step_us``).
STEP_PERCENTILES = (50, 95, 99, 99.9)


def _i(col: int, dtype=None):
    return lambda ri, rf, keep: ri[keep, col] if dtype is None else ri[keep, col].astype(dtype)


def _f(col: int):
    return lambda ri, rf, keep: rf[keep, col]


def _arrival(ri, rf, keep) -> np.ndarray:
    return ri[keep, L.RI_ARRIVE_US].astype(np.float64)


def _ttft(ri, rf, keep) -> np.ndarray:
    first = rf[keep, L.RF_FIRST_US]
    return np.where(first >= 0, first - _arrival(ri, rf, keep), np.nan)


def _tpot(ri, rf, keep) -> np.ndarray:
    first = rf[keep, L.RF_FIRST_US]
    last = rf[keep, L.RF_LAST_US]
    nout = ri[keep, L.RI_NOUT]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((first >= 0) & (nout > 1), (last - first) / (nout - 1), np.nan)


def _e2e(ri, rf, keep) -> np.ndarray:
    first = rf[keep, L.RF_FIRST_US]
    return np.where(first >= 0, rf[keep, L.RF_LAST_US] - _arrival(ri, rf, keep), np.nan)


#: The per-request table's columns, in order: how each is computed from the core's
#: request tables (``R_i``, ``R_f``) at the kept ids, one column at a time.
REQUEST_COLUMNS = {
    "request_id": lambda ri, rf, keep: keep.astype(np.int64),
    "arrival_us": _arrival,
    "admit_us": _f(L.RF_ADMIT_US),
    "ttft_us": _ttft,
    "tpot_us": _tpot,
    "e2e_us": _e2e,
    "prompt_tokens": _i(L.RI_PROMPT),
    "output_tokens": _i(L.RI_NOUT),
    "lookup_tokens": _i(L.RI_LOOKUP_TOK),
    "hbm_hit_tokens": _i(L.RI_HIT_TOK),
    "dram_hit_tokens": _i(L.RI_HIT_TOK + 1),
    "cxl_hit_tokens": _i(L.RI_HIT_TOK + 2),
    "nvme_hit_tokens": _i(L.RI_HIT_TOK + 3),
    "recompute_tokens": _i(L.RI_RECOMP_TOK),
    "stall_us": _f(L.RF_STALL_US),
    "preemptions": _i(L.RI_PREEMPTS),
    "ttft_deadline_us": _i(L.RI_TTFT_DL),
    "ttft_missed": _i(L.RI_TTFT_MISS, bool),
    "tpot_deadline_tokens": _i(L.RI_TPOT_DL),
    "tpot_missed_tokens": _i(L.RI_TPOT_MISS),
    "decode_critical_misses": _i(L.RI_DC_MISS),
    "deadline_bound": _i(L.RI_BOUND, bool),
    "request_priority": _i(L.RI_PRIO),
    "tenant": _i(L.RI_TENANT),
    "evictions_suffered": _i(L.RI_EV_SUFFERED),
    "evictions_caused": _i(L.RI_EV_CAUSED),
}


def _kept_ids(R_i: np.ndarray, n: int) -> np.ndarray:
    return np.flatnonzero(R_i[:n, L.RI_STATE] != L.RS_UNSEEN)


def request_table(R_i: np.ndarray, R_f: np.ndarray, n: int) -> pd.DataFrame:
    """One row per request that arrived or ran (ids with no rows are left out)."""
    keep = _kept_ids(R_i, n)
    import pandas as pd

    return pd.DataFrame({name: col(R_i, R_f, keep) for name, col in REQUEST_COLUMNS.items()})


class RequestLog:
    """A replay's per-request results as folded by the driver
    (:class:`kvsim.replay.slots.FoldedRequests`, in bounded memory): the summary reads its
    figures chunk by chunk (:meth:`figures`), and the :func:`request_table` DataFrame is
    built only when asked for (``SimResult.requests``)."""

    def __init__(self, folded) -> None:
        self.folded = folded

    def frame(self) -> pd.DataFrame:
        return self.folded.frame()

    def figures(self, measured: np.ndarray | None, block_size_tokens: int) -> dict:
        return self.folded.figures(measured, block_size_tokens)


def _pct(x: np.ndarray, q: float) -> float:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else float("nan")


def _rate(num: float, den: float) -> float:
    return float(num / den) if den > 0 else float("nan")


def summarize(policy: str, offline: bool, C: np.ndarray, Cw: np.ndarray | None,
              measured: np.ndarray | None, warm_step: int, steps: pd.DataFrame | StepLog,
              requests: pd.DataFrame | RequestLog, costs, events: int, block_size_tokens: int = 16,
              mode: str = "engine", warmup_requests: int = 0) -> dict:
    """The summary dict (keys :func:`summary_keys` of ``mode``).

    Measurement window: ``measured`` are the ids of the requests after the warm-up (in
    arrival order; None = every request).  Per-request figures (hit rates, TTFT, TPOT,
    deadline misses) are over those requests; with a warm-up snapshot ``Cw`` the other
    counters are differences from the step ``warm_step`` the first measured request
    arrived in, and only steps from ``warm_step`` on are measured.

    Hit rates (docs/simulate.md, "Metrics"): ``*_hit_rate`` are token-weighted, hit tokens
    of the measured requests' prompts over their prompt tokens at admission (vLLM's
    ``prefix_cache_hit_rate``, kvcache-simulator's ``hitRate``); ``block_hit_rate`` is per
    block: blocks served from any tier over prompt blocks (``ceil(prompt / block)``);
    only full blocks are shared, so hit tokens are whole blocks."""
    M = C.copy()
    if Cw is not None:
        M[L.M_FIRST:L.M_LAST] -= Cw[L.M_FIRST:L.M_LAST]
    if isinstance(steps, StepLog):  # exact, in bounded memory
        n_steps, mean_step, pct_step = steps.latency_stats(warm_step if Cw is not None
                                                           else None)
    else:
        if Cw is not None:
            steps = steps[steps["step"] >= warm_step]
        lat = steps["latency_us"].to_numpy()
        n_steps = len(steps)
        mean_step = float(lat.mean()) if len(lat) else float("nan")
        pct_step = [_pct(lat, q) for q in STEP_PERCENTILES]
    bs = max(int(block_size_tokens), 1)
    if isinstance(requests, RequestLog):  # chunk by chunk, in bounded memory
        f = requests.figures(measured, bs)
        n_requests, lookup, hit = f["requests"], f["lookup_tokens"], f["hit"]
        prompt_blk, hit_blk, hbm_blk = f["prompt_blocks"], sum(hit) // bs, hit[0] // bs
        ttft_missed, tpot_missed = f["ttft_missed"], f["tpot_missed"]
        missed_any = f["missed_any"]
        pcts = {k: f[k] for k in ("ttft_us", "tpot_us", "e2e_us")}  # p50, p99
    else:
        if measured is not None:
            requests = requests[requests["request_id"].isin(measured)]
        n_requests = len(requests)
        lookup = int(requests["lookup_tokens"].sum())
        hit = [int(requests[c].sum()) for c in ("hbm_hit_tokens", "dram_hit_tokens",
                                                "cxl_hit_tokens", "nvme_hit_tokens")]
        admitted = requests["lookup_tokens"] > 0
        prompt_blk = int(((requests["prompt_tokens"][admitted] + bs - 1) // bs).sum())
        # cache mode gives hit blocks per request (a partial last block hits with its tokens)
        hit_blk = int(requests["hit_blocks"].sum()) if "hit_blocks" in requests else \
            sum(hit) // bs
        hbm_blk = int(requests["hbm_hit_blocks"].sum()) if "hbm_hit_blocks" in requests \
            else hit[0] // bs
        ttft_missed = int(requests["ttft_missed"].sum())
        tpot_missed = int(requests["tpot_missed_tokens"].sum())
        missed_any = int(((requests["ttft_missed"]) |
                          (requests["tpot_missed_tokens"] > 0)).sum())
        pcts = {k: [_pct(np.asarray(requests[k]), q) for q in (50, 99)]
                for k in ("ttft_us", "tpot_us", "e2e_us")}
    link = [M[L.M_BYTES_UP + t] + M[L.M_BYTES_DOWN + t] for t in range(4)]
    swap = M[L.M_SWAP_OUT_BYTES] + M[L.M_SWAP_IN_BYTES]
    out = {
        "policy": policy,
        "offline": bool(offline),
        "mode": mode,
        "events": int(events),
        "steps": int(n_steps),
        "requests": int(n_requests),
        "warmup_requests": int(warmup_requests),
        "p50_step_us": pct_step[0],
        "p95_step_us": pct_step[1],
        "p99_step_us": pct_step[2],
        "p999_step_us": pct_step[3],
        "mean_step_us": mean_step,
        "ttft_p50_us": pcts["ttft_us"][0],
        "ttft_p99_us": pcts["ttft_us"][1],
        "tpot_p50_us": pcts["tpot_us"][0],
        "tpot_p99_us": pcts["tpot_us"][1],
        "e2e_p50_us": pcts["e2e_us"][0],
        "e2e_p99_us": pcts["e2e_us"][1],
        "deadline_misses": missed_any,
        "ttft_deadline_misses": ttft_missed,
        "tpot_deadline_misses": tpot_missed,
        "decode_critical_misses": int(M[L.M_DC_MISS]),
        "hbm_hit_rate": _rate(hit[0], lookup),
        "dram_hit_rate": _rate(hit[1], lookup),
        "cxl_hit_rate": _rate(hit[2], lookup),
        "nvme_hit_rate": _rate(hit[3], lookup),
        "prefix_hit_rate": _rate(sum(hit), lookup),
        "block_hit_rate": _rate(hit_blk, prompt_blk),
        "hbm_block_hit_rate": _rate(hbm_blk, prompt_blk),
        "lookup_tokens": lookup,
        "hit_tokens": int(sum(hit)),
        "prompt_blocks": prompt_blk,
        "hit_blocks": int(hit_blk),
        "bytes_moved": int(sum(link) + swap),
        "bytes_dram_link": int(link[1] + swap),
        "bytes_cxl_link": int(link[2]),
        "bytes_nvme_link": int(link[3]),
        "recompute_tokens": int(M[L.M_RECOMP_TOK] + M[L.M_PREEMPT_RECOMP_TOK]),
        "first_compute_tokens": int(M[L.M_FIRST_TOK]),
        "preempt_recompute_tokens": int(M[L.M_PREEMPT_RECOMP_TOK]),
        "evictions": int(sum(M[L.M_EVICT + t] for t in range(4))),
        "evictions_hbm": int(M[L.M_EVICT]),
        "evictions_dram": int(M[L.M_EVICT + 1]),
        "evictions_cxl": int(M[L.M_EVICT + 2]),
        "evictions_nvme": int(M[L.M_EVICT + 3]),
        "spills": int(sum(M[L.M_DEMOTE + t] for t in range(3))),
        "spills_hbm": int(M[L.M_DEMOTE]),
        "spills_dram": int(M[L.M_DEMOTE + 1]),
        "spills_cxl": int(M[L.M_DEMOTE + 2]),
        "promotions": int(M[L.M_PROMOTE]),
        "prefetches": int(M[L.M_PREFETCH]),
        "prefetches_useful": int(M[L.M_PREFETCH_USEFUL]),
        "prefetches_wasted": int(M[L.M_PREFETCH_WASTED]),
        "write_throughs": int(M[L.M_WRITE_THROUGH]),
        "preemptions": int(M[L.M_PREEMPTIONS]),
        "swap_out_bytes": int(M[L.M_SWAP_OUT_BYTES]),
        "swap_in_bytes": int(M[L.M_SWAP_IN_BYTES]),
        "cow_copies": int(M[L.M_COW_COPIES]),
        "overflow_blocks": int(M[L.M_OVERFLOW]),
        "peak_hbm_blocks": int(C[L.C_PEAK]),
        "peak_dram_blocks": int(C[L.C_PEAK + 1]),
        "peak_cxl_blocks": int(C[L.C_PEAK + 2]),
        "peak_nvme_blocks": int(C[L.C_PEAK + 3]),
        "hbm_capacity_blocks": int(costs[0].capacity_blocks),
        "dram_capacity_blocks": int(costs[1].capacity_blocks),
        "cxl_capacity_blocks": int(costs[2].capacity_blocks),
        "nvme_capacity_blocks": int(costs[3].capacity_blocks),
        "stall_us": float(M[L.M_STALL_US]),
        "saved_us": float(M[L.M_SAVED_US]),
        "makespan_us": float(C[L.C_CLOCK_US]),
    }
    assert tuple(out) == SUMMARY_KEYS
    if mode == "cache":
        for k in LATENCY_KEYS:
            del out[k]
    return out
