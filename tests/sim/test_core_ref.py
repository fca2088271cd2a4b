"""The replay core's state as one value in compiled code (kvsim.replay.kernel.core_ref.CoreRef): every
member is the driver's own array, writes go through, a replaced buffer is what the core
sees on its next call, and the interpreted engine takes the plain CoreState."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from kvsim.replay.kernel.core_ref import CORE_FIELDS, CORE_REF, CoreState, core_arg, core_ref
from kvsim.spec.sim_config import SimConfig

_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_cr",
                                               Path(__file__).with_name("conftest.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)


def _getter(name):
    namespace = {"njit": njit}
    exec(f"@njit\ndef get(r):\n    return r.{name}\n", namespace)
    return namespace["get"]


@njit
def _pool_ref_cnt(r):
    return r.st.ref_cnt


@njit
def _tier_slots(r):
    return r.T1.L_i, r.T2.L_i, r.T3.L_i


@njit
def _view_hash(r):
    return r.H_view.content_hash, r.TMP.content_hash


@njit
def _write(r):
    r.C[3] = 7.5
    r.A_i[2, 1] = 11
    r.seen[0] = 1
    return r.A_i.shape[0]


@pytest.fixture
def replay(tiny_hw, tmp_path):
    """A finished compiled replay of a small trace (its driver, kvsim.replay.driver._Run)."""
    from kvsim.policy.registry import get_policy
    from kvsim.replay.driver import execute

    trace = _helpers.random_trace(_helpers.TraceBuilder, 5).write(tmp_path / "r.parquet")
    cfg = SimConfig(hardware=tiny_hw, hbm_blocks=10, engine="compiled")
    return execute(trace, get_policy("lru"), cfg).run


def test_every_member_is_the_drivers_own_array(replay):
    """The struct has CORE_FIELDS in order, and each array member is the driver's array
    itself (no copy); the pool, views and tiers are the driver's own too."""
    assert list(CORE_REF.field_dict) == list(CORE_FIELDS)
    nu = np.arange(5, dtype=np.int64)
    seen = np.zeros(5, dtype=np.int8)
    cs = replay.core_state(nu, seen)
    r = core_ref(cs)
    arrays = [name for name in CORE_FIELDS
              if isinstance(getattr(cs, name), np.ndarray)]
    assert len(arrays) == 25  # all but st, out, pst, H_view, T1-T3, TMP (structs), G
    for name in arrays:
        got = _getter(name)(r)
        mine = getattr(cs, name)
        assert got.shape == mine.shape and got.dtype == mine.dtype, name
        assert got.size == 0 or np.shares_memory(got, mine), name
    assert cs.next_use is nu and cs.seen is seen
    for got, mine in zip(_getter("G")(r), replay.G):
        assert np.shares_memory(got, mine)
    for got, mine in zip(_getter("out")(r), replay.out):  # runners-up: (rows, 0) unlogged
        assert got.shape == mine.shape and (got.size == 0 or np.shares_memory(got, mine))
    assert replay.out.alt_blocks.shape[1] == 0
    assert np.shares_memory(_pool_ref_cnt(r), replay.st.ref_cnt)
    for got, T in zip(_tier_slots(r), replay.T):
        assert np.shares_memory(got, T[0])
    hbm_hash, tmp_hash = _view_hash(r)
    assert np.shares_memory(hbm_hash, replay.views[0].content_hash)
    assert hbm_hash.shape == (11,)  # hbm_blocks + 1 rows
    # the rows are the views' own memory: H_rows over the HBM view, L*_rows the tiers'
    assert cs.H_rows.shape == (11, 11)
    for rows, v in zip((cs.H_rows, cs.L1_rows, cs.L2_rows, cs.L3_rows), replay.views):
        assert np.shares_memory(rows, v.content_hash) and rows.shape[0] == len(v.next_use)
    assert np.shares_memory(cs.TMP_rows, replay.TMP_view.pinned)


def test_writes_go_through_and_a_replaced_buffer_is_seen(replay):
    seen = np.zeros(3, dtype=np.int8)
    cs = replay.core_state(replay.no_next, seen)
    old_rows = replay.A_i.shape[0]
    assert _write(core_ref(cs)) == old_rows
    assert replay.C[3] == 7.5 and replay.A_i[2, 1] == 11 and seen[0] == 1
    # the driver grows the arena (as _compact_arena does): a new CoreRef sees the new one
    replay.A_i = np.zeros((2 * old_rows, replay.A_i.shape[1]), dtype=np.int64)
    cs2 = replay.core_state(replay.no_next, seen)
    assert _write(core_ref(cs2)) == 2 * old_rows
    assert replay.A_i[2, 1] == 11
    # a member replaced on the CoreState itself is what its next CoreRef holds
    bigger = np.zeros(9, dtype=np.int8)
    cs2.seen = bigger
    _write(core_ref(cs2))
    assert bigger[0] == 1
    assert np.shares_memory(_getter("seen")(core_ref(cs2)), bigger)


