"""Numbers that must agree wherever kvsim prints them (issue #19's inconsistencies)."""

from __future__ import annotations

from kvsim.trace_summary import PrefixReuse, summarize_trace
from kvsim.workload import generate

import numpy as np


def test_generate_and_inspect_report_the_same_prefix_reuse(tmp_path):
    """One definition (kvsim.trace_summary.PrefixReuse): a multi-turn chat's prompt re-uses
    the previous answer's decode blocks, which the importers once left out."""
    out = tmp_path / "chat.parquet"
    made = generate("multi_turn_chat", 48, 7, out)
    seen = summarize_trace(out)
    assert made.prefix_reuse_fraction == seen.prefix_reuse_fraction
    assert made.prompt_blocks == seen.prompt_block_refs
    assert seen.prefix_reuse_fraction > 0


def test_prefix_reuse_counts_earlier_blocks_of_any_phase_in_file_order():
    r = PrefixReuse()
    # decode block 7 allocated first, then prompts: 7 (hit: decode block), 8, 8 (hit), 0
    r.add(np.array([7], np.int64), np.array([False]))
    r.add(np.array([7, 8, 8, 0], np.int64), np.array([True, True, True, True]))
    assert (r.refs, r.reuses) == (4, 2) and r.fraction == 0.5
