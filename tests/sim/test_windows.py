"""Measurement windows: warm-up counted in requests (arrival order), token and block hit rates.

The trace is the shape of an imported Mooncake trace: every request ARRIVEs in step 0 and
runs later.  Counting warm-up in steps measured no request there (empty TTFT/TPOT).
Blocks are 4 tokens (tests/sim/conftest.py).
"""

from __future__ import annotations

import math

import pytest

from kvsim.api import simulate
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import Phase
from kvsim.spec.sim_config import SimConfig


def cfg(hw, **kw) -> SimConfig:
    kw.setdefault("engine", "interpreted")
    kw.setdefault("check_invariants", True)
    return SimConfig(hardware=hw, **kw)


def all_arrive_first(builder, n=4):
    """n requests arrive in step 0; each runs alone: prompt = 2 full blocks [11, 12] plus a
    1-token partial block (9 tokens), one decode step, then FREE."""
    tb = builder()
    tb.STEP(0, 100)
    for r in range(n):
        tb.ARRIVE(r, 9)
    t = 1000
    for r in range(n):
        tb.STEP(t, 1000); tb.prompt(r, [11, 12, 100 + r], last_tokens=1); tb.ACCESS(r, 9)
        tb.STEP(t + 1000, 500); tb.ACCESS(r, 1, Phase.DECODE); tb.FREE(r)
        t += 2000
    return tb


def test_warmup_fraction_counts_requests_not_steps(builder, tiny_hw, tmp_path):
    trace = all_arrive_first(builder).write(tmp_path / "t.parquet")
    s = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, warmup_fraction=0.5)).summary
    # requests 0, 1 are warm-up (floor(0.5 x 4) = 2); 2 and 3 measured, each hitting
    # blocks 11 and 12: 8 of 9 prompt tokens, 2 of 3 prompt blocks
    assert s["warmup_requests"] == 2 and s["requests"] == 2
    assert s["hbm_hit_rate"] == pytest.approx(16 / 18)
    assert s["block_hit_rate"] == pytest.approx(4 / 6)
    assert s["lookup_tokens"] == 18 and s["hit_tokens"] == 16
    assert s["prompt_blocks"] == 6 and s["hit_blocks"] == 4
    assert not math.isnan(s["ttft_p50_us"]) and not math.isnan(s["tpot_p50_us"])
    # the window starts at the step request 2 arrived in (step 0): every step is measured
    assert s["steps"] == 9
    same = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, warmup_requests=2)).summary
    assert same == s


def test_no_warmup_counts_every_request(builder, tiny_hw, tmp_path):
    trace = all_arrive_first(builder).write(tmp_path / "t.parquet")
    s = simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8)).summary
    # request 0 misses; 1..3 hit 8 of 9 tokens
    assert s["requests"] == 4 and s["warmup_requests"] == 0
    assert s["hbm_hit_rate"] == pytest.approx(24 / 36)
    assert s["block_hit_rate"] == pytest.approx(6 / 12)
    assert s["mode"] == "engine"


def test_warmup_requests_must_leave_requests(builder, tiny_hw, tmp_path):
    trace = all_arrive_first(builder).write(tmp_path / "t.parquet")
    # the API names the fields; the command line its options (tests/bad_inputs/cli_cases.toml)
    with pytest.raises(KvsimInputError, match="field 'warmup_requests': expected fewer"):
        simulate(trace, "lru", cfg(tiny_hw, hbm_blocks=8, warmup_requests=4))
    with pytest.raises(KvsimInputError, match="either warmup_requests or warmup_fraction, "
                                              "not both"):
        cfg(tiny_hw, warmup_requests=1, warmup_fraction=0.5)
