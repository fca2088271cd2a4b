"""Pack the kv-cache-tester Claude-Code conversations in ../shared/traces/claude-code-agentic/
(one JSON per file, Apache-2.0) into the Weka layout (JSONL, one trace per line) that
SemiAnalysis publishes (``semianalysisai/cc-traces-weka-*``): the same objects
(``id, models, block_size: 64, hash_id_scope, tool_tokens, system_tokens, requests``), one per
line.  The output is a stand-in for the Weka dataset, which this machine cannot download;
it is never committed (docs/benchmarks.md, "Issue 37").

    python bench/make_weka_sample.py OUT.jsonl [N [SRC]]   # first N conversations by name
                                                           # (SRC: default ../shared/...)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "shared" / "traces" / "claude-code-agentic"


def main(out: str, n: int | None = None, src: Path = SRC) -> None:
    files = sorted(src.glob("trace_*.json"))[:n]
    if not files:
        sys.exit(f"no conversations under {src}")
    with open(out, "w", encoding="utf-8") as fh:
        for f in files:
            doc = json.loads(f.read_text())
            doc.pop("totals", None)
            fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{len(files)} traces -> {out}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None,
         Path(sys.argv[3]) if len(sys.argv) > 3 else SRC)
