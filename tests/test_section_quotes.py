"""Every docs/benchmarks.md section that code, benches, tests and the other docs quote by
title (``docs/benchmarks.md, "Title"``) exists: a heading of the file equal to the quote
or starting with it.  docs/benchmarks.md is reorganised by topic as figures are replaced;
a quote naming a section that is gone sends a reader nowhere (session 19 found 12)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: ``benchmarks.md, "Title"``, ``benchmarks.md "Title"``, ``benchmarks.md ("Title"``
QUOTE = re.compile(r'benchmarks\.md[,:]?\s*\(?"([^"]+)"')


def _headings() -> list[str]:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    return [re.sub(r"^#+\s*", "", line).strip() for line in text.splitlines()
            if line.startswith("#")]


def _quotes() -> list[tuple[str, str]]:
    files = [*ROOT.glob("kvsim/**/*.py"), *ROOT.glob("policies/*.py"),
             *ROOT.glob("bench/**/*.py"), *ROOT.glob("tests/**/*.py"),
             *(p for p in ROOT.glob("docs/*.md") if p.name != "benchmarks.md"),
             ROOT / "README.md"]
    out = []
    for path in sorted(set(files) - {Path(__file__).resolve()}):  # not this file's examples
        # a title wrapped over comment or docstring lines: joined ("#:" and "#" dropped)
        text = re.sub(r"\s*\n\s*(#:?\s*)?", " ", path.read_text(encoding="utf-8"))
        out += [(str(path.relative_to(ROOT)), m.group(1)) for m in QUOTE.finditer(text)]
    return out


def test_quoted_benchmark_sections_exist() -> None:
    heads = _headings()
    quotes = _quotes()
    assert len(quotes) > 20  # the pattern still finds them
    stale = [(f, q) for f, q in quotes if not any(h == q or h.startswith(q) for h in heads)]
    assert not stale, f"quotes of docs/benchmarks.md sections that do not exist: {stale}"
