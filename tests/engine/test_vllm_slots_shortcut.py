"""``schedule()``'s shortcut for a running request (kvsim.engine.vllm_step._slots_unchanged):
whenever it says ``allocate_slots`` would change nothing, ``allocate_slots`` called there
returns 0 and leaves every request column, output count and pool array as they were.

Checked before every step of the first 300 steps of the ``mooncake200`` recording of vLLM's
scheduler (its running requests cross block boundaries, cache full blocks, finish, are
preempted) for every running request and the token counts around a block's end (1, B - 1,
B, B + 1 and all it has left), and that the shortcut fires (it is the common case) and
also declines (a new block or a block to cache).  Slow (tests/conftest.py SLOW_TESTS):
``allocate_slots`` called from Python compiled again for that call in every process (its
policy argument holds first-class functions), ~70 s on the loaded 2-core VM."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.analysis.sched_validate import build_requests
from kvsim.engine import vllm_step as V
from kvsim.engine.vllm_compiled import CompiledVllmScheduler
from kvsim.engine.vllm_scheduler import EngineConfig
from kvsim.ingest.vllm_sched import load_sched_recording

REC = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_sched" / "mooncake200.jsonl.gz"
POOL = ("sc", "ref_cnt", "block_hash", "in_empty", "in_cand", "hidx", "tables", "seq_len",
        "seq_is_open")


def _snapshot(comp):
    p = comp._pst_arrays
    return ([comp.R.copy(), comp.oc.copy(), comp.oev.copy()]
            + [np.array(getattr(p, name), copy=True) for name in POOL])


def test_shortcut_means_allocate_slots_changes_nothing():
    rec = load_sched_recording(REC)
    comp = CompiledVllmScheduler(EngineConfig.from_recording(rec.engine), build_requests(rec))
    fired = declined = 0
    bs = int(comp.ip[V.P_BS])
    for k, s in enumerate(rec.steps[:300]):
        for i in s.get("arrived", []):
            comp.add_request(i)
        R = comp.R
        for j in range(int(comp.sv[V.V_NRUN])):
            i = int(comp.run[j])
            left = int(R[i, V.K_PLEN] + R[i, V.K_NOUT] + R[i, V.K_SPEC] - R[i, V.K_NCOMP])
            for num_new in sorted({n for n in (1, bs - 1, bs, bs + 1, left) if 1 <= n <= left}):
                if not V._slots_unchanged(comp.ip, R, i, num_new,
                                           comp._pst_arrays.seq_len):
                    declined += 1
                    continue
                fired += 1
                before = _snapshot(comp)
                got = V.allocate_slots(comp.ip, R, comp.hh, i, num_new, comp.hits,
                                       np.int64(0), np.int64(0), np.bool_(False),
                                       np.bool_(True), comp.st, comp.pol, comp.view,
                                       comp.pout, comp.hs, comp.oev, comp.oc)
                assert got == 0, (k, i, num_new)
                for a, b in zip(before, _snapshot(comp)):
                    np.testing.assert_array_equal(a, b)
        comp.step()
    assert fired > 1000 and declined > 10
