"""The batch-job reorder study (kvsim.analysis.reorder, ``kvsim reorder``; issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.analysis.reorder import adjacent_shared_blocks, order_indices, reorder_study
from kvsim.cli import app
from kvsim.ingest import read_requests
from kvsim.modes.closed.closed_loop import EngineOptions
from kvsim.spec.sim_config import SimConfig

SERVEGEN = Path(__file__).parent / "fixtures" / "servegen"


def _generic(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "g.csv"
    p.write_text("arrival_ms,prompt_tokens,output_tokens,block_ids\n"
                 + "".join(f"0,{16 * len(r.split())},1,{r}\n" for r in rows))
    return p


def test_orders_exact(tmp_path):
    """Prefix-tree nodes by first appearance: r0 [0,1,2], r1 [3,4], r2 [0,1,5], r3 [3,6],
    r4 [0,1,2,7]; DFS sorts the node paths, grouped keeps first-block groups."""
    t = read_requests(_generic(tmp_path, ["1 2 3", "5 6", "1 2 4", "5 7", "1 2 3 8"]))
    assert order_indices(t, "submission").tolist() == [0, 1, 2, 3, 4]
    assert order_indices(t, "grouped").tolist() == [0, 2, 4, 1, 3]
    assert order_indices(t, "dfs").tolist() == [0, 4, 2, 1, 3]
    assert adjacent_shared_blocks(t, np.arange(5)) == 0.0
    assert adjacent_shared_blocks(t, order_indices(t, "grouped")) == 5 / 4
    assert adjacent_shared_blocks(t, order_indices(t, "dfs")) == 6 / 4


def _interleaved(tmp_path: Path) -> Path:
    """Two task templates (ids 0-3, 100-103), 3 requests each, submitted A B A B A B; each
    prompt 96 tokens = 4 shared + 2 unique 16-token blocks."""
    rows, u = [], 1000
    for _ in range(3):
        for base in (0, 100):
            rows.append({"request_id": len(rows), "type": "text", "input_length": 96,
                         "hash_ids": [base, base + 1, base + 2, base + 3, u, u + 1],
                         "img_ids": []})
            u += 2
    p = tmp_path / "batch.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_study_interleaved_batch_exact(tmp_path):
    """8 HBM blocks, no lower tier, one request at a time.  Grouped / DFS: every request
    after a template's first re-uses its 4 shared blocks (4 x 64 = 256 tokens).
    Submission order: the other template's 6 blocks evict 4 of the 6 cached (tail first),
    leaving each template's first 2 blocks: 4 x 32 = 128 tokens."""
    t = read_requests(_interleaved(tmp_path), output_tokens=1)
    df = reorder_study(t, config=SimConfig(hbm_blocks=8, dram_gb=0, cxl_gb=0, nvme_gb=0),
                       engine=EngineOptions(max_num_seqs=1))
    assert df["order"].tolist() == ["submission", "grouped", "dfs"]
    assert df["hit_tokens"].tolist() == [128, 256, 256]
    assert df["prefix_hit_rate"].tolist() == pytest.approx([128 / 576, 256 / 576, 256 / 576])
    assert (df["makespan_s"].iloc[1:] < df["makespan_s"].iloc[0]).all()
    assert df["makespan_vs_submission"].iloc[0] == 1.0
    # with room for both templates the order no longer matters
    df = reorder_study(t, config=SimConfig(hbm_blocks=12, dram_gb=0, cxl_gb=0, nvme_gb=0),
                       engine=EngineOptions(max_num_seqs=1))
    assert df["hit_tokens"].tolist() == [256, 256, 256]


def test_servegen_trace_a_head_is_already_dfs():
    """trace_a (dictionary translation): every request shares the same 10-block template,
    so submission order is already a DFS order and reordering changes nothing."""
    t = read_requests(SERVEGEN / "trace_a_head20.jsonl")
    assert order_indices(t, "dfs").tolist() == list(range(20))
    df = reorder_study(t, orders=["submission", "dfs"])
    assert df["hit_tokens"].tolist() == [19 * 160, 19 * 160]


def test_cli_reorder_json(tmp_path):
    res = CliRunner().invoke(app, ["reorder", "--request-trace", str(_interleaved(tmp_path)),
                                   "--output-tokens", "1", "--hbm-blocks", "8",
                                   "--dram-gb", "0", "--cxl-gb", "0", "--nvme-gb", "0",
                                   "--max-num-seqs", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [r["hit_tokens"] for r in out["orders"]] == [128, 256, 256]


def test_cli_reorder_bad_order(tmp_path):
    res = CliRunner().invoke(app, ["reorder", "--request-trace", str(_interleaved(tmp_path)),
                                   "--orders", "submission,random"])
    assert res.exit_code == 2 and "--orders" in res.stderr and "random" in res.stderr


def test_dropped_requests_are_a_warning_and_none_served_is_refused(capsys):
    """Issue 38 on reorder: some requests dropped -> one warning line; every one dropped in
    every order -> one error naming the option that sized HBM (main: exit 0, nulls)."""
    from kvsim.cli.reorder import _check_dropped
    from kvsim.core.errors import KvsimInputError

    rows = [{"order": o, "requests": 65, "dropped_requests": 21} for o in ("submission", "dfs")]
    _check_dropped(rows, SimConfig(hbm_blocks=400))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: 21 of 65 requests dropped")
    assert "--hbm-blocks" in err[0]
    _check_dropped([{**r, "dropped_requests": 0} for r in rows], SimConfig())
    assert capsys.readouterr().err == ""
    with pytest.raises(KvsimInputError, match="all 65 requests were dropped") as info:
        _check_dropped([{**r, "dropped_requests": 65} for r in rows], SimConfig(hbm_gb=0.01))
    assert info.value.field == "--hbm-gb"


def test_a_burst_sharing_a_cached_prefix_fits_the_step_block_lists(tmp_path):
    """40 requests queued at t = 0 share a 20-block prefix (16-token blocks), each with one
    block of its own, on a 64-block pool: vLLM caches the first one's blocks when it
    allocates them, so the next ones hit the prefix in the same step and one step lists
    ~40 tables of 21 blocks (~840 ids), far past the pool (2 x 64 + 16 = 144 ids, the old
    bound of that buffer: ``ValueError: vllm_step: block id buffer full`` on the session-18
    main, found by ``reorder --hbm-blocks 400`` on traces/sample_mooncake.jsonl)."""
    prefix = " ".join(str(b) for b in range(20))
    t = read_requests(_generic(tmp_path, [f"{prefix} {100 + i}" for i in range(40)]))
    df = reorder_study(t, orders=("submission",),
                       config=SimConfig(hbm_blocks=64, dram_gb=0, cxl_gb=0, nvme_gb=0))
    assert df["requests"].tolist() == [40]
    # every request but the first hits the 20 shared blocks (320 tokens)
    assert df["hit_tokens"].tolist() == [39 * 320]
