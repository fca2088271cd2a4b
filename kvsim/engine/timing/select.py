"""Which step-time model a run uses (``--timing``), and its name in every output.

``--timing``:

* ``auto`` (default): ``measured`` when a bundled profile exists for (model, GPU, TP 1),
  else ``roofline``;
* ``roofline``: :mod:`kvsim.engine.engine_model`'s datasheet roofline;
* ``measured``: the bundled AIConfigurator-derived tables
  (:mod:`kvsim.engine.timing.measured`); a one-line error when there are none for the
  pair;
* a ``.toml`` path: a timing profile file: measured tables (``kvsim.timing.measured/1``,
  written by ``bench/timing/extract_aic.py``) or fitted coefficients
  (``kvsim.timing.fitted/1``, written by ``kvsim calibrate --from-vllm-bench``), named
  ``fitted:<file stem>``.

Catalog models that share their architecture (layers, heads, KV heads, hidden and FFN
sizes, vocabulary) with a profiled one use its profile (:data:`SAME_ARCHITECTURE`;
``tests/timing/test_step_time.py`` checks the shapes): step time depends on the shapes,
not on the checkpoint.  The name written to outputs (``timing_model``) is ``roofline`` or
``measured:<tool>-<version>/<backend>-<version>`` (``measured:aiconfigurator-0.12.0/
vllm-0.24.0``), with the profile used in ``timing_profile``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.core.errors import KvsimInputError

TIMINGS = ("auto", "roofline", "measured")
#: catalog model -> the profiled catalog model with the same architecture
SAME_ARCHITECTURE = {"llama-3-8b": "llama-3.1-8b", "llama-3-70b": "llama-3.1-70b",
                     "llama-3.3-70b": "llama-3.1-70b"}
#: TP degree of a single-engine run (kvsim has no tensor-parallel option yet)
DEFAULT_TP = 1


@dataclass(frozen=True)
class Timing:
    """A resolved step-time model: its output name, the profile it reads (None for the
    roofline) and its packed tables (empty for the roofline)."""

    name: str = "roofline"
    profile: str | None = None
    tables: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False,
                               repr=False)

    @property
    def kind(self) -> str:
        return self.name.split(":", 1)[0]


ROOFLINE = Timing()


def measured_name(source: dict) -> str:
    """``measured:aiconfigurator-0.12.0/vllm-0.24.0`` from a profile's ``[source]``."""
    tool = str(source.get("tool", "?")).removesuffix("-core")
    return (f"measured:{tool}-{source.get('version', '?')}/"
            f"{source.get('backend', '?')}-{source.get('backend_version', '?')}")


def _from_measured(m) -> Timing:
    from kvsim.engine.timing.step_time import pack_measured

    stem = Path(str(m.path)).name.removesuffix(".toml")
    return Timing(name=measured_name(m.source), profile=stem, tables=pack_measured(m))


def bundled_profile(model: str, gpu: str, tp: int = DEFAULT_TP) -> Path | None:
    """The bundled measured profile for (model, gpu, tp), through
    :data:`SAME_ARCHITECTURE`; None when there is none."""
    from kvsim.engine.timing.measured import _profile_name, bundled_dir

    p = bundled_dir() / _profile_name(gpu, SAME_ARCHITECTURE.get(model, model), tp)
    return p if p.is_file() else None


def resolve_timing(timing: str | None, model: str, gpu: str, tp: int = DEFAULT_TP) -> Timing:
    """The step-time model ``timing`` names for catalog ``model`` on hardware profile
    ``gpu`` (module docstring); :class:`KvsimInputError` (exit 2) when it cannot be had."""
    from kvsim.engine.timing.measured import MeasuredStepTime, available

    t = "auto" if timing is None else str(timing)
    if t == "roofline":
        return ROOFLINE
    if t in ("auto", "measured"):
        p = bundled_profile(model, gpu, tp)
        if p is None:
            if t == "auto":
                return ROOFLINE
            have = ", ".join(sorted({f"{g}/{m}" for g, m, _ in available()})) or "none"
            alias = SAME_ARCHITECTURE.get(model)
            raise KvsimInputError(
                f"no measured step-time data for model {model!r}"
                + (f" (as {alias!r})" if alias else "") + f" on hardware {gpu!r} at TP {tp}"
                f" (bundled: {have}); expected --timing roofline or auto, or a timing "
                "profile .toml", None, None, "--timing")
        try:
            return _from_measured(MeasuredStepTime.from_file(p))
        except (OSError, ValueError) as e:  # a damaged bundled file: say which
            raise KvsimInputError(str(e).splitlines()[0], p, None, "--timing") from None
    if t.endswith(".toml") or Path(t).is_file():
        p = Path(t)
        if not p.is_file():
            raise KvsimInputError("expected a timing profile file, found none", p, None,
                                  "--timing")
        try:
            import tomllib

            from kvsim.engine.timing import fitted

            with open(p, "rb") as f:
                schema = tomllib.load(f).get("schema")
            if schema == fitted.SCHEMA:
                coef, _doc = fitted.read_profile(p)
                return Timing(name=f"fitted:{p.name.removesuffix('.toml')}",
                              profile=p.name.removesuffix(".toml"), tables=coef)
            return _from_measured(MeasuredStepTime.from_file(p))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise KvsimInputError(f"not a timing profile: {str(e).splitlines()[0]}", p,
                                  None, "--timing") from None
    raise KvsimInputError(f"expected auto | roofline | measured | a timing profile .toml, "
                          f"got {t!r}", None, None, "--timing")
