"""Reading a comparison's results (rows = policies, columns = the ``--json`` keys of
:func:`kvsim.api.compare`): which rows are identical, which row is the offline bound,
derived metrics, and the one-line verdict.  Pure functions on DataFrames: the CLI table
(:mod:`kvsim.cli.render`) and the HTML report (:mod:`kvsim.analysis.report_compare`) share them.
"""

from __future__ import annotations

import math

import pandas as pd

#: metrics that do not take part in "are these two policies' results identical?"
_NOT_A_RESULT = ("policy", "offline")


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


def verdict(df: pd.DataFrame, baseline: str = "lru") -> str:
    """One line: the best online policy (with the policies tied with it), its HBM-hit and
    decode-critical margins over ``baseline`` and its distance to the offline bound."""
    groups = [g for g in group_identical(df) if not g[1].get("offline")]
    if not groups:
        return "no online policy in the results"
    if len(groups) == 1:
        names, r = groups[0]
        head = (f"all {len(names)} online policies give identical results"
                if len(names) > 1 else f"{names[0]}")
    else:
        names, r = min(groups, key=lambda g: _rank(g[1]))
        head = f"best online: {names[0]}" + (f" (= {', '.join(names[1:])})" if len(names) > 1
                                             else "")
    margins = []
    base = next((g[1] for g in groups if baseline in g[0]), None)
    if base is not None and baseline not in names:
        dh = (_num(r.get("hbm_hit_rate")) or 0) - (_num(base.get("hbm_hit_rate")) or 0)
        margins.append(f"{100 * dh:+.2f} pp vs {baseline}")
    gap = _num(with_derived(pd.DataFrame([r] + [b for b in [bound_row(df)] if b]))
               ["gap_to_bound"].iloc[0])
    if gap is not None:
        margins.append(f"{-100 * gap + 0.0:+.2f} pp vs {bound_name(df)}")
    text = f"{head}: HBM hit {_pct(r.get('hbm_hit_rate'))}"
    if margins:
        text += f" ({', '.join(margins)})"
    if base is not None and baseline not in names:
        dc = _num(r.get("decode_critical_misses")) or 0
        bc = _num(base.get("decode_critical_misses")) or 0
        pct = f", {100 * (dc - bc) / bc:+.0f}%" if bc else ""
        text += f", decode-crit misses {int(dc):,} ({baseline} {int(bc):,}{pct})"
    return text


