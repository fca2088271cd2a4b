"""The lowering's KV block budget (num_gpu_blocks): admission steps, held blocks, shared
prefixes counted once, FIFO head-of-line blocking, decode stalls, the deadlock breaker,
the watermark, dropped requests, and agreement with the replay's default HBM pool.

Hand-derived cases use 16-token blocks and budgets far below 100 blocks, so the vLLM
watermark (int(0.01 x budget)) is 0 unless a test says otherwise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvsim.core.schema import EventKind as K
from kvsim.core.schema import Phase
from kvsim.engine.engine_model import EngineConfig, build_cost_model, default_num_gpu_blocks
from kvsim.engine.lowering import lower_requests
from kvsim.events import read_events
from kvsim.ingest import build_request_table
from tests.ingest.test_lowering import check_rules

B = 16


def table(**cols):
    n = len(cols["prompt_tokens"])
    cols.setdefault("arrival_us", [0] * n)
    cols.setdefault("output_tokens", [1] * n)
    return build_request_table(cols, block_size_tokens=B)


def lower(tmp_path, t, name="ev.parquet", **kw):
    s = lower_requests(t, tmp_path / name, **kw)
    header, df = read_events(tmp_path / name)
    check_rules(df)
    return s, header, df


def admission_steps(df) -> list[int]:
    """Step of each request's first (prompt) ALLOCATE, by request id."""
    pre = df[(df.kind == K.ALLOCATE) & (df.phase == Phase.PREFILL)]
    return pre.groupby("request_id").step.min().sort_index().tolist()


def decode_steps(df, rid) -> list[int]:
    acc = df[(df.kind == K.ACCESS) & (df.request_id == rid) & (df.phase == Phase.DECODE)]
    return acc.step.tolist()


def replay_held(path, hbm_blocks):
    """The replay's own pool, sized exactly at the budget: (held blocks per step end,
    preemptions)."""
    from kvsim.api import simulate
    from kvsim.spec.sim_config import SimConfig

    r = simulate(path, "lru", SimConfig(hbm_blocks=hbm_blocks, dram_gb=0, cxl_gb=0,
                                        nvme_gb=0, engine="interpreted"))
    return r.steps.hbm_used_blocks.tolist(), r.summary["preemptions"]


def test_fifo_head_of_line_blocking(tmp_path):
    # 10 blocks, unhashed prompts of 4, 7 and 1 blocks.  Step 0: r0 (4) fits, r1 (4+7 > 10)
    # does not, and r2 (1 block, would fit) waits behind it (FCFS).  r0 decodes into a 5th
    # block at step 1 and finishes at step 2; step 3 admits r1 (7) and r2 (7+1 <= 10).
    t = table(prompt_tokens=[64, 112, 16], output_tokens=[3, 1, 1])
    s, header, df = lower(tmp_path, t, num_gpu_blocks=10)
    assert admission_steps(df) == [0, 3, 3]
    assert s.num_gpu_blocks == 10 and s.watermark_blocks == 0
    assert s.max_held_blocks == 8 and s.max_running_seqs == 2
    assert s.admission_blocked_steps == 3  # steps 0, 1, 2
    assert s.decode_stalls == 0 and s.forced_decodes == 0 and s.dropped_requests == 0
    held, preempt = replay_held(tmp_path / "ev.parquet", 10)
    assert held == [4, 5, 0, 0]  # step ends (after frees): the replay agrees
    assert preempt == 0
    eng = header.source["engine"]
    assert eng["num_gpu_blocks"] == 10 and eng["num_gpu_blocks_given"] is True
    assert eng["watermark_blocks"] == 0 and eng["gpu_memory_utilization"] == 0.9
    # without a binding budget all three are admitted at step 0
    _, _, free = lower(tmp_path, t, "free.parquet")
    assert admission_steps(free) == [0, 0, 0]


