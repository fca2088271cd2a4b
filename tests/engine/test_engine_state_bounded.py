"""The closed loop's per-replica engine state follows what can be resident, not the trace's
length (issue 38, "Memory"): the same requests repeated (same block ids, later arrivals)
leave every set-up array of an engine the same size, and the block hashes vLLM's
scheduler reads are one array shared by requests of equal content and by every replica."""

from __future__ import annotations

import numpy as np
import pytest

#: seven requests: a shared 3-block prefix, two tenants, requests whose ids past their
#: hashed tokens differ (equal hashes), one unhashed and one long (250 hashed blocks)
_BASE = {"prompt_tokens": [64, 64, 80, 40, 64, 33, 4000],
         "output_tokens": [4, 20, 4, 2, 20, 3, 1],
         "block_ids": [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 9], [7, 8, 9], [1, 2, 3, 6],
                       [11, 12, 13], list(range(1000, 1250))],
         "hashed_tokens": [64, 48, 80, 40, 48, 0, 4000], "tenant": [0, 0, 1, 0, 0, 0, 0]}


def _table(copies: int):
    from kvsim.ingest.requests import build_request_table

    n = len(_BASE["prompt_tokens"])
    cols = {k: v * copies for k, v in _BASE.items()}
    cols["arrival_us"] = [k * 1_000_000 + i * 1000 for k in range(copies) for i in range(n)]
    return build_request_table(cols, block_size_tokens=16)


def _engine(copies: int, scheduler: str = "vllm", tiers=()):
    from kvsim.modes.closed.closed_loop import Engine, EngineOptions, prepare
    from kvsim.policy.registry import resolve_policy
    from kvsim.spec.sim_config import SimConfig

    # multi-TB lower tiers (the defaults' size): their capacity never binds here
    config = SimConfig(mode="engine", hbm_blocks=512, dram_gb=1000, cxl_gb=1000,
                       nvme_gb=4000, engine="interpreted", tier_policies=tuple(tiers))
    opts = EngineOptions(scheduler=scheduler)
    cost, hbm_blocks, costs, block_bytes, off, ids, table, _ = prepare(_table(copies), config,
                                                                      opts)
    return Engine(table, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks,
                  costs, block_bytes)


def _sizes(e) -> dict:
    from kvsim.engine.vllm_rows import VS_HH

    run = e.run
    return {"next_use": e.nu.nbytes + e.seen.nbytes,
            "lower_slots": [int(T.L_i.shape[0]) for T in run.T],
            "lower_bytes": sum(T.L_i.nbytes + T.L_free.nbytes for T in run.T),
            "lower_table": run.T[0].L_h.nbytes, "hashes": e.vs[VS_HH].nbytes}


def test_engine_state_does_not_grow_when_the_trace_repeats():
    """On the old main every one of these grew with the copies: ``next_use``/``seen`` and
    the lower tiers' slots were sized by every block of the whole trace, and each replica
    hashed every request."""
    one, many = _sizes(_engine(1)), _sizes(_engine(64))
    assert many == one
    # the hashed blocks of the distinct contents (requests 1 and 4 hash alike): 4+3+5+2+250
    assert one["lower_slots"] == [264, 264, 264]


def test_lower_tier_keeps_its_capacity_for_the_policy():
    """Slots follow the distinct hashes, the tier's own capacity is its slots (the
    free-slot stack never runs out before every distinct hash is held), and a disabled
    tier stays disabled."""
    from kvsim.core import layout as L
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.lower_tiers import _lower_table, _lower_tier

    lru = resolve_policy("lru")
    T = _lower_tier(1, 10**6, lru, {"seed": 0}, 5000, _lower_table(8), 8)
    assert T.L_i.shape[0] == 8 and list(T.Lm) == [1, 8, 8, 0]
    off = _lower_tier(2, 0, lru, {"seed": 0}, 5000, _lower_table(1), 8)
    assert off.Lm[L.LM_CAP] == 0
    small = _lower_tier(3, 4, lru, {"seed": 0}, 5000, _lower_table(4), 8)
    assert small.L_i.shape[0] == 4 and small.Lm[L.LM_CAP] == 4


