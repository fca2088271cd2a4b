"""Every registered policy in the tiered replay: capacity never exceeded, invariants hold,
deterministic, and Belady's offline bound is never beaten on HBM hit rate.

Runs on the interpreted engine (same source as the compiled core; no compile per policy,
so the suite stays within its time budget whatever the number of policies)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvsim.api import simulate
from kvsim.policy.registry import list_policies
from kvsim.spec.sim_config import SimConfig

_CONFTEST = Path(__file__).with_name("conftest.py")
_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest", _CONFTEST)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)

POLICIES = [p.name for p in list_policies()]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    return [_helpers.random_trace(_helpers.TraceBuilder, seed).write(d / f"r{seed}.parquet")
            for seed in (1, 2)]


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_contract(policy, traces, tiny_hw):
    config = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="interpreted",
                       check_invariants=True, tier_policies=(("dram", policy),))
    for trace in traces[:1]:
        a = simulate(trace, policy, config)
        b = simulate(trace, policy, config)
        assert a.summary == b.summary, "same inputs must give identical results"
        assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
        assert a.checks["pool_ok"], a.checks
        assert a.checks["peak_within_capacity"]
        assert a.checks["held_blocks"] == 0 and a.checks["running"] == 0  # all freed
        s = a.summary
        assert s["peak_hbm_blocks"] <= s["hbm_capacity_blocks"]
        assert s["peak_dram_blocks"] <= s["dram_capacity_blocks"]
        assert s["requests"] == 40 and s["overflow_blocks"] == 0
        assert s["evictions_hbm"] + s["spills_hbm"] > 0  # the trace does put pressure on


def test_belady_never_beaten_on_hbm_hit_rate(traces, tiny_hw):
    online = [p for p in POLICIES if p != "belady"]
    for trace in traces:
        config = SimConfig(hardware=tiny_hw, hbm_blocks=10, dram_gb=0,
                           engine="interpreted")
        bound = simulate(trace, "belady", config).summary["hbm_hit_rate"]
        for name in online:
            rate = simulate(trace, name, config).summary["hbm_hit_rate"]
            assert rate <= bound + 1e-12, (name, rate, bound)


def _policy_overloads() -> set:
    """(module, function, signature) of every compiled overload the policies' own modules'
    numba functions hold in this process (compiled or loaded from numba's disk cache)."""
    import sys

    from numba.core.dispatcher import Dispatcher

    return {(name, f, sig) for name, mod in list(sys.modules.items())
            if name.startswith("kvsim.policies.")
            for f, d in vars(mod).items() if isinstance(d, Dispatcher)
            for sig in d.overloads}


def test_the_interpreted_engine_compiles_none_of_a_policys_code(traces, tiny_hw):
    """The engine picked to compile nothing compiles nothing: a policy's hooks run as plain
    Python and so do the helpers they call (kvsim.jit.python_twin).  Before, deadline's
    ``_file`` / ``_expire``, s3fifo's sweeps, ... compiled for the types Python passes (~49
    CPU-s of the default test step from empty caches; a run of ``--policy deadline`` on a
    small trace compiled ~20 CPU-s of it)."""
    config = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="interpreted",
                       tier_policies=(("dram", "s3fifo"),))
    before = _policy_overloads()
    for name in POLICIES:
        simulate(traces[0], name, config)
    assert _policy_overloads() - before == set()


