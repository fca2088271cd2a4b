"""Compare measured GPU step times (bench/gpu/torch_step_time.py's JSON) with kvsim's
``measured`` step clock (AIConfigurator's kernel database, profiles/timing/).

    python bench/gpu/compare_step_time.py bench/results/gpu/h200_torch_step_times.json \\
        --gpu h200 --model llama-3.1-8b --tp 1

Prints one row per step shape: the GPU's time, kvsim's, and kvsim's error relative to the
GPU.  Runs anywhere (no GPU, no torch): it only reads the JSON.
"""

from __future__ import annotations

import argparse
import json

from kvsim.engine.timing.measured import MeasuredStepTime


def rows(doc: dict, clock: MeasuredStepTime) -> list[dict]:
    out = []
    for r in doc["rows"]:
        if "ms" not in r:
            continue
        chunks = [(r["chunk"], r["context"])] if r["chunk"] else []
        kvsim_ms = clock.step_ms(prefill_chunks=chunks,
                                 decode_contexts=[r["decode_context"]] * r["batch"])
        out.append({**r, "kvsim_ms": round(kvsim_ms, 3),
                    "kvsim_error_pct": round((kvsim_ms / r["ms"] - 1.0) * 100.0, 1)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured_json")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tp", type=int, default=1)
    args = ap.parse_args(argv)
    with open(args.measured_json) as f:
        doc = json.load(f)
    clock = MeasuredStepTime.bundled(args.gpu, args.model, args.tp)
    print(f"# {doc['device']}, torch {doc['torch']}, CUDA {doc['cuda']}; kvsim clock: "
          f"{args.gpu} / {args.model} / TP {args.tp}")
    print("| step | prefill chunk | its context | decode batch | decode context | GPU ms "
          "| kvsim ms | kvsim vs GPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows(doc, clock):
        print(f"| {r['kind']} | {r['chunk']} | {r['context']} | {r['batch']} "
              f"| {r['decode_context']} | {r['ms']:.2f} | {r['kvsim_ms']:.2f} "
              f"| {r['kvsim_error_pct']:+.1f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
