"""The Mooncake reader's memory (issue 38, "Memory"): the prefix-tree check of the fast
path (:func:`kvsim.ingest.mooncake._prefix_tree`) works a batch of ids at a time with one
parent per id value, so its working memory grows with the distinct ids, not with how often
the trace repeats them (it sorted every id of the trace: ~7 arrays of the trace's ids, the
read's peak at 10x and 100x the conversation trace), and its answer is the sort's."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from kvsim.ingest import mooncake


def _lists(copies: int, n: int = 400, seed: int = 3) -> list[list[int]]:
    """``n`` prefix-hash id lists (8 shared prefixes, then each request's own ids),
    repeated ``copies`` times: the same ids, a longer trace."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        own = int(rng.integers(1, 24))
        out.append([r % 8] + [8 + 64 * r + k for k in range(own)])
    return out * copies


def _write(path, lists) -> None:
    with path.open("w") as f:
        for t, h in enumerate(lists):
            f.write(json.dumps({"timestamp": t, "input_length": 512 * len(h),
                                "output_length": 4, "hash_ids": h}) + "\n")


def _check_peak_bytes(lists, monkeypatch) -> tuple[int, bool]:
    flat = np.array([x for h in lists for x in h], dtype=np.int64)
    lens = np.array([len(h) for h in lists], dtype=np.int64)
    monkeypatch.setattr(mooncake, "_TREE_BATCH_IDS", 1024, raising=False)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        ok = mooncake._prefix_tree(flat, lens)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, ok


def test_prefix_tree_check_does_not_grow_when_the_trace_repeats(monkeypatch) -> None:
    one, one_ok = _check_peak_bytes(_lists(1), monkeypatch)
    ten, ten_ok = _check_peak_bytes(_lists(10), monkeypatch)
    assert one_ok and ten_ok
    # what may grow: 8 bytes a request (where each list starts); the sort took ~7 x 8
    # bytes an id of the whole trace (main: 0.34 -> 2.65 MB)
    assert ten <= one + 8 * 400 * 10 + 4096, (one, ten)
    assert ten < 1.5 * one


@pytest.mark.parametrize("seed", range(6))
def test_batched_check_answers_as_the_sort(seed, monkeypatch) -> None:
    """Random prefix trees, some with an id moved under another parent, ids small or
    huge (the sort's path), batches of 1 to 7 ids: the same answer as one sort."""
    rng = np.random.default_rng(seed)

    def by_sort(flat, lens):
        prev = np.empty_like(flat)
        prev[1:] = flat[:-1]
        prev[(np.cumsum(lens) - lens)[lens > 0]] = -1
        _u, first, inv = np.unique(flat, return_index=True, return_inverse=True)
        return bool((prev == prev[first][inv.ravel()]).all())

    answers = set()
    for trial in range(120):
        parent, nxt, lists = {}, 0, []
        for _ in range(int(rng.integers(1, 16))):
            path, node = [], -1
            for _ in range(int(rng.integers(0, 6))):
                kids = [k for k, p in parent.items() if p == node]
                if kids and rng.random() < 0.6:
                    node = int(rng.choice(kids))
                else:
                    parent[nxt], node, nxt = node, nxt, nxt + 1
                path.append(node)
            lists.append(path)
        full = [h for h in lists if h]
        if full and rng.random() < 0.4:
            h = full[int(rng.integers(0, len(full)))]
            h[int(rng.integers(0, len(h)))] = int(rng.integers(0, nxt))
        flat = np.array([x for h in lists for x in h], dtype=np.int64)
        if not flat.size:
            continue
        if trial % 4 == 0:
            flat = flat * 10**15  # too large for one parent per id value: the sort
        lens = np.array([len(h) for h in lists], dtype=np.int64)
        monkeypatch.setattr(mooncake, "_TREE_BATCH_IDS", int(rng.integers(1, 8)),
                            raising=False)
        want = by_sort(flat, lens)
        assert mooncake._prefix_tree(flat, lens) == want
        answers.add(want)
    assert answers == {True, False}


def test_repeated_trace_reads_the_same_rows(tmp_path, monkeypatch) -> None:
    """The fast path still takes a repeated trace, and a broken tree still leaves it."""
    _write(tmp_path / "t.jsonl", _lists(3))
    monkeypatch.setattr(mooncake, "_TREE_BATCH_IDS", 64, raising=False)
    t = mooncake.read_mooncake(tmp_path / "t.jsonl")
    off, ids = t.flat_block_ids()
    assert len(t) == 1200 and ids.tolist() == [x for h in _lists(3) for x in h]
    lists = _lists(1)
    lists[-1] = [lists[0][1]] + lists[-1][1:]  # id 8 after nothing, elsewhere after 0
    _write(tmp_path / "b.jsonl", lists)
    assert mooncake._plain_columns(tmp_path / "b.jsonl", mooncake.get_limits()) is None
