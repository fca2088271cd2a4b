"""Quiet steps that cache a block (:mod:`kvsim.replay.kernel.closed_ffwd`): a step where a
running request's last block just filled is run in the compiled engine's fast path (vLLM's
``allocate_slots`` caches the block and changes nothing else), unless that block's hash is
the one the first waiting request's prefix lookup stops at (then it could be admitted and
the full path runs the step).  Every output equals the interpreted twin's, which runs every
step through ``schedule()`` and the core.

Hand-built conversations (llama-3-8b on h100-sxm, 16-token blocks): each turn's prompt is
the previous turn's prompt and output plus new tokens, with the output's content known
(``hashed_tokens`` covers it), so a turn waiting behind a decoding one stops its lookup at
exactly the block that decode fills and caches; a small pool keeps a queue waiting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvsim.ingest.requests import build_request_table
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.modes.closed.cluster import serve
from kvsim.spec.sim_config import SimConfig

B = 16


def _conversations(seed: int, chains: int = 4, turns: int = 4):
    rng = np.random.default_rng(seed)
    rows = []
    k = 1000
    for c in range(chains):
        ids: list[int] = []
        t_us = int(rng.integers(0, 40_000))
        for _ in range(turns):
            new = int(rng.integers(1, 4)) * B + int(rng.integers(0, B))
            prompt = len(ids) * B + new if ids else new
            output = int(rng.integers(20, 90))
            total = prompt + output
            nb = (total + B - 1) // B
            ids = ids + list(range(k, k + nb - len(ids)))
            k += nb
            # the turn's own blocks, output included; the next turn repeats them all
            rows.append((t_us, prompt, output, list(ids), (total // B) * B))
            ids = ids[:total // B]  # the next turn goes on from the last full block
            t_us += int(rng.integers(1_000, 30_000))
    rows.sort(key=lambda r: r[0])
    return build_request_table(
        {"arrival_us": [r[0] for r in rows], "prompt_tokens": [r[1] for r in rows],
         "output_tokens": [r[2] for r in rows], "block_ids": [r[3] for r in rows],
         "hashed_tokens": [r[4] for r in rows]},
        block_size_tokens=B)


def _engine(table, hbm: int, engine: str, **config_kw):
    from kvsim.modes.closed.closed_facts import block_facts
    from kvsim.modes.closed.closed_loop import Engine, prepare
    from kvsim.policy.registry import resolve_policy

    config = SimConfig(mode="engine", hbm_blocks=hbm, engine=engine, **config_kw)  # as serve's
    opts = EngineOptions(scheduler="vllm")
    cost, hbm_blocks, costs, block_bytes, off, ids, table2, _ = prepare(table, config, opts)
    e = Engine(table2, off, ids, resolve_policy("lru"), config, opts, cost, hbm_blocks,
               costs, block_bytes)
    e.set_block_facts(block_facts(table2, off, ids, opts.block_size_tokens))
    return e


def test_steps_that_cache_a_block_run_in_the_fast_path():
    """Counted in the step driver's aux columns: quiet steps, and those of them that cached
    a block; a step whose caching would move the waiting head is left to the full path."""
    from kvsim.replay.kernel import closed_step as CS

    quiet = cached = head = 0
    for seed in range(4):
        e = _engine(_conversations(seed), 24, "compiled")
        e.advance()
        e.finish()
        quiet += int(e.aux[CS.X_QUIET])
        cached += int(e.aux[CS.X_QCACHE])
        head += int(e.aux[CS.X_QHEAD])
    assert quiet > 200
    assert cached > 10  # main: every such step ran the full path
    assert head > 0  # and the waiting head's case happens in these traces


def _same(a, b):
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    sa = {k: v for k, v in a.summary.items() if k not in ("engine", "wall_s")}
    sb = {k: v for k, v in b.summary.items() if k not in ("engine", "wall_s")}
    assert repr(sa) == repr(sb)


@pytest.mark.parametrize("seed,hbm", [(0, 24), (1, 24), (2, 40), (3, 400)])
def test_cache_steps_change_no_output(seed, hbm):
    t = _conversations(seed)
    vllm = EngineOptions(scheduler="vllm")
    runs = [serve(t, "lru", SimConfig(mode="engine", hbm_blocks=hbm, engine=e),
                  engine=vllm)
            for e in ("compiled", "interpreted")]
    assert len(runs[0].steps) > 50
    _same(*runs)

