"""Warnings about results a user should not trust as they are: never silent nonsense.

:func:`result_warnings` reads the result rows of ``simulate`` / ``compare`` (the ``--json``
keys) and returns a list of ``{"code", "message"}`` dicts; the CLI prints each as one
``warning:`` line on stderr and puts the list under ``warnings`` in ``--json``
(docs/simulate.md, "Warnings").  Codes:

* ``no_requests``: a run served 0 requests (every cell would be "-");
* ``preemption_storm``: more preemptions than requests (HBM far too small for the batch the
  scheduler runs: hit rates and latencies measure thrashing, not the policy);
* ``overload``: the run's makespan is more than :data:`OVERLOAD_FACTOR` x the trace's span
  (the deployment cannot keep up: TTFT measures the queue; add replicas);
* ``hbm_below_budget``: the replayed HBM holds under half the blocks the recorded schedule
  was made for (its batches no longer fit: preemptions and overflow, not caching);
* ``request_larger_than_hbm``: a request needs more blocks than HBM holds (the closed
  loop's ``dropped_requests``: never admitted, counted as misses in the hit rates and
  left out of every other metric; or, given
  ``largest_request_blocks``, the largest request of an event file).
* ``few_measured``: the warm-up (``--warmup-fraction`` / ``--warmup-requests``) leaves
  fewer than :data:`MIN_MEASURED_REQUESTS` requests measured: every tail percentile is
  set by the two slowest requests.
* ``no_shared_content`` (a single run, ``single_run=True``): prompt tokens were looked up
  but none hit and no block was evicted, so the requests share no prompt content (a trace
  without content identity, such as Azure's token counts, or unique prompts): the hit
  rates are 0 whatever the policy and the memory.
* ``no_eviction`` (a single run): blocks hit but no block left HBM (neither dropped nor
  demoted to a lower tier), no live block spilled (``--live-offload``) and no block moved
  between tiers, so the policy never chose: every policy gives these results, the hit rate
  is set by the trace's reuse (and the router), not by the policy.

Neither is said of a run with a warm-up: its counts are the measured window's, and the
policy's choices during the warm-up decide what the window hits.

``compare`` states both in its verdict instead (the same test across its rows,
:func:`kvsim.results.compare_view.identical_cause`), and a sweep's large cells are expected
to fit, so neither warns about them.

Sizing warnings made before a replay (context, offered load) come from
:mod:`kvsim.analysis.sizing` with codes ``over_context`` and ``overload_predicted``.
"""

from __future__ import annotations

import math

from kvsim.results.compare_view import identical_cause

#: Makespan / trace span above which a run is reported as overloaded.
OVERLOAD_FACTOR = 2.0
#: HBM blocks / the recorded schedule's budget below which the replay is warned about.
BUDGET_FRACTION = 0.5
#: Measured requests (after the warm-up) below which a run is warned about.  Percentiles
#: are ``np.percentile``'s (linear interpolation at rank (n - 1) p / 100), which falls
#: between the two largest of n values when n < 1 + 100 / (100 - p): below 11 for p90, 101
#: for p99.  So with fewer than 10 measured requests every tail percentile a summary
#: reports (p90 and p99 of TTFT, TPOT, E2E, queue) is set by the two slowest requests,
#: and with one request every percentile is that request's value.
MIN_MEASURED_REQUESTS = 10