def test_the_interpreted_closed_loop_runs_vllms_scheduler_as_python(monkeypatch):
    """On the interpreted engine with vLLM's compiled step not compiled yet, the closed
    loop's step driver, vLLM's scheduler under it (``vllm_rows``, ``vllm_step``) and its
    pool value are plain Python: no module of that twin reads a compiled function by name,
    the pool is no structref, and the run gives the compiled engine's steps.  Before, the
    twin always called the compiled ``vllm_rows`` from Python, so a small first run with
    vLLM's scheduler (the default) compiled it: ~30 of its ~35 CPU-s (docs/simulate.md,
    "Engines").  Once ``vllm_rows`` is compiled (here: the compiled engine ran), the
    interpreted loop calls it again (``python_vllm``)."""
    from numba.core.dispatcher import Dispatcher
    from numba.experimental.structref import StructRefProxy

    from kvsim.engine.vllm_value import VS_POOL
    from kvsim.modes.closed import closed_loop
    from kvsim.replay import variants
    from tests.helpers import small_closed_engine

    tw = variants.closed_for(variants.interpreted(), True)
    rows = tw.vllm_rows.__globals__
    step = rows["V"]
    for name, space in (("closed_step", vars(tw)), ("vllm_rows", rows),
                        ("vllm_step", vars(step))):
        compiled = sorted(k for k, v in space.items() if isinstance(v, Dispatcher))
        assert compiled == [], (name, compiled)
    assert step.pool_ops is variants.interpreted().ops
    assert not isinstance(tw.CF.pool_members, Dispatcher)
    with monkeypatch.context() as m:  # as on a cold cache
        m.setattr(closed_loop, "python_vllm", lambda core: not variants.is_compiled(core))
        py = small_closed_engine("interpreted")
    jit = small_closed_engine("compiled")
    assert py.py_vllm and not isinstance(py.vs[VS_POOL], StructRefProxy)
    _same_steps(py, jit)
    again = small_closed_engine("interpreted")  # vllm_rows compiled in this process now
    assert not again.py_vllm and isinstance(again.vs[VS_POOL], StructRefProxy)


def _same_steps(py, jit) -> None:
    """Run both engines to the end: the same steps, scheduler state and counters."""
    import numpy as np

    for e in (py, jit):
        e.advance()
        e.finish()
    assert py.steps == jit.steps > 20
    np.testing.assert_array_equal(py.sched.st, jit.sched.st)
    np.testing.assert_array_equal(py.run.C, jit.run.C)


@pytest.mark.slow  # its compiled comparison compiles advance for kvsim's scheduler, which
# no default test compiles: ~22 CPU-s from empty caches
def test_the_interpreted_closed_loop_runs_kvsims_scheduler_as_python(monkeypatch):
    """As vLLM's above, for kvsim's own scheduler (``--scheduler kvsim``): while its compiled
    ``run_steps`` is not compiled yet, the interpreted step driver reads a twin of
    :mod:`kvsim.engine.scheduler` in which no function is compiled, and the run gives the
    compiled engine's steps.  Before, the twin called the compiled ``run_steps`` (and
    ``_ensure``) from Python: the first run of the README's 65-request sample with
    ``--scheduler kvsim`` compiled them, 26.8 CPU-s of its 27 (7.5 after; docs/simulate.md,
    "Engines").  Once ``run_steps`` is compiled, the interpreted loop calls it again."""
    from numba.core.dispatcher import Dispatcher

    from kvsim.modes.closed import closed_loop
    from kvsim.replay import variants
    from tests.helpers import small_closed_engine

    tw = variants.closed_for(variants.interpreted(), False, True)
    compiled = sorted(k for k, v in vars(tw.S).items() if isinstance(v, Dispatcher))
    assert compiled == [], compiled
    assert variants.closed_for(variants.interpreted()).S is not tw.S  # compiled there
    with monkeypatch.context() as m:  # as on a cold cache
        m.setattr(closed_loop, "python_kvsim", lambda core: not variants.is_compiled(core))
        py = small_closed_engine("interpreted", "kvsim")
    jit = small_closed_engine("compiled", "kvsim")
    assert py.py_kvsim and py.step_mod.S is tw.S
    _same_steps(py, jit)
    again = small_closed_engine("interpreted", "kvsim")  # run_steps compiled in this process
    assert not again.py_kvsim and again.step_mod.S is not tw.S


