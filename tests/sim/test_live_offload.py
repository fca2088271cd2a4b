"""Live KV offload (``SimConfig(live_offload=True)``, kvsim/modes/live/live_offload.py): exact
stalls, spills and prefetch counts on hand-made traces.

Tiny profile (tests/sim/conftest.py): blocks of 100 bytes; DRAM: up latency 1 + 4 = 5 us,
link 100 bytes/us, so fetching n blocks from DRAM in one ACCESS stalls ``5 + n`` us.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kvsim.api import simulate
from kvsim.core.errors import KvsimInputError
from kvsim.core.schema import Phase, Priority
from kvsim.spec.sim_config import SimConfig

_spec = importlib.util.spec_from_file_location("kvsim_tests_sim_conftest_live",
                                               Path(__file__).with_name("conftest.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
TraceBuilder = _helpers.TraceBuilder

DEC = Phase.DECODE


def live(hw, hbm, **kw) -> SimConfig:
    return SimConfig(hardware=hw, hbm_blocks=hbm, live_offload=True, **kw)


def three_requests(path: Path) -> Path:
    """A (2 blocks, decode deadline 250 us), B (1 block, deadline 10 ms), then C (2 blocks)
    arrives into a 4-block HBM: one block must be spilled; A decodes at the next step."""
    tb = TraceBuilder()
    tb.STEP(0, 100)
    tb.ARRIVE(0, 8)
    tb.ARRIVE(1, 4)
    for i in range(2):
        tb.ALLOC(0, i, 0, deadline_us=250)
    tb.ACCESS(0, 8, deadline_us=250)
    tb.ALLOC(1, 0, 0, deadline_us=10_000)
    tb.ACCESS(1, 4, deadline_us=10_000)
    tb.STEP(100, 100)
    tb.ARRIVE(2, 8)
    for i in range(2):
        tb.ALLOC(2, i, 0, deadline_us=10_000)
    tb.ACCESS(2, 8, deadline_us=10_000)
    tb.STEP(200, 100)
    tb.ACCESS(0, 1, DEC, deadline_us=250, priority=Priority.DECODE_CRITICAL)
    tb.FREE(0)
    tb.FREE(1)
    tb.FREE(2)
    return tb.write(path)


def test_lru_spills_the_block_needed_next_step_deadline_does_not(tmp_path, tiny_hw):
    trace = three_requests(tmp_path / "t.parquet")
    lru = simulate(trace, "lru", live(tiny_hw, 4)).summary
    dl = simulate(trace, "deadline", live(tiny_hw, 4)).summary
    # lru: A is least recently used -> A's block 1 spilled at step 1, fetched back at step 2
    # (5 us latency + 100 bytes / 100 bytes/us), making room by spilling B's block
    assert lru["stall_us"] == 6.0
    assert lru["decode_stalls"] == 1 and lru["decode_critical_stalls"] == 1
    assert lru["live_spills"] == 2 and lru["blocks_fetched"] == 1
    assert lru["bytes_dram_link"] == 300
    # deadline: B's deadline is the latest -> B spilled; A's step finds all its blocks
    assert dl["stall_us"] == 0.0
    assert dl["decode_stalls"] == 0 and dl["decode_critical_stalls"] == 0
    assert dl["live_spills"] == 1 and dl["blocks_fetched"] == 0
    assert dl["bytes_dram_link"] == 100
    steps = simulate(trace, "lru", live(tiny_hw, 4)).steps
    assert steps["latency_us"].tolist() == [100.0, 100.0, 106.0]
    # the policies differ with no cached block ever evicted: no "policy never chose" warning
    from kvsim.results.warnings import result_warnings

    assert lru["evictions_hbm"] == 0 and dl["evictions_hbm"] == 0
    codes = [w["code"] for r in (lru, dl) for w in result_warnings([r], single_run=True)]
    assert "no_eviction" not in codes and "no_shared_content" not in codes, codes
    assert lru["live_offload"] is True


def prefetch_trace(path: Path, step1_us: float, intruder: bool = False) -> Path:
    """HBM 3: A (2 blocks, deadline 5 ms), B (1 block, deadline 300 us); C arrives at
    step 1 (one block): deadline spills A's top block (A's 5 ms deadline is the latest); C finishes in step 1, so a slot is
    free for a prefetch of A's block at the end of step 1 (budget (step1_us - 5) x 100
    bytes).  ``intruder``: D allocates a block at step 2 before A reads (the prefetched
    block is spilled again: wasted); A then decodes at step 3."""
    tb = TraceBuilder()
    tb.STEP(0, 100)
    tb.ARRIVE(0, 8)
    tb.ARRIVE(1, 4)
    for i in range(2):
        tb.ALLOC(0, i, 0, deadline_us=5_000)
    tb.ACCESS(0, 8, deadline_us=5_000)
    tb.ALLOC(1, 0, 0, deadline_us=300)
    tb.ACCESS(1, 4, deadline_us=300)
    tb.STEP(100, step1_us)
    tb.ARRIVE(2, 4)
    tb.ALLOC(2, 0, 0, deadline_us=20_000)
    tb.ACCESS(2, 4, deadline_us=20_000)
    tb.FREE(2)
    tb.STEP(1000, 100)
    if intruder:
        tb.ARRIVE(3, 4)
        tb.ALLOC(3, 0, 0, deadline_us=1_000)
        tb.ACCESS(3, 4, deadline_us=1_000)
        tb.STEP(2000, 100)
    tb.ACCESS(0, 1, DEC, deadline_us=5_000)
    tb.FREE(0)
    tb.FREE(1)
    if intruder:
        tb.FREE(3)
    return tb.write(path)


def test_prefetch_hides_the_transfer_exactly_when_the_budget_fits(tmp_path, tiny_hw):
    # budget (6 - 5 us latency) x 100 bytes/us = 100 bytes = exactly one block: hidden
    fits = simulate(prefetch_trace(tmp_path / "a.parquet", 6.0), "deadline",
                    live(tiny_hw, 3)).summary
    assert fits["prefetches"] == 1 and fits["prefetches_useful"] == 1
    assert fits["prefetches_wasted"] == 0
    assert fits["stall_us"] == 0.0 and fits["blocks_fetched"] == 0
    # 0.5 us short: 50 bytes of budget, no prefetch, the decode step stalls 5 + 1 us
    short = simulate(prefetch_trace(tmp_path / "b.parquet", 5.5), "deadline",
                     live(tiny_hw, 3)).summary
    assert short["prefetches"] == 0 and short["stall_us"] == 6.0
    assert short["decode_stalls"] == 1
    # lru has no prefetch hook: fetch on demand, the same 6 us
    lru = simulate(prefetch_trace(tmp_path / "a.parquet", 6.0), "lru",
                   live(tiny_hw, 3)).summary
    assert lru["prefetches"] == 0 and lru["stall_us"] == 6.0
    # prefetch off for every policy
    off = simulate(prefetch_trace(tmp_path / "a.parquet", 6.0), "deadline",
                   live(tiny_hw, 3, prefetch=False)).summary
    assert off["prefetches"] == 0 and off["stall_us"] == 6.0


def test_wasted_prefetch_is_counted(tmp_path, tiny_hw):
    s = simulate(prefetch_trace(tmp_path / "w.parquet", 6.0, intruder=True), "deadline",
                 live(tiny_hw, 3)).summary
    # prefetched at the end of step 1, spilled again for D at step 2 before A read it
    assert s["prefetches"] == 1
    assert s["prefetches_wasted"] == 1 and s["prefetches_useful"] == 0
    assert s["blocks_fetched"] == 1 and s["stall_us"] == 6.0


# ---- the mode off changes nothing; every built-in runs in it -----------------------------

def test_mode_off_is_todays_replay_bit_for_bit(tmp_path, tiny_hw):
    trace = three_requests(tmp_path / "t.parquet")
    base = simulate(trace, "lru", SimConfig(hardware=tiny_hw, hbm_blocks=4,
                                            engine="interpreted"))
    off = simulate(trace, "lru", SimConfig(hardware=tiny_hw, hbm_blocks=4,
                                           engine="interpreted", live_offload=False))
    assert "live_offload" not in base.summary
    assert base.summary.keys() == off.summary.keys()
    for k, v in base.summary.items():
        assert v == off.summary[k] or (v != v and off.summary[k] != off.summary[k]), k
    assert base.steps.equals(off.steps) and base.requests.equals(off.requests)


def _policies():
    from kvsim.policy.registry import list_policies

    return [p.name for p in list_policies()]


def random_trace(path: Path, seed: int, n_req: int = 4, max_blocks: int = 3,
                 n_steps: int = 8) -> Path:
    """Requests of 1..max_blocks blocks admitted at random steps, each step a random
    subset of the running requests decoding (no sharing, no pins)."""
    rng = np.random.default_rng(seed)
    tb = TraceBuilder()
    sizes = rng.integers(1, max_blocks + 1, n_req)
    admit = np.sort(rng.integers(0, n_steps // 2, n_req))
    for s in range(n_steps):
        tb.STEP(100 * s, 50)
        for r in range(n_req):
            if admit[r] == s:
                tb.ARRIVE(r, 4 * int(sizes[r]))
                for i in range(int(sizes[r])):
                    tb.ALLOC(r, i, 0, deadline_us=int(rng.integers(0, 2000)))
                tb.ACCESS(r, 4 * int(sizes[r]), deadline_us=int(rng.integers(0, 2000)))
            elif admit[r] < s and rng.random() < 0.6:
                tb.ACCESS(r, 1, DEC, deadline_us=100 * s + int(rng.integers(0, 2000)))
    for r in range(n_req):
        tb.FREE(r)
    return tb.write(path)


def test_every_builtin_runs_live_and_optimal_bounds_it(tmp_path, tiny_hw):
    trace = random_trace(tmp_path / "r.parquet", 7, n_req=6, max_blocks=3, n_steps=12)
    cfg = live(tiny_hw, 5)
    opt = simulate(trace, "optimal", cfg).summary
    assert opt["policy"] == "optimal" and opt["offline"] is True
    loads = {}
    for name in _policies():
        s = simulate(trace, name, cfg).summary
        assert s["live_offload"] is True and s["steps"] == 12
        assert s["prefetches_useful"] + s["prefetches_wasted"] <= s["prefetches"]
        loads[name] = s["blocks_fetched"] + s["prefetches"]
        assert loads[name] >= opt["blocks_fetched"], name
    assert len(set(loads.values())) > 1  # they do not tie


# ---- optimal = brute force over every spill choice on tiny traces ------------------------

def brute_force_loads(trace: Path, capacity: int) -> int:
    """Fewest blocks brought into HBM over every choice of spilled block (written from the
    need rule alone: an ACCESS needs its request's blocks resident; a block is placed (new
    or fetched) only into a free slot or the slot of a resident block of another
    request)."""
    from kvsim.core.schema import EventKind
    from kvsim.events import read_events

    _, df = read_events(trace)
    ops = [(int(r.kind), int(r.request_id)) for r in df.itertuples()
           if int(r.kind) in (EventKind.ALLOCATE, EventKind.ACCESS, EventKind.FREE)]
    owner: dict[int, int] = {}
    best = [1 << 30]

    def place(res: frozenset, r: int):
        """Every resident set after making room for one block of ``r``."""
        if len(res) < capacity:
            return [res]
        return [res - {b} for b in sorted(res) if owner[b] != r]

    def go(i: int, res: frozenset, spilled: frozenset, loads: int, nxt: int) -> None:
        if loads >= best[0]:
            return
        if i == len(ops):
            best[0] = loads
            return
        kind, r = ops[i]
        if kind == EventKind.FREE:
            mine = {b for b, o in owner.items() if o == r}
            go(i + 1, res - mine, spilled - mine, loads, nxt)
        elif kind == EventKind.ALLOCATE:
            owner[nxt] = r
            for base in place(res, r):
                gone = res - base
                go(i + 1, base | {nxt}, spilled | gone, loads, nxt + 1)
        else:
            missing = sorted(b for b in spilled if owner[b] == r)
            states = [(res, spilled)]
            for b in missing:
                nxt_states = []
                for rs, sp in states:
                    for base in place(rs, r):
                        nxt_states.append((base | {b}, (sp | (rs - base)) - {b}))
                states = list(dict.fromkeys(nxt_states))
            for rs, sp in states:
                go(i + 1, rs, sp, loads + len(missing), nxt)

    # block ids are assigned in ALLOCATE order, as the replay does
    go(0, frozenset(), frozenset(), 0, 0)
    return best[0]


@pytest.mark.parametrize("seed", range(6))
def test_optimal_equals_brute_force_on_tiny_traces(tmp_path, tiny_hw, seed):
    trace = random_trace(tmp_path / f"b{seed}.parquet", seed, n_req=4, max_blocks=2,
                         n_steps=6)
    cap = 3
    opt = simulate(trace, "optimal", live(tiny_hw, cap)).summary
    assert opt["blocks_fetched"] == brute_force_loads(trace, cap)


def test_bad_combinations_are_one_line_errors(tmp_path, tiny_hw):
    with pytest.raises(KvsimInputError, match="--live-offload"):
        SimConfig(live_offload=True, mode="cache")
    with pytest.raises(KvsimInputError, match="--live-offload"):
        SimConfig(live_offload=True, preemption="swap")
    trace = three_requests(tmp_path / "t.parquet")
    with pytest.raises(KvsimInputError, match="--hbm-blocks"):
        simulate(trace, "lru", live(tiny_hw, 1))  # request 0 alone holds 2 blocks


# ---- CLI --------------------------------------------------------------------------------

def test_cli_live_offload_json_table_and_errors(tmp_path, tiny_hw):
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app
    from tests.helpers import assert_one_line_error

    runner = CliRunner()
    trace = three_requests(tmp_path / "t.parquet")
    base = ["--trace", str(trace), "--hardware", tiny_hw, "--hbm-blocks", "4",
            "--live-offload"]
    res = runner.invoke(app, ["simulate", *base, "--policy", "lru", "--json"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["policies"][0]
    assert row["live_offload"] is True and row["stall_us"] == 6.0
    res = runner.invoke(app, ["compare", *base, "--policies", "lru,deadline", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["policy"]: r for r in json.loads(res.stdout)["policies"]}
    assert rows["deadline"]["decode_critical_stalls_vs_lru"] == -1
    assert rows["lru"]["gap_blocks_fetched_to_optimal"] == 1  # optimal fetches nothing
    res = runner.invoke(app, ["compare", *base, "--policies", "lru,deadline"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())  # the title may wrap at the terminal width
    assert "live offload" in text and "decode-crit" in text
    assert_one_line_error(runner.invoke(app, ["simulate", *base, "--mode", "cache"]),
                          "--live-offload", "--mode engine")
    assert_one_line_error(runner.invoke(app, ["compare", *base, "--decision-log-dir",
                                              str(tmp_path / "logs")]), "--decision-log")


# ---- deadline's live victims by target step (kvsim's lowering: a decode ACCESS row's ----
# target_decode_step is step + 1)

def served_in_step(path: Path) -> Path:
    """HBM 5.  Step 0: A (2 blocks), B (2), C (1) prefill; step 1: A decodes, B's decode
    needs a new block (HBM full), then C decodes; step 2: A decodes.  At B's block A has
    already been served in step 1 (target 2) and C not yet (target 1): the block to spill
    is A's.  C's deadline is the latest (10 ms; A's 1.1 ms), so ranking by deadline (and
    lru, by recency) spills C's block, which C fetches back in the same step."""
    tb = TraceBuilder()
    tb.STEP(0, 100)
    for r, n, dl in ((0, 2, 1_000), (1, 2, 1_000), (2, 1, 10_000)):
        tb.ARRIVE(r, 4 * n)
        for i in range(n):
            tb.ALLOC(r, i, 0, deadline_us=dl, target_decode_step=1)
        tb.ACCESS(r, 4 * n, deadline_us=dl, target_decode_step=1)
    tb.STEP(100, 100)
    tb.ACCESS(0, 1, DEC, deadline_us=1_100, target_decode_step=2)
    tb.ALLOC(1, 2, 0, ntok=1, phase=DEC, deadline_us=1_100, target_decode_step=2)
    tb.ACCESS(1, 1, DEC, deadline_us=1_100, target_decode_step=2)
    tb.ACCESS(2, 1, DEC, deadline_us=10_100, target_decode_step=2)
    tb.STEP(200, 100)
    tb.ACCESS(0, 1, DEC, deadline_us=1_200, target_decode_step=3)
    for r in (0, 1, 2):
        tb.FREE(r)
    return tb.write(path)


