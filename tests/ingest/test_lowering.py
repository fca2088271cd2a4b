"""Lowering: exact event sequences for hand-derived cases, the roofline, block-size mapping,
intent rules, and the lowering rules of kvsim.core.schema checked on every row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.core.schema import EventKind as K
from kvsim.core.schema import Phase, Priority
from kvsim.engine.engine_model import build_cost_model
from kvsim.engine.lowering import import_request_trace, lower_requests
from kvsim.events import read_events
from kvsim.ingest import build_request_table

DATA = Path(__file__).parent / "data"
B = 16


def table(**cols):
    n = len(cols["prompt_tokens"])
    cols.setdefault("arrival_us", [0] * n)
    cols.setdefault("output_tokens", [1] * n)
    return build_request_table(cols, block_size_tokens=16)


def lower(tmp_path, t, name="ev.parquet", **kw) -> tuple[object, pd.DataFrame]:
    s = lower_requests(t, tmp_path / name, **kw)
    _, df = read_events(tmp_path / name)
    check_rules(df)
    return s, df


def check_rules(df: pd.DataFrame) -> None:
    """Schema lowering rules 1-3 and the per-step order, on every request."""
    assert (np.diff(df.step.to_numpy()) >= 0).all()
    steps = df[df.kind == K.STEP]
    assert (steps.num_tokens >= 0).all() and (steps.duration_us > 0).all()
    for rid, g in df[df.kind != K.STEP].groupby("request_id", sort=False):
        kinds = g.kind.tolist()
        assert kinds[0] == K.ARRIVE, rid
        assert kinds[-1] == K.FREE and g.block_index.iloc[-1] == -1, rid
        assert kinds.count(K.ARRIVE) == 1 and (g.kind == K.FREE).sum() >= 1
        alloc = g[g.kind == K.ALLOCATE]
        acc = g[g.kind == K.ACCESS]
        if len(alloc) and not (g.kind == K.FORK).any():
            # prompt blocks all allocated in the admission step, before the first ACCESS
            first_access = acc.index[0]
            pre = alloc[alloc.phase == Phase.PREFILL]
            assert (pre.index < first_access).all() and pre.step.nunique() == 1
            assert pre.block_index.tolist() == list(range(len(pre)))
            prefill = acc[acc.phase == Phase.PREFILL].num_tokens.sum()
            assert prefill == pre.num_tokens.sum()  # every prompt token computed once


def test_single_request_exact(tmp_path):
    t = table(prompt_tokens=[40], output_tokens=[3])
    s, df = lower(tmp_path, t, timing="roofline")  # the roofline's formula, hand-derived
    rows = [(int(r.step), K(r.kind).name, int(r.block_index), int(r.num_tokens))
            for r in df.itertuples()]
    assert rows == [
        (0, "STEP", -1, 40), (0, "ARRIVE", -1, 40), (0, "ALLOCATE", 0, 16),
        (0, "ALLOCATE", 1, 16), (0, "ALLOCATE", 2, 8), (0, "ACCESS", -1, 40),
        (1, "STEP", -1, 1), (1, "INTENT", -1, 0), (1, "ACCESS", -1, 1),
        (2, "STEP", -1, 1), (2, "ACCESS", -1, 1), (2, "INTENT", -1, 0), (2, "FREE", -1, 0)]
    cost = build_cost_model("llama-3-8b", "h100-sxm", timing="roofline")
    assert s.timing_model == "roofline"
    d0 = cost.step_us(40, 40 * 41 / 2, 40)
    d1 = cost.step_us(1, 41, 41)  # decode at position 40 attends 41 positions
    steps = df[df.kind == K.STEP]
    assert steps.duration_us.tolist() == pytest.approx([d0, d1, cost.step_us(1, 42, 42)])
    assert steps.time_us.tolist() == [0, int(d0), int(d0 + d1)]
    assert s.num_requests == 1 and s.num_steps == 3 and s.total_output_tokens == 3
    fin = df[(df.kind == K.INTENT)].iloc[-1]
    assert fin.phase == Phase.DONE and fin.priority == Priority.COLD  # one-shot request
    # recompute cost of block 1 = prefill of 16 tokens at positions 16..31
    assert df[df.kind == K.ALLOCATE].recompute_cost_us.iloc[1] == pytest.approx(
        cost.prefill_us(16, 16))
    assert (df[df.block_index >= 0].size_bytes == cost.kv_bytes_per_token * B).all()


def test_decode_block_allocated_in_the_step_its_token_starts(tmp_path):
    _, df = lower(tmp_path, table(prompt_tokens=[40], output_tokens=[20]))
    alloc = df[(df.kind == K.ALLOCATE) & (df.phase == Phase.DECODE)]
    # decode step k feeds position 40 + k - 1; position 48 starts block 3 at step 9
    assert alloc[["step", "block_index", "num_tokens"]].values.tolist() == [[9, 3, 1]]


def test_chunked_prefill(tmp_path):
    _, df = lower(tmp_path, table(prompt_tokens=[20000], output_tokens=[1]))
    acc = df[df.kind == K.ACCESS]
    assert acc.num_tokens.tolist() == [8192, 8192, 3616] and acc.step.tolist() == [0, 1, 2]
    alloc = df[df.kind == K.ALLOCATE]
    assert len(alloc) == 1250 and set(alloc.step) == {0}


def test_max_num_seqs_and_fifo(tmp_path):
    _, df = lower(tmp_path, table(prompt_tokens=[32, 32], output_tokens=[2, 2]),
                  max_num_seqs=1)
    arrive = df[df.kind == K.ARRIVE]
    assert arrive.step.tolist() == [0, 0]
    first_alloc = df[df.kind == K.ALLOCATE].groupby("request_id").step.min().tolist()
    assert first_alloc == [0, 2]  # request 1 admitted once request 0 finished (step 1)


def test_idle_clock_jumps_to_next_arrival(tmp_path):
    _, df = lower(tmp_path, table(prompt_tokens=[16, 16], output_tokens=[1, 1],
                                  arrival_us=[0, 10_000_000]))
    steps = df[df.kind == K.STEP]
    assert steps.time_us.tolist()[-1] == 10_000_000 and len(steps) == 2


def test_parallel_samples_fork_copy_on_write(tmp_path):
    s, df = lower(tmp_path, table(prompt_tokens=[20], output_tokens=[3], n=[2]))
    fork = df[df.kind == K.FORK]
    assert fork[["step", "request_id", "parent_request_id"]].values.tolist() == [[1, 1, 0]]
    child_arrive = df[(df.kind == K.ARRIVE) & (df.request_id == 1)]
    assert child_arrive.step.tolist() == [1] and child_arrive.num_tokens.tolist() == [0]
    assert sorted(df[df.kind == K.FREE].request_id.tolist()) == [0, 1]
    assert s.num_forks == 1
    # prompt 20 = blocks 0 (16) and 1 (4 tokens, shared after the fork): each sequence's
    # first write lands in block 1, so each names it again (the replay copies on write)
    step1 = df[(df.step == 1) & (df.kind != K.STEP)]
    assert [(K(k).name, int(r), int(b)) for k, r, b in
            step1[["kind", "request_id", "block_index"]].values] == [
        ("ARRIVE", 1, -1), ("INTENT", 0, -1), ("ALLOCATE", 0, 1), ("ACCESS", 0, -1),
        ("FORK", 1, -1), ("INTENT", 1, -1), ("ALLOCATE", 1, 1), ("ACCESS", 1, -1)]
    assert (df[(df.kind == K.ALLOCATE) & (df.step > 1)].empty)  # later writes: private copies


def test_beam_search_prunes_and_reforks(tmp_path):
    s, df = lower(tmp_path, table(prompt_tokens=[20], output_tokens=[20], beam_width=[3]))
    # 2 forks at the first decode step, then one prune + refork every 8 decode steps
    # (decode steps 8 and 16 of 19): 4 forks in all
    assert s.num_forks == 4
    frees = df[(df.kind == K.FREE) & (df.block_index == -1)]
    assert len(frees) == 1 + 4  # every sequence released exactly once


def test_speculative_reject_frees_draft_blocks(tmp_path):
    _, df = lower(tmp_path, table(prompt_tokens=[14], output_tokens=[3],
                                  spec_draft_tokens=[3], spec_accept_prob=[0.0]))
    rows = [(int(r.step), K(r.kind).name, int(r.block_index), Phase(r.phase).name,
             int(r.num_tokens)) for r in df.itertuples() if r.kind != K.STEP]
    assert rows[3:] == [
        (1, "INTENT", -1, "DECODE", 0), (1, "ALLOCATE", 1, "DRAFT", 2),
        (1, "ACCESS", -1, "VERIFY", 4), (1, "FREE", 1, "ROLLBACK", 0),
        (2, "ALLOCATE", 1, "DRAFT", 3), (2, "ACCESS", -1, "VERIFY", 4),
        (2, "FREE", 1, "ROLLBACK", 0), (2, "INTENT", -1, "DONE", 0), (2, "FREE", -1, "DONE", 0)]


def test_speculative_accept_commits(tmp_path):
    _, df = lower(tmp_path, table(prompt_tokens=[14], output_tokens=[3],
                                  spec_draft_tokens=[3], spec_accept_prob=[1.0]))
    commits = df[df.kind == K.COMMIT]
    assert commits[["step", "block_index"]].values.tolist() == [[1, 1]]
    assert (df.kind == K.ACCESS).sum() == 2  # prefill + one verify step makes 4 tokens


def test_single_request_measured_by_default(tmp_path):
    """The default timing (auto) on a bundled pair: the measured tables' step times, as
    MeasuredStepTime gives them (prefill of 40 tokens, then decodes at KV 41 and 42)."""
    from kvsim.engine.timing.measured import MeasuredStepTime

    s, df = lower(tmp_path, table(prompt_tokens=[40], output_tokens=[3]))
    assert s.timing_model == "measured:aiconfigurator-0.12.0/vllm-0.24.0"
    assert s.timing_profile == "h100-sxm__llama-3.1-8b__tp1"
    m = MeasuredStepTime.bundled("h100-sxm", "llama-3.1-8b", 1)
    want = [1000 * m.step_ms([(40, 0)]), 1000 * m.step_ms((), [41]), 1000 * m.step_ms((), [42])]
    steps = df[df.kind == K.STEP]
    assert steps.duration_us.tolist() == pytest.approx(want, rel=1e-9)


def test_intent_rules(tmp_path):
    t = table(prompt_tokens=[40, 40], output_tokens=[2, 2], request_priority=[90, 50],
              ttft_deadline_us=[1_000_000, -1], session_continues=[True, False],
              next_turn_gap_us=[5_000_000, -1], shared_prefix_tokens=[0, 32])
    _, df = lower(tmp_path, t)
    r0, r1 = df[df.request_id == 0], df[df.request_id == 1]
    dec0 = r0[(r0.kind == K.INTENT) & (r0.phase == Phase.DECODE)].iloc[0]
    assert dec0.priority == Priority.DECODE_CRITICAL and bool(dec0.pin_requested)
    dec1 = r1[(r1.kind == K.INTENT) & (r1.phase == Phase.DECODE)].iloc[0]
    assert dec1.priority == Priority.WARM and not bool(dec1.pin_requested)
    assert r0[r0.kind == K.ARRIVE].deadline_us.iloc[0] == 1_000_000
    # post-finish: the continuing session's blocks are IDLE/HOT until next turn + TTFT
    idle = r0[(r0.kind == K.INTENT) & (r0.phase == Phase.IDLE)].iloc[0]
    d = df[df.kind == K.STEP].duration_us.tolist()
    end_us = int(d[0] + d[1])  # the engine clock: a float sum of step times
    assert idle.priority == Priority.HOT
    assert idle.deadline_us == end_us + 5_000_000 + 1_000_000
    # the one-shot request: DONE/COLD, but its shared system-prompt blocks stay HOT
    assert r1[r1.kind == K.ALLOCATE].priority.tolist() == [Priority.HOT, Priority.HOT,
                                                             Priority.WARM]
    tail = r1[r1.kind == K.INTENT].iloc[-3:]
    assert [(int(a), int(b), int(c)) for a, b, c in
            tail[["block_index", "phase", "priority"]].values] == [
        (-1, Phase.DONE, Priority.COLD), (0, Phase.IDLE, Priority.HOT),
        (1, Phase.IDLE, Priority.HOT)]


def test_mooncake_block_size_mapping(tmp_path):
    s512 = import_request_trace(DATA / "mooncake_small.jsonl", tmp_path / "a.parquet",
                                block_size_tokens=512)
    assert s512.prompt_blocks == 8 and s512.hashed_prompt_blocks == 8
    assert s512.prefix_reuse_fraction == pytest.approx(3 / 8)
    s256 = import_request_trace(DATA / "mooncake_small.jsonl", tmp_path / "b.parquet",
                                block_size_tokens=256)
    # 4 + 6 + 3 + 2 blocks; request 1 re-uses request 0's 4, request 2 its first 2
    assert s256.prompt_blocks == 15 and s256.prefix_reuse_fraction == pytest.approx(6 / 15)
    _, df = read_events(tmp_path / "b.parquet")
    a = df[df.kind == K.ALLOCATE]
    r1 = a[a.request_id == 1]
    assert r1.num_tokens.tolist() == [256] * 5 + [20]  # partial last block, still hashed
    assert (r1.content_hash != 0).all()


def test_agentic_partial_tail_unhashed(tmp_path):
    import_request_trace(DATA / "agentic_small", tmp_path / "g.parquet", block_size_tokens=64)
    _, df = read_events(tmp_path / "g.parquet")
    a = df[(df.kind == K.ALLOCATE) & (df.request_id == 0)]  # in 200: 3 full ids + 8 tokens
    assert a.num_tokens.tolist() == [64, 64, 64, 8]
    assert (a.content_hash.to_numpy() != 0).tolist() == [True, True, True, False]


def test_jsonl_and_parquet_hold_the_same_events(tmp_path):
    t = table(prompt_tokens=[40, 70], output_tokens=[5, 3], n=[1, 2])
    lower_requests(t, tmp_path / "e.parquet")
    lower_requests(t, tmp_path / "e.jsonl")
    _, a = read_events(tmp_path / "e.parquet")
    _, b = read_events(tmp_path / "e.jsonl")
    pd.testing.assert_frame_equal(a, b)


def test_bad_engine_options(tmp_path):
    from kvsim.core.errors import KvsimInputError

    with pytest.raises(KvsimInputError):
        lower_requests(table(prompt_tokens=[4]), tmp_path / "x.parquet", model="no-such-model")
    with pytest.raises(KvsimInputError):
        lower_requests(table(prompt_tokens=[4]), tmp_path / "x.parquet", block_size_tokens=0)
    assert not (tmp_path / "x.parquet").exists()
