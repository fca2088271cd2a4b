"""Mutation fuzzing of the ragpulse, bailian, burstgpt and vllm-kv-events readers and of
``kvsim validate`` (events and request log), with the mutators of tests/fuzz_importers.py,
seeded from the small files the readers' tests write.  Outcome per input: read, a one-line
KvsimInputError (the contract), or a failure (any other exception, a multi-line error, a
hang).  A short run is in tests/ingest/test_new_formats_fuzz.py; a campaign::

    python -m tests.ingest.fuzz_new_formats 1000 7
"""

from __future__ import annotations

import json
import random
import signal
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import msgpack

from tests.fuzz_importers import Seed, _mutate_json_value, mutate, mutate_bytes

TARGETS = ("bailian", "burstgpt", "ragpulse", "vllm-kv-events", "vllm-msgpack",
           "validate-log")


class _Timeout(BaseException):
    pass


def _alarm(*_):
    raise _Timeout()


def _jl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def fuzz_new_formats(n: int, seed: int = 0, timeout_s: float = 20.0):
    """(counts {target: {ok, error}}, failures [(target, input, kind, detail)])."""
    import tests.ingest.test_bailian as BL
    import tests.ingest.test_burstgpt as BG
    import tests.ingest.test_ragpulse as RP
    import tests.ingest.test_vllm_kv_events as VE
    import tests.test_validate as TV
    from kvsim.analysis.validate import validate
    from kvsim.core.errors import KvsimInputError, KvsimWarning
    from kvsim.engine.lowering import lower_requests
    from kvsim.ingest import read_requests

    warnings.simplefilter("ignore", KvsimWarning)
    seeds = {
        "bailian": [Seed("bailian", "b", _jl(BL.ROWS), ".jsonl")],
        "burstgpt": [Seed("burstgpt", "g", BG.CSV.encode(), ".csv"),
                     Seed("burstgpt", "g3", BG.CSV_SESSIONS.encode(), ".csv")],
        "ragpulse": [Seed("ragpulse", "0_trace.jsonl", _jl(RP.TRACE), ".jsonl")] + [
            Seed("side", name, _jl(rows), ".jsonl") for name, rows in RP.SIDE.items()],
        "vllm-kv-events": [Seed("v", "a", _jl(VE.array_like_batches()), ".jsonl"),
                           Seed("v", "m", _jl([VE._hex(b) for b in VE.map_batches()]),
                                ".jsonl"),
                           Seed("v", "g", _jl([VE._hex(b) for b in TV.golden_batches()]),
                                ".jsonl")],
    }
    mp_seeds = [VE.array_like_batches(), VE.map_batches(), TV.golden_batches()]
    rng = random.Random(seed)
    fails: list[tuple[str, int, str, str]] = []
    counts: dict[str, dict[str, int]] = {}
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        with tempfile.TemporaryDirectory(prefix="kvsim-fuzz-new-") as tmp_:
            tmp = Path(tmp_)
            for target in TARGETS:
                c = counts.setdefault(target, {"ok": 0, "error": 0})
                for k in range(n):
                    for p in sorted(tmp.rglob("*"), reverse=True):
                        if p.is_file():
                            p.unlink()
                    ev = None
                    if target == "ragpulse":
                        folder = RP.write_folder(tmp / "rp")
                        s = rng.choice(seeds["ragpulse"])
                        data, suffix = mutate(rng, s)
                        (folder / s.name).unlink()
                        (folder / (s.name + suffix[len(".jsonl"):])).write_bytes(data)
                        path = folder
                    elif target == "vllm-msgpack":
                        batches = json.loads(json.dumps(rng.choice(mp_seeds),
                                                        default=lambda b: b.hex()))
                        if rng.random() < 0.6:
                            i = rng.randrange(len(batches))
                            batches[i] = _mutate_json_value(rng, batches[i])
                        try:
                            data = b"".join(msgpack.packb(b, use_bin_type=True)
                                            for b in batches)
                        except OverflowError:  # msgpack cannot hold the mutated int
                            data = b""
                        if rng.random() < 0.4:
                            data = mutate_bytes(rng, data)
                        path = tmp / "r.msgpack"
                        path.write_bytes(data)
                    elif target == "validate-log":
                        ev, rl = TV.write(tmp, TV.golden_batches(), TV.golden_log())
                        data, suffix = mutate(rng, Seed("l", "l", rl.read_bytes(), ".jsonl"))
                        rl.unlink()
                        path = tmp / ("requests" + suffix)
                        path.write_bytes(data)
                    else:
                        s = rng.choice(seeds[target])
                        data, suffix = mutate(rng, s)
                        path = tmp / ("in" + suffix)
                        path.write_bytes(data)
                    signal.setitimer(signal.ITIMER_REAL, timeout_s)
                    try:
                        if target == "validate-log":
                            validate(ev, path, num_gpu_blocks=11)
                        elif target in ("vllm-kv-events", "vllm-msgpack"):
                            validate(path, num_gpu_blocks=rng.choice([None, 3, 11]),
                                     reconstruct=True)
                            read_requests(path, "vllm-kv-events")
                        else:
                            t = read_requests(path, target)
                            if k % 10 == 0:
                                lower_requests(t, tmp / "ev.parquet", num_gpu_blocks=4096)
                        c["ok"] += 1
                    except KvsimInputError as exc:
                        c["error"] += 1
                        if "\n" in str(exc):
                            fails.append((target, k, "multi-line error", str(exc)))
                    except _Timeout:
                        fails.append((target, k, "hang", f"over {timeout_s} s"))
                    except Exception:  # noqa: BLE001 - any other exception is a bug
                        fails.append((target, k, "traceback", traceback.format_exc(limit=8)))
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return counts, fails


if __name__ == "__main__":
    counts, fails = fuzz_new_formats(int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
                                     int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(counts)
    print(len(fails), "failures")
    for f in fails[:5]:
        print(*f[:3])
        print(f[3][-1500:])
    sys.exit(1 if fails else 0)
