"""Per-tenant metrics of a run: one row per tenant from its requests table
(``SimResult.requests``: the ``tenant`` column and each request's counters).

Columns (:data:`TENANT_COLUMNS`): ``tenant``; ``requests`` (measured requests);
``lookup_tokens`` (prompt tokens looked up at admission); ``hit_tokens`` (of those, found in
HBM or a lower tier) and ``hit_rate`` = hit / lookup; ``hbm_hit_rate`` (HBM only);
``ttft_p50_us``, ``ttft_p99_us`` (NaN without engine timing: cache mode);
``evictions_suffered`` (HBM blocks this tenant's requests brought in that were later
evicted to make room) and ``evictions_caused`` (HBM blocks evicted to make room for this
tenant's requests' blocks).  A block's tenant is the tenant of the request that brought it
into HBM (``view.tenant``).  Evictions count every request, warm-up included (a block
brought in during the warm-up and evicted after it is suffered by its tenant); the hit and
TTFT columns count the measured requests (``request_id >= warmup``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

TENANT_COLUMNS = ("tenant", "requests", "lookup_tokens", "hit_tokens", "hit_rate",
                  "hbm_hit_rate", "ttft_p50_us", "ttft_p99_us", "evictions_suffered",
                  "evictions_caused")
_HIT_COLUMNS = ("hbm_hit_tokens", "dram_hit_tokens", "cxl_hit_tokens", "nvme_hit_tokens")


def _pct(v: np.ndarray, q: float) -> float:
    v = v[~np.isnan(v)]
    return float(np.percentile(v, q)) if len(v) else float("nan")


def tenant_table(requests: pd.DataFrame, warmup: int = 0) -> pd.DataFrame:
    """One row per tenant (ascending id) of ``requests``; see the module docstring."""
    rows = []
    if not len(requests):
        return pd.DataFrame(columns=list(TENANT_COLUMNS))
    for t, g in requests.groupby("tenant", sort=True):
        m = g[g["request_id"] >= warmup]
        look = int(m["lookup_tokens"].sum())
        hit = int(sum(m[c].sum() for c in _HIT_COLUMNS if c in m))
        hbm = int(m["hbm_hit_tokens"].sum())
        ttft = m["ttft_us"].to_numpy(np.float64) if "ttft_us" in m else np.zeros(0)
        rows.append({"tenant": int(t), "requests": int(len(m)), "lookup_tokens": look,
                     "hit_tokens": hit,
                     "hit_rate": hit / look if look else float("nan"),
                     "hbm_hit_rate": hbm / look if look else float("nan"),
                     "ttft_p50_us": _pct(ttft, 50), "ttft_p99_us": _pct(ttft, 99),
                     "evictions_suffered": int(g.get("evictions_suffered", pd.Series(
                         [], dtype=np.int64)).sum()),
                     "evictions_caused": int(g.get("evictions_caused", pd.Series(
                         [], dtype=np.int64)).sum())})
    return pd.DataFrame(rows, columns=list(TENANT_COLUMNS))
