"""Tenants: HBM evictions suffered and caused per tenant, quotas held by quota_lru under
pressure (hard cap, guaranteed share), the tenant table of compare, and options that
leave every output without tenants unchanged.

The closed loop on a hand-built Request table (interpreted engine, roofline timing,
16-token blocks, an HBM pool of 20 blocks, no lower tier): request A (tenant 1, 4 full
blocks) arrives first, then five flood requests F1..F5 of tenant 0 (8 unique full blocks
each, 1 s apart, each alone), then A again (tenant 1).  One output token each, so a
request holds exactly its prompt blocks and releases them at once.

By hand, lru: A 4 + F1 8 + F2 8 fill the 20 blocks; F3 evicts the 8 least recently used
(A's 4, F1's first 4), F4 the next 8 (F1's last 4, F2's first 4), F5 the next 8; A again
finds nothing (0 hit tokens) and evicts 4 of F3's.  Suffered: A 4, F1 8, F2 8, F3 8;
caused: F3 8, F4 8, F5 8, A-again 4.
quota_lru with tenant 1 guaranteed 4 blocks (or tenant 0 capped at 8): the victims are
always tenant 0's least recently used blocks (F1's 8, F2's 8, F3's 8), so A's 4 blocks
survive: A again hits 3 blocks = 48 tokens (a hit covers at most prompt - 1 tokens) and
evicts 1 block of F4 for its last block.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.core.errors import KvsimInputError
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig, parse_tenant_quotas

B = 16
ENGINE = EngineOptions(timing="roofline")


def flood_table():
    prompt = [64] + [128] * 5 + [64]
    ids = [[1, 2, 3, 4]] + [list(range(100 + 10 * i, 108 + 10 * i)) for i in range(5)] \
        + [[1, 2, 3, 4]]
    return build_request_table({
        "arrival_us": [1_000_000 * i for i in range(7)], "prompt_tokens": prompt,
        "output_tokens": [1] * 7, "block_ids": ids, "hashed_tokens": prompt,
        "tenant": [1, 0, 0, 0, 0, 0, 1]}, block_size_tokens=B)


def run(policy, quotas=()):
    cfg = SimConfig(engine="interpreted", hbm_blocks=20, dram_gb=0, cxl_gb=0, nvme_gb=0,
                    tenant_quotas=quotas, tenant_metrics=True)
    return serve(flood_table(), policy, cfg, engine=ENGINE)


def _by_tenant(res):
    return {r["tenant"]: (r["evictions_suffered"], r["evictions_caused"], r["hit_tokens"])
            for r in res.summary["tenant_rows"]}


def test_evictions_suffered_and_caused_exact_under_lru():
    res = run("lru")
    rq = res.requests.sort_values("request_id")
    assert rq["evictions_suffered"].tolist() == [4, 8, 8, 8, 0, 0, 0]
    assert rq["evictions_caused"].tolist() == [0, 0, 0, 8, 8, 8, 4]
    assert rq["hbm_hit_tokens"].tolist() == [0] * 7
    assert _by_tenant(res) == {0: (24, 24, 0), 1: (4, 4, 0)}
    assert res.summary["evictions_hbm"] == 28  # every eviction charged to one tenant


@pytest.mark.parametrize("quota", [(1, "hbm", 1000, 4),  # tenant 1 guaranteed 4 blocks
                                   (0, "hbm", 8, 0)])  # tenant 0 capped at 8 blocks
def test_quota_holds_under_pressure(quota):
    res = run("quota_lru", (quota,))
    rq = res.requests.sort_values("request_id")
    assert rq["evictions_suffered"].tolist() == [0, 8, 8, 8, 1, 0, 0]
    assert rq["evictions_caused"].tolist() == [0, 0, 0, 8, 8, 8, 1]
    assert rq["hbm_hit_tokens"].tolist() == [0, 0, 0, 0, 0, 0, 48]
    assert _by_tenant(res) == {0: (25, 24, 0), 1: (0, 1, 48)}
    rows = {r["tenant"]: r for r in res.summary["tenant_rows"]}
    assert rows[1]["hit_rate"] == 48 / 128 and rows[1]["requests"] == 2


def test_quota_lru_without_quotas_is_lru():
    a, b = run("lru"), run("quota_lru")
    for col in ("evictions_suffered", "evictions_caused", "hbm_hit_tokens", "ttft_us"):
        assert a.requests[col].tolist() == b.requests[col].tolist(), col


def test_quota_parsing_and_defaults():
    assert parse_tenant_quotas(["1:hbm:cap=100,share=20", "2:dram:share=5"]) == \
        ((1, "hbm", 100, 20), (2, "dram", 2**62, 5))
    for bad in ("1:hbm", "x:hbm:cap=1", "1:hbm:size=3", "1:hbm:"):
        with pytest.raises(KvsimInputError):
            parse_tenant_quotas([bad])
    with pytest.raises(KvsimInputError):  # share above cap
        SimConfig(tenant_quotas=((1, "hbm", 4, 8),))
    with pytest.raises(KvsimInputError):  # unknown tier
        SimConfig(tenant_quotas=((1, "l4", 4, 0),))
    cfg = SimConfig(tenant_quotas=((1, "hbm", 10, 2), (1, "dram", 50, 0)))
    assert cfg.quota_params() == {"hbm": ((1, 10, 2),), "dram": ((1, 50, 0),)}
    # without tenants, a config describes itself as before (outputs unchanged)
    assert "tenant_quotas" not in SimConfig().to_dict()
    assert "tenant_metrics" not in SimConfig().to_dict()
    assert cfg.to_dict()["tenant_quotas"] == cfg.tenant_quotas


def test_compare_tenants_cli(tmp_path):
    from kvsim.cli import app

    table = flood_table().df.copy()
    path = tmp_path / "t.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for r in table.itertuples():
            fh.write(json.dumps({"arrival_us": int(r.arrival_us),
                                 "prompt_tokens": int(r.prompt_tokens), "output_tokens": 1,
                                 "block_ids": [int(x) for x in r.block_ids],
                                 "tenant": int(r.tenant)}) + "\n")
    res = CliRunner().invoke(app, [
        "compare", "--request-trace", str(path), "--format", "generic",
        "--policies", "lru,quota_lru", "--hbm-blocks", "20", "--dram-gb", "0",
        "--cxl-gb", "0", "--nvme-gb", "0", "--engine", "interpreted", "--timing",
        "roofline", "--tenants", "--tenant-quota", "0:hbm:cap=8", "--json"])
    assert res.exit_code == 0, res.output
    rows = {p["policy"]: p["tenant_rows"] for p in json.loads(res.stdout)["policies"]}
    got = {p: [(r["tenant"], r["evictions_suffered"], r["evictions_caused"]) for r in trs]
           for p, trs in rows.items() if p in ("lru", "quota_lru")}
    assert got == {"lru": [(0, 24, 24), (1, 4, 4)], "quota_lru": [(0, 25, 24), (1, 0, 1)]}
    bad = CliRunner().invoke(app, ["compare", "--request-trace", str(path), "--format",
                                   "generic", "--tenant-quota", "0:hbm:cap", "--policies",
                                   "lru"])
    assert bad.exit_code == 2 and bad.stderr.strip().startswith("error: ")
