"""The streaming pre-pass (kvsim.replay.prepass): ``seen`` and ``next_use`` per ALLOCATE row
computed batch by batch equal their brute-force definitions, and a replay gives identical
results whatever the batch size (the core runs on batch-local ordinals)."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.core.schema import EventKind
from kvsim.events import read_events
from kvsim.events.seen_set import SeenSet
from kvsim.policy.api import NEVER
from kvsim.replay.prepass import offline_next_use, scan_trace
from kvsim.spec.sim_config import SimConfig

_CONFTEST = Path(__file__).with_name("conftest.py")
_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_pp", _CONFTEST)
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)


def _brute(hashes, full=None):
    """seen / next_use straight from their definitions (quadratic): ``seen`` = an earlier
    row has the content; ``next_use`` = the next *full* row of it (only full blocks are
    looked up; a partial row carries its full content's hash and is cached once full)."""
    n = len(hashes)
    full = np.ones(n, bool) if full is None else full
    seen = np.zeros(n, np.int8)
    nxt = np.full(n, NEVER, np.int64)
    for i in range(n):
        if hashes[i] == 0:
            continue
        seen[i] = int(any(hashes[j] == hashes[i] for j in range(i)))
        later = [j for j in range(i + 1, n) if hashes[j] == hashes[i] and full[j]]
        if later:
            nxt[i] = later[0]
    return seen, nxt


def test_next_use_waits_for_a_full_row(tmp_path):
    """Rows (ordinal: hash, tokens of 4): 0: h7 partial (a decode block), 1: h7 partial,
    2: h9 full, 3: h7 full, 4: h7 partial, 5: h9 partial.  Rows 0, 1 wait for row 3 (the
    next full h7); 3 and 4 never see another full h7; 2 and 5 no full h9 after them."""
    tb = _helpers.TraceBuilder()
    tb.STEP(0, 100.0)
    for r, (h, ntok) in enumerate([(7, 1), (7, 2), (9, 4), (7, 4), (7, 3), (9, 1)]):
        tb.ARRIVE(r, ntok)
        tb.ALLOC(r, 0, h, ntok)
        tb.ACCESS(r, ntok)
        tb.FREE(r)
    trace = tb.write(tmp_path / "t.parquet")
    for batch in (1, 5, 1 << 20):
        got = offline_next_use(trace, _helpers.BLOCK_TOKENS, 6, batch)
        assert got.tolist() == [3, 3, NEVER, NEVER, NEVER, NEVER]
    s = SeenSet()
    assert s.mark(np.array([7, 7, 9, 7, 7, 9], np.int64)).tolist() == [0, 1, 0, 1, 1, 1]


def test_seen_set_matches_definition_across_chunks_and_growth():
    rng = np.random.default_rng(3)
    # negative, huge and zero hashes; many repeats; a 4-slot table that must grow
    pool = np.concatenate([rng.integers(-2**63, 2**63 - 1, 300, dtype=np.int64), [0, 1, -1]])
    hashes = pool[rng.integers(0, len(pool), 2000)]
    want, _ = _brute(hashes)
    s = SeenSet(initial_slots=4)
    got = np.concatenate([s.mark(hashes[a:b]) for a, b in
                          [(0, 1), (1, 50), (50, 50), (50, 1200), (1200, 2000)]])
    assert np.array_equal(got, want)
    assert s.n == len(set(hashes.tolist()) - {0})
    size = s.keys.shape[0]  # load <= 3/4 (SeenSet.LOAD), power of two, never needlessly big
    assert 4 * s.n <= 3 * size and size & (size - 1) == 0
    s2 = SeenSet(initial_slots=4)
    s2.mark(np.arange(1, 7, dtype=np.int64))  # 6 keys: 8 slots (load 3/4), not 16
    assert s2.keys.shape[0] == 8 and s2.n == 6
    # mark_rows (the pre-pass's one pass over a batch's kind and content_hash columns):
    # the same flags as mark on the ALLOCATE rows' hashes alone, other rows skipped
    kind = rng.choice(np.array([int(k) for k in EventKind], np.int8), len(hashes))
    rows = np.where(kind == int(EventKind.ALLOCATE), hashes,
                    rng.integers(1, 99, len(hashes)))
    want, _ = _brute(hashes[kind == int(EventKind.ALLOCATE)])
    s3 = SeenSet(initial_slots=4)
    got = np.concatenate([s3.mark_rows(kind[a:b], rows[a:b]) for a, b in
                          [(0, 1), (1, 50), (50, 50), (50, 1200), (1200, 2000)]])
    assert np.array_equal(got, want)
    assert s3.n == len(set(hashes[kind == int(EventKind.ALLOCATE)].tolist()) - {0})


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("pp")
    return _helpers.random_trace(_helpers.TraceBuilder, 5, n_requests=60).write(d / "t.parquet")


def test_home_slots_spread_over_tables_past_2_to_the_24():
    """A set of over 8 M keys (a table past 2^24 slots) must spread its home slots over the
    whole table: with 24 bits of home (before) every key began its probe in the first 2^24
    slots and linear probing ran through one cluster.  Hashes and sequential ids (IdMap's
    keys) alike.  The table is never written: its zero pages cost no memory."""
    from kvsim.events.seen_set import _slot

    rng = np.random.default_rng(0)
    for bits in (10, 24, 26):
        keys = np.zeros(1 << bits, dtype=np.int64)  # empty (_EMPTY = 0)
        for h in (rng.integers(1, 2**63, 4096), np.arange(1, 4097)):
            homes = np.array([_slot(keys, np.int64(x)) for x in h])
            # a uniform spread: every eighth of the table holds 1/8 of the homes (+-25 %)
            counts = np.bincount(homes >> (bits - 3), minlength=8)
            assert counts.min() >= 0.75 * 512 and counts.max() <= 1.25 * 512, (bits, counts)


def test_scan_and_next_use_match_definition(trace):
    _, df = read_events(trace)
    alloc = df[df["kind"] == int(EventKind.ALLOCATE)]
    full = alloc["num_tokens"].to_numpy() == _helpers.BLOCK_TOKENS
    hashes = alloc["content_hash"].to_numpy()
    want_seen, want_next = _brute(hashes, full)
    for batch, mem in ((3, None), (64, 0), (1 << 20, 5), (7, 0)):
        facts = scan_trace(trace, _helpers.BLOCK_TOKENS, batch, bits_mem_bytes=mem)
        # the seen flags: 1 bit per ALLOCATE row, read back at any offset and length (in
        # memory, or from the temporary file past ``mem`` bytes)
        assert len(facts.seen_bits) == (len(alloc) + 7) // 8
        assert (facts.seen_bits.file is None) == (mem is None)
        # and after a round trip through pickle (facts sent to a worker), in memory
        assert np.array_equal(pickle.loads(pickle.dumps(facts)).seen_at(0, len(alloc)),
                              want_seen)
        assert np.array_equal(facts.seen_at(0, len(alloc)), want_seen)
        for a, b in [(0, 1), (5, 13), (7, 8), (9, 40), (len(alloc) - 3, len(alloc))]:
            assert np.array_equal(facts.seen_at(a, b - a), want_seen[a:b])
        assert facts.num_rows == len(df)
        assert facts.num_allocs == len(alloc)
        assert facts.max_request_id == int(df["request_id"].max())
        assert facts.max_blocks_per_request == int(alloc["block_index"].max()) + 1
        assert facts.next_use is None  # only computed for offline policies
        got = offline_next_use(trace, _helpers.BLOCK_TOKENS, facts.num_allocs, batch)
        assert np.array_equal(got, want_next)
    assert (want_next != NEVER).sum() > 20  # the trace does reuse content
    assert 20 < want_seen.sum() < len(alloc) - 20


@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_replay_identical_for_any_batch_size(trace, tiny_hw, policy):
    results = [simulate(trace, policy, SimConfig(hardware=tiny_hw, hbm_blocks=8, dram_gb=0,
                                                 engine="interpreted", batch_rows=b))
               for b in (1 << 20, 7, 1)]
    for r in results[1:]:
        assert r.summary == results[0].summary
        assert r.requests.equals(results[0].requests) and r.steps.equals(results[0].steps)
    s = results[0].summary
    # the per-ALLOCATE inputs matter here: blocks are recomputed (seen before, resident
    # nowhere) and hits happen
    assert s["recompute_tokens"] > 0 and s["hbm_hit_rate"] > 0


def test_arrivals_in_a_file_read_the_same(trace, tiny_hw, monkeypatch):
    """Past ``ARRIVALS_MEM`` requests the arrival arrays live in a temporary file: the
    warm-up step, the measured ids and a warm-up replay's JSON are the same as in memory."""
    from kvsim.core.spill import IntsFile
    from kvsim.replay import prepass

    mem = scan_trace(trace, _helpers.BLOCK_TOKENS, 64)
    disk = scan_trace(trace, _helpers.BLOCK_TOKENS, 64, arrivals_mem=0)
    assert isinstance(disk.arrival_order, IntsFile) and disk.arrival_order.dtype == np.int32
    assert not isinstance(mem.arrival_order, IntsFile)
    assert disk.num_requests == mem.num_requests > 20
    for w in (0, 1, 7, mem.num_requests - 1, mem.num_requests):
        assert disk.warmup_step(w) == mem.warmup_step(w)
        assert np.array_equal(disk.measured_requests(w), mem.measured_requests(w))
    back = pickle.loads(pickle.dumps(disk))
    assert np.array_equal(back.arrival_step[:], mem.arrival_step)
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=8, dram_gb=0, warmup_fraction=0.3)
    want = simulate(trace, "lru", cfg).summary
    monkeypatch.setattr(prepass, "ARRIVALS_MEM", 0)
    assert simulate(trace, "lru", cfg).summary == want