def test_deadline_spills_the_request_already_served_in_the_step(tmp_path, tiny_hw):
    trace = served_in_step(tmp_path / "s.parquet")
    off = simulate(trace, "deadline", live(tiny_hw, 5, prefetch=False))
    # deadline: A's block spilled at step 1 (A is needed at step 2), fetched at step 2
    # (5 us + 1 block x 1 us); making room for it spills one more (B or C, both served);
    # ranked by deadline (main before this rule) it spilled C at step 1: 6 us at step 1
    # and 6 more at step 2
    assert (off.summary["live_spills"], off.summary["blocks_fetched"]) == (2, 1)
    assert off.summary["stall_us"] == 6.0 and off.summary["decode_stalls"] == 1
    assert off.steps["stall_us"].tolist() == [0.0, 0.0, 6.0]
    # with its prefetch, A's block comes back at the end of step 1 (C's 10 ms deadline is
    # the latest: C's block makes room) and nothing stalls
    on = simulate(trace, "deadline", live(tiny_hw, 5)).summary
    assert (on["live_spills"], on["blocks_fetched"], on["prefetches"],
            on["prefetches_useful"], on["stall_us"]) == (2, 0, 1, 1, 0.0)
    # lru: C (least recently used) spilled at step 1 and fetched back for C's own decode
    # in the same step (6 us), A's block spilled for it and fetched at step 2 (6 us)
    lru = simulate(trace, "lru", live(tiny_hw, 5))
    assert (lru.summary["live_spills"], lru.summary["blocks_fetched"]) == (3, 2)
    assert lru.steps["stall_us"].tolist() == [0.0, 6.0, 6.0]
    assert lru.summary["stall_us"] == 12.0
    # the bound: 1 load
    assert simulate(trace, "optimal", live(tiny_hw, 5)).summary["blocks_fetched"] == 1


