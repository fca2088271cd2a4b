"""``--scheduler auto`` (the default of the CLI and of EngineOptions): the closed loop runs
vLLM 0.33's scheduler (kvsim.engine.vllm_rows) unless the run needs what it does not model
(n > 1, beams, --preemption swap); then kvsim's scheduler, said once on
stderr as a note; ``summary["scheduler"]`` says which ran.  An explicit ``--scheduler vllm``
with such a run is a one-line error (exit 2).  The default tests fail on a main where the
default was kvsim."""

from __future__ import annotations

import json

import pytest

from kvsim.core.errors import KvsimInputError


def _table(**extra):
    from kvsim.ingest.requests import build_request_table

    cols = {"arrival_us": [0, 10], "prompt_tokens": [32, 32], "output_tokens": [4, 4],
            "block_ids": [[1, 2], [1, 2]], "hashed_tokens": [32, 32]}
    cols.update(extra)
    return build_request_table(cols, block_size_tokens=16)


def _serve(table, scheduler=None, preemption="recompute"):
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig

    opts = EngineOptions() if scheduler is None else EngineOptions(scheduler=scheduler)
    return serve(table, "lru", SimConfig(mode="engine", hbm_blocks=64, preemption=preemption),
                 engine=opts).summary


def test_default_is_auto_and_picks_vllm():
    from kvsim.modes.closed.closed_loop import EngineOptions

    assert EngineOptions().scheduler == "auto"
    assert _serve(_table())["scheduler"] == "vllm"
    assert _serve(_table(), "kvsim")["scheduler"] == "kvsim"


@pytest.mark.parametrize("col,value,what", [("n", [1, 2], "n > 1"),
                                            ("beam_width", [1, 4], "beam search")])
def test_auto_falls_back_on_unmodelled_features(col, value, what):
    from kvsim.modes.closed.closed_loop import EngineOptions, resolve_scheduler
    from kvsim.spec.sim_config import SimConfig

    table = _table(**{col: value})
    opts, why = resolve_scheduler(table, SimConfig(mode="engine"), EngineOptions())
    assert opts.scheduler == "kvsim" and what in why
    assert _serve(table)["scheduler"] == "kvsim"
    with pytest.raises(KvsimInputError, match=f"--scheduler vllm does not model {what}"):
        _serve(table, "vllm")


def test_swap_preemption_falls_back_or_is_refused():
    """vLLM 0.33 only recomputes: auto with --preemption swap runs kvsim's scheduler (the
    swap costs are then charged by the scheduler that swaps); vllm with it is refused."""
    assert _serve(_table(), preemption="swap")["scheduler"] == "kvsim"
    with pytest.raises(KvsimInputError, match="--preemption swap"):
        _serve(_table(), "vllm", preemption="swap")


def _cli(*args):
    from typer.testing import CliRunner

    from kvsim.cli import app
    return CliRunner().invoke(app, list(args))


def test_cli_default_runs_vllm_without_a_note():
    res = _cli("simulate", "--profile", "deadline_pressure", "--requests", "8", "--hbm-gb",
               "8", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policies"][0]["scheduler"] == "vllm"
    assert "scheduler vllm" in " ".join(res.stderr.split()) and "note: --scheduler auto" not in res.stderr


@pytest.mark.parametrize("profile,what", [("beam_search", "beam search")])
def test_cli_auto_falls_back_with_one_note(profile, what):
    res = _cli("simulate", "--profile", profile, "--requests", "8", "--hbm-gb", "8",
               "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policies"][0]["scheduler"] == "kvsim"
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("note: --scheduler")]
    assert len(notes) == 1 and what in notes[0] and "kvsim's scheduler" in notes[0]


def test_cli_speculative_profile_runs_vllm_without_a_note():
    """Speculative drafts are modelled by vLLM's scheduler now (kvsim.engine.vllm_spec):
    auto no longer falls back for them."""
    res = _cli("simulate", "--profile", "speculative_decode", "--requests", "8", "--hbm-gb",
               "8", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["policies"][0]["scheduler"] == "vllm"
    assert "note: --scheduler auto" not in res.stderr  # (the header is a note too)


@pytest.mark.parametrize("args,what", [
    (("--profile", "beam_search"), "beam search"),
    (("--profile", "deadline_pressure", "--preemption", "swap"), "--preemption swap")])
def test_cli_explicit_vllm_with_unmodelled_feature_is_one_line(args, what):
    res = _cli("compare", *args, "--requests", "8", "--hbm-gb", "8", "--scheduler", "vllm",
               "--policies", "lru")
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and what in err and "--scheduler" in err
    assert res.stdout == ""


def test_last_full_output_block_is_cached_at_finish():
    """Turn 1: 32 prompt + 17 output tokens, so 48 computed tokens fill 3 blocks exactly at
    finish; turn 2's prompt holds them.  vLLM caches block 3 in the step that computes it, so
    turn 2 hits 48 tokens: vLLM's scheduler assumes 48, the replay finds 32 (16 lost hit
    tokens; kvsim's scheduler saves 32).  With 18 output tokens block 4 is appended and
    block 3 cached: 48 saved by both, none lost.  This was the README job's 128 lost hit
    tokens under lru (8 such blocks).  Fixed in the replay's release path
    (kvsim.replay.kernel.placement._fill_at_finish): fails before it."""
    t = _table(prompt_tokens=[32, 64], output_tokens=[17, 4],
               block_ids=[[1, 2, 3, 4], [1, 2, 3, 4]], hashed_tokens=[48, 64],
               arrival_us=[0, 5_000_000])
    for sched in ("vllm", "kvsim"):
        s = _serve(t, sched)
        assert (s["lost_hit_tokens"], s["prefill_tokens_saved"]) == (0, 48), sched


def test_last_block_one_token_short_at_finish_stays_uncached():
    """The guard of the fix above: 32 prompt + 16 output tokens compute 47 tokens (the last
    output token is sampled, never computed), so block 3 holds 15 of 16 at finish and vLLM
    never caches it, although the trace knows its full content (hashed_tokens 48): turn 2
    hits 32 tokens under both schedulers, none lost."""
    t = _table(prompt_tokens=[32, 64], output_tokens=[16, 4],
               block_ids=[[1, 2, 3, 4], [1, 2, 3, 4]], hashed_tokens=[48, 64],
               arrival_us=[0, 5_000_000])
    for sched in ("vllm", "kvsim"):
        s = _serve(t, sched)
        assert (s["lost_hit_tokens"], s["prefill_tokens_saved"]) == (0, 32), sched