def test_shared_prefix_blocks_count_once(tmp_path):
    # r0: 4 full hashed blocks [1,2,3,4] -> 4 keys.  r1: [1,2,3,4,5], 80 tokens: its lookup
    # may hit (80-1)//16 = 4 blocks -> shares all 4, 1 new.  r2: [1,2,3,4], 64 tokens: the
    # lookup stops at (64-1)//16 = 3 blocks, so its last block is a private copy -> 1 new.
    # r3: 3 unhashed blocks.  Held = 4 + 1 + 1 + 3 = 9 (16 without sharing).
    ids = [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4], []]
    t = table(prompt_tokens=[64, 80, 64, 48], output_tokens=[4, 1, 1, 1], block_ids=ids,
              hashed_tokens=[64, 80, 64, 0])
    s, _, df = lower(tmp_path, t, num_gpu_blocks=9)
    assert admission_steps(df) == [0, 0, 0, 0] and s.max_held_blocks == 9
    assert s.admission_blocked_steps == 0
    held, preempt = replay_held(tmp_path / "ev.parquet", 9)
    # step 0 ends: r1, r2, r3 finished -> r0's 4 blocks; r0 then grows to 5 blocks
    assert held[:2] == [4, 5] and preempt == 0
    # one block less: r3 (3 blocks) no longer fits after 6 held; r1 and r2 finish at step
    # 0 (their shared blocks stay held by r0, their own block is released): held 4; step 1
    # r0 decodes into a 5th block, then r3 fits exactly (5 + 3 = 8)
    s8, _, df8 = lower(tmp_path, t, "b8.parquet", num_gpu_blocks=8)
    assert admission_steps(df8) == [0, 0, 0, 1] and s8.max_held_blocks == 8
    held8, preempt8 = replay_held(tmp_path / "b8.parquet", 8)
    assert max(held8) <= 8 and preempt8 == 0


def test_decode_waits_for_a_free_block(tmp_path):
    # 5 blocks; two unhashed 2-block prompts.  r0's first decode (position 32) takes the
    # 5th block at step 1; r1's needs one too and waits (steps 1-9) until r0 finishes at
    # step 9 (10 output tokens) and releases 3 blocks.
    t = table(prompt_tokens=[32, 32], output_tokens=[10, 3])
    s, _, df = lower(tmp_path, t, num_gpu_blocks=5)
    assert admission_steps(df) == [0, 0]
    assert decode_steps(df, 0) == list(range(1, 10))
    assert decode_steps(df, 1) == [10, 11]
    assert s.decode_stalls == 9 and s.forced_decodes == 0 and s.max_held_blocks == 5
    held, preempt = replay_held(tmp_path / "ev.parquet", 5)
    assert max(held) <= 5 and preempt == 0


def test_deadlock_is_broken_by_forcing_the_oldest(tmp_path):
    # 4 blocks, both sequences hold 2 and both need a 3rd at step 1: nothing can advance,
    # so the oldest (r0) is forced over the budget (5 held); r1 waits until r0 finishes.
    t = table(prompt_tokens=[32, 32], output_tokens=[3, 3])
    s, _, df = lower(tmp_path, t, num_gpu_blocks=4)
    assert decode_steps(df, 0) == [1, 2] and decode_steps(df, 1) == [3, 4]
    assert s.forced_decodes == 1 and s.decode_stalls == 2 and s.max_held_blocks == 5


def test_watermark_keeps_one_percent_free_at_admission(tmp_path):
    # 200 blocks -> watermark 2.  r0 takes 197; r1 (2 blocks) would fit the 200 but not
    # 200 - 2, so it waits for r0 to finish (step 0).
    t = table(prompt_tokens=[197 * B, 2 * B], output_tokens=[1, 1])
    s, _, df = lower(tmp_path, t, num_gpu_blocks=200)
    assert s.watermark_blocks == 2 and admission_steps(df) == [0, 1]
    assert EngineConfig().watermark_blocks(200) == 2


def test_prompt_larger_than_the_budget_is_dropped(tmp_path):
    # 4 blocks: a 5-block prompt can never be admitted (vLLM: AllocStatus.NEVER, ignored)
    t = table(prompt_tokens=[80, 16, 64], output_tokens=[1, 1, 1])
    s, header, df = lower(tmp_path, t, num_gpu_blocks=4)
    assert s.num_requests == 2 and s.dropped_requests == 1
    assert s.dropped_requests_by_reason == {"prompt_exceeds_kv_blocks": 1}
    assert header.source["engine"]["dropped_requests"] == 1
    arrive = df[df.kind == K.ARRIVE]
    assert arrive.request_id.tolist() == [0, 1] and arrive.num_tokens.tolist() == [16, 64]


