"""Short fuzz run over the new readers and kvsim validate: every mutated input is read or
refused with a one-line KvsimInputError, never a traceback or a hang (the campaign:
``python -m tests.ingest.fuzz_new_formats 1000 SEED``)."""

from __future__ import annotations

from tests.ingest.fuzz_new_formats import TARGETS, fuzz_new_formats


def test_short_fuzz_run_new_formats() -> None:
    counts, fails = fuzz_new_formats(30, seed=2026)
    assert fails == [], fails[:3]
    assert set(counts) == set(TARGETS)
    for target, c in counts.items():
        assert c["ok"] + c["error"] == 30
        assert c["error"] > 0, (target, c)
