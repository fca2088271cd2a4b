"""``kvsim validate --sched-recording``: kvsim's engine step function against vLLM's own
scheduler, step by step.

Data flow: a ``kvsim-vllm-sched`` recording (:mod:`kvsim.ingest.vllm_sched`, made by
``bench/vllm/record_scheduler.py`` running vLLM's v1 ``Scheduler``) -> its requests
rebuilt exactly (token mapping, cache salt, priority, arrival time by the step clock) ->
:class:`kvsim.engine.vllm_scheduler.VllmScheduler` with the recording's engine config,
driven by the recorded arrivals and actions per step -> every step compared.

Per step it compares: the scheduled set with token counts, in order (``sched``); the
block ids handed out (``blocks``); first-admission and resume prefix hits in tokens
(``hits``); preempted requests in order (``preempted``); finished requests (``finished``);
free blocks after ``schedule()`` and after the step (``free``); the KV events (``events``:
stored blocks by content, removed blocks by content, clears, in order); reset outcomes.
Recorded hash ids are mapped to content: a stored event's blocks are request ``r``'s
blocks ``b ..`` whose content kvsim hashes itself, so no hash function is shared.

A step *agrees* on a field when that field is equal; the fractions are over
``max(recorded steps, kvsim steps)``.  The first divergence names the step, the field,
the requests involved and both values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError
from kvsim.engine.vllm_scheduler import (
    EngineConfig,
    SimRequest,
    StepResult,
    VllmScheduler,
    chain_hashes,
)
from kvsim.ingest.vllm_sched import SchedRecording, load_sched_recording, unruns

__all__ = ["FIELDS", "SchedDivergence", "SchedValidation", "recorded_step", "validate_sched"]

#: The per-step fields compared, in the order a divergence is looked for.
FIELDS = ("sched", "preempted", "hits", "blocks", "events", "finished", "free", "reset")


@dataclass(frozen=True)
class SchedDivergence:
    step: int
    field: str
    requests: list[int]
    vllm: Any
    kvsim: Any

    def describe(self) -> str:
        who = f" (requests {self.requests})" if self.requests else ""
        return (f"step {self.step}: {self.field} differs{who}: vLLM {self.vllm!r}, "
                f"kvsim {self.kvsim!r}")


@dataclass
class SchedValidation:
    path: str
    case: str
    vllm_version: str
    num_requests: int
    steps_vllm: int
    steps_kvsim: int
    pool: str = "fast"
    engine: str = "compiled"
    agree: dict[str, int] = field(default_factory=dict)   # field -> steps equal
    preemptions: dict[str, int] = field(default_factory=dict)
    hit_tokens: dict[str, dict[str, int]] = field(default_factory=dict)
    events: dict[str, dict[str, int]] = field(default_factory=dict)
    first_divergence: SchedDivergence | None = None
    divergences: dict[str, int] = field(default_factory=dict)  # field -> steps differing
    #: closed loop only: what the replay itself counted (preemptions, lost hit tokens)
    replay: dict[str, int] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return max(self.steps_vllm, self.steps_kvsim)

    def agreement(self, name: str) -> float:
        return self.agree.get(name, 0) / self.steps if self.steps else 1.0

    @property
    def step_agreement(self) -> float:
        """Steps whose scheduled set and token counts are equal."""
        return self.agreement("sched")

    @property
    def preemption_agreement(self) -> float:
        return self.agreement("preempted")

    @property
    def event_agreement(self) -> float:
        return self.agreement("events")

    @property
    def all_agree(self) -> bool:
        return self.first_divergence is None

    def to_json_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["agreement"] = {k: self.agreement(k) for k in FIELDS if k in self.agree}
        d["first_divergence"] = (None if self.first_divergence is None
                                 else {**asdict(self.first_divergence),
                                       "text": self.first_divergence.describe()})
        return d


def recorded_step(rec: SchedRecording, s: dict, content: dict[int, int],
                  hashes: dict[int, list[int]]) -> dict[str, Any]:
    """One recorded step in the comparison form (events mapped to kvsim content hashes;
    ``content`` maps recorded hash ids to them and is extended by stored events)."""
    events: list[tuple] = []
    for e in s.get("ev", []):
        if "S" in e:
            ids = unruns(e["S"])
            r, b = int(e["r"]), int(e["b"])
            hs = hashes[r][b:b + len(ids)]
            if len(hs) != len(ids):
                raise ValueError(f"step {s['step']}: stored blocks past request {r}'s end")
            for i, h in zip(ids, hs):
                if content.setdefault(i, h) != h:
                    raise ValueError(f"step {s['step']}: hash id {i} names two contents")
            parent = None if e.get("p") is None else content[int(e["p"])]
            events.append(("S", parent, tuple(hs)))
        elif "R" in e:
            events.extend(("R", content[i]) for i in unruns(e["R"]))
        elif "C" in e:
            events.append(("C",))
    return {
        "sched": [tuple(x) for x in s.get("sched", [])],
        "preempted": list(s.get("preempted", [])),
        "hits": ([("new", i, h) for i, h in s.get("new", [])]
                 + [("resumed", i, h) for i, h in s.get("resumed", [])]),
        "blocks": [(int(i), unruns(ids)) for i, ids in s.get("blocks", [])],
        "events": events,
        "finished": list(s.get("finished", [])),
        "free": (int(s.get("free_sched", s["free"])), int(s["free"])),
        "reset": [bool(a["ok"]) for a in s.get("actions", [])],
    }


def kvsim_step(res: StepResult) -> dict[str, Any]:
    return {
        "sched": list(res.sched),
        "preempted": list(res.preempted),
        "hits": ([("new", i, h) for i, h in res.new]
                 + [("resumed", i, h) for i, h in res.resumed]),
        "blocks": [(i, list(ids)) for i, ids in res.blocks],
        "events": [e if e[0] != "S" else e[:3] for e in res.events],
        "finished": list(res.finished),
        "free": (res.free_sched, res.free_blocks),
        "reset": list(res.reset_ok),
    }


def _requests_of(name: str, a: Any, b: Any) -> list[int]:
    """The requests a differing field involves: those whose entries differ."""
    if name in ("preempted", "finished"):
        return sorted(set(a) ^ set(b))
    if name not in ("sched", "hits", "blocks"):
        return []
    pos = 1 if name == "hits" else 0

    def entries(xs):
        return {x[pos]: repr(x) for x in xs}

    ea, eb = entries(a), entries(b)
    return sorted(i for i in set(ea) | set(eb) if ea.get(i) != eb.get(i))


def build_requests(rec: SchedRecording) -> list[SimRequest]:
    """The recording's requests as the step function's, hashed with their salt."""
    arrivals = rec.arrival_ms_of()
    bs = rec.block_size
    out = []
    for r, t in zip(rec.requests, arrivals):
        toks = r.all_tokens
        out.append(SimRequest(
            idx=r.idx, request_id=r.id, all_tokens=toks, prompt_len=r.prompt_len,
            output_len=r.output_len, priority=r.priority, arrival_time=t / 1000.0,
            cache_salt=r.cache_salt,
            hashes=chain_hashes(toks[:len(toks) - 1], bs, r.cache_salt)))
    return out


#: The step functions ``validate_sched`` runs: the compiled port (the closed loop's) and
#: the plain-Python one (its witness; ``pool`` picks its block pool).
ENGINES = ("compiled", "python")


def validate_sched(path: str | Path, engine_overrides: dict[str, Any] | None = None,
                   pool: str = "fast", max_extra_steps: int = 100_000,
                   engine: str = "compiled") -> SchedValidation:
    """Run kvsim's step function over a recording and compare every step.

    ``engine_overrides`` replaces engine settings of the recording (what-if: the
    comparison then shows where vLLM with the recorded settings differs).  ``engine``:
    ``compiled`` (:mod:`kvsim.engine.vllm_step`, over the compiled pool) or ``python``
    (:mod:`kvsim.engine.vllm_scheduler`, over ``pool``: ``fast`` or ``reference``)."""
    if engine not in ENGINES:
        raise KvsimInputError(f"--engine: expected one of {', '.join(ENGINES)}, got "
                              f"{engine!r}", field="--engine")
    if engine == "compiled" and pool != "fast":
        raise KvsimInputError("--pool reference goes with --engine python (the compiled "
                              "step runs on the compiled pool)", field="--pool")
    rec = load_sched_recording(path)
    cfg = EngineConfig.from_recording({**rec.engine, **(engine_overrides or {})})
    reqs = build_requests(rec)
    if engine == "compiled":
        from kvsim.engine.vllm_compiled import CompiledVllmScheduler
        sched = CompiledVllmScheduler(cfg, reqs)
    else:
        sched = VllmScheduler(cfg, pool=pool, max_seqs=len(rec.requests) + 1)
    hashes = {r.idx: r.hashes for r in reqs}
    actions = rec.header.get("actions") or []
    by_step: dict[int, list[dict]] = {}
    before: dict[int, list[dict]] = {}
    for a in actions:
        if a.get("do") != "reset_prefix_cache":
            continue
        if "at_step" in a:
            by_step.setdefault(int(a["at_step"]), []).append(a)
        elif "before_arrival_of" in a:
            before.setdefault(int(a["before_arrival_of"]), []).append(a)

    result = SchedValidation(
        path=str(path), case=str(rec.header.get("case", "")),
        vllm_version=str(rec.header.get("vllm_version", "")), num_requests=len(reqs),
        steps_vllm=len(rec.steps), steps_kvsim=0, pool=pool, engine=engine)
    agree = dict.fromkeys(FIELDS, 0)
    differ = dict.fromkeys(FIELDS, 0)
    content: dict[int, int] = {}
    first: SchedDivergence | None = None
    pre = {"vllm": 0, "kvsim": 0}
    hit = {"new": {"vllm": 0, "kvsim": 0}, "resumed": {"vllm": 0, "kvsim": 0}}
    ev = {k: {"vllm": 0, "kvsim": 0} for k in ("stored_blocks", "removed_blocks", "cleared")}

    def run_actions(acts):
        for a in acts:
            sched.reset_prefix_cache(bool(a.get("reset_running_requests", False)))

    def tally(side: str, st: dict) -> None:
        pre[side] += len(st["preempted"])
        for kind, _, h in st["hits"]:
            hit[kind][side] += h
        for e in st["events"]:
            key = {"S": "stored_blocks", "R": "removed_blocks", "C": "cleared"}[e[0]]
            ev[key][side] += len(e[2]) if e[0] == "S" else 1

    finished = 0
    k = 0
    n_steps = len(rec.steps)
    while k < n_steps or (finished < len(reqs) and k < n_steps + max_extra_steps):
        s = rec.steps[k] if k < n_steps else None
        if s is not None:
            for i in s.get("arrived", []):
                if i in before:
                    run_actions(before.pop(i))
                sched.add_request(reqs[i])
            run_actions(by_step.pop(k, []))
        if s is None and not sched.has_requests():
            break
        mine = kvsim_step(sched.step())
        finished += len(mine["finished"])
        result.steps_kvsim += 1
        tally("kvsim", mine)
        theirs = recorded_step(rec, s, content, hashes) if s is not None else None
        if theirs is not None:
            tally("vllm", theirs)
        for name in FIELDS:
            if theirs is not None and theirs[name] == mine[name]:
                agree[name] += 1
                continue
            differ[name] += 1
            if first is None:
                a = theirs[name] if theirs is not None else None
                first = SchedDivergence(k, name, _requests_of(name, a or [], mine[name]),
                                        a, mine[name])
        k += 1
    result.agree = agree
    result.divergences = {n: c for n, c in differ.items() if c}
    result.preemptions = pre
    result.hit_tokens = hit
    result.events = ev
    result.first_divergence = first
    return result
