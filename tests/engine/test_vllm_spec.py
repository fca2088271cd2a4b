"""Speculative decoding in vLLM 0.33's scheduler step (kvsim.engine.vllm_step with
kvsim.engine.vllm_spec): draft tokens are scheduled tokens (they take the token budget),
their KV takes blocks (and the drafter's lookahead slots when it has them), accepted drafts
advance the output by more than one token a step, rejected ones roll back
num_computed_tokens (their blocks stay, as in vLLM).  Exact cases by hand, the compiled
step against its plain-Python witness, and the closed loop's ``--scheduler auto`` staying
on vLLM's scheduler with drafts.  Every test here fails on the main before this change
(the step had no drafts; auto fell back to kvsim's scheduler).

The by-hand request: block size 4, 20 blocks (block 0 is vLLM's null block: 19 free), a
prompt of 8 tokens, 9 output tokens, k = 2 drafts.  The prefill step computes the 8
prompt tokens (2 blocks) and samples token 1; then k drafts are proposed.  Each decode
step schedules 1 + k = 3 tokens:

* acceptance 1.0, n-gram (no lookahead): after the prefill ``num_computed`` is 8; the step
  needs 8 + 3 = 11 slots (3 blocks), accepts both drafts (output 4); then 14 (4 blocks,
  output 7), 17 (5 blocks, output 9: finished).  Decode steps: ceil((9 - 1) / 3) = 3, so 4
  steps in all.  Free blocks after each schedule(): 17, 16, 15, 14.
* acceptance 0: each step computes 3 tokens, keeps 1 (num_computed rolls back by 2): needs
  8+3, 9+3, 10+3, ... slots; 1 prefill + 8 decode steps = 9 = the output length.
* acceptance 1.0 with lookahead (EAGLE / MTP / a draft model: k more slots reserved): the
  prefill needs 8 + 2 = 10 slots (3 blocks), then 13, 16, 19 (4, 4, 5 blocks): free after
  each schedule() 16, 15, 15, 14.
"""

from __future__ import annotations

import pytest

from kvsim.engine.vllm_compiled import CompiledVllmScheduler
from kvsim.engine.vllm_scheduler import EngineConfig, SimRequest, VllmScheduler


def _request(idx=0, plen=8, olen=9, base=0):
    return SimRequest(idx=idx, request_id=f"r{idx}", prompt_len=plen, output_len=olen,
                      all_tokens=list(range(base, base + plen + olen)))


def _cfg(k=2, p=1.0, look=False, **kw):
    base = dict(block_size=4, num_gpu_blocks=20, max_num_seqs=4, max_num_batched_tokens=64)
    base.update(kw)
    return EngineConfig(num_speculative_tokens=k, spec_acceptance_rate=p,
                        spec_lookahead=look, spec_seed=7, **base)


def _run(cfg, make):
    """Both ports, every step equal; the compiled step's results."""
    py = VllmScheduler(cfg, pool="reference", max_seqs=8)
    comp = CompiledVllmScheduler(cfg, make())
    reqs = make()
    for r in reqs:
        py.add_request(r)
        comp.add_request(r.idx)
    out = []
    while comp.has_requests():
        a, b = py.step(), comp.step()
        assert a == b, f"step {len(out)}"
        assert py.num_free_blocks() == comp.num_free_blocks()
        out.append(b)
        assert len(out) < 100
    assert not py.has_requests()
    return out


@pytest.mark.parametrize("p, look, sched, free_sched, steps", [
    (1.0, False, [8, 3, 3, 3], [17, 16, 15, 14], 4),
    (0.0, False, [8] + [3] * 8, [17, 16, 16, 15, 15, 15, 15, 14, 14], 9),
    (1.0, True, [8, 3, 3, 3], [16, 15, 15, 14], 4),
])
def test_draft_kv_and_tokens_by_hand(p, look, sched, free_sched, steps):
    res = _run(_cfg(p=p, look=look), lambda: [_request()])
    assert len(res) == steps
    assert [s.sched for s in res] == [[(0, n)] for n in sched]
    assert [s.free_sched for s in res] == free_sched
    assert res[-1].finished == [0] and res[-1].free_blocks == 19


def test_finishes_in_ceil_steps_with_full_acceptance_and_out_steps_with_none():
    """out = 13, k = 3: acceptance 1.0 takes 1 prefill + ceil(12 / 4) = 3 decode steps;
    acceptance 0 takes 13 steps, as without drafts."""
    for p, want in ((1.0, 4), (0.0, 13)):
        assert len(_run(_cfg(k=3, p=p), lambda: [_request(olen=13)])) == want
    assert len(_run(_cfg(k=0), lambda: [_request(olen=13)])) == 13


