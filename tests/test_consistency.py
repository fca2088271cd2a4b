"""Numbers that must agree wherever kvsim prints them (issue #19's inconsistencies)."""

from __future__ import annotations

import numpy as np

from kvsim.analysis.trace_summary import summarize_trace
from kvsim.events.prefix_reuse import PrefixReuse
from kvsim.workload import generate


def test_generate_and_inspect_report_the_same_prefix_reuse(tmp_path):
    """One definition (kvsim.analysis.trace_summary.PrefixReuse): a multi-turn chat's prompt re-uses
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


def test_prefix_reuse_agrees_with_a_plain_set_on_random_batches():
    """PrefixReuse (its hash set, kvsim.events.seen_set.SeenSet, compiled and as Python)
    against the definition written out with a Python set: a prompt block's hash counts as
    reused when an earlier row of this batch or of an earlier one had it; hash 0 never."""
    rng = np.random.default_rng(3)
    for python in (False, True):
        r, seen, refs, reuses = PrefixReuse(python), set(), 0, 0
        for _ in range(12):  # past the set's first doublings (4,096 slots)
            n = int(rng.integers(0, 900))
            h = rng.integers(0, 1500, n).astype(np.int64)  # repeats within and across
            prompt = rng.random(n) < 0.7
            r.add(h, prompt)
            for x, p in zip(h.tolist(), prompt.tolist()):
                refs += p
                reuses += p and x != 0 and x in seen
                if x:
                    seen.add(x)
        assert (r.refs, r.reuses, r.distinct_hashes) == (refs, reuses, len(seen))


def test_explain_json_has_no_sentinels_and_missing_steps_suggest_neighbours(tmp_path):
    """belady logs next_use = int64 max for a block never used again: JSON says null."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from kvsim.cli import app

    trace = Path(__file__).resolve().parents[1] / "traces" / "sample_chat.parquet"
    log = tmp_path / "b.log.parquet"
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--policy", "belady",
                              "--hbm-blocks", "120", "--decision-log", str(log), "--json"])
    assert res.exit_code == 0, res.output
    out = runner.invoke(app, ["log", "explain", str(log), "--step", "305", "--json"])
    assert out.exit_code == 0, out.output
    assert "9223372036854775807" not in out.stdout and "e+18" not in out.stdout
    cands = json.loads(out.stdout)["candidates"]
    assert cands[0]["next_use"] is None and cands[0]["score"] is None
    table = runner.invoke(app, ["log", "explain", str(log), "--step", "305"],
                          env={"COLUMNS": "120"})
    assert max(len(line) for line in table.stdout.splitlines()
               if line.startswith(" ")) <= 120
    assert "never" in table.stdout
    miss = runner.invoke(app, ["log", "explain", str(log), "--step", "300"])
    assert miss.exit_code == 2 and "nearest steps with one: 305, 307" in miss.stderr


def test_every_doc_the_cli_help_names_exists():
    import re
    from pathlib import Path

    from typer.testing import CliRunner

    from kvsim.cli import app

    root = Path(__file__).resolve().parents[1]
    text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    named = set(re.findall(r"(?:docs/)?[\w.-]+\.md", text))
    assert {"README.md", "docs/cli.md", "docs/migrating-from-kvmi.md"} <= named
    for doc in named:
        assert (root / doc).is_file(), doc
