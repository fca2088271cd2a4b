"""deadline vs lru on the deadline_pressure profile: a whole replay, interpreted engine.

64 requests of ``deadline_pressure`` (seed 0), h100-sxm, llama-3-8b, HBM 8 GB (3,814
blocks of 2 MiB), the profile's DRAM tier.  The replay is deterministic, so the values are
exact; they were measured with the committed policies (docs/benchmarks.md, "deadline vs
lru").

What the margin is: lru evicts returning interactive sessions' prefixes while the batch
flood's finished (DONE) blocks stay; every block of those prefixes is then a
decode-critical miss (all requests of the profile carry a TTFT deadline).  deadline evicts
the DONE blocks first and keeps each session's chain whole (tail-first), so none of them
misses.  p99 step latency is bound by compute here (batch prefill chunks fill the 8,192
token budget); the misses land in the prefill steps of returning sessions, well under 1 %
of the steps, so deadline's p99 step is lower by only 0.29 us (of 8,880) and p99 TPOT is
equal.  Those are asserted exactly, as regression values, not as a p99 win: on this
profile we found no capacity where deadline's p99 is lower by more than microseconds, and
seed 2 at the same 8 GB (a preemption regime) is a measured loss (docs/benchmarks.md).
"""

from __future__ import annotations

import pytest

from kvsim.sim import SimConfig, simulate
from kvsim.workload import generate


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    trace = tmp_path_factory.mktemp("dp") / "dp64.parquet"
    generate("deadline_pressure", 64, 0, trace)
    cfg = SimConfig(hbm_gb=8.0, engine="interpreted")
    return {p: simulate(trace, p, cfg).summary for p in ("lru", "deadline")}


def test_deadline_has_no_decode_critical_misses_where_lru_has_251(results):
    assert results["lru"]["decode_critical_misses"] == 251
    assert results["deadline"]["decode_critical_misses"] == 0


def test_deadline_hit_rate_and_p99_not_worse(results):
    lru, dl = results["lru"], results["deadline"]
    assert dl["hbm_hit_rate"] > lru["hbm_hit_rate"]
    assert dl["hbm_hit_rate"] == pytest.approx(0.6068, abs=5e-5)
    assert lru["hbm_hit_rate"] == pytest.approx(0.5966, abs=5e-5)
    assert dl["p99_step_us"] == pytest.approx(8879.3353, abs=1e-3)
    assert lru["p99_step_us"] == pytest.approx(8879.6287, abs=1e-3)
    assert dl["p99_step_us"] < lru["p99_step_us"]
    assert dl["tpot_p99_us"] == pytest.approx(lru["tpot_p99_us"])
