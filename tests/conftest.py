"""Shared fixtures.

``shared_traces`` points at ``../shared/traces`` (real public traces kept beside the repo,
never copied into it).  A user's fresh clone does not have that folder: tests that need it
skip with a clear reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:  # property tests draw the same examples on every run (a CI step never flakes on a new
    # draw); HYPOTHESIS_PROFILE=explore draws fresh ones, for a search by hand
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True, database=None)
    _hyp_settings.register_profile("explore", database=None)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # hypothesis is a test extra
    pass

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"

# The tests' child processes (``python -m kvsim``, the README's commands, scripts) import
# kvsim from this checkout too, as pytest and its workers do (pyproject.toml, ``pythonpath``),
# whatever their working directory: one copy of the code, so one set of numba's cache
# entries (keyed on each source file's path) for the whole run.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO_ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch):
    """Tables render at ``$COLUMNS`` (kvsim.cli.render): fix it at 120, the width the CLI
    uses when stdout is not a terminal, so a test's output does not depend on the terminal
    or the test runner (pytest-xdist workers inherit a width) of whoever runs it."""
    monkeypatch.setenv("COLUMNS", "120")


@pytest.fixture(autouse=True, scope="session")
def _cli_built_once():
    """typer's ``CliRunner.invoke(app, ...)`` builds the click command from ``app`` at every
    call (``typer.main.get_command``): every registered command's options from their
    annotations, ~0.1-0.15 CPU-s once a worker has imported every command's module, the most
    CPU of ``tests/test_bad_inputs.py`` (its 257 invocations: 37.6 of 49 s under cProfile).
    Here it is built once per app and set of registered commands; the root group still
    imports and builds a command's module the first time it is asked for
    (``kvsim.cli._LazyGroup``), as the ``kvsim`` command does.  typer's own module name for
    the builder it calls (``typer.testing._get_command``) is the one replaced, for the
    session only."""
    import typer.main
    import typer.testing

    built: dict = {}

    def get_command(app):
        key = (id(app), len(app.registered_commands), len(app.registered_groups))
        if key not in built:
            built[key] = typer.main.get_command(app)
        return built[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.testing, "_get_command", get_command)
        yield


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    path = SHARED / "traces"
    if not path.is_dir():
        pytest.skip(f"real traces not found at {path} (they live in ../shared/traces beside "
                    "the repository; a plain clone does not have them)")
    return path


@pytest.fixture(scope="session")
def shared_formats() -> Path:
    path = SHARED / "formats"
    if not path.is_dir():
        pytest.skip(f"reference formats not found at {path} (../shared/formats beside the "
                    "repository)")
    return path


#: Tests that take more than a few seconds on 2 cores (measured with `pytest --durations`,
#: docs/cli.md "Running the tests"), besides every test needing the real traces: marked
#: `slow` here, in one place, so the default `pytest` run stays under 5 minutes.  They run
#: as the second step of tests/run_suite.sh (`pytest -m slow`), never dropped.  Node ids
#: or their prefixes (a prefix marks every parametrisation).
SLOW_TESTS = (
    # compiled a second specialisation of the closed loop's `advance` (an engine with no
    # lower tier), 39.9 CPU-s of the default step's compiles in session 23's profile
    # (docs/benchmarks.md, "The default test step")
    "tests/test_reorder.py::test_study_interleaved_batch_exact",
    # a closed-loop run at 2 replicas (vLLM's scheduler), ~3-4 s on the shared machine
    "tests/safety/test_resources.py::test_the_closed_loops_shared_constants_do_not_outlive_the_run",
    "tests/cluster/test_quiet_cache_steps.py::test_cache_steps_change_no_output",  # the
    # interpreted twin, 4 runs (test_quiet_steps.py covers the fast path in the default step)
    "tests/sim/test_slots.py::test_pack_records_packs_live_records_as_numpys_gather",
    # ^ compiles bookkeeping.pack_records, which no default test's replay reaches
    "tests/safety/test_signals.py::test_signal_mid_run_one_line_no_partial_output",  # ~80 s each at load 19
    "tests/safety/test_signals.py::test_file_size_limit_is_named_under_ulimit_f",  # a fresh
    # interpreter: ~6 s at load 16
    "tests/ingest/test_vllm_kv_events.py::test_msgpack_recording_over_msgpacks_buffer_is_streamed",
    # ^ 101 MiB of msgpack written and read: ~11 s at load 16
    "tests/safety/test_compile_cache.py::test_bit_flipped_replay_core_one_warning_same_result",
    # ^ two compiles of the replay core
    "tests/sim/test_warm.py::test_warm_leaves_the_lowerings_scheduler_cached",  # warm() too
    "tests/sim/test_warm.py::test_warm_leaves_every_default_run_cached",  # a cold compile when
    # nothing before it filled the cache (~100 CPU-s), else ~30 s of replays and two runs
    "tests/safety/test_compile_cache.py::test_flip_in_a_file_whose_writer_died_one_warning_same_result",
    "tests/safety/test_compile_cache.py::test_unrecorded_files_are_never_loaded",
    # ^ three runs of the probe, 10-14 s each at load 15
    "tests/policies/test_belady_bound.py::test_belady_is_a_bound",  # hypothesis, 100s of runs
    "tests/sweep/test_plan.py::test_ray_executor_gives_identical_outputs_and_resumes",
    # ^ starts a local Ray instance (~60 s here) when ray is installed; skipped without it
    "tests/policies/test_vs_libcachesim.py::",  # the peer's own replays
    "tests/policies/test_deadline_wins.py::",  # a budget-matched lowering of 256 requests
    "tests/memory/test_block_life.py::test_life_of_a_cached_block[fast]",  # numba compiles
    "tests/memory/test_block_life.py::test_decode_block_becomes_full_then_shared[fast]",
    "tests/memory/test_cow_preempt.py::test_fork_diverge_prune[fast]",
    "tests/memory/test_cow_preempt.py::test_preemption_recompute_and_rerun_accounting[fast]",
    "tests/memory/test_order_plugin.py::test_golden_scenario_under_lifo_order",  # compiles
    "tests/sweep/test_report.py::",  # matplotlib figures of a sweep, Chromium
    "tests/sim/test_report_compare.py::",  # matplotlib figures of a compare, Chromium
    "tests/backends/test_cpu_backend.py::test_import_and_cpu_use_import_nothing_cuda_and_"
    "detect_never_raises",  # fresh interpreters
    "tests/sweep/test_cli.py::test_sweep_cli_resumes_from_cache_and_report_cli",
    "tests/test_events_roundtrip.py::test_jsonl_parquet_round_trip_is_identity",  # hypothesis
    "tests/test_bad_inputs.py::test_real_subprocess",  # a fresh interpreter per bad file
    # session 16: the default step reached 310 s alone on 2 cores (limit 300 s)
    "tests/test_bad_inputs.py::test_cli_case[simulate_dropped_requests_warn]",  # ~20-60 s
    "tests/test_bad_inputs.py::test_cli_case[mooncake_not_prefix_tree_warns]",  # ~15-45 s
    # session 19: the second of two compare rows replaying lru before a policy fails (~3 s)
    "tests/test_bad_inputs.py::test_cli_case[compare_failed_policy_keeps_other_logs]",
    "tests/cluster/test_pd.py::test_infinite_link_decode_steps_are_the_aggregated_decode_"
    "steps_shifted",  # ~15-45 s, both engines
    "tests/policies/test_contract.py::TestContract_s3fifo::test_legal_sequences_and_"
    "determinism",  # ~25-70 s
    "tests/sim/test_reference_diff.py::test_replay_matches_reference[deadline]",  # ~30-85 s
    "tests/policies/test_contract.py::TestContract_deadline::test_legal_sequences_and_"
    "determinism",  # ~15-45 s
    "tests/policies/test_contract.py::TestContract_quota_lru::test_legal_sequences_and_"
    "determinism",  # ~15-45 s
    # session 17: allocate_slots compiled for a call from Python (~70 s loaded)
    "tests/engine/test_vllm_slots_shortcut.py::",
    # session 18 (memreq6): a fresh interpreter serving 3 replicas (~5 s at load 19)
    "tests/cluster/test_request_side.py::test_closed_loop_json_run_imports_no_pandas[3-"
    "replicas]",
    # session 18 (route6): the interpreted engine yielding after every step (22 s idle)
    "tests/cluster/test_closed_speed.py::test_advance_keeps_its_arguments_across_yields",
    # session 19 (arrive7): a compiled closed loop yielding after every step (its
    # first run in a worker compiles or loads advance and core.run)
    "tests/cluster/test_arrival_crossings.py::test_advance_unboxes_core_run_once_not_per_"
    "call",
    # session 19 (arrive7): 5 routers x 2 interpreted 3-replica runs (~7 s loaded)
    "tests/cluster/test_arrival_crossings.py::test_arrival_loop_reads_replica_state_only_"
    "after_it_changes",
    # session 19 (slots7): kvsim's scheduler compiled for the interpreted closed loop
    "tests/cluster/test_closed_slots.py::test_recycled_rows_give_the_same_requests[kvsim]",
    # session 20 (engref8): compiled closed loops (their first run compiles or loads
    # advance and core.run, the EngineRef and RouteRef constructors)
    "tests/cluster/test_engine_ref.py::",
    # session 21 (ci9): vLLM's prefix-cache resets in the closed loop.  A resets table in
    # vs[VS_RESETS] (None without resets, which numba prunes) is a specialisation of the
    # closed loop's advance / vllm_rows that only these tests compile: 20.3 of the default
    # step's ~546 CPU-s from an empty cache (docs/benchmarks.md, session 21, ci9)
    "tests/engine/test_vllm_closed.py::test_closed_loop_agrees_with_vllm_every_step[reset]",
    "tests/engine/test_vllm_closed.py::test_reset_recording_replays_every_reset",
    "tests/engine/test_vllm_closed.py::test_a_reset_while_idle_empties_the_replays_cache[resets1-0]",
    "tests/engine/test_vllm_closed.py::test_a_reset_while_idle_empties_the_replays_cache[resets2-48]",
    # session 21 (ci9): vLLM's native CPU offloading in the closed loop, likewise a
    # specialisation of advance only this test compiles in the default step (17.6 CPU-s)
    "tests/engine/test_vllm_offload.py::test_vllm_offload_equals_vllm_every_step",
    # session 26: the quiet steps under vLLM's CPU offloading, the same specialisation of
    # advance (now with the quiet steps in it: 27.1 CPU-s in the default step's cold profile)
    "tests/engine/test_vllm_offload.py::test_quiet_steps_under_vllms_cpu_offloading_change_no_output",
    # session 27: the default step's cold profile (CPU of the test, its compiles, its
    # children; 10:47-10:55 UTC, in-tree, empty caches) -- compiles no other default test needs
    # vLLM's CPU offloading's victim pass compiled for a call from Python: 10.3 of 10.4 CPU-s
    "tests/engine/test_vllm_offload.py::test_victims_in_one_pass_are_the_rescans_victims",
    # eight fresh interpreters, each at its own NUMBA_OPT / vectorizer setting: 11.0 CPU-s
    "tests/sim/test_engine_choice.py::test_cache_never_mixes_numba_optimisation_settings",
    # a cold compile and a rerun in fresh interpreters per damage (~5 CPU-s each); the
    # bit-flipped .nbc stays in the default step
    "tests/safety/test_compile_cache.py::test_damaged_cache_one_warning_same_result[truncated_nbi]",
    "tests/safety/test_compile_cache.py::test_damaged_cache_one_warning_same_result[empty_nbi]",
    "tests/safety/test_compile_cache.py::test_damaged_cache_one_warning_same_result[garbage_nbc]",
)


def pytest_collection_modifyitems(config, items) -> None:
    """Mark `slow`: the tests of :data:`SLOW_TESTS` and every test needing the real traces
    (marker `traces` or fixture `shared_traces`)."""
    slow = pytest.mark.slow
    for item in items:
        nodeid = item.nodeid.replace("\\", "/")
        if (item.get_closest_marker("traces") is not None
                or "shared_traces" in getattr(item, "fixturenames", ())
                or any(nodeid == s or (s.endswith("::") and nodeid.startswith(s))
                       or nodeid.startswith(s + "[") for s in SLOW_TESTS)):
            item.add_marker(slow)
