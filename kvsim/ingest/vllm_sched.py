"""Read a vLLM scheduler recording (schema ``kvsim-vllm-sched`` v1, docs/vllm-recordings.md).

A recording is what ``bench/vllm/record_scheduler.py`` wrote while vLLM's own v1
``Scheduler`` ran a request trace: the header (engine config, token mapping), one line per
request (prompt segments, output length, priority, cache salt, arrival) and one line per
engine step (arrivals, scheduled tokens, block ids, hits, preemptions, finished requests,
free blocks, KV events).  This module is the part of ``bench/vllm/read_recording.py`` that
kvsim needs (standard library only: CI never installs vLLM); the token mapping is expanded
exactly as ``read_recording.expand_prompt`` does.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError

SCHEMA = "kvsim-vllm-sched"
VERSION = 1
#: Token-id stride of one ``blk`` namespace.
NS_STRIDE = 1 << 27

__all__ = ["SchedRecording", "SchedRequest", "expand_prompt", "load_sched_recording",
           "unruns"]


def unruns(enc: list) -> list[int]:
    """Decode the run encoding: ``[[3,5],[9,7],2]`` -> 3 4 5 9 8 7 2."""
    out: list[int] = []
    for x in enc:
        if isinstance(x, list):
            a, b = x
            out.extend(range(a, b + 1) if b >= a else range(a, b - 1, -1))
        else:
            out.append(x)
    return out


def expand_prompt(segments: list[dict], reqs: list[dict]) -> list[int]:
    """A prompt's token ids from its segments (the recording's token mapping)."""
    out: list[int] = []
    for seg in segments:
        if "tok" in seg:
            out.extend(int(t) for t in seg["tok"])
        elif "rep" in seg:
            tok, n = seg["rep"]
            out.extend([int(tok)] * int(n))
        elif "range" in seg:
            start, n = seg["range"]
            out.extend(range(int(start), int(start) + int(n)))
        elif "blk" in seg:
            ns, bs, h, n = (int(x) for x in seg["blk"])
            base = 1 + ns * NS_STRIDE + bs * h
            out.extend(range(base, base + n))
        elif "prompt_of" in seg:
            out.extend(reqs[int(seg["prompt_of"])]["prompt_tokens"])
        elif "output_of" in seg:
            r = reqs[int(seg["output_of"])]
            n = int(seg.get("n", r["output_len"]))
            out.extend(range(int(r["output_base"]), int(r["output_base"]) + n))
        else:
            raise KvsimInputError(f"unknown prompt segment {seg!r}")
    return out


@dataclass
class SchedRequest:
    """One recorded request, its tokens expanded."""

    idx: int
    id: str
    prompt_tokens: list[int]
    output_len: int
    output_base: int
    priority: int
    cache_salt: str | None
    arrival_ms: float | None          # None for an ``after`` request (see arrival_ms_of)
    after: dict | None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_tokens)

    @property
    def all_tokens(self) -> list[int]:
        """Prompt then every output token (the last one is sampled, never computed)."""
        return self.prompt_tokens + list(range(self.output_base,
                                               self.output_base + self.output_len))


@dataclass
class SchedRecording:
    """A parsed recording: ``steps`` are the raw step dicts (schema v1)."""

    path: str
    header: dict[str, Any]
    requests: list[SchedRequest]
    steps: list[dict[str, Any]]
    hashes: dict[str, Any] | None
    summary: dict[str, Any] | None
    engine: dict[str, Any] = field(default_factory=dict)

    @property
    def block_size(self) -> int:
        return int(self.engine["block_size"])

    def step_times_ms(self) -> list[float]:
        """T_k of every step by the recording's step clock (t_ms where written)."""
        clk = self.header["clock"]
        base, per = float(clk["step_base_ms"]), float(clk["per_token_ms"])
        out, t = [], 0.0
        for s in self.steps:
            if "t_ms" in s:
                t = float(s["t_ms"])
            out.append(t)
            t = t + base + per * sum(n for _, n in s.get("sched", []))
        return out

    def arrival_ms_of(self) -> list[float]:
        """Every request's arrival time: its ``arrival_ms``, or for an ``after`` request
        T_{k+1} + delay_ms, k the step its predecessor finished in."""
        times = self.step_times_ms()
        clk = self.header["clock"]
        base, per = float(clk["step_base_ms"]), float(clk["per_token_ms"])
        finish: dict[int, int] = {}
        for s in self.steps:
            for i in s.get("finished", []):
                finish[i] = s["step"]
        out = []
        for r in self.requests:
            if r.arrival_ms is not None:
                out.append(r.arrival_ms)
                continue
            k = finish[int(r.after["req"])]
            t_next = times[k] + base + per * sum(n for _, n in self.steps[k].get("sched", []))
            out.append(t_next + float(r.after.get("delay_ms", 0.0)))
        return out


def load_sched_recording(path: str | Path) -> SchedRecording:
    """Parse a recording; rejects an unknown schema or version (KvsimInputError)."""
    p = str(path)
    header, raw, steps, hashes, summary = None, [], [], None, None
    try:
        fh = gzip.open(p, "rt") if p.endswith(".gz") else open(p)
        with fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                d = json.loads(line)
                k = d.get("kind")
                if k == "header":
                    header = d
                elif k == "request":
                    raw.append(d)
                elif k == "step":
                    steps.append(d)
                elif k == "hashes":
                    hashes = d
                elif k == "summary":
                    summary = d
    except (OSError, ValueError, EOFError) as exc:
        raise KvsimInputError(f"{p}: cannot read the scheduler recording ({exc})") from exc
    if header is None or header.get("schema") != SCHEMA:
        raise KvsimInputError(f"{p}: not a {SCHEMA} recording (no header with that schema)")
    if header.get("version") != VERSION:
        raise KvsimInputError(f"{p}: {SCHEMA} version {header.get('version')} is not "
                              f"understood (this kvsim reads version {VERSION})")
    reqs: list[SchedRequest] = []
    for i, d in enumerate(raw):
        if d["idx"] != i:
            raise KvsimInputError(f"{p}: request lines out of order at {i}")
        d["prompt_tokens"] = expand_prompt(d["prompt"], raw)
        if len(d["prompt_tokens"]) != d["prompt_len"]:
            raise KvsimInputError(f"{p}: request {i}: prompt expands to "
                                  f"{len(d['prompt_tokens'])} tokens, not {d['prompt_len']}")
        reqs.append(SchedRequest(
            idx=i, id=str(d["id"]), prompt_tokens=d["prompt_tokens"],
            output_len=int(d["output_len"]), output_base=int(d["output_base"]),
            priority=int(d.get("priority", 0) or 0), cache_salt=d.get("cache_salt"),
            arrival_ms=float(d["arrival_ms"]) if "arrival_ms" in d else None,
            after=d.get("after")))
    return SchedRecording(path=p, header=header, requests=reqs, steps=steps, hashes=hashes,
                          summary=summary, engine=dict(header["engine"]))
