"""Pack the kv-cache-tester Claude-Code conversations in ../shared/traces/claude-code-agentic/
(one JSON per file, Apache-2.0) into the Weka layout that SemiAnalysis publishes
(``semianalysisai/cc-traces-weka-*``: JSONL, one trace per line, the same objects:
``id, models, block_size: 64, hash_id_scope, tool_tokens, system_tokens, requests``).  The
output stands in for the Weka dataset, which this machine cannot download; it is never
committed (docs/benchmarks.md, "Issue 37").

    python bench/make_weka_sample.py OUT.jsonl [--max-context 131072] [--n N] [--src DIR]

``--max-context``: keep only conversations whose every request (``in + out``, sub-agents
included) fits that many tokens, so a 128k-context model serves the sample without
dropping requests mid-conversation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SRC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "claude-code-agentic"


def _requests(reqs):
    for r in reqs:
        if r.get("type") == "subagent":
            yield from _requests(r.get("requests", []))
        else:
            yield r


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=None, help="at most N conversations (by name)")
    ap.add_argument("--src", type=Path, default=SRC)
    ap.add_argument("--max-context", type=int, default=None)
    args = ap.parse_args(argv)
    files = sorted(args.src.glob("trace_*.json"))
    if not files:
        raise SystemExit(f"no conversations under {args.src}")
    kept = 0
    with open(args.out, "w", encoding="utf-8") as fh:
        for f in files:
            doc = json.loads(f.read_text())
            if args.max_context is not None and any(
                    r["in"] + r["out"] > args.max_context for r in _requests(doc["requests"])):
                continue
            doc.pop("totals", None)
            fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
            kept += 1
            if args.n is not None and kept >= args.n:
                break
    print(f"{kept} of {len(files)} conversations -> {args.out}")


if __name__ == "__main__":
    main()