def test_fork_inherits_per_sequence_blocks(tmp_path):
    # prompt 40 = 2 full hashed blocks + a partial one; n = 2.  The child shares the two
    # full blocks (counted once) and inherits the partial block (counted per sequence):
    # 3 + 1 = 4 held.  With 4 blocks the fork goes ahead at step 1; with 3 it cannot,
    # nothing else can run, so it is forced.
    t = table(prompt_tokens=[40], output_tokens=[3], n=[2], block_ids=[[1, 2, 3]],
              hashed_tokens=[40])
    s, _, df = lower(tmp_path, t, num_gpu_blocks=4)
    assert s.num_forks == 1 and s.max_held_blocks == 4 and s.forced_decodes == 0
    _, _, ref = lower(tmp_path, t, "ref.parquet")
    assert df.equals(ref)  # the budget does not bind: same events
    s3, _, df3 = lower(tmp_path, t, "f3.parquet", num_gpu_blocks=3)
    assert s3.num_forks == 1 and s3.forced_decodes == 1 and s3.max_held_blocks == 4
    assert df3[df3.kind == K.FORK].step.tolist() == [1]


def test_beam_and_speculative_fit_a_tight_budget(tmp_path):
    t = table(prompt_tokens=[20, 14], output_tokens=[20, 6], beam_width=[3, 1],
              spec_draft_tokens=[0, 3], spec_accept_prob=[0.0, 0.5])
    s, _, df = lower(tmp_path, t, num_gpu_blocks=12)
    assert s.num_forks == 4 and s.forced_decodes == 0 and s.max_held_blocks <= 12
    held, preempt = replay_held(tmp_path / "ev.parquet", 12)
    assert max(held) <= 12 and preempt == 0


def test_default_budget_is_the_replays_default_hbm_pool(tmp_path):
    from kvsim.replay.driver import resolve_tiers, scan_trace
    from kvsim.spec.sim_config import SimConfig

    t = table(prompt_tokens=[40], output_tokens=[2])
    s, header, _ = lower(tmp_path, t)
    path = tmp_path / "ev.parquet"
    _, costs = resolve_tiers(SimConfig(), header, scan_trace(path, B, 1 << 20))
    assert s.num_gpu_blocks == costs[0].capacity_blocks
    # h100-sxm (85,520,809,984 bytes) x 0.9 - llama-3-8b weights (16,060,522,496 bytes),
    # over 16 x 131,072-byte tokens: 29,043 blocks, watermark 290
    assert s.num_gpu_blocks == 29_043 and s.watermark_blocks == 290
    cost = build_cost_model("llama-3-8b", "h100-sxm", block_size_tokens=B)
    assert default_num_gpu_blocks(cost, 0.5) == (85_520_809_984 // 2 - 16_060_522_496) // (
        16 * 131_072)
    s5, h5, _ = lower(tmp_path, t, "u5.parquet", gpu_memory_utilization=0.5)
    _, costs5 = resolve_tiers(SimConfig(gpu_memory_utilization=0.5), h5,
                              scan_trace(tmp_path / "u5.parquet", B, 1 << 20))
    assert s5.num_gpu_blocks == costs5[0].capacity_blocks == default_num_gpu_blocks(cost, 0.5)
    assert h5.source["engine"]["num_gpu_blocks_given"] is False


def test_bad_budget_options(tmp_path):
    from kvsim.core.errors import KvsimInputError

    for kw in ({"num_gpu_blocks": 0}, {"gpu_memory_utilization": 1.5},
               {"gpu_memory_utilization": 0.1}):  # 0.1 x 85.5 GB < 16 GB of weights
        with pytest.raises(KvsimInputError):
            lower_requests(table(prompt_tokens=[4]), tmp_path / "x.parquet", **kw)
    assert not (tmp_path / "x.parquet").exists()


