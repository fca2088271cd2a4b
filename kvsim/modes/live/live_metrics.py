"""The live-offload replay's driver (rows -> :class:`~kvsim.modes.live.live_offload.LiveReplay`),
its step clock and its summary (keys documented in docs/simulate.md, "Live offload").

Step clock (the open loop of docs/cost-model.md): ``start = max(time_us, end of the
previous step)``, ``latency = duration_us + demand-fetch stalls of its requests``,
``end = start + latency``.  A token of an ``ACCESS`` row in DECODE / VERIFY / DRAFT with
``num_tokens > 0`` is produced at the end of its step: TPOT per request = (last token end -
first token end) / (tokens - 1); a token misses its deadline when its step ends after the
row's ``deadline_us``; a request misses its TTFT deadline (ARRIVE ``deadline_us``) when its
first token's step ends after it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.core.errors import KvsimInputError
from kvsim.modes.live.live_offload import (
    K_ACCESS,
    K_ALLOCATE,
    K_ARRIVE,
    K_FORK,
    K_FREE,
    K_INTENT,
    K_STEP,
    LiveReplay,
)

#: Keys a live-offload summary adds (docs/simulate.md, "Live offload").
LIVE_KEYS = (
    "live_offload", "stalls", "stall_us", "decode_stalls", "decode_stall_us",
    "decode_critical_stalls", "live_spills", "pinned_spills", "blocks_fetched",
    "prefetches", "prefetches_useful", "prefetches_wasted", "peak_live_blocks",
    "oversubscription",
)


def _pct(x, q: float) -> float:
    x = np.asarray(x, np.float64)
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else float("nan")


class _Clock:
    """Steps: start, latency, tokens; the per-step table."""

    def __init__(self, rep: LiveReplay) -> None:
        self.rep = rep
        self.rows: list[tuple] = []
        self.open = False

    def close(self) -> None:
        rep = self.rep
        if not self.open:
            return
        rep._end_serve()
        from kvsim.modes.live.live_prefetch import prefetch_step

        prefetch_step(rep, rep.dur_us)
        lat = rep.dur_us + rep.stall_us
        end = rep.start_us + lat
        for r, dl in rep.step_tokens:
            if rep.first_tok[r] < 0:
                rep.first_tok[r] = end
                tdl = rep.ttft_deadline[r]
                if tdl >= 0 and end > tdl:
                    rep.c["ttft_deadline_misses"] += 1
            rep.last_tok[r] = end
            rep.ntok[r] += 1
            if dl >= 0 and end > dl:
                rep.c["tpot_deadline_misses"] += 1
        rep.step_tokens = []
        spilled = rep.tier_used[1] + rep.tier_used[2] + rep.tier_used[3]
        self.rows.append((rep.step, rep.start_us, lat, rep.stall_us, rep.dur_us,
                          rep.C - len(rep.free_slots), spilled, rep.live_blocks))
        rep.prev_end = end
        self.open = False

    def start(self, step: int, time_us: int, duration_us: float) -> None:
        self.close()
        rep = self.rep
        rep.step = step
        rep.start_us = max(float(time_us), rep.prev_end)
        rep.now_us = rep.start_us
        rep.dur_us = float(duration_us)
        rep.stall_us = 0.0
        self.open = True


def replay_rows(rep: LiveReplay, clock: _Clock, cols: dict, base: int, path: str) -> None:
    """Feed one batch of event rows (``base`` = ordinal of its first row)."""
    kinds = cols["kind"].tolist()
    rids = cols["request_id"].tolist()
    bidx = cols["block_index"].tolist()
    n = len(kinds)
    for i in range(n):
        k = kinds[i]
        rep.ordinal = base + i
        if k == K_STEP:
            clock.start(int(cols["step"][i]), int(cols["time_us"][i]),
                        float(cols["duration_us"][i]))
            continue
        r = rids[i]
        if not clock.open:
            clock.start(int(cols["step"][i]), int(cols["time_us"][i]), 0.0)
        if r >= rep.NR:
            raise KvsimInputError(f"expected request ids below {rep.NR}", path,
                                  f"row {base + i}", "request_id")
        if k == K_ALLOCATE:
            rep.allocate(r, bidx[i], int(cols["content_hash"][i]), int(cols["num_tokens"][i]),
                         _intent(cols, i), bool(cols["pin_requested"][i]))
        elif k == K_ACCESS:
            rep.access_intent = _intent(cols, i)
            rep.access(r, base + i, int(cols["phase"][i]), int(cols["priority"][i]),
                       int(cols["deadline_us"][i]), int(cols["num_tokens"][i]))
        elif k == K_INTENT:
            rep.intent(r, bidx[i], _intent(cols, i), bool(cols["pin_requested"][i]))
        elif k == K_FREE:
            rep.free(r, bidx[i])
        elif k == K_ARRIVE:
            rep.arrival_us[r] = float(cols["time_us"][i])
            rep.ttft_deadline[r] = int(cols["deadline_us"][i])
        elif k == K_FORK:
            raise KvsimInputError("--live-offload does not replay FORK rows (beam search, "
                                  "parallel sampling); expected a trace without forks",
                                  path, f"row {base + i}", "kind")
        # COMMIT: no placement effect in this mode


def _intent(cols: dict, i: int) -> tuple:
    return (int(cols["phase"][i]), int(cols["priority"][i]), int(cols["request_priority"][i]),
            int(cols["deadline_us"][i]), int(cols["slack_us"][i]),
            int(cols["target_decode_step"][i]), float(cols["recompute_cost_us"][i]))


def run_live(trace_path, policy, config, decision_log=None, facts=None):
    """:func:`kvsim.modes.live.live_metrics.simulate_live`."""
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.driver import SimResult, _describe, resolve_tiers
    from kvsim.replay.prepass import _open, scan_trace

    if decision_log is not None:
        raise KvsimInputError("--live-offload writes no decision log yet; expected no "
                              "--decision-log", None, None, "--decision-log")
    offline_name = None
    if policy == "optimal":
        offline_name, policy = "optimal", "belady"
    pol = resolve_policy(policy)
    with _open(trace_path) as reader:
        header = reader.header
    bs = int(header.block_size_tokens)
    if facts is None:
        facts = scan_trace(trace_path, bs, config.batch_rows)
    block_bytes, costs = resolve_tiers(config, header, facts)
    nu = None
    if pol.offline:
        from kvsim.bounds.live_optimal import next_uses

        nu = next_uses(trace_path, config.batch_rows)
    rep = LiveReplay(pol, costs, block_bytes, facts.max_request_id + 1, bs, nu,
                     prefetch=config.prefetch, seed=config.seed)
    rep.runs = config.engine != "interpreted"  # interpreted: the block-by-block reference
    clock = _Clock(rep)
    base = 0
    with _open(trace_path) as reader:
        for cols in reader.batches(config.batch_rows):
            replay_rows(rep, clock, cols, base, str(trace_path))
            base += len(cols["kind"])
    clock.close()
    steps = pd.DataFrame(clock.rows, columns=["step", "start_us", "latency_us", "stall_us",
                                              "duration_us", "hbm_used_blocks",
                                              "spilled_blocks", "live_blocks"])
    requests = _request_table(rep)
    name = offline_name or pol.name
    summary = _summary(name, bool(pol.offline), rep, steps, requests, facts, costs)
    cfg = _describe(config, costs, block_bytes)
    return SimResult(name, bool(pol.offline), summary, requests, steps, cfg,
                     str(trace_path), costs, {})


def _request_table(rep: LiveReplay) -> pd.DataFrame:
    seen = [r for r in range(rep.NR) if rep.arrival_us[r] >= 0 or rep.count[r] > 0]
    rows = []
    for r in seen:
        n = rep.ntok[r]
        tpot = ((rep.last_tok[r] - rep.first_tok[r]) / (n - 1)) if n > 1 else math.nan
        ttft = (rep.first_tok[r] - rep.arrival_us[r]) if (rep.first_tok[r] >= 0 and
                                                            rep.arrival_us[r] >= 0) else math.nan
        rows.append((r, rep.arrival_us[r], ttft, tpot, n, rep.req_stall_us[r],
                     rep.req_fetched[r]))
    return pd.DataFrame(rows, columns=["request_id", "arrival_us", "ttft_us", "tpot_us",
                                       "output_tokens", "stall_us", "blocks_fetched"])


def _summary(name, offline, rep, steps, requests, facts, costs) -> dict:
    from kvsim.replay.metrics import SUMMARY_KEYS

    nan = float("nan")
    s = {k: nan for k in SUMMARY_KEYS}
    lat = steps["latency_us"].to_numpy()
    c = rep.c
    names = ("hbm", "dram", "cxl", "nvme")
    s.update({
        "policy": name, "offline": offline, "mode": "engine", "schedule": "recorded",
        "live_offload": True, "events": int(facts.num_rows), "steps": int(len(steps)),
        "requests": int(len(requests)), "warmup_requests": 0,
        "p50_step_us": _pct(lat, 50), "p95_step_us": _pct(lat, 95),
        "p99_step_us": _pct(lat, 99), "p999_step_us": _pct(lat, 99.9),
        "mean_step_us": float(lat.mean()) if len(lat) else nan,
        "ttft_p50_us": _pct(requests["ttft_us"], 50), "ttft_p99_us": _pct(requests["ttft_us"], 99),
        "tpot_p50_us": _pct(requests["tpot_us"], 50), "tpot_p99_us": _pct(requests["tpot_us"], 99),
        "ttft_deadline_misses": c["ttft_deadline_misses"],
        "tpot_deadline_misses": c["tpot_deadline_misses"],
        "deadline_misses": c["ttft_deadline_misses"] + c["tpot_deadline_misses"],
        "decode_critical_misses": c["decode_critical_stalls"],
        "stalls": c["stalls"], "stall_us": rep.c_us["stall_us"],
        "decode_stalls": c["decode_stalls"], "decode_stall_us": rep.c_us["decode_stall_us"],
        "decode_critical_stalls": c["decode_critical_stalls"],
        "live_spills": c["live_spills"], "pinned_spills": c["pinned_spills"],
        "spills": c["live_spills"], "spills_hbm": c["live_spills"],
        "blocks_fetched": c["blocks_fetched"], "promotions": c["blocks_fetched"],
        "prefetches": c["prefetches"], "prefetches_useful": c["prefetches_useful"],
        "prefetches_wasted": c["prefetches_wasted"],
        "evictions_hbm": c["evictions_hbm"], "evictions": c["evictions_hbm"],
        "peak_live_blocks": rep.peak_live,
        "oversubscription": rep.peak_live / rep.C if rep.C else nan,
        "hit_blocks": c["hit_blocks"],
        "hbm_block_hit_rate": (c["hit_blocks"] / c["lookup_blocks"]) if c["lookup_blocks"]
        else nan,
        "makespan_us": rep.prev_end, "saved_us": 0.0, "preemptions": 0,
    })
    for t, nm in enumerate(names):
        s[f"{nm}_capacity_blocks"] = int(costs[t].capacity_blocks)
        if t:
            s[f"bytes_{nm}_link"] = int(rep.link_bytes[t])
    s["bytes_moved"] = int(sum(rep.link_bytes))
    return s


def simulate_live(trace_path: str | Path, policy, config, decision_log=None, facts=None):
    """Replay ``trace_path`` in the live-offload mode under HBM policy ``policy`` (a name,
    a ``.py`` file or a :class:`~kvsim.policy.registry.Policy`; ``"optimal"`` is the
    offline bound of :mod:`kvsim.bounds.live_optimal`).  Returns a
    :class:`kvsim.replay.driver.SimResult` whose summary has the keys of docs/simulate.md
    ("Live offload") with ``live_offload = True``.  Same inputs => identical result."""
    return run_live(trace_path, policy, config, decision_log, facts)


__all__ = ["LIVE_KEYS", "replay_rows", "run_live", "simulate_live"]
