"""Limits on sizes and lengths a trace may ask for, so that absurd input is refused in
one line instead of hanging or exhausting memory (an ``output_length`` of 1e11 would make
the lowering generate 1e11 decode steps).

Defaults are generous for real workloads (sources beside each value) and overridable:
``KVSIM_LIMIT_<NAME>`` in the environment (e.g. ``KVSIM_LIMIT_MAX_OUTPUT_TOKENS=4000000``)
or ``--limit NAME=VALUE`` on ``kvsim import-request-trace`` (which sets the same
variable for the process and its workers).  docs/cli.md lists them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from kvsim.errors import KvsimInputError


@dataclass(frozen=True)
class Limits:
    """Most a single request (or the whole trace) may ask for."""

    #: Prompt tokens of one request.  Largest context windows shipped today are 10M tokens
    #: (Llama 4 Scout model card, April 2025); kvsim allows that much.
    max_prompt_tokens: int = 10_000_000
    #: Tokens one request may generate.  The largest documented output budgets are 128K
    #: tokens (Anthropic Claude 3.7 Sonnet extended output, Feb 2025; OpenAI o3: 100K);
    #: kvsim allows 8x that.  Each output token is one decode step of the lowering, so
    #: this is what bounds an import's run time per request.
    max_output_tokens: int = 1_048_576
    #: Parallel samples / beam width of one request (OpenAI API: n <= 128).
    max_fanout: int = 128
    #: Latest arrival, microseconds after the trace start: 10 years (a trace spanning more
    #: is certainly a unit error, and 10 years in us fits int64 with room to add durations).
    max_time_us: int = 10 * 365 * 86_400 * 1_000_000
    #: Absolute timestamps (epoch microseconds) up to the year 2200; timestamps are read
    #: relative to the earliest, but the raw value must be a plausible time.
    max_epoch_us: int = 7_258_118_400 * 1_000_000
    #: Total tokens (prompt + output) over the whole trace: 1e12 (the public traces hold
    #: 1e7-1e9); beyond that the lowering would run for days.
    max_total_tokens: int = 1_000_000_000_000


DEFAULT_LIMITS = Limits()
ENV_PREFIX = "KVSIM_LIMIT_"


def limit_names() -> list[str]:
    return [f.name for f in fields(Limits)]


def get_limits() -> Limits:
    """The limits in force: the defaults with ``KVSIM_LIMIT_<NAME>`` overrides."""
    values = {}
    for f in fields(Limits):
        env = ENV_PREFIX + f.name.upper()
        text = os.environ.get(env)
        if text is None:
            continue
        values[f.name] = parse_limit_value(text, env)
    return Limits(**values)


def parse_limit_value(text: str, where: str) -> int:
    try:
        value = float(text.strip()) if text.strip().isascii() else float("nan")
    except ValueError:
        value = float("nan")
    if not (value == value) or value < 1 or value > 2**62 or not value.is_integer():
        raise KvsimInputError(f"expected an integer limit between 1 and 2**62, got {text!r}",
                              None, None, where)
    return int(value)


def set_limit_overrides(pairs: list[str] | None) -> None:
    """Apply ``NAME=VALUE`` pairs (the ``--limit`` option) for this process and its
    workers (through the environment)."""
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        name = name.strip().lower()
        if not sep or name not in limit_names():
            raise KvsimInputError(f"expected NAME=VALUE with NAME one of {', '.join(limit_names())}, "
                                  f"got {pair!r}", None, None, "--limit")
        os.environ[ENV_PREFIX + name.upper()] = str(parse_limit_value(value, "--limit"))
