"""``--write-policy vllm_offload`` (kvsim.replay.kernel.offload) against vLLM 0.33's own
native CPU offloading: a recording of vLLM's Scheduler with its ``OffloadingConnector``
(scheduler side, ``CPUOffloadingManager`` with the ``lru`` cache policy; a fake worker
finishes every transfer in its step) replayed through kvsim's closed loop with vLLM's
scheduler and a DRAM tier of the recording's CPU chunks.  Every step agrees: the scheduled
set, admissions with their hit tokens (GPU prefix hits + tokens loaded from the CPU tier),
finished requests, the GPU KV events, free GPU blocks, and the CPU tier's contents after
the step; the loads, stores and CPU evictions add up to vLLM's.

The recording: bench/vllm/record_scheduler.py --case offload_lru (docs/vllm-recordings.md,
"Native CPU offloading").  kvsim's old DRAM tier (an exclusive write-back victim cache:
blocks enter when HBM evicts them) holds other blocks and finds other hits: the second
test shows it, so the first fails if kvsim used it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvsim.analysis.sched_closed import validate_sched_closed
from kvsim.core.errors import KvsimInputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_offload"


def _summary(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        for line in fh:
            d = json.loads(line)
            if d["kind"] == "summary":
                return d
    raise AssertionError("no summary")


def _check(name: str) -> None:
    path = FIXTURES / f"{name}.jsonl.gz"
    r = validate_sched_closed(path)
    s = _summary(path)
    assert r.first_divergence is None, r.first_divergence.describe()
    assert r.steps_vllm == r.steps_kvsim == r.replay["steps"]
    assert set(r.agree) == {"sched", "preempted", "hits", "finished", "free", "events",
                            "reset", "offload"}
    for f, n in r.agree.items():
        assert n == r.steps, f
    assert r.replay["lost_hit_tokens"] == 0
    assert r.replay["preemptions"] == s["preemptions"]
    off = s["offload"]
    assert r.replay["offload"] == {"load": off["load"], "store": off["store"],
                                   "evict": off["evict"]}
    assert r.hit_tokens["new"] == {"vllm": s["new_hit_tokens"], "kvsim": s["new_hit_tokens"]}


def test_vllm_offload_equals_vllm_every_step():
    """38 requests over 10 shared documents, 24 GPU blocks, 36 CPU chunks, 3 sequences,
    chunked prefill: 68 steps, 165 stores, 129 CPU evictions, 23 loads (368 tokens), each
    step's CPU tier exactly vLLM's."""
    _check("offload_lru")
    s = _summary(FIXTURES / "offload_lru.jsonl.gz")["offload"]
    assert (s["store"], s["evict"], s["load"]) == (165, 129, 23)


def test_old_dram_tier_is_not_vllms():
    """The same recording through kvsim's write-back DRAM tier (blocks enter on HBM
    eviction) and write-through (first use, kept in tier-LRU order): neither holds vLLM's
    CPU blocks, so the test above would fail with either."""
    path = FIXTURES / "offload_lru.jsonl.gz"
    for wp in ("write_back", "write_through"):
        r = validate_sched_closed(path, write_policy=wp)
        assert r.divergences.get("offload", 0) > 0, wp
    r = validate_sched_closed(path, write_policy="write_back")
    assert r.hit_tokens["new"]["kvsim"] != r.hit_tokens["new"]["vllm"]


def test_vllm_offload_refused_outside_vllms_closed_loop(tmp_path):
    """One line, exit 2, for the configurations it does not model."""
    from kvsim.modes.closed.closed_loop import check_vllm_offload
    from kvsim.modes.dispatch import simulate
    from kvsim.spec.sim_config import SimConfig

    cfg = SimConfig(write_policy="vllm_offload", dram_gb=1.0, cxl_gb=0, nvme_gb=0)
    with pytest.raises(KvsimInputError, match="--scheduler auto or vllm"):
        check_vllm_offload(cfg, vllm=False)
    with pytest.raises(KvsimInputError, match="--cxl-gb 0"):
        check_vllm_offload(SimConfig(write_policy="vllm_offload", dram_gb=1.0, cxl_gb=2.0),
                           vllm=True)
    with pytest.raises(KvsimInputError, match="--dram-gb > 0"):
        check_vllm_offload(SimConfig(write_policy="vllm_offload", dram_gb=0), vllm=True)
    with pytest.raises(KvsimInputError, match="without --shared-tier-gb"):
        check_vllm_offload(SimConfig(write_policy="vllm_offload", shared_tier_gb=8.0),
                           vllm=True)
    check_vllm_offload(cfg, vllm=True)  # accepted
    with pytest.raises(KvsimInputError, match="not an event file"):
        simulate(str(tmp_path / "events.parquet"), "lru", cfg)


@pytest.mark.slow
def test_vllm_offload_mooncake_equals_vllm():
    """The first 150 Mooncake requests at their real lengths and times, 512-token blocks,
    260 GPU blocks, 1,000 CPU chunks, 16 sequences: 7,605 steps, 6 preemptions, 3,960
    stores, 2,960 CPU evictions, 5 loads; every step's CPU tier and hits are vLLM's (~40 s).
    It found kvsim storing an HBM block that duplicates cached content (no hash in HBM)."""
    _check("offload_mooncake150")
    s = _summary(FIXTURES / "offload_mooncake150.jsonl.gz")
    assert (s["offload"]["store"], s["offload"]["evict"], s["offload"]["load"],
            s["preemptions"]) == (3960, 2960, 5, 6)


def test_arc_recording_refused():
    """vLLM's arc cache policy is recorded (offload_arc: 120 stores, 84 CPU evictions, 68
    loads against lru's 165 / 129 / 23 on the same requests) but not modelled: one line."""
    with pytest.raises(KvsimInputError, match="lru cache policy"):
        validate_sched_closed(FIXTURES / "offload_arc.jsonl.gz")
    s = _summary(FIXTURES / "offload_arc.jsonl.gz")["offload"]
    assert (s["store"], s["evict"], s["load"]) == (120, 84, 68)