def test_the_closed_loops_set_up_runs_as_python_for_the_interpreted_engine(monkeypatch):
    """The closed loop's set-up passes called from Python (vLLM's block hashes,
    ``shared_hashes``; the block facts, ``block_facts``) run as their Python twins for the
    interpreted engine while their compiled code is cold (``setup_func``), with the
    compiled passes' results: a tenant-salted, partly hashed table at two block sizes, the
    next uses too.  Before, they compiled (~3-4 CPU-s of the README sample's 5.7 cold;
    2.8 now, nothing compiled: the subprocess test below)."""
    import numpy as np

    from kvsim.engine.vllm_rows import shared_hashes
    from kvsim.jit import disk_cache
    from kvsim.modes.closed.closed_facts import block_facts
    from tests.helpers import shared_prefix_table

    table = shared_prefix_table(seed=3, n=40, gap_us=1_000)
    off, ids = table.flat_block_ids()
    cols = {k: table.column(k) for k in ("prompt_tokens", "output_tokens", "hashed_tokens")}
    cols["hashed_tokens"] = np.minimum(cols["hashed_tokens"], 70)  # content known in part
    tenant = np.arange(len(table)) % 3
    calls = []
    monkeypatch.setattr(disk_cache, "_SETUP", {})  # its choices: this test's only
    for B in (16, 32):
        args = (cols["prompt_tokens"], cols["output_tokens"], cols["hashed_tokens"], tenant,
                off, ids, table.block_size_tokens, B)
        jit_h = shared_hashes(*args)
        jit_f = block_facts(table, off, ids, B)
        with monkeypatch.context() as m:  # as on a cold cache
            m.setattr(disk_cache, "cold", lambda d: calls.append(d.__name__) or True)
            py_h = shared_hashes(*args, python=True)
            py_f = block_facts(table, off, ids, B, python=True)
        for a, b in zip((*jit_h, *jit_f), (*py_h, *py_f), strict=True):
            np.testing.assert_array_equal(a, b)
        assert np.count_nonzero(py_h[2]) > 10 and np.count_nonzero(py_f[2]) > 0
    assert {"_content_keys", "_own_hashes", "_all_block_hashes", "_mark_seen",
            "_mark_next"} <= set(calls)


@pytest.mark.parametrize("router", ["prefix", "tiered"])
def test_the_routers_lookups_run_as_python_for_the_interpreted_engine(monkeypatch, router):
    """The ``prefix`` router's scorer and the ``tiered`` router's placement run as their
    Python twins for the interpreted engine while cold (``setup_func``), with the compiled
    lookups' picks: 3 replicas of the interpreted engine serve the same requests either
    way.  The reference run takes the compiled lookups whatever the cache holds (left to
    the cache, a cold one gave it the twins too), and only those: the scheduler's steps
    stay as the cache has them."""
    import json

    import numpy as np

    from kvsim.jit import disk_cache
    from kvsim.modes.closed.cluster import serve
    from kvsim.spec.sim_config import SimConfig
    from tests.helpers import shared_prefix_table

    table = shared_prefix_table(seed=5, n=48, gap_us=20_000)
    config = SimConfig(engine="interpreted", hbm_blocks=24, dram_gb=0.002, cxl_gb=0,
                       nvme_gb=0)
    lookups = ({"route_prefix", "_route_prefix"} if router == "prefix" else
               {"_cached_prefix", "hash_slot", "prefill_cost_us"})
    cold = disk_cache.cold
    with monkeypatch.context() as m:  # the lookups compiled, as on a warm cache
        m.setattr(disk_cache, "_SETUP", {})
        m.setattr(disk_cache, "cold", lambda d: d.__name__ not in lookups and cold(d))
        ref = serve(table, "lru", config, replicas=3, router=router)
    calls = []
    with monkeypatch.context() as m:  # as on a cold cache
        m.setattr(disk_cache, "_SETUP", {})
        m.setattr(disk_cache, "cold", lambda d: calls.append(d.__name__) or True)
        got = serve(table, "lru", config, replicas=3, router=router)
    assert lookups <= set(calls)
    assert len(set(np.asarray(got.requests["replica"]))) == 3
    assert json.dumps(got.summary, sort_keys=True, default=str) == json.dumps(
        ref.summary, sort_keys=True, default=str)


_SMALL_RUNS = [["--scheduler", "vllm"], ["--scheduler", "kvsim"],
               pytest.param(["--pd", "1:1"], marks=pytest.mark.slow),
               pytest.param(["--replicas", "2", "--router", "prefix"], marks=pytest.mark.slow),
               pytest.param(["--replicas", "2", "--router", "tiered", "--dram-gb", "4"],
                            marks=pytest.mark.slow)]


