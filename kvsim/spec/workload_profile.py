"""Workload profiles: TOML files describing a synthetic request mix (no code needed).

A profile (``profiles/workloads/<name>.toml``, bundled as package data of
``kvsim.profiles``; or any ``.toml`` path) has a ``name``, a ``description``, an
``[arrivals]`` table and one or more ``[[classes]]``.  Every key is documented in
docs/profiles.md and in the bundled files themselves.  Unknown keys are errors, so a typo
never silently falls back to a default.

Distributions are inline tables: ``{dist = "constant", value = x}``,
``{dist = "uniform", min = a, max = b}``, ``{dist = "lognormal", median = m, sigma = s,
min = a, max = b}``, ``{dist = "exponential", mean = m, min = a, max = b}``,
``{dist = "geometric", mean = m}`` (integers >= 1, for turns).  Token counts are rounded
to integers and clipped to ``[min, max]``.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import read_utf8_text

DISTRIBUTIONS = ("constant", "uniform", "lognormal", "exponential", "geometric")


@dataclass(frozen=True)
class Dist:
    """One scalar distribution; :meth:`sample` draws with an explicit Generator."""

    dist: str
    value: float = 0.0
    min: float = 0.0
    max: float = math.inf
    median: float = 0.0
    sigma: float = 0.0
    mean: float = 0.0

    def sample(self, rng: np.random.Generator) -> float:
        if self.dist == "constant":
            x = self.value
        elif self.dist == "uniform":
            x = rng.uniform(self.min, self.max)
        elif self.dist == "lognormal":
            x = self.median * math.exp(self.sigma * rng.standard_normal())
        elif self.dist == "exponential":
            x = rng.exponential(self.mean)
        else:  # geometric on 1, 2, ... with the given mean
            x = float(rng.geometric(1.0 / max(self.mean, 1.0)))
        return min(max(x, self.min), self.max)

    def sample_int(self, rng: np.random.Generator) -> int:
        return int(round(self.sample(rng)))


@dataclass(frozen=True)
class RequestClass:
    """One class of sessions; see docs/profiles.md for each field."""

    name: str
    weight: float = 1.0
    prompt_tokens: Dist = Dist("constant", value=512)
    output_tokens: Dist = Dist("constant", value=128)
    turns: Dist = Dist("constant", value=1)
    think_time_s: Dist = Dist("exponential", mean=30.0)
    turn_tokens: Dist = Dist("constant", value=128)
    system_prompt_tokens: int = 0
    system_prompts: int = 1
    rag_corpus_docs: int = 0
    rag_docs_per_request: int = 0
    rag_doc_tokens: int = 0
    rag_zipf_s: float = 1.0
    request_priority: int = 50
    ttft_slo_ms: float = 0.0
    tpot_slo_ms: float = 0.0
    tenant: int = 0
    n: int = 1
    beam_width: int = 1
    spec_draft_tokens: int = 0
    spec_accept_prob: float = 0.0


@dataclass(frozen=True)
class WorkloadProfile:
    """A parsed profile: session arrival rate and weighted request classes."""

    name: str
    description: str
    sessions_per_s: float
    classes: tuple[RequestClass, ...]
    source: str = ""
    #: assumed seconds per output token used to place a session's next turn after the
    #: previous reply (the generator has no engine; see docs/profiles.md)
    assumed_tpot_s: float = 0.02
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


_DIST_FIELDS = {f.name for f in fields(RequestClass) if f.type in ("Dist", Dist)}


def _dist(value: Any, path: str, key: str) -> Dist:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise bad_value(path, None, key, "a finite number", value)
        return Dist("constant", value=float(value))
    if not isinstance(value, dict) or value.get("dist") not in DISTRIBUTIONS:
        raise bad_value(path, None, key, "a number or {dist = one of "
                        + ", ".join(DISTRIBUTIONS) + ", ...}", value)
    allowed = {f.name for f in fields(Dist)}
    for k, v in value.items():
        if k not in allowed:
            raise bad_value(path, None, f"{key}.{k}", "a key of " + ", ".join(sorted(allowed)), k)
        if k != "dist" and (isinstance(v, bool) or not isinstance(v, (int, float))
                            or not math.isfinite(v)):
            raise bad_value(path, None, f"{key}.{k}", "a finite number", v)
    d = Dist(**{k: (float(v) if k != "dist" else v) for k, v in value.items()})
    need = {"constant": ("value",), "uniform": ("min", "max"), "lognormal": ("median", "sigma"),
            "exponential": ("mean",), "geometric": ("mean",)}[d.dist]
    for k in need:
        if k not in value:
            raise KvsimInputError(f"missing key for dist = {d.dist!r}", path, None, f"{key}.{k}")
    if d.min > d.max:
        raise bad_value(path, None, f"{key}.min", f"<= max ({d.max})", d.min)
    # each distribution's own domain (main drew from sigma = -0.9 silently)
    for k, ok, what in (("median", d.dist != "lognormal" or d.median > 0, "> 0"),
                        ("sigma", d.sigma >= 0, ">= 0"),
                        ("mean", d.dist != "exponential" or d.mean >= 0, ">= 0"),
                        ("mean", d.dist != "geometric" or d.mean >= 1,
                         ">= 1 (a count of at least one)")):
        if k in value and not ok:
            raise bad_value(path, None, f"{key}.{k}", f"a number {what} for dist = "
                            f"{d.dist!r}", value[k])
    return d


def parse_profile(text: str, path: str) -> WorkloadProfile:
    """Parse and validate profile TOML; errors name ``path`` and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KvsimInputError(f"not valid TOML: {exc}", path) from None
    for k in data:
        if k not in ("name", "description", "arrivals", "classes", "assumed_tpot_s"):
            raise bad_value(path, None, k, "one of name, description, arrivals, classes, "
                            "assumed_tpot_s", k)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise bad_value(path, None, "name", "a non-empty string", name)
    arrivals = data.get("arrivals", {})
    if not isinstance(arrivals, dict) or set(arrivals) - {"sessions_per_s"}:
        raise bad_value(path, None, "arrivals", "a table with sessions_per_s", arrivals)
    rate = arrivals.get("sessions_per_s", 1.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < math.inf:
        raise bad_value(path, None, "arrivals.sessions_per_s", "a finite number > 0", rate)
    raw = data.get("classes")
    if not isinstance(raw, list) or not raw:
        raise KvsimInputError("expected at least one [[classes]] table", path, None, "classes")
    known = {f.name: f for f in fields(RequestClass)}
    classes = []
    for i, c in enumerate(raw):
        where = f"classes[{i}]"
        if not isinstance(c, dict) or "name" not in c:
            raise KvsimInputError("expected a table with a name", path, None, where)
        kwargs: dict[str, Any] = {}
        for k, v in c.items():
            if k not in known:
                raise bad_value(path, None, f"{where}.{k}", "a class key (docs/profiles.md)", k)
            if k in _DIST_FIELDS:
                kwargs[k] = _dist(v, path, f"{where}.{k}")
            elif k == "name":
                kwargs[k] = str(v)
            else:
                default = known[k].default
                if isinstance(v, bool) or not isinstance(v, (int, float)) \
                        or not math.isfinite(v):
                    raise bad_value(path, None, f"{where}.{k}", "a finite number", v)
                if isinstance(default, int) and not float(v).is_integer():
                    raise bad_value(path, None, f"{where}.{k}", "an integer", v)
                kwargs[k] = type(default)(v)
        rc = RequestClass(**kwargs)
        checks = [("weight", rc.weight > 0, "> 0"), ("request_priority",
                  0 <= rc.request_priority <= 100, "0..100"), ("n", rc.n >= 1, ">= 1"),
                  ("beam_width", rc.beam_width >= 1, ">= 1"),
                  ("system_prompts", rc.system_prompts >= 1, ">= 1"),
                  ("spec_accept_prob", 0 <= rc.spec_accept_prob <= 1, "in [0, 1]"),
                  ("spec_draft_tokens", rc.spec_draft_tokens >= 0, ">= 0"),
                  ("rag_docs_per_request", rc.rag_docs_per_request <= max(rc.rag_corpus_docs, 0),
                   "<= rag_corpus_docs"),
                  ("ttft_slo_ms", rc.ttft_slo_ms >= 0, ">= 0 (0 = none)"),
                  ("tpot_slo_ms", rc.tpot_slo_ms >= 0, ">= 0 (0 = none)")]
        for key, ok, expected in checks:
            if not ok:
                raise bad_value(path, None, f"{where}.{key}", expected, getattr(rc, key))
        t = rc.turns  # a session has at least one turn (turns = 0 would serve nothing)
        low = {"constant": t.value, "uniform": t.min, "geometric": t.mean}.get(t.dist, 1.0)
        if low < 1:
            field = {"constant": "turns", "uniform": "turns.min", "geometric": "turns.mean"}
            raise bad_value(path, None, f"{where}.{field[t.dist]}", "a number of turns >= 1",
                            low)
        _check_limits(rc, path, where)
        classes.append(rc)
    tpot = data.get("assumed_tpot_s", 0.02)
    if isinstance(tpot, bool) or not isinstance(tpot, (int, float)) or tpot < 0:
        raise bad_value(path, None, "assumed_tpot_s", "a number >= 0", tpot)
    return WorkloadProfile(name=name, description=str(data.get("description", "")),
                           sessions_per_s=float(rate), classes=tuple(classes), source=path,
                           assumed_tpot_s=float(tpot))


def _central(d: Dist) -> float:
    """A distribution's typical value (constant value, uniform max, lognormal median, mean)."""
    return {"constant": d.value, "uniform": d.max, "lognormal": d.median}.get(d.dist, d.mean)


def _check_limits(rc: RequestClass, path: str, where: str) -> None:
    """Refuse a class whose typical request is over kvsim's limits (kvsim.core.limits),
    before the generator builds its block ids (``prompt_tokens = 1e15`` was MemoryError)."""
    from kvsim.core.limits import get_limits

    lim = get_limits()
    prompt = (max(_central(rc.prompt_tokens), _central(rc.turn_tokens))
              + rc.system_prompt_tokens + rc.rag_docs_per_request * rc.rag_doc_tokens)
    for key, v, top, name in (("prompt_tokens", prompt, lim.max_prompt_tokens,
                               "max_prompt_tokens"),
                              ("output_tokens", _central(rc.output_tokens),
                               lim.max_output_tokens, "max_output_tokens")):
        if v > top:
            raise KvsimInputError(
                f"expected requests of at most {top:,} {key.split('_')[0]} tokens (kvsim "
                f"limit {name}; raise it with KVSIM_LIMIT_{name.upper()}), the class's "
                f"typical request has {v:,.0f}", path, None, f"{where}.{key}")


def _bundled():
    return resources.files("kvsim.profiles").joinpath("workloads")


def list_profiles() -> list[str]:
    """Names of the bundled workload profiles, sorted."""
    return sorted(p.name[:-5] for p in _bundled().iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_path: str | Path) -> WorkloadProfile:
    """A bundled profile by name, or a profile TOML by path."""
    arg = str(name_or_path)
    path = Path(arg)
    if arg.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(2, "No such file or directory", arg)
        text = read_utf8_text(path, arg)
        return parse_profile(text, arg)
    names = list_profiles()
    if arg not in names:
        raise bad_value(None, None, "--profile", "one of " + ", ".join(names)
                        + " or a .toml path", arg)
    text = _bundled().joinpath(f"{arg}.toml").read_text(encoding="utf-8")
    return parse_profile(text, f"profiles/workloads/{arg}.toml")