def _victims_by_rescans(L_i, view, cap, need, now_us, stamp):
    """The selection as it was written first: the lowest rank ``need`` times over the whole
    tier, each time after the previous victim left (the count of evictable slots first)."""
    from kvsim.core.layout import LI_STATE

    ok = [v for v in range(cap) if L_i[v, LI_STATE] == 1 and view.last_access_us[v] != now_us
          and view.deadline_us[v] != stamp]
    if len(ok) < need:
        return ok
    out = []
    for _ in range(need):
        best = -1
        for v in ok:
            if v not in out and (best < 0 or view.slack_us[v] < view.slack_us[best]):
                best = v
        out.append(best)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_victims_in_one_pass_are_the_rescans_victims(seed):
    """:func:`kvsim.replay.kernel.offload._victims` (one pass, a selection, a sort of the
    victims) picks the same slots in the same order as ``need`` rescans of the tier, with
    ties of rank, slots touched in this step, slots offered by this call, free slots, and
    too few evictable slots; compiled and as plain Python."""
    import numpy as np

    from kvsim.core.layout import LI_STATE, NLI
    from kvsim.replay.kernel.offload import _victims
    from kvsim.replay.kernel.tiers import new_record_view

    rng = np.random.default_rng(seed)
    cap = int(rng.integers(1, 60))
    view = new_record_view(cap)
    L_i = np.zeros((cap, NLI), dtype=np.int64)
    L_i[:, LI_STATE] = rng.random(cap) < 0.85
    view.slack_us[:] = rng.integers(0, 8, cap)  # few distinct ranks: many ties
    now_us, stamp = 5.0, -70.0
    view.last_access_us[:] = np.where(rng.random(cap) < 0.15, now_us, 1.0)
    view.deadline_us[:] = np.where(rng.random(cap) < 0.1, stamp, -1.0)
    for need in range(1, cap + 3):
        want = _victims_by_rescans(L_i, view, cap, need, now_us, stamp)
        for f in (_victims, _victims.py_func):
            got = [int(v) for v in f(L_i, view, np.int64(cap), np.int64(need), now_us, stamp)]
            assert got == want, (f, need)


@pytest.mark.parametrize("seed,hbm,dram_gb", [(0, 24, 0.03), (1, 40, 0.03), (2, 24, 0.2),
                                              (3, 400, 0.2)])
def test_quiet_steps_under_vllms_cpu_offloading_change_no_output(seed, hbm, dram_gb):
    """Under ``--write-policy vllm_offload`` a step is run in the fast path only while the
    offloading's step would do nothing (:func:`kvsim.replay.kernel.offload.idle`: every
    running request has offered its computed prompt blocks, no finished request waits for
    its re-rank): the compiled engine, which takes such steps in one go, gives the outputs
    of the interpreted one, which runs every step in full (the traces and checks of
    tests/cluster/test_quiet_cache_steps.py; here, on the worker that compiles this mode's
    engine for the recordings above).  A CPU tier of 14 blocks evicts;
    one of ~100 holds more.  Before, no step was quiet in this mode (``X_QUIET`` 0)."""
    from kvsim.modes.closed.closed_loop import EngineOptions
    from kvsim.modes.closed.cluster import serve
    from kvsim.replay.kernel import closed_step as CS
    from kvsim.spec.sim_config import SimConfig
    from tests.cluster.test_quiet_cache_steps import _conversations, _engine, _same

    t = _conversations(seed)
    vllm = EngineOptions(scheduler="vllm")
    runs = [serve(t, "lru", SimConfig(mode="engine", hbm_blocks=hbm, engine=e,
                                      write_policy="vllm_offload", dram_gb=dram_gb,
                                      cxl_gb=0, nvme_gb=0), engine=vllm)
            for e in ("compiled", "interpreted")]
    assert len(runs[0].steps) > 50
    s = runs[1].summary
    assert s["write_throughs"] > 20  # the CPU tier stores
    if hbm < 100:
        assert s["dram_hit_rate"] > 0  # and loads
    if dram_gb < 0.1:
        assert s["evictions_dram"] > 10  # and is full
    _same(*runs)
    e = _engine(t, hbm, "compiled", write_policy="vllm_offload", dram_gb=dram_gb, cxl_gb=0,
                nvme_gb=0)
    e.advance()
    e.finish()
    assert int(e.aux[CS.X_QUIET]) > 20