def test_the_driver_passes_its_last_core_ref_again_until_a_member_changes(replay):
    """``_Run.core_value``: the same arrays give the same CoreRef (no ~1 ms remake on each
    re-entry of the core); a grown buffer, or a batch's new ``seen``, gives a new one that
    holds the new array."""
    seen = np.zeros(3, dtype=np.int8)
    first = replay.core_value(replay.no_next, seen)
    assert replay.core_value(replay.no_next, seen) is first
    old_rows = replay.A_i.shape[0]
    replay.A_i = np.zeros((2 * old_rows, replay.A_i.shape[1]), dtype=np.int64)
    grown = replay.core_value(replay.no_next, seen)
    assert grown is not first and _write(grown) == 2 * old_rows
    assert replay.core_value(replay.no_next, seen) is grown
    other = np.zeros(3, dtype=np.int8)  # equal contents, another array: remade
    again = replay.core_value(replay.no_next, other)
    assert again is not grown and np.shares_memory(_getter("seen")(again), other)


def test_interpreted_takes_the_plain_state_and_every_member_is_required(replay):
    cs = replay.core_state(replay.no_next, replay.no_seen)
    assert core_arg(cs, False) is cs
    assert [getattr(cs, name) is value for name, value in
            zip(CORE_FIELDS, cs.members())] == [True] * len(CORE_FIELDS)
    members = dict(zip(CORE_FIELDS, cs.members()))
    del members["vo"]
    with pytest.raises(TypeError, match=r"missing \['vo'\]"):
        CoreState(**members)
    with pytest.raises(TypeError, match=r"unknown \['extra'\]"):
        CoreState(**dict(zip(CORE_FIELDS, cs.members())), extra=1)


def test_copy_row_is_copy_view():
    """A row copy (kvsim.replay.kernel.tiers.copy_row on record_rows) writes exactly what copy_view
    writes: the 12 fields, not the two timestamps; any other layout is refused."""
    from kvsim.policy.api import BLOCK_VIEW_FIELDS, new_block_view
    from kvsim.replay.kernel.tiers import copy_row, copy_view, new_record_view, record_rows

    rng = np.random.default_rng(3)
    src = new_record_view(5)
    for name in BLOCK_VIEW_FIELDS:
        a = getattr(src, name)
        a[:] = rng.integers(0, 2 if a.dtype == np.bool_ else 100, size=5).astype(a.dtype)
    a, b = new_record_view(4), new_record_view(4)
    a.last_access_us[2] = b.last_access_us[2] = 7.0
    copy_view(a, 2, src, 3)
    copy_row.py_func(record_rows(b), 2, record_rows(src), 3)  # plain Python, as interpreted
    for name in BLOCK_VIEW_FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.last_access_us[2] == 7.0 and a.insert_us[2] == 0.0  # timestamps not copied
    assert a.content_hash[2] == src.content_hash[3] and a.pinned[2] == src.pinned[3]
    with pytest.raises(ValueError, match="not a record view"):
        record_rows(new_block_view(4))


#: core.run and what it calls, compiled without reference counting: a callee without its
#: own setting is compiled under its first caller's, so each one is marked itself (else a
#: counted copy compiled for another caller may be the one linked into run)
UNCOUNTED = {"core": ["run"],
             "placement": ["_preempt", "_allocate", "_queued_promotion", "_place",
                           "_release_all", "_fill_last", "_fill_at_finish", "_reset_cache"],
             "spill": ["_hbm_evicted_range"],
             "tier_ops": ["touch", "touch_range", "spill_step", "_spill", "_write_through"],
             "tiers": ["copy_view", "log_row", "log_candidates"],
             "bookkeeping": ["_peak", "_set_view_from_record", "_pick_victim", "_first_lower",
                             "_grow_records", "_finalize_step", "_resumed_token"]}


@pytest.mark.parametrize("mod,name", [(m, n) for m, ns in UNCOUNTED.items() for n in ns])
def test_the_core_is_compiled_without_counts(mod, name):
    """Each counted call counted every array and structref it received (~250 counted pairs
    a full closed-loop step on main: the 20 event columns, the state's members)."""
    import importlib

    f = getattr(importlib.import_module(f"kvsim.replay.kernel.{mod}"), name)
    # a kvsim.jit.decorators.helper (log_row) holds its options as jit_options
    options = getattr(f, "targetoptions", None) or f.jit_options
    assert options.get("_nrt") is False, f"{mod}.{name}"


@njit(_nrt=False)
def _members_uncounted(r):
    """Members of the core's state, a tier's and the pool's, read as core.run reads them."""
    return r.C[3] + r.A_i.shape[0] + r.T1.L_i.shape[0] + r.st.seq_len.shape[0] + r.G[0].shape[0]


def test_members_are_read_without_counts(replay):
    """CoreRef's and TierRef's members are read borrowed (register_borrowed_members): a
    function compiled _nrt=False reads them (numba's own read needs NRT: no compile on main)
    and counts nothing."""
    cs = replay.core_state(replay.no_next, replay.no_seen)
    replay.C[3] = 2.0
    want = (2.0 + replay.A_i.shape[0] + replay.T[0][0].shape[0] + replay.st.seq_len.shape[0]
            + replay.G[0].shape[0])
    assert _members_uncounted(core_ref(cs)) == want
    ir = _members_uncounted.inspect_llvm(_members_uncounted.signatures[0])
    assert "NRT_incref" not in ir and "NRT_decref" not in ir