def test_replay_gives_read_buffers_back_past_a_slack(trace, tiny_hw, monkeypatch):
    """The replay's pass gives its read buffers back (Arrow's pool, glibc's heap) only once
    the resident set has grown past ``RELEASE_SLACK_BYTES`` since the last release, not
    after every batch (each batch then faulted and zeroed them again; main gave them back
    after each of this trace's 7-row batches); where the resident set cannot be read,
    after every batch.  The results are the same either way."""
    from kvsim.replay import driver, prepass

    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=8, dram_gb=0, batch_rows=7)
    batches = -(-scan_trace(trace, _helpers.BLOCK_TOKENS, 7).num_rows // 7)
    calls = []
    # prepass's: the pre-pass's end and BufferRelease; driver's: the replay's pass's end
    monkeypatch.setattr(prepass, "release_read_buffers", lambda: calls.append("prepass"))
    monkeypatch.setattr(driver, "release_read_buffers", lambda: calls.append("end"))
    rss = iter(range(0, 1 << 40, 1 << 20))  # grows 1 MiB a read
    monkeypatch.setattr(prepass, "_rss_bytes", lambda: next(rss))
    monkeypatch.setattr(prepass, "RELEASE_SLACK_BYTES", 10 << 20)
    want = simulate(trace, "lru", cfg).summary
    assert batches > 50 and calls.count("end") == 1
    # read 0 MiB at the start, k MiB after batch k: past 0 + 10 at batch 11, then read 12
    # MiB; past 22 at batch 22 (read 23) ...: a release every 11th batch
    assert calls.count("prepass") == 1 + batches // 11
    calls.clear()
    monkeypatch.setattr(prepass, "RELEASE_SLACK_BYTES", 0)
    assert simulate(trace, "lru", cfg).summary == want
    assert calls.count("prepass") == 1 + batches and calls.count("end") == 1
    calls.clear()
    monkeypatch.setattr(prepass, "RELEASE_SLACK_BYTES", 1 << 40)
    monkeypatch.setattr(prepass, "_rss_bytes", lambda: None)  # /proc unreadable
    assert simulate(trace, "lru", cfg).summary == want
    assert calls.count("prepass") == 1 + batches and calls.count("end") == 1
