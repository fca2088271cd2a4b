"""An HBM ``victim()`` call gets room for runners-up only when a decision log records them
(kvsim.memory.fast.new_out): list policies walk their list once per runner-up they write,
which put ``lru.victim`` at 4.7 % of an lru replay of the Mooncake 16-token import with no
log at all (1.2 % without the walk)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.memory import PoolConfig
from kvsim.memory.fast import MAX_ALT, new_out
from kvsim.policy.registry import load_policy_file
from kvsim.spec.sim_config import SimConfig

_CONFTEST = Path(__file__).with_name("conftest.py")
_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_alt", _CONFTEST)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)

POLICY = '''
"""FIFO that records the size of the runners-up arrays each victim() call receives."""
NAME = "alt_probe"
DESCRIPTION = "fifo, recording alt_blocks.shape[0]"
REASONS = ("first in",)
WIDTHS = []


def init(capacity_blocks, num_slots, params):
    return ([],)


def on_insert(state, view, b, now_us):
    state[0].append(b)


def on_hit(state, view, b, now_us):
    pass


def on_remove(state, view, b):
    state[0].remove(b)


def victim(state, view, now_us, alt_blocks, alt_scores):
    WIDTHS.append(alt_blocks.shape[0])
    order = state[0]
    if not order:
        return -1, 0, 0
    n = min(len(order), alt_blocks.shape[0])
    for i in range(n):
        alt_blocks[i] = order[i]
        alt_scores[i] = -float(i)
    return order[0], 0, n
'''


def test_new_out_width():
    cfg = PoolConfig(16, 4, max_seqs=2, max_blocks_per_seq=5)
    assert new_out(cfg).alt_blocks.shape == (5, MAX_ALT)
    out = new_out(cfg, 0)
    assert out.alt_blocks.shape == (5, 0) and out.alt_scores.shape == (5, 0)
    assert out.alt_scores.dtype == np.float64
    with pytest.raises(ValueError, match="n_alt: expected 0..8, got 9"):
        new_out(cfg, MAX_ALT + 1)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("alt") / "alt_probe.py"
    path.write_text(POLICY)
    return load_policy_file(str(path))  # registered once: a name is loaded once


@pytest.mark.parametrize("log, candidates, width", [(False, 4, 0), (True, 4, 4),
                                                     (True, 0, 0), (True, 8, 8)])
def test_victim_gets_the_log_width(tmp_path, tiny_hw, probe, log, candidates, width):
    pol = probe
    widths = pol.module.WIDTHS
    widths.clear()
    trace = _helpers.random_trace(_helpers.TraceBuilder, 3, n_requests=30).write(
        tmp_path / "t.parquet")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=8, dram_gb=0, engine="interpreted",
                    log_candidates=candidates)
    r = simulate(trace, pol, cfg, decision_log=tmp_path / "log.parquet" if log else None)
    assert r.summary["evictions_hbm"] > 0 and widths  # the HBM victim was asked
    assert set(widths) == {width}