@pytest.mark.parametrize("salted", [False, True])
def test_shared_hashes_equal_each_requests_own(salted):
    """Every request's slice of the shared array is exactly its own chain hashes
    (:func:`request_hashes` on a private array); equal contents share one slice."""
    from kvsim.engine.vllm_rows import request_hashes, shared_hashes

    t = _table(3)
    df = t.df
    off, ids = t.flat_block_ids()
    i64 = lambda x: np.ascontiguousarray(x, dtype=np.int64)  # noqa: E731
    prompt, out = i64(df["prompt_tokens"]), i64(df["output_tokens"])
    hashed = i64(df["hashed_tokens"])
    tenant = i64(df["tenant"]) if salted else np.zeros(len(df), np.int64)
    B = 16
    h0, h1, hh = shared_hashes(prompt, out, hashed, tenant, off, ids, t.block_size_tokens, B)
    nfull = np.maximum(prompt + out - 1, 0) // B
    hoff = np.zeros(len(df) + 1, np.int64)
    hoff[1:] = np.cumsum(nfull)
    own = np.zeros(max(int(hoff[-1]), 1), np.int64)
    request_hashes(len(df), B, t.block_size_tokens, prompt, out, hashed, tenant, i64(off),
                   i64(ids), hoff, own)
    for c in range(len(df)):
        assert list(hh[h0[c]:h1[c]]) == list(own[hoff[c]:hoff[c + 1]])
    # three copies, and requests 1 and 4 of each: one slice per distinct content
    assert len(hh) == int(nfull[:7].sum() - nfull[4])


def test_digest_collisions_never_share():
    """Two requests of different content given the same representative (a digest
    collision) are split: each keeps its own hashes."""
    from kvsim.engine.vllm_rows import _split_unequal

    nfull = np.array([2, 2, 2], np.int64)
    hashed = np.array([32, 32, 32], np.int64)
    tenant = np.zeros(3, np.int64)
    off = np.array([0, 1, 2, 3], np.int64)
    ids = np.array([5, 5, 6], np.int64)
    used = np.ones(3, np.int64)
    rep = np.array([0, 0, 0], np.int64)
    _split_unequal(rep, 16, nfull, hashed, tenant, off, ids, used)
    assert list(rep) == [0, 0, 2]


def _policy_bytes(ps) -> int:
    """The bytes of a policy state's arrays (nested in tuples, beside its hooks)."""
    if isinstance(ps, tuple):
        return sum(_policy_bytes(x) for x in ps)
    return ps.nbytes if isinstance(ps, np.ndarray) else 0


@pytest.mark.parametrize("name", ["arc", "s3fifo"])
def test_ghost_lists_follow_the_contents_not_the_trace(name):
    """A lower tier larger than the trace: its policy is told the trace's blocks as its
    capacity (unchanged, so are its decisions), but ARC's and S3-FIFO's ghost pools hold
    at most one node per distinct content that reaches the tier (``params["max_contents"]``):
    the same size for 5,000 and 500,000 blocks of a trace with 8 distinct contents (s18:
    ARC 3 x capacity + 2 nodes, S3-FIFO 1.9 x capacity + 2, ~60 bytes a node)."""
    from kvsim.policy.registry import resolve_policy
    from kvsim.replay.lower_tiers import _lower_table, _lower_tier

    pol = resolve_policy(name)
    small, large = (_lower_tier(1, 10**7, pol, {"seed": 0}, blocks, _lower_table(8), 8)
                    for blocks in (5000, 500_000))
    assert _policy_bytes(small.L_ps) == _policy_bytes(large.L_ps) < 4096
    if name == "arc":
        assert small.L_ps.i64[4][0] == 5000  # the capacity it is told: unchanged


@pytest.mark.parametrize("name", ["arc", "s3fifo"])
def test_closed_loop_ghosts_do_not_grow_when_the_trace_repeats(name):
    """The closed loop's DRAM tier under ARC / S3-FIFO: the policy state is the same size
    for 1 and 64 copies of the requests."""
    one, many = (_engine(c, tiers=(("dram", name),)).run.T[0].L_ps for c in (1, 64))
    assert _policy_bytes(one) == _policy_bytes(many)