def test_cli_options_and_json(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps({"timestamp": 0, "input_length": n, "output_length": 1,
                                       "hash_ids": list(range(k, k + (n + 511) // 512))})
                           + "\n" for k, n in ((0, 1024), (100, 2048))))
    res = CliRunner().invoke(app, ["import-request-trace", "--requests", str(src), "--out",
                                   str(tmp_path / "o.parquet"), "--block-size", "512",
                                   "--num-gpu-blocks", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["num_gpu_blocks"] == 4 and out["max_held_blocks"] <= 4
    assert out["admission_blocked_steps"] == 1 and out["max_running_seqs"] == 1
    res = CliRunner().invoke(app, ["generate", "--profile", "balanced", "--requests", "4",
                                   "--out", str(tmp_path / "g.parquet"),
                                   "--gpu-memory-utilization", "0.5", "--json"])
    assert res.exit_code == 0, res.output
    # (85,520,809,984 x 0.5 - 16,060,522,496) // 2,097,152
    assert json.loads(res.stdout)["num_gpu_blocks"] == 12_731
    res = CliRunner().invoke(app, ["import-request-trace", "--requests", str(src), "--out",
                                   str(tmp_path / "z.parquet"), "--num-gpu-blocks", "0"])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_byte_identical_with_a_binding_budget(tmp_path):
    import hashlib

    t = table(prompt_tokens=[64, 112, 16, 48, 32], output_tokens=[30, 5, 40, 2, 9],
              arrival_us=[0, 0, 100, 5_000, 9_000])
    digests = set()
    for name in ("a.parquet", "b.parquet"):
        lower_requests(t, tmp_path / name, num_gpu_blocks=12)
        digests.add(hashlib.sha256((tmp_path / name).read_bytes()).hexdigest())
    assert len(digests) == 1
    _, df = read_events(tmp_path / "a.parquet")
    check_rules(df)
    assert np.all(np.diff(df.step.to_numpy()) >= 0)


def test_random_shared_workload_never_overflows_the_replay_pool(tmp_path):
    # 40 requests drawing prompts from 3 shared prefixes (Mooncake-like ids), a 60-block
    # budget: the lowering's held count stays within it, and the replay, given exactly
    # that pool, never has to preempt.
    rng = np.random.default_rng(7)
    prompts, ids, outs, arrivals = [], [], [], []
    for i in range(40):
        base = int(rng.integers(0, 3)) * 1000
        nb = int(rng.integers(2, 12))
        tail = int(rng.integers(1, 16))
        prompts.append(nb * B + tail)
        ids.append([base + j for j in range(nb)] + [10_000 + i])
        outs.append(int(rng.integers(1, 40)))
        arrivals.append(i * 2_000)
    t = table(prompt_tokens=prompts, output_tokens=outs, arrival_us=arrivals, block_ids=ids,
              hashed_tokens=prompts)
    s, _, df = lower(tmp_path, t, num_gpu_blocks=60)
    assert s.dropped_requests == 0 and s.forced_decodes == 0
    assert s.max_held_blocks <= 60 and s.admission_blocked_steps > 0
    held, preempt = replay_held(tmp_path / "ev.parquet", 60)
    assert max(held) <= 60 and preempt == 0
    _, _, free = lower(tmp_path, t, "free.parquet")
    assert admission_steps(free) != admission_steps(df)  # the budget did bind


def test_lowering_options_size_the_scheduler_to_the_replay_pool():
    from kvsim.core.errors import KvsimInputError
    from kvsim.spec.sim_config import SimConfig

    # llama-3.1-8b (the default model; llama-3-8b's KV geometry): 131,072 bytes per token,
    # 2,097,152 per 16-token block
    assert SimConfig(hbm_gb=4.0).lowering_options()["num_gpu_blocks"] == 1_907
    assert SimConfig(hbm_gb=4.0).lowering_options(block_size_tokens=512)[
        "num_gpu_blocks"] == 59
    assert SimConfig(hbm_blocks=123, hbm_gb=4.0).lowering_options()["num_gpu_blocks"] == 123
    opts = SimConfig(hardware="h200", gpu_memory_utilization=0.8).lowering_options()
    assert "num_gpu_blocks" not in opts  # derived by the lowering, as the replay derives it
    assert (opts["hardware"], opts["model"], opts["gpu_memory_utilization"]) == \
        ("h200", "llama-3.1-8b", 0.8)
    with pytest.raises(KvsimInputError, match="hbm_gb"):
        SimConfig(hbm_gb=0.001).lowering_options()


def test_compare_profile_lowers_for_the_hbm_it_replays(tmp_path):
    """compare --profile --hbm-gb 4 lowers with a 1,907-block budget, so the replay into a
    1,907-block pool never holds more than that and never preempts."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    res = CliRunner().invoke(app, ["compare", "--profile", "deadline_pressure", "--requests",
                                   "12", "--hbm-gb", "4", "--policies", "lru",
                                   "--engine", "interpreted", "--json"])
    assert res.exit_code == 0, res.output
    row = {p["policy"]: p for p in json.loads(res.stdout)["policies"]}["lru"]
    assert row["hbm_capacity_blocks"] == 1_907
    assert row["preemptions"] == 0 and row["peak_hbm_blocks"] <= 1_907
    assert "scheduler budget 1,907 blocks" in " ".join(res.stderr.split())
