"""Reading a comparison's results (rows = policies, columns = the ``--json`` keys of
:func:`kvsim.api.compare`): which rows are identical, which row is the offline bound,
derived metrics, and the one-line verdict.  Pure functions on DataFrames: the CLI table
(:mod:`kvsim.cli.render`) and the HTML report (:mod:`kvsim.analysis.report_compare`) share them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: pandas is imported by whoever builds a table
    import pandas as pd


#: metrics that do not take part in "are these two policies' results identical?"
_NOT_A_RESULT = ("policy", "offline", "bound_claim", "bound_note")

#: What each offline row is, per kind of comparison (docs/simulate.md, "Bounds").
#: ``bound``: a proven upper bound on every online policy's HBM hit rate in that table;
#: ``heuristic``: an offline policy that reads the future, reported for reference, with
#: no bound claim (an online policy may beat it).
#:
#: * cache: ``optimal`` is Belady with bypass over unit-size blocks, the exact optimum of
#:   the model (kvsim.bounds.optimal); ``belady`` (forced admission, no bypass) is one of
#:   the schedules it maximises over, so it is never above it, but prefix lookups make it
#:   no bound on the online policies;
#: * engine (a recorded schedule): ``optimal`` is the optimum over the schedule's block
#:   productions (kvsim.bounds.optimal.engine_bound), a bound while no replay preempts
#:   (a preempted rerun re-produces blocks it does not model); ``belady`` is forced
#:   admission with pinned running blocks: a heuristic;
#: * live offload: ``optimal`` is kvsim.bounds.live_optimal (a bound on blocks fetched);
#: * closed loop: no bound exists (hits change the schedule); ``belady`` is a heuristic.
BOUND_RULES = {
    "cache": {"optimal": "bound", "belady": "heuristic"},
    "engine": {"optimal": "bound", "belady": "heuristic"},
    "live": {"optimal": "bound", "belady": "heuristic"},
    "closed": {"optimal": "heuristic", "belady": "heuristic"},
}

#: Slack for float noise when checking that a claimed bound is not beaten.
_BOUND_EPS = 1e-9


def label_bounds(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """``df`` (a comparison's rows) with ``bound_claim`` (``"bound"``, ``"heuristic"``, or
    None for an online policy) and ``bound_note`` (why a row is not claimed as a bound)
    set by :data:`BOUND_RULES` for ``kind`` (cache | engine | live | closed), then checked:
    a row claimed as a bound that any online row beats (HBM hit rate; live: blocks
    fetched) is demoted to ``heuristic`` with the reason, so the table never calls a number
    a bound that its own rows contradict."""
    out = df.copy()
    rules = BOUND_RULES.get(kind, {})
    rows = out.to_dict(orient="records")
    online = [r for r in rows if not bool(r.get("offline"))]
    preempting = [str(r["policy"]) for r in online if (_num(r.get("preemptions")) or 0) > 0]
    claims, notes = [], []
    for r in rows:
        if not bool(r.get("offline")):
            claims.append(None)
            notes.append(None)
            continue
        name = str(r["policy"])
        claim = rules.get(name, "heuristic")
        note = None
        if claim == "heuristic":
            note = ("no bound exists in the closed loop (hits change the schedule)"
                    if kind == "closed" else "offline heuristic, not a bound in this mode")
        elif kind == "engine" and preempting:
            claim = "heuristic"
            note = (f"not a bound here: {', '.join(preempting[:3])} preempted, and a "
                    "preempted rerun re-produces blocks the bound does not model")
        if claim == "bound":
            if kind == "live":
                mine = (_num(r.get("blocks_fetched")) or 0) + (_num(r.get("prefetches")) or 0)
                beaten = [(str(o["policy"]), mine - (_num(o.get("blocks_fetched")) or 0)
                           - (_num(o.get("prefetches")) or 0)) for o in online]
                beaten = [(n, d) for n, d in beaten if d > _BOUND_EPS]
                what = "blocks"
            else:
                mine = _num(r.get("hbm_hit_rate"))
                beaten = [(str(o["policy"]), (_num(o.get("hbm_hit_rate")) or 0) - mine)
                          for o in online if mine is not None]
                beaten = [(n, 100 * d) for n, d in beaten if d > _BOUND_EPS]
                what = "pp"
            if beaten:
                n, d = max(beaten, key=lambda t: t[1])
                claim = "heuristic"
                note = (f"not a bound here: {n} beats it by {d:.3g} {what} "
                        "(please report this trace)")
        claims.append(claim)
        notes.append(note)
    out["bound_claim"] = claims
    out["bound_note"] = notes
    return out


def offline_label(row: dict) -> str:
    """The table's suffix for an offline row: ``(bound)`` only where it is claimed as one."""
    if not bool(row.get("offline")):
        return ""
    claim = row.get("bound_claim")
    if claim is None or (isinstance(claim, float) and math.isnan(claim)):
        return " (bound)"  # a frame from before bound_claim existed (kvsim report)
    return " (bound)" if claim == "bound" else " (offline heuristic)"