def _num(v) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def result_warnings(rows: list[dict], *, span_us: float | None = None,
                    schedule_budget_blocks: int | None = None,
                    largest_request_blocks: int | None = None,
                    single_run: bool = False) -> list[dict]:
    """Warnings for the online rows of a result (module docstring); ``single_run``: the
    rows are one ``simulate`` run's (adds ``no_shared_content`` / ``no_eviction``)."""
    out: list[dict] = []
    online = [r for r in rows if not bool(r.get("offline"))]

    def add(code: str, message: str) -> None:
        out.append({"code": code, "message": message})

    empty = [str(r["policy"]) for r in online if (_num(r.get("requests")) or 0) == 0]
    if empty:
        add("no_requests", f"0 requests served ({', '.join(empty)}): every metric is empty; "
            "check the trace, the model's context and --warmup-*")
    storm = [(str(r["policy"]), _num(r.get("preemptions")) or 0, _num(r.get("requests")) or 0)
             for r in online]
    storm = [s for s in storm if s[2] > 0 and s[1] > s[2]]
    if storm:
        p, n, req = max(storm, key=lambda s: s[1])
        add("preemption_storm", f"preemption storm: {int(n):,} preemptions for {int(req):,} "
            f"requests ({p}); HBM is far too small for the batches the scheduler runs, so "
            "hit rates and latencies measure thrashing (raise --hbm-gb, or add --replicas)")
    if span_us and span_us > 0:
        late = [(str(r["policy"]), _num(r.get("makespan_us")) or 0) for r in online]
        late = [x for x in late if x[1] > OVERLOAD_FACTOR * span_us]
        if late:
            p, m = max(late, key=lambda x: x[1])
            add("overload", f"overloaded: the run took {m / 1e6:,.0f} s to serve a trace "
                f"spanning {span_us / 1e6:,.0f} s ({p}); TTFT measures the queue, not the "
                "cache (add replicas: --replicas auto)")
    for r in online[:1]:
        cap = _num(r.get("hbm_capacity_blocks"))
        if cap and schedule_budget_blocks and cap < BUDGET_FRACTION * schedule_budget_blocks:
            add("hbm_below_budget", f"HBM holds {int(cap):,} blocks but the recorded schedule "
                f"was made for {int(schedule_budget_blocks):,}: its batches no longer fit "
                "(preemptions and overflow, not caching); regenerate the events for this "
                "HBM or serve the request trace closed loop")
        dropped = _num(r.get("dropped_requests")) or 0
        if dropped > 0:  # the closed loop leaves out what can never be admitted
            total = int(dropped + (_num(r.get("requests")) or 0))
            add("request_larger_than_hbm", f"{int(dropped):,} of {total:,} requests dropped: "
                f"each needs more KV blocks than HBM holds ({int(cap or 0):,} blocks a "
                "replica, the scheduler's budget), so they are never admitted: the hit "
                "rates count their prompts as misses, the latencies leave them out; raise "
                "--hbm-gb / --hbm-blocks or lower --block-size")
        elif cap and largest_request_blocks and largest_request_blocks > cap:
            add("request_larger_than_hbm", f"a request needs {largest_request_blocks:,} "
                f"blocks but HBM holds {int(cap):,}: it can never be resident at once")
        warm = int(_num(r.get("warmup_requests")) or 0)
        measured = int(_num(r.get("requests")) or 0)
        if warm > 0 and 0 < measured < MIN_MEASURED_REQUESTS:
            add("few_measured", f"only {measured:,} of {measured + warm:,} requests measured "
                f"after the warm-up of {warm:,} (--warmup-fraction / --warmup-requests): "
                f"with fewer than {MIN_MEASURED_REQUESTS} the p90 and p99 are set by the two "
                "slowest requests; lower the warm-up or serve a longer trace")
    if single_run and len(online) == 1:
        out += _policy_never_chose(online[0])
    return out


def _policy_never_chose(r: dict) -> list[dict]:
    """``no_shared_content`` / ``no_eviction`` for one policy's result row (module
    docstring): the test compare's verdict makes across its rows
    (:func:`kvsim.results.compare_view.identical_cause`)."""
    if (_num(r.get("warmup_requests")) or 0) > 0:
        # the counts are the measured window's: the policy may have chosen during the
        # warm-up, and what it kept there is what the window hits
        return []
    cause = identical_cause([r])
    if cause == "no_shared_content":
        return [{"code": cause, "message": (
            f"no prompt content is shared between requests: 0 of "
            f"{int(_num(r.get('lookup_tokens')) or 0):,} prompt tokens hit and no block was "
            "evicted, so every policy and every HBM size give this 0 % hit rate (a trace "
            "without content identity, e.g. Azure's token counts, or unique prompts): it "
            "measures the engine's load, not the cache")}]
    if cause == "no_eviction":
        return [{"code": cause, "message": (
            "no block left HBM, neither evicted nor demoted (HBM holds "
            f"{int(_num(r.get('hbm_capacity_blocks')) or 0):,} blocks), so the policy never "
            "chose: every policy gives these results, and the hit rate is set by the "
            "trace's reuse, not by the policy (lower --hbm-gb / --hbm-blocks to compare "
            "policies)")}]
    return []


__all__ = ["BUDGET_FRACTION", "MIN_MEASURED_REQUESTS", "OVERLOAD_FACTOR", "result_warnings"]
