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

import pandas as pd
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


# ---- watermarks (Mooncake Store's quota design: evict from a high watermark down to a low one)
#
# HBM 20 blocks, one output token each (a request holds its prompt blocks and releases them
# at once), 1 s apart: Y (tenant 1, 4 blocks), X (tenant 0, 12 blocks), Z (tenant 1, 8
# blocks), W (tenant 1, 4 blocks).  Y + X = 16 blocks; Z takes the 4 free ones and evicts 4;
# W evicts 4.  By hand:
# - lru: Z evicts Y's 4 (the oldest), W X's 4: suffered Y 4, X 4.
# - tenant 0 high=10, low=6: X's insertion takes tenant 0 to 12 > 10, so it drains: Z's 4
#   victims are X's (12 -> 8, still above 6), W's first 2 too (8 -> 6: draining ends), then
#   least recently used again: Y's 2.  Suffered Y 2, X 6.
# - tenant 0 high=low=10 (coinciding watermarks, Mooncake #3741) drains only until 10 = a
#   hard cap of 10: Z evicts X's 2 (12 -> 10), then Y's 2 (LRU); W Y's 2 and X's 2: suffered
#   Y 4, X 4 -- exactly cap=10's victims, the hysteresis gone.
def watermark_table():
    prompt = [64, 192, 128, 64]
    ids = [[1, 2, 3, 4], list(range(100, 112)), list(range(200, 208)), list(range(300, 304))]
    return build_request_table({
        "arrival_us": [1_000_000 * i for i in range(4)], "prompt_tokens": prompt,
        "output_tokens": [1] * 4, "block_ids": ids, "hashed_tokens": prompt,
        "tenant": [1, 0, 1, 1]}, block_size_tokens=B)


def run_wm(policy, quotas=()):
    cfg = SimConfig(engine="interpreted", hbm_blocks=20, dram_gb=0, cxl_gb=0, nvme_gb=0,
                    tenant_quotas=quotas, tenant_metrics=True)
    return serve(watermark_table(), policy, cfg, engine=ENGINE)


@pytest.mark.parametrize("policy, quotas, suffered, caused", [
    ("lru", (), [4, 4, 0, 0], [0, 0, 4, 4]),
    ("quota_lru", parse_tenant_quotas(["0:hbm:high=10,low=6"]), [2, 6, 0, 0], [0, 0, 4, 4]),
    ("quota_lru", parse_tenant_quotas(["0:hbm:high=10,low=10"]), [4, 4, 0, 0], [0, 0, 4, 4]),
    ("quota_lru", parse_tenant_quotas(["0:hbm:cap=10"]), [4, 4, 0, 0], [0, 0, 4, 4]),
])
def test_watermarks_drain_to_low_under_pressure(policy, quotas, suffered, caused):
    res = run_wm(policy, quotas)
    rq = res.requests.sort_values("request_id")
    assert rq["evictions_suffered"].tolist() == suffered
    assert rq["evictions_caused"].tolist() == caused


def test_watermark_victims_in_the_decision_log(tmp_path):
    """high=10,low=6: reason 3 (draining) for Z's 4 and W's first 2 victims, all tenant 0;
    then reason 1 (over share: both tenants have share 0, least recently used) for Y's 2;
    coinciding watermarks: reason 3 only for the 2 blocks that take tenant 0 back to 10."""
    def reasons(quota):
        path = tmp_path / f"{len(quota)}.parquet"
        cfg = SimConfig(engine="interpreted", hbm_blocks=20, dram_gb=0, cxl_gb=0, nvme_gb=0,
                        tenant_quotas=parse_tenant_quotas([quota]))
        serve(watermark_table(), "quota_lru", cfg, engine=ENGINE, decision_log=path)
        log = pd.read_parquet(path)
        ev = log[log["reason_code"] >= 0]
        return ev["reason_code"].tolist(), None
    got, _ = reasons("0:hbm:high=10,low=6")
    assert got == [3] * 6 + [1] * 2
    got, _ = reasons("0:hbm:high=10")
    assert got[:2] == [3, 3] and 3 not in got[2:]


def test_watermark_parsing():
    assert parse_tenant_quotas(["1:hbm:cap=100,high=80,low=60", "2:dram:high=5"]) == \
        ((1, "hbm", 100, 0, 80, 60), (2, "dram", 2**62, 0, 5, 5))
    for bad in ("1:hbm:low=3", "1:hbm:high=x"):
        with pytest.raises(KvsimInputError):
            parse_tenant_quotas([bad])
    with pytest.raises(KvsimInputError):  # low above high
        SimConfig(tenant_quotas=parse_tenant_quotas(["1:hbm:high=4,low=8"]))
    cfg = SimConfig(tenant_quotas=((1, "hbm", 10, 2, 8, 4), (2, "hbm", 10, 0)))
    assert cfg.quota_params() == {"hbm": ((1, 10, 2, 8, 4), (2, 10, 0))}
