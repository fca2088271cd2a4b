"""Write traces/sample_mooncake.jsonl: a small request trace in Mooncake's format, for the
README's import step (kvsim import-request-trace reads it like the real Mooncake traces).

Format (Mooncake's FAST'25 traces, docs/importers.md): one JSON object per line,
``timestamp`` (ms), ``input_length`` and ``output_length`` (tokens), ``hash_ids`` (one id
per 512-token block of the prompt; equal ids = equal content, shared prefixes).

Workload (seeded, numpy PCG64 seed 0): 12 conversations of 4-8 turns behind 3 system
prompts (4 blocks each), each turn's prompt = the previous prompt + 1-3 new blocks; turns
arrive every 2-20 s per conversation, conversations start 0-60 s apart; 40-400 output
tokens.  Rerun to regenerate byte-identically:  python traces/make_mooncake_sample.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK_TOKENS = 512  # Mooncake's hash-id granularity


def requests(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    next_id = 1
    systems = []
    for _ in range(3):
        systems.append(list(range(next_id, next_id + 4)))
        next_id += 4
    out = []
    for conv in range(12):
        t = float(rng.uniform(0, 60_000))
        prompt = list(systems[conv % 3])
        for _turn in range(int(rng.integers(4, 9))):
            new = int(rng.integers(1, 4))
            prompt = prompt + list(range(next_id, next_id + new))
            next_id += new
            last = int(rng.integers(64, BLOCK_TOKENS + 1))  # the last block is partial
            out.append({"timestamp": int(t),
                        "input_length": (len(prompt) - 1) * BLOCK_TOKENS + last,
                        "output_length": int(rng.integers(40, 401)),
                        "hash_ids": list(prompt)})
            t += float(rng.uniform(2_000, 20_000))
    out.sort(key=lambda r: (r["timestamp"], r["hash_ids"]))
    return out


def main(out_dir: Path = HERE) -> Path:
    path = Path(out_dir) / "sample_mooncake.jsonl"
    path.write_text("".join(json.dumps(r, separators=(", ", ": ")) + "\n"
                            for r in requests()), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(main())
