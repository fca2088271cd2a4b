"""Readers read what they must (byte-order marks, compressed files) and refuse what they
must not (limits, digits in other scripts, values beyond int64), with exact messages."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import pytest

from kvsim.analysis.trace_summary import summarize_trace
from kvsim.core.errors import KvsimInputError, KvsimWarning
from kvsim.core.limits import DEFAULT_LIMITS, get_limits
from kvsim.ingest import read_requests
from kvsim.ingest.tracefile import as_float, as_int

DATA = Path(__file__).resolve().parent / "data"
TRACES = Path(__file__).resolve().parents[2] / "traces"
BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("name, fmt", [("mooncake_small.jsonl", None),
                                       ("azure_small.csv", None),
                                       ("openai_small.jsonl", None)])
@pytest.mark.parametrize("compress", [False, True])
def test_byte_order_mark_is_read_like_any_other_file(tmp_path, name, fmt, compress) -> None:
    data = (DATA / name).read_bytes()
    path = tmp_path / (name + (".gz" if compress else ""))
    path.write_bytes(gzip.compress(BOM + data, mtime=0) if compress else BOM + data)
    ours = read_requests(path, fmt).df
    ref = read_requests(DATA / name, fmt).df
    assert ours.drop(columns="block_ids").equals(ref.drop(columns="block_ids"))
    assert [list(x) for x in ours["block_ids"]] == [list(x) for x in ref["block_ids"]]


def test_event_file_with_byte_order_mark(tmp_path) -> None:
    src = TRACES / "sample_fork.jsonl"
    path = tmp_path / "bom.jsonl"
    path.write_bytes(BOM + src.read_bytes())
    assert summarize_trace(path) == summarize_trace(src)


@pytest.mark.parametrize("value, message", [
    ("\u0663\u0660\u0660", "written in ASCII digits"),
    ("\uff13\uff10\uff10", "written in ASCII digits"),
    (2**63, "<= 9,223,372,036,854,775,807 (int64)"),
    ("1e300", "(int64)"),
    (1.5, "expected an integer"),
    (True, "expected an integer"),
])
def test_as_int_refuses(value, message) -> None:
    with pytest.raises(KvsimInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        as_int(value, "f.jsonl", "line 3", "input_length")


def test_as_int_and_as_float_accept() -> None:
    assert as_int(" 300 ", "f", "line 1", "x") == 300
    assert as_int("1e3", "f", "line 1", "x") == 1000
    assert as_int(2**63 - 1, "f", "line 1", "x") == 2**63 - 1
    assert as_float("2.5", "f", "line 1", "x") == 2.5
    with pytest.raises(KvsimInputError, match="finite"):
        as_float(10**400, "f", "line 1", "x")  # an int beyond float range


def test_limits_default_and_environment_override(monkeypatch, tmp_path) -> None:
    assert get_limits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_output_tokens == 1_048_576
    path = tmp_path / "mc.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2000000, '
                    '"hash_ids": [1]}\n')
    with pytest.raises(KvsimInputError, match=r"mc.jsonl: line 1: field 'output_length': "
                       r"expected an integer >= 1 and <= 1,048,576"):
        read_requests(path)
    monkeypatch.setenv("KVSIM_LIMIT_MAX_OUTPUT_TOKENS", "3000000")
    assert int(read_requests(path).df["output_tokens"][0]) == 2_000_000
    monkeypatch.setenv("KVSIM_LIMIT_MAX_OUTPUT_TOKENS", "lots")
    with pytest.raises(KvsimInputError, match="KVSIM_LIMIT_MAX_OUTPUT_TOKENS"):
        get_limits()


def test_mooncake_prefix_tree_warning_counts_requests(tmp_path) -> None:
    path = tmp_path / "mc.jsonl"
    lines = ['{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}',
             '{"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [3, 2]}',
             '{"timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}',
             '{"timestamp": 3, "input_length": 1000, "output_length": 1, "hash_ids": [2, 1]}']
    path.write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = read_requests(path)
    assert len(table) == 4
    msgs = [str(w.message) for w in caught if issubclass(w.category, KvsimWarning)]
    assert len(msgs) == 1
    assert "2 of 4 requests" in msgs[0] and "first: line 2: id 2 at position 1 follows 3, " \
        "elsewhere 1" in msgs[0]
    with pytest.raises(KvsimInputError, match="line 2: field 'hash_ids': expected prefix"):
        read_requests(path, strict=True)
    ok = tmp_path / "ok.jsonl"
    ok.write_text("\n".join(lines[:1] + lines[2:3]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_requests(ok)) == 2


@pytest.mark.parametrize("name, data", [
    ("empty.jsonl", b""), ("blank.jsonl", b"\n \n"), ("empty.csv", b""),
])
def test_no_requests_is_an_error(tmp_path, name, data) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    fmt = "azure" if name.endswith(".csv") else "mooncake"
    with pytest.raises(KvsimInputError, match="empty file|at least one request"):
        read_requests(path, fmt)