def _num(v) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _pct(v) -> str:
    f = _num(v)
    return "-" if f is None else f"{100 * f:.2f}%"


def _lower_tier_hit(row: dict) -> float | None:
    vals = [_num(row.get(f"{t}_hit_rate")) for t in ("dram", "cxl", "nvme")]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def bound_row(df: pd.DataFrame) -> dict | None:
    """The offline bound among the results (rows with ``offline`` true): the one with the
    highest HBM hit rate, i.e. the tightest bound (belady today; ``optimal`` when run)."""
    if "offline" not in df.columns or not len(df):
        return None
    off = [r for r in df.to_dict(orient="records") if bool(r.get("offline"))]
    if "bound_claim" in df.columns:  # only a row claimed as a bound is one
        off = [r for r in off if r.get("bound_claim") == "bound"]
    if not off:
        return None
    return max(off, key=lambda r: _num(r.get("hbm_hit_rate")) or 0.0)


def with_derived(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus the derived columns (lower-tier hit rate, gap to the offline bound) as
    numbers, so they can be sorted and compared; the originals are untouched."""
    out = df.copy()
    rows = df.to_dict(orient="records")
    out["lower_tier_hit_rate"] = [_lower_tier_hit(r) for r in rows]
    bound = bound_row(df)
    ref = _num(bound.get("hbm_hit_rate")) if bound else None
    given = bound_gap_column(df)
    out["gap_to_bound"] = [
        (ref - h) if ref is not None and (h := _num(r.get("hbm_hit_rate"))) is not None
        else (_num(r.get(given)) if given and bound is None else None)
        for r in rows]
    out["gap_to_bound"] = out["gap_to_bound"].astype(float)
    return out


def bound_gap_column(df: pd.DataFrame) -> str | None:
    """When the bound ran but its row is not among the results (compare lists only the
    policies asked for), the gap computed against it: ``gap_hbm_hit_rate_to_<bound>``."""
    if "bound_claim" in df.columns:  # labelled: bound_row alone says where a bound is
        return None
    cols = [c for c in df.columns if c.startswith("gap_hbm_hit_rate_to_")
            and df[c].notna().any()]
    return cols[0] if cols else None


def bound_name(df: pd.DataFrame) -> str | None:
    """The offline bound's name: its row's, else the one the gap columns were computed to."""
    row = bound_row(df)
    if row is not None:
        return str(row["policy"])
    col = bound_gap_column(df)
    return col[len("gap_hbm_hit_rate_to_"):] if col else None


def _result_key(row: dict) -> tuple:
    items = []
    for k, v in sorted(row.items()):
        if k in _NOT_A_RESULT or k.endswith("_vs_lru") or k.endswith("_pct_vs_lru"):
            continue
        f = _num(v)
        items.append((k, f if f is not None else (v if isinstance(v, str) else None)))
    return (bool(row.get("offline")), tuple(items))


def group_identical(df: pd.DataFrame) -> list[tuple[list[str], dict]]:
    """Rows whose every metric is equal become one group (names in first-seen order);
    an offline bound is never grouped with an online policy."""
    groups: dict[tuple, tuple[list[str], dict]] = {}
    for r in df.to_dict(orient="records"):
        key = _result_key(r)
        if key in groups:
            groups[key][0].append(str(r["policy"]))
        else:
            groups[key] = ([str(r["policy"])], r)
    return list(groups.values())


def _rank(row: dict) -> tuple:
    """Best online policy: highest HBM hit, then fewest decode-critical misses, then lowest
    TTFT p99 (every metric the default table leads with)."""
    return (-(_num(row.get("hbm_hit_rate")) or 0.0),
            _num(row.get("decode_critical_misses")) or 0.0,
            _num(row.get("ttft_p99_us")) or 0.0)


#: Differences in HBM hit rate below this many percentage points are reported as "no
#: meaningful difference" (never as a winner).  Why 1.0 pp (0.5 before issue #33's
#: measurement): on the README job's profile (deadline_pressure, 256 requests, 8 GB,
#: closed loop, seeds 0-4) the seed-to-seed standard deviation of two policies' HBM-hit
#: difference has a median of 0.68 pp over the 55 pairs of online policies (max 1.17), and
#: pairs whose order flips from one seed to the next differ by up to 1.2-1.3 pp (lru vs
#: lfu: -0.76 .. +1.23; s3fifo vs fifo: -1.33 .. +0.55); a margin under 1 pp is within
#: that spread, so it says nothing about which policy is better on the user's traffic
#: (docs/simulate.md, "Verdict"; docs/benchmarks.md, "Issue 33: answers to trust").
NO_DIFFERENCE_PP = 1.0


#: What :func:`identical_cause` finds, and how the verdict says it.
IDENTICAL_REASONS = {
    "no_requests": "no request was served",
    "no_lookup": "no prompt content to look up (no prompt tokens, so no hit is possible)",
    "no_shared_content": "no prompt content is shared between requests (no hit is possible)",
    "no_eviction": "everything fits in HBM (nothing evicted or spilled, so the policy never "
                   "chooses)",
    "no_read_back": "every block that left HBM went to a lower tier and was never read back, "
                    "so which blocks left did not matter",
}


def identical_cause(rows: list[dict]) -> str | None:
    """Why policies gave (or would give) identical results, where the rows show it: a key
    of :data:`IDENTICAL_REASONS`, or None (a metric missing from a row proves nothing).
    Also the test of ``simulate``'s ``no_shared_content`` / ``no_eviction`` warnings on one
    run's row (kvsim.results.warnings)."""
    def every(key, test) -> bool:
        vals = [_num(r.get(key)) for r in rows]
        return bool(vals) and all(v is not None and test(v) for v in vals)

    def never(key) -> bool:  # a mechanism a mode lacks has no key: it never ran
        return all((_num(r.get(key)) or 0) == 0 for r in rows)

    if every("requests", lambda v: v == 0):
        return "no_requests"
    if every("lookup_tokens", lambda v: v == 0):
        return "no_lookup"
    # the policy chose nothing: no block left HBM, neither dropped (``evictions_hbm``) nor
    # demoted to a lower tier (``spills_hbm``: with a lower tier an HBM eviction is a
    # spill, ``evictions_hbm`` staying 0), no live block spilled (--live-offload: the policy
    # picks which running request's blocks leave HBM), no block moved between tiers
    unchosen = (every("evictions_hbm", lambda v: v == 0) and never("spills_hbm")
                and never("live_spills") and never("bytes_moved"))
    if unchosen and every("hit_tokens", lambda v: v == 0):
        return "no_shared_content"
    if unchosen:
        return "no_eviction"
    # blocks left HBM, none was dropped anywhere and none was read back from a lower tier:
    # any block reused after leaving HBM would have been a lower-tier hit, so no victim
    # was ever needed again (rows that are identical; one row proves nothing of others)
    if len(rows) > 1 and every("evictions", lambda v: v == 0) and all(
            every(f"{t}_hit_rate", lambda v: v == 0) for t in ("dram", "cxl", "nvme")):
        return "no_read_back"
    return None


def identical_reason(rows: list[dict]) -> str | None:
    """Why policies gave identical results, in words (:func:`identical_cause`)."""
    cause = identical_cause(rows)
    return None if cause is None else IDENTICAL_REASONS[cause]


def verdict_info(df: pd.DataFrame, baseline: str = "lru",
                 threshold_pp: float = NO_DIFFERENCE_PP) -> dict:
    """The verdict as data (the ``verdict`` object of ``compare --json``; keys in
    docs/simulate.md, "Verdict"): ``text`` (the line under the table), ``best`` (the best
    online policy and those identical to it), ``meaningful`` (false when every online
    policy's HBM hit rate lies within ``threshold_pp``), ``tied`` (policies within
    ``threshold_pp`` of the best, not identical to it), ``spread_pp`` (best minus worst
    online HBM hit), ``threshold_pp``, ``margin_vs_baseline_pp``, ``baseline``,
    ``bound`` (name, claim, gap_pp of the best to it; null without a claimed bound) and
    ``identical`` (groups of identical policies with the reason when known)."""
    groups = [g for g in group_identical(df) if not g[1].get("offline")]
    info: dict = {"text": "no online policy in the results", "best": [], "meaningful": False,
                  "tied": [], "spread_pp": None, "threshold_pp": threshold_pp,
                  "margin_vs_baseline_pp": None, "baseline": baseline, "bound": None,
                  "identical": []}
    for names, r in group_identical(df):
        if len(names) > 1:
            members = [x for x in df.to_dict(orient="records") if str(x["policy"]) in names]
            info["identical"].append({"policies": names, "reason": identical_reason(members)})
    if not groups:
        return info
    hit = {tuple(g[0]): (_num(g[1].get("hbm_hit_rate")) or 0.0) for g in groups}
    names, r = min(groups, key=lambda g: _rank(g[1]))
    best_hit = hit[tuple(names)]
    spread = 100 * (max(hit.values()) - min(hit.values()))
    tied = [n for g in groups if tuple(g[0]) != tuple(names)
            and 100 * abs(best_hit - hit[tuple(g[0])]) < threshold_pp for n in g[0]]
    info.update(best=list(names), tied=tied, spread_pp=spread,
                meaningful=len(groups) > 1 and spread >= threshold_pp)
    base = next((g[1] for g in groups if baseline in g[0]), None)
    if base is not None and baseline not in names:
        info["margin_vs_baseline_pp"] = 100 * (best_hit - (_num(base.get("hbm_hit_rate"))
                                                          or 0.0))
    b = bound_row(df)
    if b is not None:
        gap = (_num(b.get("hbm_hit_rate")) or 0.0) - best_hit
        info["bound"] = {"policy": str(b["policy"]), "claim": "bound", "gap_pp": 100 * gap}
    if len(groups) == 1:
        why = identical_reason([x for x in df.to_dict(orient="records")
                                if not x.get("offline")])
        head = (f"all {len(names)} online policies give identical results"
                + (f" ({why})" if why else "") if len(names) > 1 else f"{names[0]}")
        text = f"{head}: HBM hit {_pct(r.get('hbm_hit_rate'))}"
    elif not info["meaningful"]:
        every = [n for g in groups for n in g[0]]
        lo, hi = min(hit.values()), max(hit.values())
        text = (f"no meaningful difference between {', '.join(every)}: HBM hit "
                f"{_pct(lo)} to {_pct(hi)}, within {spread:.2f} pp (< {threshold_pp:g} pp, "
                "the seed-to-seed spread; docs/simulate.md, 'Verdict')")
    else:
        text = f"best online: {names[0]}" + (f" (= {', '.join(names[1:])})"
                                             if len(names) > 1 else "")
        margins = []
        if info["margin_vs_baseline_pp"] is not None:
            margins.append(f"{info['margin_vs_baseline_pp']:+.2f} pp vs {baseline}")
        if info["bound"] is not None:
            margins.append(f"{-info['bound']['gap_pp'] + 0.0:+.2f} pp vs "
                           f"{info['bound']['policy']} (bound)")
        text += f": HBM hit {_pct(r.get('hbm_hit_rate'))}"
        if margins:
            text += f" ({', '.join(margins)})"
        if base is not None and baseline not in names:
            dc = _num(r.get("decode_critical_misses")) or 0
            bc = _num(base.get("decode_critical_misses")) or 0
            pct = f", {100 * (dc - bc) / bc:+.0f}%" if bc else ""
            text += f", decode-crit misses {int(dc):,} ({baseline} {int(bc):,}{pct})"
        if tied:
            text += f"; tied within {threshold_pp:g} pp: {', '.join(tied)}"
    info["text"] = text
    return info


def verdict(df: pd.DataFrame, baseline: str = "lru") -> str:
    """One line: the best online policy (with the policies tied with it), its HBM-hit and
    decode-critical margins over ``baseline`` and its distance to the offline bound; or
    "no meaningful difference" when every online policy lies within
    :data:`NO_DIFFERENCE_PP` (:func:`verdict_info`)."""
    return verdict_info(df, baseline)["text"]
