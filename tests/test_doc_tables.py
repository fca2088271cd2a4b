"""The example tables of docs/simulate.md and docs/policies.md are the output of
bench/doc_tables.py (one run of the README's main job): they cannot go stale (issue #33).
After a change that moves them: `python bench/doc_tables.py` rewrites them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_markers_are_in_place():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import doc_tables
    finally:
        sys.path.pop(0)
    for name, doc in doc_tables.DOCS.items():
        assert doc_tables._span(name).search(doc.read_text(encoding="utf-8")), name


@pytest.mark.slow  # the README's main job (~5 s warm, ~35 s cold on 2 cores)
def test_doc_tables_match_a_fresh_run():
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "doc_tables.py"), "--check"],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