@pytest.mark.parametrize("extra", _SMALL_RUNS)
def test_a_small_first_closed_loop_run_compiles_nothing(tmp_path, extra):
    """The README's 65-request sample served closed loop from empty caches (the engine
    ``auto`` picks: the interpreted one), with vLLM's scheduler and with kvsim's, on 2
    replicas behind the ``prefix`` and the ``tiered`` router, and as ``--pd 1:1`` (slow
    tests, ~3 CPU-s each): numba compiles nothing (docs/simulate.md, "Engines"; that the
    Python twins give the compiled code's results: the tests above)."""
    import json

    root = Path(__file__).resolve().parents[2]
    p = _count_compiles(tmp_path, "simulate", "--request-trace",
                        str(root / "traces" / "sample_mooncake.jsonl"), "--model",
                        "llama-3.1-8b", "--block-size", "512", "--hbm-blocks", "900", "--json",
                        *extra)
    got = json.loads(p.stdout)["policies"][0]
    assert got["requests"] - got["dropped_requests"] == 65


def test_a_small_first_import_compiles_nothing(tmp_path):
    """``kvsim import-request-trace`` of the README's 65-request sample from empty caches:
    the lowering runs kvsim's scheduler as Python while the compiled one is cold and the
    work is too small to pay for its compile (``kvsim.engine.lowering._small_and_cold``):
    numba compiles nothing (before: ~19 CPU-s of its ~21).  The file: the test below."""
    root = Path(__file__).resolve().parents[2]
    _count_compiles(tmp_path, "import-request-trace", "--requests",
                    str(root / "traces" / "sample_mooncake.jsonl"), "--model", "llama-3.1-8b",
                    "--out", str(tmp_path / "m.parquet"))
    assert (tmp_path / "m.parquet").stat().st_size > 0


def test_a_lowerings_engine_must_be_known(tmp_path):
    """``lower_requests(engine=...)``: auto, compiled or interpreted; anything else is one
    clear error naming the field, before any file is written."""
    from kvsim.core.errors import KvsimInputError
    from kvsim.engine import lowering
    from tests.helpers import shared_prefix_table

    with pytest.raises(KvsimInputError, match="auto | compiled | interpreted") as e:
        lowering.lower_requests(shared_prefix_table(seed=2, n=4, gap_us=500),
                                tmp_path / "x.parquet", engine="jit")
    assert e.value.field == "engine" and not (tmp_path / "x.parquet").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["synthetic", "sample"])
def test_a_lowering_in_python_writes_the_compiled_lowerings_file(tmp_path, case):
    """The lowering's steps as Python (``engine="interpreted"``, what a small lowering runs
    while the compiled scheduler is cold) and compiled write byte-identical event files: a
    synthetic table that blocks admissions and stalls decodes (40 GPU blocks), and the
    README's Mooncake sample.  Slow: the compiled side compiles kvsim's scheduler
    (``run_steps``, ~20 CPU-s), which no default test compiles (before the engines were
    named here, the first lowering took ``auto`` and on a cold cache ran as Python too)."""
    from kvsim.engine import lowering
    from kvsim.ingest import read_requests
    from tests.helpers import shared_prefix_table

    root = Path(__file__).resolve().parents[2]
    if case == "sample":
        table, kw = read_requests(root / "traces" / "sample_mooncake.jsonl"), {}
    else:
        table, kw = shared_prefix_table(seed=2, n=60, gap_us=500), {"num_gpu_blocks": 40}
    jit = lowering.lower_requests(table, tmp_path / "jit.parquet", engine="compiled", **kw)
    py = lowering.lower_requests(table, tmp_path / "py.parquet", engine="interpreted", **kw)
    assert (tmp_path / "py.parquet").read_bytes() == (tmp_path / "jit.parquet").read_bytes()
    import dataclasses

    assert dataclasses.replace(py, out_path=jit.out_path) == jit and py.num_events > 1000
    if case == "synthetic":
        assert py.admission_blocked_steps > 0 and py.decode_stalls > 0