def served_order(path: Path) -> Path:
    """HBM 6.  Step 0: A, B, C (2 blocks each) prefill; step 1: A, B, C decode in that
    order, then D's admission needs a slot; step 2: A, B, C decode again (D does not)."""
    tb = TraceBuilder()
    tb.STEP(0, 100)
    for r in (0, 1, 2):
        tb.ARRIVE(r, 8)
        for i in range(2):
            tb.ALLOC(r, i, 0, deadline_us=1_000, target_decode_step=1)
        tb.ACCESS(r, 8, deadline_us=1_000, target_decode_step=1)
    tb.STEP(100, 100)
    for r in (0, 1, 2):
        tb.ACCESS(r, 1, DEC, deadline_us=1_100, target_decode_step=2)
    tb.ARRIVE(3, 4)
    tb.ALLOC(3, 0, 0, deadline_us=1_100, target_decode_step=2)
    tb.ACCESS(3, 4, deadline_us=1_100, target_decode_step=2)
    tb.STEP(200, 100)
    for r in (0, 1, 2):
        tb.ACCESS(r, 1, DEC, deadline_us=1_200, target_decode_step=3)
    for r in (0, 1, 2, 3):
        tb.FREE(r)
    return tb.write(path)


def test_deadline_spills_the_request_served_last_no_cascade(tmp_path, tiny_hw):
    """A, B and C all have target step 2 and no slack when D needs a slot: deadline spills
    C, served last in step 1 and so needed last in step 2; at C's fetch A and B have been
    served (target 3): one fetch, 6 us.  lru spills A (least recently served), needed
    first in step 2: each fetch in step 2 spills the next request to be served (a
    cascade), 3 fetches, 18 us."""
    trace = served_order(tmp_path / "o.parquet")
    dl = simulate(trace, "deadline", live(tiny_hw, 6, prefetch=False))
    assert (dl.summary["live_spills"], dl.summary["blocks_fetched"]) == (2, 1)
    assert dl.steps["stall_us"].tolist() == [0.0, 0.0, 6.0]
    lru = simulate(trace, "lru", live(tiny_hw, 6))
    assert (lru.summary["live_spills"], lru.summary["blocks_fetched"]) == (4, 3)
    assert lru.steps["stall_us"].tolist() == [0.0, 0.0, 18.0]
    opt = simulate(trace, "optimal", live(tiny_hw, 6)).summary
    assert (opt["live_spills"], opt["blocks_fetched"]) == (2, 1)


