"""The replay's pre-pass facts kept by content (kvsim.replay.facts_cache): a second pass over
the same bytes loads what the first stored, field for field and in the same representation
(arrays in memory or in temporary files), and a replay from loaded facts gives the same
results; another content, another column set, a damaged entry or the switch off scan again."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.core import parsed_cache
from kvsim.core.spill import IntsFile, PackedBits
from kvsim.replay import facts_cache, prepass
from kvsim.replay.prepass import SCAN_COLUMNS, scan_trace
from kvsim.spec.sim_config import SimConfig

_CONFTEST = Path(__file__).with_name("conftest.py")
_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_fc", _CONFTEST)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
BT = _helpers.BLOCK_TOKENS


@pytest.fixture
def trace(tmp_path):
    """Per test (one test edits it): 60 seeded requests sharing prefixes."""
    return _helpers.random_trace(_helpers.TraceBuilder, 5, n_requests=60).write(
        tmp_path / "t.parquet")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(parsed_cache.ENV_OFF, raising=False)
    monkeypatch.setattr(parsed_cache, "MIN_BYTES", 0)  # this test's traces are small
    return tmp_path / "cache" / "traces"


def _counting(monkeypatch) -> list:
    """The passes that really read the file."""
    calls = []
    real = prepass._scan

    def scan(*a, **k):
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(prepass, "_scan", scan)
    return calls


def _same(a, b) -> None:
    for name in ("num_rows", "first_step", "last_step", "max_request_id",
                 "max_blocks_per_request", "max_concurrent_requests", "max_size_bytes",
                 "num_allocs", "ids_final", "max_distinct_hashes", "next_use"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("arrival_order", "arrival_step"):
        x, y = getattr(a, name), getattr(b, name)
        assert type(x) is type(y) and x.dtype == y.dtype, name
        assert np.array_equal(x[0:len(x)], y[0:len(y)]), name
    assert (a.seen_bits.file is None) == (b.seen_bits.file is None)
    assert a.seen_bits.n == b.seen_bits.n
    assert np.array_equal(a.seen_at(0, a.num_allocs), b.seen_at(0, b.num_allocs))


@pytest.mark.parametrize("bits_mem, arrivals_mem", [(None, None), (0, 0), (3, 5)])
def test_a_second_pass_loads_the_first_ones_facts(trace, cache_dir, monkeypatch, bits_mem,
                                                  arrivals_mem) -> None:
    calls = _counting(monkeypatch)
    first = scan_trace(trace, BT, 7, bits_mem, arrivals_mem)
    assert len(calls) == 1 and len(list(cache_dir.glob("*.facts.npz"))) == 1
    again = scan_trace(trace, BT, 64, bits_mem, arrivals_mem)  # any batch size
    assert len(calls) == 1  # loaded, not scanned
    _same(first, again)
    assert first.num_allocs > 20 and 0 < first.seen_at(0, first.num_allocs).sum()
    if arrivals_mem == 0:
        assert isinstance(again.arrival_order, IntsFile)


def test_the_checked_columns_and_the_content_are_in_the_key(trace, cache_dir,
                                                           monkeypatch) -> None:
    calls = _counting(monkeypatch)
    scan_trace(trace, BT, columns=SCAN_COLUMNS)
    scan_trace(trace, BT)  # every column checked: not answered by an 8-column pass
    scan_trace(trace, BT)
    assert len(calls) == 2
    other = trace.with_name("other.parquet")
    other.write_bytes(trace.read_bytes())
    scan_trace(other, BT)  # same bytes, another path: its own entry, loaded the same
    assert len(calls) == 3
    # edited in place (another seed): scanned afresh, its own facts
    _helpers.random_trace(_helpers.TraceBuilder, 6, n_requests=61).write(trace)
    edited = scan_trace(trace, BT)
    assert len(calls) == 4 and edited.num_requests == 61


def test_a_damaged_entry_is_one_warning_and_a_scan(trace, cache_dir, monkeypatch) -> None:
    want = scan_trace(trace, BT)
    (entry,) = cache_dir.glob("*.facts.npz")
    entry.write_bytes(entry.read_bytes()[:200])
    calls = _counting(monkeypatch)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = scan_trace(trace, BT)
    lines = [str(w.message) for w in seen]
    assert len(lines) == 1 and "damaged pre-pass cache entry removed" in lines[0]
    assert len(calls) == 1
    _same(want, got)


def test_off_or_too_large_keeps_nothing(trace, cache_dir, monkeypatch) -> None:
    monkeypatch.setenv(parsed_cache.ENV_OFF, "0")
    scan_trace(trace, BT)
    assert not cache_dir.exists() or not list(cache_dir.glob("*.facts.npz"))
    monkeypatch.setenv(parsed_cache.ENV_OFF, "1")
    monkeypatch.setattr(facts_cache, "MAX_FACTS_BYTES", 10)
    scan_trace(trace, BT)
    assert not cache_dir.exists() or not list(cache_dir.glob("*.facts.npz"))


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_a_replay_from_loaded_facts_is_the_same(trace, tiny_hw, cache_dir, monkeypatch,
                                                policy) -> None:
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=8, dram_gb=0, engine="interpreted",
                    warmup_fraction=0.2)
    calls = _counting(monkeypatch)
    first = simulate(trace, policy, cfg)
    second = simulate(trace, policy, cfg)
    assert len(calls) == 1
    assert second.summary == first.summary
    assert second.requests.equals(first.requests) and second.steps.equals(first.steps)


def test_packed_bits_round_trip() -> None:
    rng = np.random.default_rng(3)
    for n, mem in ((0, None), (1, None), (13, 0), (64, 1), (1001, 50)):
        flags = rng.integers(0, 2, n).astype(np.int8)
        bits = PackedBits(mem)
        bits.append(flags)
        bits.finish()
        back = PackedBits.from_array(bits.to_array(), n, mem)
        assert back.n == n and (back.file is None) == (bits.file is None)
        assert np.array_equal(back.get(0, n), flags)
    with pytest.raises(ValueError, match="cannot hold"):
        PackedBits.from_array(np.zeros(3, np.uint8), 30)
