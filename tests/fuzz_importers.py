"""Mutation fuzzing of every importer: no input may end in a traceback or a hang.

For each importer a few valid seed files (the bundled samples in ``traces/``, the importer
fixtures in ``tests/ingest/data/`` and, when present, the first lines of the real traces
in ``../shared/traces/``) are mutated at random (seeded):

* bytes: flip, insert, delete, truncate at a random point, prepend a byte-order mark,
  append binary garbage, gzip / zstandard the result (sometimes truncated);
* records (JSON lines, JSON documents, CSV cells): delete a field, retype it (string,
  list, object, null, bool, float), set it huge (2**70, 1e300, 1e11, -1, NaN literal,
  digits in other scripts), duplicate or drop a line.

Each mutated file is read by the importer's API (``read_requests``; kvmi:
``convert_kvmi``; event files: ``summarize_trace``) and, for one input in
``lower_every``, also lowered to an event file.  Outcome per input: ``ok`` (read),
``error`` (a :class:`~kvsim.core.errors.KvsimInputError`: the contract), ``traceback`` (any
other exception: a bug) or ``hang`` (over the per-input timeout, SIGALRM).

Run the full campaign (docs/cli.md gives the command and the result)::

    python -m tests.fuzz_importers --per-importer 10000 --timeout-s 10

A short run (a few hundred inputs) is in the default test suite:
``tests/test_fuzz_importers.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "ingest" / "data"
SHARED = ROOT.parent / "shared" / "traces"
GENERIC_MAP = "arrival_ms=ts,prompt_tokens=in,output_tokens=out,block_ids=ids,session=user"

#: Replacement values for a field (JSON) or a cell (CSV).
EVIL = [None, True, False, "", "x", "12", "-1", "1e300", "nan", "inf", "\u0663\u0660\u0660",
        "\uff13\uff10\uff10", [], [1, 2], {}, {"a": 1}, 0, -1, 1.5, 2**63, 2**70, -2**70,
        1e300, -1e300, 1e11, 10**11, 4294967296, 1e-300, "9" * 40, [2**70], ["a"], [None],
        [1.5], "2023-13-45 99:99:99", "1970-01-01T00:00:00Z", "\x00", "\ud7ff"]
EVIL_TEXT = ["", "x", "-1", "1e300", "nan", "inf", "-inf", "\u0663\u0660", "\uff13", "9" * 30,
             "1.5", "0", "4294967296", "1;2;3", "\x00", '"', "a,b", "1 " + str(2**70)]


@dataclass
class Seed:
    importer: str  # key of IMPORTERS
    name: str
    data: bytes
    suffix: str  # file name ending that keeps the format detectable


def _first_lines(path: Path, n: int) -> bytes | None:
    if not path.is_file():
        return None
    with open(path, "rb") as fh:
        return b"".join(fh.readline() for _ in range(n))


def seeds() -> list[Seed]:
    out = [
        Seed("mooncake", "mooncake_small", (DATA / "mooncake_small.jsonl").read_bytes(),
             ".jsonl"),
        Seed("azure", "azure_small", (DATA / "azure_small.csv").read_bytes(), ".csv"),
        Seed("openai", "openai_small", (DATA / "openai_small.jsonl").read_bytes(), ".jsonl"),
        Seed("generic", "generic_small", (DATA / "generic_small.csv").read_bytes(), ".csv"),
        Seed("generic_jsonl", "generic_jsonl", b"".join(
            json.dumps({"ts": i * 250, "in": 40 + i, "out": 3, "ids": [7, 8 + i],
                        "user": f"u{i % 2}"}).encode() + b"\n" for i in range(4)), ".jsonl"),
        Seed("kvmi", "kvmi_small", (DATA / "kvmi_small.jsonl").read_bytes(), ".jsonl"),
        Seed("events", "sample_chat_head", _first_lines(ROOT / "traces" / "sample_chat.jsonl",
                                                         60), ".jsonl"),
        Seed("events", "sample_fork", (ROOT / "traces" / "sample_fork.jsonl").read_bytes(),
             ".jsonl"),
    ]
    # issue 37's formats (samples written from their documentation; ServeGen's real head)
    servegen = ROOT / "tests" / "fixtures" / "servegen"
    out += [
        Seed("weka", "weka_small", (DATA / "weka_small.jsonl").read_bytes(), ".jsonl"),
        Seed("dynamo", "dynamo_small", (DATA / "dynamo_small.jsonl").read_bytes(), ".jsonl"),
        Seed("otel", "otel_small", (DATA / "otel_small.jsonl").read_bytes(), ".jsonl"),
        Seed("azure-mm", "azure_mm_small", (DATA / "azure_mm_small.csv").read_bytes(),
             ".csv"),
        Seed("servegen", "servegen_a", _first_lines(servegen / "trace_a_head20.jsonl", 8),
             ".jsonl"),
        Seed("servegen", "servegen_d", (servegen / "trace_d_head10.jsonl").read_bytes(),
             ".jsonl"),
    ]
    for f in sorted((DATA / "agentic_small").glob("*.json")):
        out.append(Seed("agentic", f"agentic_{f.stem}", f.read_bytes(), ".json"))
    real = [("mooncake", SHARED / "mooncake" / "conversation_trace.jsonl", ".jsonl"),
            ("azure", SHARED / "azure" / "AzureLLMInferenceTrace_code.csv", ".csv")]
    for importer, path, suffix in real:
        data = _first_lines(path, 12)
        if data:
            out.append(Seed(importer, f"real_{path.stem}", data, suffix))
    small_agentic = SHARED / "claude-code-agentic" / "trace_0505.json"
    if small_agentic.is_file():
        out.append(Seed("agentic", "real_trace_0505", small_agentic.read_bytes(), ".json"))
    return out


# ------------------------------------------------------------------------------ mutations

def _mutate_json_value(rng: random.Random, obj):
    """Delete, retype or blow up one field somewhere in ``obj`` (in place when possible)."""
    containers = []

    def walk(o, depth):
        if depth > 6:
            return
        if isinstance(o, dict) and o:
            containers.append(o)
            for v in o.values():
                walk(v, depth + 1)
        elif isinstance(o, list) and o:
            containers.append(o)
            for v in o[:20]:
                walk(v, depth + 1)

    walk(obj, 0)
    if not containers:
        return rng.choice(EVIL)
    c = rng.choice(containers)
    if isinstance(c, dict):
        k = rng.choice(list(c))
        if rng.random() < 0.25:
            del c[k]
        else:
            c[k] = rng.choice(EVIL)
    else:
        i = rng.randrange(len(c))
        if rng.random() < 0.25:
            del c[i]
        else:
            c[i] = rng.choice(EVIL)
    return obj


def _dumps(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


def mutate_records(rng: random.Random, data: bytes, suffix: str) -> bytes:
    if suffix == ".json":
        try:
            return _dumps(_mutate_json_value(rng, json.loads(data)))
        except ValueError:
            return data
    lines = data.split(b"\n")
    body = [i for i, ln in enumerate(lines) if ln.strip()]
    if not body:
        return data
    i = rng.choice(body)
    op = rng.random()
    if op < 0.1:
        del lines[i]
    elif op < 0.2:
        lines.insert(i, lines[i])
    elif suffix == ".csv":
        cells = lines[i].decode("utf-8", "replace").split(",")
        j = rng.randrange(len(cells))
        if rng.random() < 0.15:
            del cells[j]
        else:
            cells[j] = rng.choice(EVIL_TEXT)
        lines[i] = ",".join(cells).encode("utf-8", "surrogatepass")
    else:
        try:
            lines[i] = _dumps(_mutate_json_value(rng, json.loads(lines[i])))
        except ValueError:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    return b"\n".join(lines)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    op = rng.random()
    if op < 0.3 and b:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op < 0.45:
        pos = rng.randrange(len(b) + 1)
        b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif op < 0.6 and b:
        pos = rng.randrange(len(b))
        del b[pos:pos + rng.randint(1, 16)]
    elif op < 0.8:
        b = b[: rng.randrange(len(b) + 1)]
    elif op < 0.9:
        b = bytearray(b"\xef\xbb\xbf") + b
    else:
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(b)


def mutate(rng: random.Random, seed: Seed) -> tuple[bytes, str]:
    """(mutated bytes, file suffix) of one fuzz input."""
    data = seed.data
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        data = mutate_records(rng, data, seed.suffix) if rng.random() < 0.6 \
            else mutate_bytes(rng, data)
    suffix = seed.suffix
    r = rng.random()
    if r < 0.06:
        data = gzip.compress(data, mtime=0)
        suffix += ".gz"
    elif r < 0.1:
        import zstandard

        data = zstandard.ZstdCompressor(level=1).compress(data)
        suffix += ".zst"
    if suffix.endswith((".gz", ".zst")) and rng.random() < 0.3:
        data = data[: rng.randrange(len(data) + 1)]
    return data, suffix


# ------------------------------------------------------------------------------ running

class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_importer(importer: str, path: Path, out_dir: Path, lower: bool) -> None:
    """Read ``path`` with ``importer``'s API (and lower it when ``lower``)."""
    from kvsim.engine.lowering import lower_requests
    from kvsim.ingest import read_requests

    if importer == "events":
        from kvsim.analysis.trace_summary import summarize_trace

        summarize_trace(path)
        return
    if importer == "kvmi":
        from kvsim.ingest.kvmi import convert_kvmi

        convert_kvmi(path, out_dir / "kvmi.parquet")
        return
    fmt = "generic" if importer == "generic_jsonl" else importer
    mapping = GENERIC_MAP if fmt == "generic" else None
    table = read_requests(path, fmt, mapping)
    if lower:
        lower_requests(table, out_dir / "events.parquet", num_gpu_blocks=4096)