def _counts_match_stacks(rep) -> None:
    """Every unit's per-priority block counts equal a recount of its stack."""
    for r, classes in enumerate(rep.stack):
        for cls, st in enumerate(classes):
            want = [0, 0, 0, 0]
            for b in st:
                pr = rep.b_intent[b][1]
                want[0 if pr < 0 else 3 if pr > 3 else pr] += 1
            assert rep.ucnt[2 * r + cls] == want, (r, cls)


@pytest.mark.parametrize("prio", [Priority.HOT, Priority.DECODE_CRITICAL])
def test_intent_on_a_shared_block_recounts_its_owners_unit(tmp_path, tiny_hw, monkeypatch,
                                                          prio):
    """B's per-block INTENT on the prefix block A owns changes the block's priority (and,
    for DECODE_CRITICAL, its class) inside A's unit: the unit's counts follow it (they
    drifted when only the owner's intents were re-counted)."""
    from kvsim.core.schema import EventKind
    from kvsim.modes.live import live_offload

    calls = []
    orig = live_offload.LiveReplay.intent

    def checked(self, r, idx, intent, pin):
        orig(self, r, idx, intent, pin)
        _counts_match_stacks(self)
        calls.append((r, idx, self.b_req[self.table[r][idx]] if idx >= 0 else -1))

    monkeypatch.setattr(live_offload.LiveReplay, "intent", checked)
    tb = TraceBuilder()
    tb.STEP(0, 100)
    tb.ARRIVE(0, 8)
    tb.prompt(0, [1, 2])
    tb.ACCESS(0, 8)
    tb.STEP(100, 100)
    tb.ARRIVE(1, 8)
    tb.prompt(1, [1, 3])
    tb.ACCESS(1, 8)
    tb.add(kind=EventKind.INTENT, request_id=1, block_index=0, priority=int(prio),
           phase=int(DEC))
    tb.STEP(200, 100)
    tb.ACCESS(0, 1, DEC)
    tb.ACCESS(1, 1, DEC)
    tb.FREE(0)
    tb.FREE(1)
    trace = tb.write(tmp_path / "t.parquet")
    for pol in ("lru", "intent", "deadline"):
        calls.clear()
        simulate(trace, pol, live(tiny_hw, 3))
        assert calls == [(1, 0, 0)]  # B's intent, on the block A owns
