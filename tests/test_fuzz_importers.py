"""The short fuzz run of the default suite: mutated inputs for every importer end in a
result or a one-line KvsimInputError, never a traceback or a hang (the full campaign,
10,000 inputs per importer, is ``python -m tests.fuzz_importers``; docs/cli.md)."""

from __future__ import annotations

import random

from tests.fuzz_importers import fuzz, mutate, seeds

PER_IMPORTER = 40  # x 13 importers = 520 inputs, ~25 s


def test_every_importer_has_seeds_and_mutations_differ() -> None:
    by = {}
    for s in seeds():
        by.setdefault(s.importer, []).append(s)
    assert {"mooncake", "azure", "openai", "agentic", "kvmi", "generic", "generic_jsonl",
            "events"} <= set(by)
    rng = random.Random(1)
    s = by["mooncake"][0]
    outs = {mutate(rng, s)[0] for _ in range(50)}
    assert len(outs) > 40  # 50 mutations of one seed: (nearly) all distinct


def test_short_fuzz_run_finds_no_traceback_and_no_hang() -> None:
    report = fuzz(PER_IMPORTER, seed=12345, timeout_s=20.0, lower_every=8)
    assert report.failures == [], report.failures[:3]
    for importer, counts in report.counts.items():
        assert sum(counts.values()) == PER_IMPORTER
        # the mutations reach both outcomes: some inputs still read, most are refused
        assert counts["error"] > 0 and counts["ok"] > 0, (importer, dict(counts))
