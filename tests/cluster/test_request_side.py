"""The closed loop's request side (issues #34 and #38): a ``simulate --request-trace ...
--json`` run imports no pandas; the Request table holds numpy columns and its block ids as
one flat int64 array with offsets (no Python object per request), parsed a batch at a time;
the per-request results are numpy columns whose figures equal the DataFrame's bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from kvsim.ingest import mooncake
from kvsim.ingest.mooncake import read_mooncake
from kvsim.ingest.requests import REQUEST_COLUMNS, RequestTable, build_request_table

#: bytes a request of the non-list columns of REQUEST_COLUMNS take as numpy columns
#: (``model`` is an object column: one pointer a row), and of its offset in the CSR pair
COLUMN_BYTES = sum(8 if dtype == "string" else np.dtype(dtype).itemsize
                   for _name, dtype, _ in REQUEST_COLUMNS if dtype != "list") + 8


def _mooncake(path, n: int, k: int = 4) -> None:
    """A Mooncake trace of ``n`` requests of ``k`` ids each (the first shared by all)."""
    lines, nxt = [], 1
    for i in range(n):
        ids = [0, *range(nxt, nxt + k - 1)]
        nxt += k - 1
        lines.append(json.dumps({"timestamp": i * 50, "input_length": 512 * k - 100,
                                 "output_length": 8 + i % 5, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("extra", [[], ["--replicas", "3", "--router", "prefix"]],
                         ids=["1-replica", "3-replicas"])
def test_closed_loop_json_run_imports_no_pandas(tmp_path, extra) -> None:
    """pandas costs ~0.27 CPU-s a process (issue #34): a closed-loop run that prints
    ``--json`` builds no DataFrame, so it never imports pandas."""
    trace = tmp_path / "t.jsonl"
    _mooncake(trace, 40)
    argv = ["simulate", "--request-trace", str(trace), "--block-size", "512",
            "--hbm-blocks", "64", "--json", *extra]
    code = ("import sys, json\nfrom kvsim.cli import app\n"
            f"sys.argv = ['kvsim', *{argv!r}]\n"
            "code = 0\n"
            "try:\n    app()\nexcept SystemExit as e:\n    code = e.code or 0\n"
            "print(json.dumps({'pandas': 'pandas' in sys.modules, 'exit': code}), "
            "file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="120"), timeout=600)
    got = json.loads(p.stderr.strip().splitlines()[-1])
    assert got == {"pandas": False, "exit": 0}, p.stderr[-2000:]
    assert json.loads(p.stdout)["policies"][0]["requests"] == 40


def test_request_table_memory_per_request_is_its_columns(tmp_path, monkeypatch) -> None:
    """The Mooncake reader's table retains its columns and 8 bytes an id, nothing per
    request on top (it held one numpy array per request, ~110 bytes, and its CSR pair was
    a second copy of every id each time it was asked for).  20,000 requests: Python's
    free lists (~2,000 tuples of the last parsed batch) stay under 8 bytes a request."""
    monkeypatch.setenv("KVSIM_TRACE_CACHE", "0")  # the parse's table (kvsim.core.parsed_cache)
    n, k = 20000, 4
    trace = tmp_path / "t.jsonl"
    _mooncake(trace, n, k)
    read_mooncake(trace)  # warm: imports and caches are not the table's
    tracemalloc.start()
    try:
        table = read_mooncake(trace)
        retained = tracemalloc.get_traced_memory()[0]
        off, ids = table.flat_block_ids()
        again = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(ids) == n * k and len(off) == n + 1
    # this branch: 147 bytes a request; main: 260
    assert retained / n <= COLUMN_BYTES + 8 * k + 16, retained / n
    assert again - retained < 4096  # the table's own arrays, not a copy
    assert table.flat_block_ids()[1] is ids


def test_mooncake_parse_peak_is_not_python_ints(tmp_path, monkeypatch) -> None:
    """The fast path parses a batch of lines at a time into numpy: above the table, its
    peak is one batch's Python objects and the prefix-tree check's numpy temporaries
    (~60 bytes an id), not every id of the trace as a Python int in a list (~104 bytes
    an id on main)."""
    monkeypatch.setattr(mooncake, "_CHUNK_CHARS", 1 << 15)
    monkeypatch.setenv("KVSIM_TRACE_CACHE", "0")  # the parse, not a parsed-trace cache hit
    n, k = 20000, 16
    trace = tmp_path / "t.jsonl"
    _mooncake(trace, n, k)
    read_mooncake(trace)
    tracemalloc.start()
    try:
        table = read_mooncake(trace)
        retained, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table) == n
    assert (peak - retained) / (n * k) < 75, (peak - retained) / (n * k)


def test_table_columns_and_frame_agree() -> None:
    """``RequestTable.df`` (built when first read) holds what the columns hold; rows are
    sorted by arrival with their ids; ``take`` renumbers; an edit of ``df`` is what
    ``column`` reads afterwards."""
    cols = {"arrival_us": [30, 10, 20], "prompt_tokens": [5, 40, 17],
            "output_tokens": [1, 2, 3], "block_ids": [[7], [1, 2, 3], [4, 5]],
            "hashed_tokens": [5, 40, 17]}
    t = build_request_table(cols, block_size_tokens=16)
    assert t.column("arrival_us").tolist() == [10, 20, 30]
    off, ids = t.flat_block_ids()
    assert off.tolist() == [0, 3, 5, 6] and ids.tolist() == [1, 2, 3, 4, 5, 7]
    kept = t.take(np.array([True, False, True]))
    assert kept.column("request_id").tolist() == [0, 1]
    assert [x.tolist() for x in kept.df["block_ids"]] == [[1, 2, 3], [7]]
    df = t.df
    assert list(df.columns) == [c[0] for c in REQUEST_COLUMNS]
    assert [x.tolist() for x in df["block_ids"]] == [[1, 2, 3], [4, 5], [7]]
    assert df["tenant"].dtype == np.int32 and df["model"].tolist() == ["", "", ""]
    df.loc[0, "prompt_tokens"] = 41
    assert t.column("prompt_tokens").tolist() == [41, 17, 5]
    old = RequestTable(df=df.copy(), block_size_tokens=16)  # a table made of a DataFrame
    assert old.flat_block_ids()[1].tolist() == ids.tolist()
    assert old.take(np.array([False, True, True])).column("request_id").tolist() == [0, 1]


def test_cluster_requests_figures_equal_the_dataframes() -> None:
    """The summary's per-request figures from the numpy columns (ClusterRequests) are the
    DataFrame path's (kvsim.replay.metrics.summarize), bit for bit, with and without a
    measurement window."""
    from kvsim.modes.closed.serving_metrics import ClusterRequests, serving_keys
    from kvsim.replay.metrics import REQUEST_COLUMNS as RC

    rng = np.random.default_rng(3)
    n = 257
    cols = {}
    for name in RC:
        if name in ("ttft_missed", "deadline_bound"):
            cols[name] = rng.random(n) < 0.3
        elif name.endswith("_us") and name not in ("ttft_deadline_us",):
            v = rng.random(n) * 1e6
            v[rng.random(n) < 0.1] = np.nan
            cols[name] = v
        else:
            cols[name] = rng.integers(0, 5000, n).astype(np.int64)
    cols["request_id"] = np.arange(n, dtype=np.int64)
    cols["lookup_tokens"][::7] = 0
    cr = ClusterRequests(cols)
    frame = cr.frame()
    for measured in (None, np.arange(40, n, dtype=np.int64)):
        f = cr.figures(measured, 16)
        rq = frame if measured is None else frame[frame["request_id"].isin(measured)]
        assert f["requests"] == len(rq)
        assert f["lookup_tokens"] == int(rq["lookup_tokens"].sum())
        assert f["hit"] == [int(rq[c].sum()) for c in ("hbm_hit_tokens", "dram_hit_tokens",
                                                       "cxl_hit_tokens", "nvme_hit_tokens")]
        adm = rq["lookup_tokens"] > 0
        assert f["prompt_blocks"] == int(((rq["prompt_tokens"][adm] + 15) // 16).sum())
        assert f["ttft_missed"] == int(rq["ttft_missed"].sum())
        assert f["tpot_missed"] == int(rq["tpot_missed_tokens"].sum())
        for k in ("ttft_us", "tpot_us", "e2e_us"):
            x = rq[k].to_numpy()
            x = x[~np.isnan(x)]
            assert f[k] == [float(np.percentile(x, q)) for q in (50, 99)]
        a = serving_keys(cr.select(measured), 3.5e6, "closed", 2, "prefix", 0, 0)
        b = serving_keys(rq, 3.5e6, "closed", 2, "prefix", 0, 0)
        assert json.dumps(a) == json.dumps(b)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == list(cols)


@pytest.mark.parametrize("warm_step", [None, 40])
def test_cluster_step_stats_streamed_equal_in_memory(warm_step) -> None:
    """The replicas' step-latency figures streamed from spilled rows (bounded memory) are
    the in-memory ones bit for bit (they held every replica's (step, latency) columns and
    their concatenation: ~40 bytes a step, 100 MB for 8 replicas of the Mooncake trace)."""
    from kvsim.core import layout as L
    from kvsim.core.spill import SpilledRows
    from kvsim.modes.closed.serving_metrics import ClusterSteps, percentiles
    from kvsim.replay.metrics import STEP_PERCENTILES

    def parts(mem_rows):
        out = []
        for r, (n, keep) in enumerate(((700, None), (523, 30), (300, False), (911, 0))):
            rows = SpilledRows(L.NS, mem_rows=mem_rows)
            a = np.zeros((n, L.NS))
            a[:, L.S_STEP] = np.arange(n)
            a[:, L.S_LATENCY_US] = np.random.default_rng(r).random(n) * 1e4
            for lo in range(0, n, 97):
                rows.append(a[lo:lo + 97])
            out.append([r, rows, np.zeros(n, np.int64), 0, keep])
        return out

    spilled, held = ClusterSteps(parts(64)), ClusterSteps(parts(None))
    assert all(p[1].spilled for p in spilled.parts)
    assert not any(p[1].spilled for p in held.parts)
    a, b = spilled.latency_stats(warm_step), held.latency_stats(warm_step)
    assert json.dumps(a) == json.dumps(b)
    lat = np.concatenate([
        c[:, L.S_LATENCY_US][(c[:, L.S_STEP] >= (p[4] or 0)) & (p[4] is not False)
                             & (c[:, L.S_STEP] >= (warm_step or 0))]
        for p in held.parts for c in [p[1].to_array()]])
    assert a == (len(lat), float(lat.mean()), percentiles(lat, STEP_PERCENTILES))
    assert len(spilled) == len(held) == 700 + 523 - 30 + 911