def test_a_small_first_open_loop_replay_compiles_nothing(tmp_path):
    """``kvsim simulate --trace traces/sample_chat.parquet`` from empty caches (the engine
    ``auto`` picks from the file's row count: the interpreted one): the pre-pass and the
    id maps run as Python while cold (``kvsim.jit.disk_cache.python_while_cold``): numba
    compiles nothing (before: ~2.5 CPU-s of pre-pass and id-map passes)."""
    root = Path(__file__).resolve().parents[2]
    _count_compiles(tmp_path, "simulate", "--trace", str(root / "traces" / "sample_chat.parquet"),
                    "--policy", "lru", "--hbm-gb", "0.06", "--json")


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_an_open_loop_replay_with_python_passes_gives_the_compiled_passes_result(
        monkeypatch, tmp_path, policy):
    """The open-loop replay on the interpreted engine with its pre-pass and id maps as
    Python (as cold) and compiled (whatever the cache holds: left to the cache, a cold one
    gave the reference run the twins too): the same summary, requests and decision log."""
    import json

    from kvsim.jit import disk_cache
    from kvsim.replay.driver import replay

    root = Path(__file__).resolve().parents[2]
    trace = root / "traces" / "sample_chat.parquet"
    config = SimConfig(engine="interpreted", hbm_gb=0.06)
    calls = []
    with monkeypatch.context() as m:  # as on a cold cache
        m.setattr(disk_cache, "_SETUP", {})
        m.setattr(disk_cache, "cold", lambda d: calls.append(d.__name__) or True)
        py = replay(trace, policy, config, tmp_path / "py.parquet")
    assert {"_scan_rows", "_mark_rows"} <= set(calls)
    cold = disk_cache.cold
    with monkeypatch.context() as m:  # those passes compiled, as on a warm cache
        m.setattr(disk_cache, "_SETUP", {})
        m.setattr(disk_cache, "cold", lambda d: d.__name__ not in calls and cold(d))
        jit = replay(trace, policy, config, tmp_path / "jit.parquet")
    assert json.dumps(py.summary, sort_keys=True, default=str) == json.dumps(
        jit.summary, sort_keys=True, default=str)
    assert (tmp_path / "py.parquet").read_bytes() == (tmp_path / "jit.parquet").read_bytes()


def _count_compiles(tmp_path, *argv):
    """``kvsim ARGV`` in a child from empty caches under ``tmp_path``, asserting that it
    exits 0 and that numba compiled nothing in it; returns the finished process."""
    import os
    import subprocess
    import sys

    code = ("import sys; from numba.core import event\n"
            "n = []\n"
            "class L(event.Listener):\n"
            "    def on_start(self, ev): n.append(1)\n"
            "    def on_end(self, ev): pass\n"
            "event.register('numba:compile', L())\n"
            "from kvsim.cli import app\n"
            "sys.argv = ['kvsim'] + sys.argv[1:]\n"
            "try:\n    app()\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(f'compiles={len(n)}\\n')\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               KVSIM_CACHE_DIR=str(tmp_path / "kvsim"))
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.strip().endswith("compiles=0"), p.stderr[-2000:]
    return p


def test_python_twin_runs_no_compiled_code():
    """A twin calls its helpers' twins (by global name, nested code included) and leaves the
    dispatchers untouched; it gives what the compiled function gives."""
    import numba

    from kvsim.jit.python_twin import python_twin

    assert python_twin(_outer) is not _outer.py_func
    assert python_twin(_leaf) is _leaf.py_func  # reads no dispatcher: its own Python
    assert python_twin(_outer)(5) == 5 * 3 + sum(2 * i for i in range(5))
    assert (_outer.signatures, _mid.signatures, _leaf.signatures) == ([], [], [])
    assert _outer(5) == python_twin(_outer)(5)
    assert isinstance(_mid, numba.core.dispatcher.Dispatcher)


@__import__("numba").njit
def _leaf(x):
    return 2 * x


@__import__("numba").njit
def _mid(x):
    return [_leaf(i) for i in range(x)]


@__import__("numba").njit
def _outer(x):
    return 3 * x + sum(_mid(x))
