"""The shared cluster tier (kvsim.modes.closed.shared_tier) and the ``tiered`` router
(kvsim.modes.closed.tier_router), on hand-built Request tables (interpreted engine)."""

from __future__ import annotations

import pytest

from kvsim.core.errors import KvsimInputError
from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig

B = 16
A = list(range(1, 21))  # a 20-block prompt: at most 19 blocks hit (the last token computes)


def _table(arrival, prompt, output, ids):
    return build_request_table({"arrival_us": arrival, "prompt_tokens": prompt,
                                "output_tokens": output, "block_ids": ids,
                                "hashed_tokens": [min(len(x) * B, p) for x, p in
                                                  zip(ids, prompt)]},
                               block_size_tokens=B)


def cfg(**kw) -> SimConfig:
    return SimConfig(engine="interpreted", write_policy="write_through", **kw)


def block_bytes() -> int:
    # llama-3-8b: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 131,072 per token
    return 32 * 8 * 128 * 2 * 2 * B


def test_a_block_one_replica_stored_is_found_by_another():
    t = _table([0, 1_000_000], [20 * B] * 2, [2, 2], [A, A])  # round robin: 0 -> r0, 1 -> r1
    private = serve(t, "lru", cfg(dram_gb=1.0), replicas=2).requests.set_index("request_id")
    assert private.loc[1, "dram_hit_tokens"] == 0  # replica 1 never saw A
    res = serve(t, "lru", cfg(shared_tier_gb=1.0), replicas=2)
    rq = res.requests.set_index("request_id")
    assert list(rq["replica"]) == [0, 1]
    assert rq.loc[1, "dram_hit_tokens"] == 19 * B and rq.loc[1, "hbm_hit_tokens"] == 0
    s = res.summary
    assert s["shared_tier_hit_rate"] == pytest.approx(19 * B / (40 * B))
    assert s["shared_tier_capacity_blocks"] == int(1e9 // block_bytes())
    # written once (write_through, replica 0: its 20 hashed blocks; replica 1 finds them
    # there: de-duplicated), 19 read back by replica 1
    assert s["shared_tier_peak_blocks"] == 20
    assert s["network_bytes"] == (20 + 19) * block_bytes()
    assert (s["network_bytes_down"], s["network_bytes_up"]) == (20 * block_bytes(),
                                                                19 * block_bytes())
    # replica 1 was idle: nothing to hide the transfer behind; one batch over its network
    # link: 10 us + 19 blocks / 12.5 GB/s
    assert rq.loc[1, "stall_us"] == pytest.approx(10.0 + 19 * block_bytes() / 12.5e3)


def test_the_link_speed_is_an_option():
    t = _table([0, 1_000_000], [20 * B] * 2, [2, 2], [A, A])
    rq = serve(t, "lru", cfg(shared_tier_gb=1.0, shared_link_bytes_per_s=25e9,
                             shared_link_latency_us=0.0),
               replicas=2).requests.set_index("request_id")
    assert rq.loc[1, "stall_us"] == pytest.approx(19 * block_bytes() / 25e3)


def test_tiered_router_weighs_a_shared_tier_prefix_by_its_transfer():
    """A is cached on replica 0 (HBM) and in the shared tier; replica 0 then runs C, a
    long decode.  ``prefix`` counts the shared copy like an HBM one and sends A's repeat
    to the idle replica 1; ``tiered`` prices the 19 network transfers (about half a
    block's prefill each) above replica 0's few active blocks and keeps it on 0."""
    c = [201, 202]
    t = _table([0, 1_000_000, 1_010_000], [20 * B, 2 * B, 20 * B], [2, 2000, 2], [A, c, A])
    got = {}
    for router in ("prefix", "tiered"):
        rq = serve(t, "lru", cfg(shared_tier_gb=1.0), replicas=2,
                   router=router).requests.set_index("request_id")
        got[router] = list(rq["replica"])
    assert got["prefix"] == [0, 0, 1]
    assert got["tiered"] == [0, 0, 0]


def test_shared_tier_refuses_private_tiers():
    t = _table([0], [B], [1], [[1]])
    with pytest.raises(KvsimInputError, match="--dram-gb"):
        serve(t, "lru", cfg(shared_tier_gb=1.0, dram_gb=2.0), replicas=2)


SAMPLE = ["--request-trace", "traces/sample_mooncake.jsonl", "--model", "llama-3.1-8b",
          "--block-size", "512", "--hbm-gb", "2", "--engine", "interpreted", "--json"]


def test_cli_shared_tier_and_link_queue():
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from kvsim.cli import app

    root = Path(__file__).resolve().parents[2]
    args = ["simulate", *SAMPLE, "--replicas", "2", "--router", "tiered",
            "--shared-tier-gb", "8", "--shared-link-gbps", "25", "--link-model", "queue"]
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        res = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    s = out["policies"][0]
    assert out["config"]["shared_tier_gb"] == 8.0 and out["config"]["link_model"] == "queue"
    assert out["config"]["shared_link_bytes_per_s"] == 25e9 / 8
    assert s["shared_tier_hit_rate"] > 0 and s["network_bytes"] > 0
    assert s["link_shared_up_transfers"] == s["link_transfers_up"] > 0


@pytest.mark.parametrize("extra, fragment", [
    (["--link-model", "fair"], "--link-model"),
    (["--shared-tier-gb", "8", "--dram-gb", "4"], "--dram-gb"),
])
def test_cli_bad_cluster_memory_options(extra, fragment):
    from typer.testing import CliRunner

    from kvsim.cli import app
    from tests.helpers import assert_one_line_error

    res = CliRunner().invoke(app, ["simulate", "--request-trace", "x.jsonl", *extra])
    assert_one_line_error(res, fragment)


def test_the_replicas_config_is_a_fixed_point():
    from kvsim.modes.closed.shared_tier import config_for

    c = config_for(cfg(shared_tier_gb=1.0, shared_tier_policy="sieve"))
    assert (c.dram_gb, c.cxl_gb, c.nvme_gb, c.tier_policy("dram")) == (1.0, 0.0, 0.0, "sieve")
    assert config_for(c) == c


def test_cluster_memory_columns_by_name_only():
    from kvsim.cli.render import parse_columns

    keys = ["shared_tier_hit_rate", "network_bytes", "link_queue_p50_us", "link_queue_p99_us"]
    assert [c.key for c in parse_columns(",".join(keys), False)] == keys
    assert not set(keys) & {c.key for c in parse_columns(None, True)}  # --wide as before
