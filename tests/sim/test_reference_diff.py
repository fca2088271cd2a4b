"""The whole tiered replay against an independent reference (tests/reference/).

``kvsim.api.simulate`` (interpreted engine: the same source as the compiled one) and the
plain-Python reference written from the docs replay the same small traces under the same
configurations; their summaries (every key of ``SimResult.summary``) and decision logs
(row by row, every column, candidates included) must be identical.  Hypothesis draws the
traces (shared prefixes, identical prompts, decode appends, intents, frees) and the
configurations (HBM small enough to evict and preempt, lower tiers on or off, write
policies, preemption modes, priority scheduling, prefetch), for every built-in policy;
derandomized, so CI runs the same examples every time.  Hand-made cases below pin exact
values worked out by hand.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.api import simulate
from kvsim.core.schema import Phase, Priority
from kvsim.policy.registry import list_policies
from kvsim.replay.metrics import SUMMARY_KEYS
from kvsim.spec.sim_config import SimConfig
from tests.reference import reference_replay
from tests.sim.conftest import TINY_PROFILE, TraceBuilder, random_trace

POLICIES = sorted(p.name for p in list_policies())
ONLINE = [p.name for p in list_policies() if not p.offline]
BLOCK_BYTES = 100  # TraceBuilder: 4 tokens x 25 bytes


def gb(blocks: int) -> float:
    return blocks * BLOCK_BYTES / 1e9


def replay_log(path: Path) -> list[dict]:
    rows = pq.read_table(path).to_pylist()
    return [dict(r) for r in rows]


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def check(trace: Path, policy: str, config: SimConfig, tmp: Path) -> None:
    log = tmp / f"{policy}.parquet"
    res = simulate(trace, policy, config, decision_log=log)
    want, want_rows = reference_replay(trace, policy, config)
    diff = {k: (res.summary[k], want[k]) for k in SUMMARY_KEYS
            if not same(res.summary[k], want[k])}
    got_rows = replay_log(log)
    for i, (g, w) in enumerate(zip(got_rows, want_rows)):
        if g != w:
            keys = [k for k in w if g.get(k) != w[k]]
            raise AssertionError(f"{policy}: decision-log row {i} differs in {keys}:\n"
                                 f"  replay    {g}\n  reference {w}\n  summary diff {diff}")
    assert len(got_rows) == len(want_rows), \
        f"{policy}: {len(got_rows)} log rows, reference {len(want_rows)}; summary diff {diff}"
    assert not diff, f"{policy}: summary differs (replay, reference): {diff}"


# ---------------------------------------------------------------------------------------
# random traces
# ---------------------------------------------------------------------------------------

request_st = st.fixed_dictionaries({
    "family": st.sampled_from([0, 0, 1]),  # requests of one family share a prefix chain
    "shared": st.sampled_from([0, 1, 2, 2, 3]),  # blocks of the family chain
    "own": st.integers(0, 2),  # private full blocks
    "tail": st.integers(0, 3),  # tokens of a partial last block
    "tail_hash": st.booleans(),  # the partial block carries its full content's hash
    "decode_hash": st.booleans(),  # decode blocks carry their full content's hash
    "decode": st.integers(0, 6),  # decode steps
    "gap": st.integers(0, 3),  # steps after the previous arrival
    "deadline": st.booleans(),
    "rprio": st.sampled_from([0, 50, 100]),
    "prio": st.sampled_from([Priority.WARM, Priority.HOT, Priority.COLD,
                             Priority.DECODE_CRITICAL]),
    "prefetch_ok": st.sampled_from([True, True, False]),
    "intent": st.booleans(),  # a request-level INTENT at its first decode step
    "chunks": st.integers(1, 2),  # chunked prefill: ACCESS rows over 1 or 2 steps
    "fork": st.sampled_from([False, False, True]),  # a child forks at the first decode
    "rollback": st.booleans(),  # its first new decode block is a rejected draft: freed
})

config_st = st.fixed_dictionaries({
    "hbm_blocks": st.integers(4, 16),
    "dram": st.sampled_from([0, 2, 4, 8]),
    "cxl": st.sampled_from([0, 0, 2, 3]),
    "nvme": st.sampled_from([0, 3, 6]),
    "tier_policy": st.sampled_from(["lru", "fifo", "lfu", "s3fifo", "arc", "sieve"]),
    "write_policy": st.sampled_from(["write_back", "write_through",
                                     "write_through_selective"]),
    "preemption": st.sampled_from(["recompute", "swap"]),
    "priority_scheduling": st.booleans(),
    "prefetch": st.sampled_from([True, True, False]),
    "log_lifecycle": st.booleans(),
    "slow_links": st.booleans(),  # slow links: transfers of hundreds of us, partly hidden
    "warmup": st.sampled_from([0, 0, 1, 2]),  # warm-up requests (arrival order)
    "log_candidates": st.sampled_from([4, 4, 0, 1, 8]),  # runners-up per eviction row
})


def build_trace(reqs: list[dict], max_running: int) -> TraceBuilder:
    """A small continuous-batching engine that follows the lowering rules of
    docs/trace-format.md: ARRIVE, then at admission every prompt block ALLOCATEd in block
    order and the first prefill chunk's ACCESS; one decode token per step (a new block
    ALLOCATEd in the step whose token starts it; a rejected draft block is freed by a
    block-level FREE after the ACCESS); a forked child (parallel sampling) shares
    its parent's table, and each one's first write into the shared partial block is an
    ALLOCATE at that index (copy-on-write); request-level FREE when done."""
    tb = TraceBuilder()
    arrive, s = [], 0
    for q in reqs:
        s += q["gap"]
        arrive.append(s)
    waiting, running, t, step, nxt = [], [], 0, 0, 0
    tokens, left, chunk, cow, rolled = {}, {}, {}, set(), set()
    spec = {r: q for r, q in enumerate(reqs)}
    child = len(reqs)
    while nxt < len(reqs) or waiting or running:
        tb.STEP(t, 300.0 + 40.0 * len(running))
        while nxt < len(reqs) and arrive[nxt] <= step:
            q = reqs[nxt]
            prompt = 4 * (q["shared"] + q["own"]) + q["tail"] or 1
            tb.ARRIVE(nxt, prompt, t + 2500 if q["deadline"] else -1,
                      request_priority=q["rprio"], priority=int(q["prio"]))
            waiting.append(nxt)
            nxt += 1
        for r in list(running):
            q = spec[r]
            if chunk.get(r):  # the rest of a chunked prefill
                tb.ACCESS(r, chunk.pop(r))
                continue
            if q["fork"] and left[r] == q["decode"] and r < len(reqs):
                c = child
                child += 1
                spec[c] = dict(q, fork=False, intent=False)
                tb.ARRIVE(c, 0, -1, request_priority=q["rprio"])
                tb.add(kind=6, request_id=c, parent_request_id=r)
                tokens[c], left[c] = tokens[r], q["decode"]
                running.append(c)
                if tokens[r] % 4:
                    cow.update((r, c))
            if q["intent"] and left[r] == q["decode"]:
                tb.add(kind=4, request_id=r, phase=int(Phase.DECODE),
                       priority=int(Priority.DECODE_CRITICAL), deadline_us=t + 900,
                       request_priority=q["rprio"], pin_requested=True)
            if r in cow:  # first write into the shared partial block
                cow.discard(r)
                tb.ALLOC(r, tokens[r] // 4, 0, tokens[r] % 4 + 1, 80.0,
                         phase=int(Phase.DECODE))
            new_block = tokens[r] % 4 == 0
            if new_block:  # hashed by its full content (docs/importers.md): cached once full
                bi = tokens[r] // 4
                tb.ALLOC(r, bi, 30_000 + 100 * r + bi if q["decode_hash"] else 0, 1, 90.0,
                         phase=int(Phase.DECODE))
            tokens[r] += 1
            left[r] -= 1
            tb.ACCESS(r, 1, Phase.DECODE, deadline_us=t + 420 if q["deadline"] else -1)
            if new_block and q["rollback"] and r not in rolled:  # block-level FREE
                rolled.add(r)
                tokens[r] -= 1
                tb.add(kind=7, request_id=r, block_index=tokens[r] // 4)
        while waiting and len(running) < max_running:
            r = waiting.pop(0)
            q = reqs[r]
            f = q["family"]
            hashes = [f * 100 + j + 1 for j in range(q["shared"])] + \
                [10_000 + 10 * r + j for j in range(q["own"])]
            ntok = [4] * len(hashes)
            if q["tail"] or not hashes:
                hashes.append(20_000 + r if q["tail_hash"] else 0)
                ntok.append(q["tail"] or 1)
            for i, (h, n) in enumerate(zip(hashes, ntok)):
                tb.ALLOC(r, i, h, n, 25.0 * n + i, priority=int(q["prio"]),
                         request_priority=q["rprio"], prefetch_ok=q["prefetch_ok"])
            tokens[r] = sum(ntok)
            left[r] = q["decode"]
            first = sum(ntok) if q["chunks"] == 1 else (sum(ntok) + 1) // 2
            tb.ACCESS(r, first)
            if sum(ntok) > first:
                chunk[r] = sum(ntok) - first
            running.append(r)
        for r in [r for r in running if left[r] == 0 and not chunk.get(r)]:
            tb.FREE(r)
            running.remove(r)
        t += 1000
        step += 1
    return tb


#: The tiny profile with slow links (DRAM 0.2, CXL 0.1, NVMe 0.05 bytes/us: one 100-byte
#: block takes 500 / 1,000 / 2,000 us), so promotions are partly hidden by queueing time
#: and swaps cost more than a step.
SLOW_PROFILE = (TINY_PROFILE.replace('name = "tiny"', 'name = "tiny-slow"')
                .replace("link_bandwidth_bytes_per_s = 1.0e8  # source: test value (100 bytes",
                         "link_bandwidth_bytes_per_s = 2.0e5  # source: test value (0.2 bytes")
                .replace("link_bandwidth_bytes_per_s = 5.0e7  # source: test value (50 bytes",
                         "link_bandwidth_bytes_per_s = 1.0e5  # source: test value (0.1 bytes")
                .replace("link_bandwidth_bytes_per_s = 1.0e8  # source: test value\n",
                         "link_bandwidth_bytes_per_s = 5.0e4  # source: test value\n"))


@pytest.fixture(scope="session")
def hw_pair(tmp_path_factory, tiny_hw) -> tuple[str, str]:
    path = tmp_path_factory.mktemp("hw") / "tiny-slow.toml"
    path.write_text(SLOW_PROFILE)
    return tiny_hw, str(path)


def config_from(c: dict, hw_pair: tuple[str, str], n_requests: int) -> SimConfig:
    hw = hw_pair[1] if c["slow_links"] else hw_pair[0]
    return SimConfig(hardware=hw, hbm_blocks=c["hbm_blocks"], dram_gb=gb(c["dram"]),
                     cxl_gb=gb(c["cxl"]), nvme_gb=gb(c["nvme"]),
                     tier_policies=tuple((t, c["tier_policy"]) for t in ("dram", "cxl", "nvme")),
                     write_policy=c["write_policy"], preemption=c["preemption"],
                     priority_scheduling=c["priority_scheduling"], prefetch=c["prefetch"],
                     log_lifecycle=c["log_lifecycle"], engine="interpreted",
                     warmup_requests=min(c["warmup"], n_requests - 1),
                     log_candidates=c["log_candidates"])


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=int(os.environ.get("KVSIM_REFERENCE_EXAMPLES", "12")), deadline=None,
          derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(request_st, min_size=1, max_size=8), max_running=st.integers(1, 3),
       cfg=config_st)
def test_replay_matches_reference(policy, reqs, max_running, cfg, hw_pair):
    with tempfile.TemporaryDirectory() as d:
        tb = build_trace(reqs, max_running)
        trace = tb.write(Path(d) / "t.jsonl")
        n_requests = len({r["request_id"] for r in tb.rows if r["request_id"] >= 0})
        check(trace, policy, config_from(cfg, hw_pair, n_requests), Path(d))


# ---------------------------------------------------------------------------------------
# hand-made cases, values worked out by hand (tiny profile: blocks of 4 tokens, 100 bytes;
# DRAM up/down = 1 us + 4 us latency, min(1 GB/s, 0.1 GB/s) = 100 bytes/us: 5 us + 1 us
# per block; every block's recompute_cost_us is 100)
# ---------------------------------------------------------------------------------------

def test_demote_then_promote_by_hand(tiny_hw, tmp_path):
    """HBM 3 blocks, DRAM 20, lru, write_back.

    step 0: r0 = [h1 h2 +1 token] misses, computed (first_compute 8 tokens; the partial
            block counts nowhere); FREE r0 tail first: the partial block -> empties,
            h2 then h1 cached (lru order h2, h1).  latency 1000, TTFT 1000.
    step 1: r1 = [h3 h4 h5] (12 tokens: lookup covers at most 2 blocks) misses: the empty
            block, then evicts h2 then h1, each DEMOTEd to DRAM (200 bytes down); computed
            (first_compute 12).  latency 1000.
    step 2: r2 = [h1 h2 +1] as r0: HBM misses, DRAM holds h1 h2 -> promoted on demand (no
            queueing time): 5 + 1 + 1 = 7 us stall; the 3 blocks of r2 evict h5 h4 h3 (DEMOTEd:
            300 bytes).  Savings 2 x 100 us over 8 hit tokens = 25 us/token, credited
            min(200, 9 x 25) = 200: latency 1000 - 200 + 7 = 807, TTFT 807.
    lookup tokens 9 + 12 + 9 = 30, DRAM hit 8 -> 8/30; DRAM link 200 + 300 down + 200 up."""
    tb = TraceBuilder()
    for r, (step_t, hashes) in enumerate([(0, [1, 2, 0]), (1000, [3, 4, 5]),
                                          (2000, [1, 2, 0])]):
        tb.STEP(step_t, 1000.0)
        prompt = 12 if hashes[-1] else 9
        tb.ARRIVE(r, prompt)
        tb.prompt(r, hashes, last_tokens=None if hashes[-1] else 1)
        tb.ACCESS(r, prompt)
        tb.FREE(r)
    trace = tb.write(tmp_path / "t.jsonl")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=3, engine="interpreted")
    res = simulate(trace, "lru", cfg, decision_log=tmp_path / "lru.parquet")
    ref, ref_rows = reference_replay(trace, "lru", cfg)
    for s in (res.summary, ref):
        assert s["first_compute_tokens"] == 20
        assert s["spills_hbm"] == 5 and s["evictions"] == 0
        assert s["promotions"] == 2 and s["prefetches"] == 0
        assert s["stall_us"] == 7.0 and s["saved_us"] == 200.0
        assert s["lookup_tokens"] == 30 and s["dram_hit_rate"] == 8 / 30
        assert s["bytes_dram_link"] == 700
        assert s["makespan_us"] == 2807.0
        assert s["ttft_p50_us"] == 1000.0 and s["p50_step_us"] == 1000.0
    got = [(r["action"], r["content_hash"], r["from_tier"], r["to_tier"])
           for r in replay_log(tmp_path / "lru.parquet")]
    demote, promote = 1, 2
    assert got == [(demote, 2, 0, 1), (demote, 1, 0, 1),  # step 1
                   (demote, 5, 0, 1), (demote, 4, 0, 1), (demote, 3, 0, 1),  # step 2
                   (promote, 1, 1, 0), (promote, 2, 1, 0)]
    assert got == [(r["action"], r["content_hash"], r["from_tier"], r["to_tier"])
                   for r in ref_rows]
    check(trace, "lru", cfg, tmp_path)


def lru_and_reference(tb: TraceBuilder, tiny_hw, tmp_path, hbm_blocks: int = 8) -> tuple:
    """Write ``tb``, replay it under lru (interpreted) and in the reference; the two
    summaries (after :func:`check` compared them and their decision logs)."""
    trace = tb.write(tmp_path / "t.jsonl")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=hbm_blocks, engine="interpreted")
    res = simulate(trace, "lru", cfg)
    ref, _ = reference_replay(trace, "lru", cfg)
    check(trace, "lru", cfg, tmp_path)
    return res.summary, ref


def test_decode_block_cached_once_full(tiny_hw, tmp_path):
    """A decode block is ALLOCATEd with one token and the hash of its full content; it is
    cached when the next block follows it (vLLM caches a block once full), so the next
    turn's prompt hits it.  HBM 8 blocks, lru, 4-token blocks.

    r0: prompt [h1 h2] (8 tokens), then 5 decode tokens: block 2 (h3) starts at the first
        and fills at the fourth, block 3 (unhashed) starts at the fifth -> h3 is cached.
    r1: prompt [h1 h2 h3] + 1 token (13 tokens; the lookup covers at most 3 blocks): hits
        h1 h2 h3 = 12 tokens (8 if the decode block were never cached)."""
    tb = TraceBuilder()
    tb.STEP(0, 1000.0)
    tb.ARRIVE(0, 8)
    tb.prompt(0, [1, 2])
    tb.ACCESS(0, 8)
    for k in range(5):
        tb.STEP(1000 * (k + 1), 100.0)
        if k in (0, 4):
            tb.ALLOC(0, 2 + k // 4, 3 if k == 0 else 0, 1, 90.0, phase=int(Phase.DECODE))
        tb.ACCESS(0, 1, Phase.DECODE)
    tb.FREE(0)
    tb.STEP(6000, 1000.0)
    tb.ARRIVE(1, 13)
    tb.prompt(1, [1, 2, 3, 0], last_tokens=1)
    tb.ACCESS(1, 13)
    tb.FREE(1)
    for s in lru_and_reference(tb, tiny_hw, tmp_path):
        assert s["hit_tokens"] == 12 and s["hit_blocks"] == 3
        assert s["lookup_tokens"] == 8 + 13


@pytest.mark.parametrize("by_priority, victims, rerun_tokens",
                         [(True, [0, 1, 2], 3 + 3 + 1), (False, [1, 2], 3 + 1)])
def test_preemption_victims_by_hand(tiny_hw, tmp_path, by_priority, victims, rerun_tokens):
    """HBM 3 blocks, no lower tier, recompute preemption; r0, r1, r2 arrive at t=0 with the
    same request_priority; r0 = [3 tokens], r1 = [3 tokens] run from step 0.

    step 1: r2 = [h7, +1 token] needs 2 blocks, 1 is empty: preempt.  vLLM v1 takes the
            last running (r1); priority scheduling max(priority, arrival) ties everywhere
            and keeps the first: r0.
    step 2: the preempted one resumes (needs 1 block, HBM full): priority -> the first
            running of the others (r1 when r0 resumes; then r2 for r1); last -> r2.
            Each resume recomputes its 3-token block (+100 us).
    step 3: r2 resumes: h7 is still cached (revived), its partial block (1 token) is
            recomputed."""
    tb = TraceBuilder()
    tb.STEP(0, 500.0)
    for r, prompt in ((0, 3), (1, 3), (2, 5)):
        tb.ARRIVE(r, prompt)
    for r in (0, 1):
        tb.ALLOC(r, 0, 0, 3)
        tb.ACCESS(r, 3)
    tb.STEP(1000, 500.0)
    tb.prompt(2, [7, 0], last_tokens=1)
    tb.ACCESS(2, 5)
    tb.STEP(2000, 500.0)
    tb.ACCESS(0, 1, Phase.DECODE)
    tb.ACCESS(1, 1, Phase.DECODE)
    tb.FREE(0)
    tb.FREE(1)
    tb.STEP(3000, 500.0)
    tb.ACCESS(2, 1, Phase.DECODE)
    tb.FREE(2)
    trace = tb.write(tmp_path / "t.jsonl")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=3, dram_gb=0.0, engine="interpreted",
                    priority_scheduling=by_priority)
    res = simulate(trace, "lru", cfg, decision_log=tmp_path / "lru.parquet")
    preempted = [r["request_id"] for r in replay_log(tmp_path / "lru.parquet")
                 if r["action"] == 6]
    assert preempted == victims
    assert res.summary["preemptions"] == len(victims)
    assert res.summary["preempt_recompute_tokens"] == rerun_tokens
    check(trace, "lru", cfg, tmp_path)


def test_partial_prefetch_by_hand(tiny_hw, tmp_path):
    """HBM 3, DRAM 20, lru.  r0 = [h1 h2 +1] then r1 = [h3 h4 +1] push h1, h2 down to DRAM
    (as in the demote/promote case).  r2 = [h1 h2 +1] ARRIVEs at 1997 us and is admitted in
    the step starting at 2000: 3 us of queueing time to hide transfers behind.  First DRAM
    block: 5 us latency + 1 us = 6 us, 3 hidden -> a (late) PREFETCH with a 3 us stall;
    second: 1 us, nothing left to hide it -> PROMOTE, 1 us stall.  Savings 200 us:
    latency 1000 - 200 + 4 = 804, TTFT = 2804 - 1997 = 807."""
    tb = TraceBuilder()
    for r, hashes in enumerate([[1, 2, 0], [3, 4, 0], [1, 2, 0]]):
        tb.STEP(1000 * r, 1000.0)
        tb.ARRIVE(r, 9, time_us=1000 * r - 3 if r == 2 else 1000 * r)
        tb.prompt(r, hashes, last_tokens=1)
        tb.ACCESS(r, 9)
        tb.FREE(r)
    trace = tb.write(tmp_path / "t.jsonl")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=3, engine="interpreted")
    res = simulate(trace, "lru", cfg, decision_log=tmp_path / "lru.parquet")
    s = res.summary
    assert (s["prefetches"], s["prefetches_useful"], s["promotions"]) == (1, 0, 1)
    assert s["stall_us"] == 4.0 and s["makespan_us"] == 2804.0
    assert res.requests.set_index("request_id").loc[2, "ttft_us"] == 807.0
    up = [(r["action"], r["content_hash"], r["cost_us"])
          for r in replay_log(tmp_path / "lru.parquet") if r["to_tier"] == 0]
    assert up == [(3, 1, 3.0), (2, 2, 1.0)]  # PREFETCH h1 (3 us stall), PROMOTE h2 (1 us)
    check(trace, "lru", cfg, tmp_path)


def test_swap_preemption_by_hand(tiny_hw, tmp_path):
    """The preemption scenario of test_preemption_victims_by_hand (no priority) with
    --preemption swap.  DRAM path: 5 us latency + 1 us per 100-byte block, each way.
    step 1: r1 (1 block) swapped out: 5 + 1 = 6 us on the step;
    step 2: r1 resumes and r2 (2 blocks) is swapped out: 5 + 2 = 7 us; r1's block swapped
            back in: 5 + 1 = 6 us;
    step 3: r2 resumes: h7 is still cached in HBM (revived), its partial block is swapped
            in: 6 us.  Steps of 500 us: 500, 506, 513, 506; nothing recomputed."""
    tb = TraceBuilder()
    tb.STEP(0, 500.0)
    for r, prompt in ((0, 3), (1, 3), (2, 5)):
        tb.ARRIVE(r, prompt)
    for r in (0, 1):
        tb.ALLOC(r, 0, 0, 3)
        tb.ACCESS(r, 3)
    tb.STEP(1000, 500.0)
    tb.prompt(2, [7, 0], last_tokens=1)
    tb.ACCESS(2, 5)
    tb.STEP(2000, 500.0)
    tb.ACCESS(0, 1, Phase.DECODE)
    tb.ACCESS(1, 1, Phase.DECODE)
    tb.FREE(0)
    tb.FREE(1)
    tb.STEP(3000, 500.0)
    tb.ACCESS(2, 1, Phase.DECODE)
    tb.FREE(2)
    trace = tb.write(tmp_path / "t.jsonl")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=3, dram_gb=0.0, engine="interpreted",
                    preemption="swap")
    res = simulate(trace, "lru", cfg, decision_log=tmp_path / "lru.parquet")
    s = res.summary
    assert (s["preemptions"], s["swap_out_bytes"], s["swap_in_bytes"]) == (2, 300, 200)
    assert s["preempt_recompute_tokens"] == 0 and s["bytes_dram_link"] == 500
    assert res.steps["latency_us"].tolist() == [500.0, 506.0, 513.0, 506.0]
    check(trace, "lru", cfg, tmp_path)


def test_admission_of_a_huge_prompt_grows_the_record_arena(tiny_hw, tmp_path):
    """An admission reserves max(4, prompt // B + 2) block-record rows at once: a prompt
    of 280,000 tokens (4-token blocks) reserves 70,002, more than the initial arena (65,536
    rows); the core asks the driver for that room first, so the next request's records
    land inside the (grown) arena and the replay matches the reference."""
    tb = TraceBuilder()
    tb.STEP(0, 1000.0)
    tb.ARRIVE(0, 280_000)
    tb.ALLOC(0, 0, 1)
    tb.ACCESS(0, 4)
    tb.FREE(0)
    tb.STEP(1000, 1000.0)
    tb.ARRIVE(1, 9)
    tb.prompt(1, [1, 2, 0], last_tokens=1)
    tb.ACCESS(1, 9)
    tb.FREE(1)
    for s in lru_and_reference(tb, tiny_hw, tmp_path):
        assert s["hit_tokens"] == 4 and s["lookup_tokens"] == 280_000 + 9


def test_arena_compacted_in_place_changes_nothing(tiny_hw, tmp_path, monkeypatch):
    """With an arena of 64 rows at the start and no slack, a random trace of 200 requests
    compacts the block records many times, in place and growing; the replay still
    matches the reference."""
    from kvsim.replay import driver as replay

    calls = {"in_place": 0, "grown": 0}
    compact = replay._Run._compact_arena

    def counted(self):
        before = self.A_i
        compact(self)
        calls["in_place" if self.A_i is before else "grown"] += 1

    monkeypatch.setattr(replay, "ARENA_ROWS", 64)
    monkeypatch.setattr(replay, "ARENA_SLACK_ROWS", 0)
    monkeypatch.setattr(replay._Run, "_compact_arena", counted)
    tb = random_trace(TraceBuilder, 7, n_requests=200)
    trace = tb.write(tmp_path / "t.parquet")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=12)
    check(trace, "lru", cfg, tmp_path)
    assert calls["in_place"] > 10 and calls["grown"] >= 1, calls