def test_drafts_take_the_token_budget():
    """Two 2-token prompts, k = 3, 6 tokens a step: step 1 gives request 0 its 1 + 3
    tokens and request 1 the 2 left (1 + 1 draft).  With full acceptance request 0 then
    has 1 + 4 = 5 output tokens, request 1 1 + 2 = 3."""
    cfg = _cfg(k=3, p=1.0, max_num_batched_tokens=6)
    py = VllmScheduler(cfg, pool="reference", max_seqs=8)
    reqs = [_request(0, plen=2, olen=20), _request(1, plen=2, olen=20, base=100)]
    for r in reqs:
        py.add_request(r)
    assert py.step().sched == [(0, 2), (1, 2)]
    assert py.step().sched == [(0, 4), (1, 2)]
    assert (reqs[0].num_output, reqs[1].num_output) == (5, 3)
    comp = CompiledVllmScheduler(cfg, [_request(0, plen=2, olen=20),
                                       _request(1, plen=2, olen=20, base=100)])
    comp.add_request(0)
    comp.add_request(1)
    assert comp.step().sched == [(0, 2), (1, 2)]
    assert comp.step().sched == [(0, 4), (1, 2)]


def test_acceptance_is_kvsims_scheduler_draw():
    """The accepted prefix is drawn as kvsim's own scheduler draws it (same seed, request,
    tokens so far, draft index), and the plain-Python draw agrees."""
    from kvsim.engine.scheduler_blocks import _uniform
    from kvsim.engine.vllm_spec import acceptance_units, accepted_drafts, py_uniform_m

    for p in (0.0, 0.3, 0.7, 1.0):
        units = int(acceptance_units(p))
        for i in range(5):
            for gen in range(6):
                want = 0
                while want < 4 and _uniform(11, i, gen, want) < p:
                    want += 1
                assert accepted_drafts(11, i, gen, 4, units) == want
                m = 0
                while m < 4 and py_uniform_m(11, i, gen, m) < units:
                    m += 1
                assert m == want


@pytest.mark.parametrize("p", [0.0, 0.4, 0.8, 1.0])
@pytest.mark.parametrize("look", [False, True])
def test_compiled_equals_python_with_drafts_under_pressure(p, look):
    """Six requests sharing a prefix in a 14-block pool: preemptions, prefix hits and
    drafts together; the two ports agree on every step."""
    cfg = _cfg(k=3, p=p, look=look, num_gpu_blocks=14, max_num_batched_tokens=16)

    def make():
        return [SimRequest(idx=i, request_id=f"r{i}", prompt_len=10, output_len=7 + i,
                           all_tokens=[1] * 8 + list(range(10 * i, 10 * i + 9 + i)))
                for i in range(6)]
    res = _run(cfg, make)
    assert sum(len(s.finished) for s in res) == 6


def _table(k, p, out=9):
    from kvsim.ingest.requests import build_request_table

    return build_request_table({
        "arrival_us": [0], "prompt_tokens": [32], "output_tokens": [out],
        "block_ids": [[1, 2]], "hashed_tokens": [32], "spec_draft_tokens": [k],
        "spec_accept_prob": [p]}, block_size_tokens=16)


def _serve(table, **opts):
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    return serve(table, "lru", SimConfig(mode="engine", hbm_blocks=64, engine="interpreted"),
                 engine=EngineOptions(timing="roofline", **opts))


def test_closed_loop_auto_stays_on_vllm_with_drafts():
    """``--scheduler auto`` with drafts runs vLLM's scheduler (it fell back to kvsim's);
    acceptance 1.0 finishes 9 tokens in 1 + ceil(8 / 3) = 4 steps, acceptance 0 in 9; a
    decode step charges 1 + k tokens on the step clock."""
    from kvsim.modes.closed.closed_loop import EngineOptions, resolve_scheduler
    from kvsim.spec.sim_config import SimConfig

    opts, why = resolve_scheduler(_table(2, 1.0), SimConfig(mode="engine"), EngineOptions())
    assert opts.scheduler == "vllm" and why is None
    full, none = _serve(_table(2, 1.0)), _serve(_table(2, 0.0))
    assert full.summary["scheduler"] == none.summary["scheduler"] == "vllm"
    assert (full.summary["steps"], none.summary["steps"]) == (4, 9)
    base = _serve(_table(0, 0.0))
    assert base.summary["steps"] == 9
    # the same 9 steps, but each decode step verifies 3 tokens: a longer run
    assert none.summary["makespan_us"] > base.summary["makespan_us"]


def test_lookahead_slots_in_the_closed_loop_and_cli():
    """EngineOptions(spec_lookahead=True) / --spec-lookahead: the drafter's k slots are
    reserved too, so the pools hold more blocks at their peak (32-token prompt, 9 output
    tokens, k = 8, acceptance 1, 16-token blocks: the prefill then the one decode step need
    32 and 41 slots = 3 blocks at the peak; with lookahead 40 and 49 = 4 blocks)."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    plain = _serve(_table(8, 1.0))
    look = _serve(_table(8, 1.0), spec_lookahead=True)
    assert look.summary["scheduler"] == "vllm"
    assert look.summary["steps"] == plain.summary["steps"] == 2
    assert (plain.summary["peak_hbm_blocks"], look.summary["peak_hbm_blocks"]) == (3, 4)
    res = CliRunner().invoke(app, ["simulate", "--profile", "speculative_decode",
                                   "--requests", "4", "--hbm-gb", "8", "--spec-lookahead",
                                   "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policies"][0]["scheduler"] == "vllm"
