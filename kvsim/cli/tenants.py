"""Tenant options shared by ``kvsim compare`` (and the tenant table it prints):
``--tenant-quota`` (per-tenant quotas, enforced by the ``quota_lru`` policy) and
``--tenants`` (one row per policy and tenant: hit rate, TTFT p99, HBM evictions suffered
and caused).  docs/policies.md, "Tenant quotas"; docs/simulate.md, "Per-tenant metrics"."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

TenantQuotaOpt = Annotated[list[str] | None, typer.Option(
    "--tenant-quota", metavar="TENANT:TIER:cap=N[,share=M][,high=H[,low=L]]",
    help="A tenant's quota in one tier, in blocks of that tier (repeat the option): cap = "
    "hard cap, share = guaranteed share, high/low = watermarks (past high, the tier's "
    "evictions take the tenant's blocks until it is down to low; low defaults to high).  "
    "Enforced by the quota_lru policy (as HBM policy, "
    "or --tier-policy dram=quota_lru); other policies ignore it.", show_default=False)]
TenantsOpt = Annotated[bool, typer.Option(
    "--tenants", help="Also print one row per policy and tenant: hit rate, TTFT p99, HBM "
    "evictions suffered and caused (--json: 'tenant_rows' in each policy's row).")]


def with_tenants(config, tenants: bool, quotas) -> object:
    """``config`` with the tenant options applied (unchanged when neither is given)."""
    from kvsim.spec.sim_config import parse_tenant_quotas

    q = parse_tenant_quotas(quotas)
    if not tenants and not q:
        return config
    return dataclasses.replace(config, tenant_metrics=bool(tenants), tenant_quotas=q)


def split_tenant_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, list | None]:
    """``df`` without its ``tenant_rows`` column (a list per policy), and that column as
    ``[(policy, rows), ...]``; None when the run made none."""
    if "tenant_rows" not in df.columns:
        return df, None
    rows = [(p, r if isinstance(r, list) else []) for p, r in zip(df["policy"],
                                                                  df["tenant_rows"])]
    return df.drop(columns=["tenant_rows"]), rows


def tenant_view(rows) -> Table:
    """One row per policy and tenant."""
    from rich import box

    t = Table(title="per tenant (evictions: HBM blocks; suffered = the tenant's blocks "
              "evicted, caused = evicted to make room for the tenant)", title_justify="left",
              box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, header_style="bold")
    for col in ("policy", "tenant", "requests", "hit rate", "HBM hit", "TTFT p99 ms",
                "evictions suffered", "evictions caused"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for policy, trs in rows:
        for r in trs:
            ttft = r["ttft_p99_us"]
            t.add_row(str(policy), str(r["tenant"]), f"{r['requests']:,}",
                      "-" if r["hit_rate"] != r["hit_rate"] else f"{100 * r['hit_rate']:.2f}%",
                      "-" if r["hbm_hit_rate"] != r["hbm_hit_rate"]
                      else f"{100 * r['hbm_hit_rate']:.2f}%",
                      "-" if ttft != ttft else f"{ttft / 1e3:,.2f}",
                      f"{r['evictions_suffered']:,}", f"{r['evictions_caused']:,}")
    return t