@dataclass
class Report:
    counts: dict[str, Counter] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, importer: str, outcome: str) -> None:
        self.counts.setdefault(importer, Counter())[outcome] += 1


def fuzz(per_importer: int, seed: int = 0, timeout_s: float = 10.0, lower_every: int = 10,
         keep_failures: Path | None = None, importers: list[str] | None = None,
         log=None) -> Report:
    """Run ``per_importer`` mutated inputs through each importer; return the outcomes."""
    import warnings

    from kvsim.core.errors import KvsimInputError, KvsimWarning

    warnings.simplefilter("ignore", KvsimWarning)
    all_seeds = seeds()
    by_importer: dict[str, list[Seed]] = {}
    for s in all_seeds:
        by_importer.setdefault(s.importer, []).append(s)
    names = importers or sorted(by_importer)
    rng = random.Random(seed)
    report = Report()
    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        with tempfile.TemporaryDirectory(prefix="kvsim-fuzz-") as tmp:
            tmp = Path(tmp)
            for name in names:
                for n in range(per_importer):
                    s = rng.choice(by_importer[name])
                    data, suffix = mutate(rng, s)
                    path = tmp / f"input{suffix}"
                    path.write_bytes(data)
                    lower = lower_every > 0 and n % lower_every == 0
                    outcome, detail = "ok", ""
                    signal.setitimer(signal.ITIMER_REAL, timeout_s)
                    try:
                        run_importer(name, path, tmp, lower)
                    except KvsimInputError as exc:
                        outcome = "error"
                        if "\n" in str(exc):
                            outcome, detail = "traceback", "multi-line error: " + str(exc)
                    except _Timeout:
                        outcome, detail = "hang", f"over {timeout_s} s"
                    except Exception:  # noqa: BLE001 - every other exception is a bug
                        outcome, detail = "traceback", traceback.format_exc(limit=6)
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    report.add(name, outcome)
                    if outcome in ("traceback", "hang"):
                        rec = {"importer": name, "seed": s.name, "input": n,
                               "outcome": outcome, "detail": detail[-2000:]}
                        report.failures.append(rec)
                        if keep_failures is not None:
                            keep_failures.mkdir(parents=True, exist_ok=True)
                            (keep_failures / f"{name}_{n}{suffix}").write_bytes(data)
                        if log:
                            log(f"{outcome}: {name} input {n} ({s.name}): "
                                f"{detail.strip().splitlines()[-1] if detail else ''}")
                    for p in tmp.iterdir():
                        p.unlink()
    finally:
        signal.signal(signal.SIGALRM, old)
    report.seconds = time.perf_counter() - t0
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-importer", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--lower-every", type=int, default=10,
                    help="also lower every Nth input to an event file (0 = never)")
    ap.add_argument("--importer", action="append", help="only these importers")
    ap.add_argument("--keep-failures", type=Path, help="write failing inputs here")
    args = ap.parse_args(argv)
    rep = fuzz(args.per_importer, args.seed, args.timeout_s, args.lower_every,
               args.keep_failures, args.importer,
               log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps({"per_importer": args.per_importer, "seed": args.seed,
                      "seconds": round(rep.seconds, 1),
                      "outcomes": {k: dict(v) for k, v in sorted(rep.counts.items())},
                      "failures": len(rep.failures)}, indent=2))
    return 1 if rep.failures else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
