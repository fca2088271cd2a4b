"""Hardware profiles: a GPU's compute and HBM plus the lower memory tiers KV can live in.

A profile is a TOML file (``profiles/hardware/<name>.toml``, format in
docs/architecture.md "Hardware profiles" and docs/hardware.md).  Bundled profiles are read
with :mod:`importlib.resources` from the ``kvsim.profiles`` package, so they work from an
installed wheel; calibrated profiles are plain ``.toml`` paths.

Every number in a bundled profile carries a trailing ``# source: ...`` (or
``# assumption: ...``) comment.  :func:`load_hardware` keeps those comments in
:attr:`HardwareProfile.sources` (key ``"section.key"``), and :func:`save_hardware` writes
them back, so ``load_hardware(save_hardware(p))`` round-trips a profile exactly.

Invariants:

- ``tiers`` always has the four keys ``"hbm", "dram", "cxl", "nvme"`` in that order; a tier
  with ``capacity_bytes == 0`` is disabled (the platform lacks it, or the user turned it
  off with :meth:`HardwareProfile.with_capacities`).
- ``tiers["hbm"].capacity_bytes`` is the raw GPU memory; the KV share after weights is
  computed by the caller, never stored here.
- Bandwidths are bytes/s per direction; a tier's ``link_*`` describe the slowest hop
  between that tier and the GPU, so moving ``b`` bytes costs
  ``latency_us + link_latency_us + b / min(medium, link) bandwidth``
  (:meth:`TierSpec.transfer_us`; the cost model in kvsim/engine/cost_model.py may refine this).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvsim.core.errors import KvsimInputError, bad_value
from kvsim.core.fsutil import atomic_output, read_utf8_text

TIER_NAMES: tuple[str, ...] = ("hbm", "dram", "cxl", "nvme")

_COMPUTE_KEYS = ("peak_dense_bf16_flops_per_s", "achievable_flops_fraction",
                 "hbm_bandwidth_bytes_per_s", "achievable_bandwidth_fraction",
                 "gpu_memory_bytes")
_TIER_NUMBER_KEYS = ("capacity_bytes", "read_bandwidth_bytes_per_s",
                     "write_bandwidth_bytes_per_s", "latency_us",
                     "link_bandwidth_bytes_per_s", "link_latency_us")
_TIER_KEYS = _TIER_NUMBER_KEYS + ("link",)


@dataclass(frozen=True)
class TierSpec:
    """One memory tier as seen from the GPU.  ``capacity_bytes == 0``: disabled."""

    name: str
    capacity_bytes: int
    read_bandwidth_bytes_per_s: float  # the medium's own bandwidth
    write_bandwidth_bytes_per_s: float
    latency_us: float  # the medium's access latency
    link: str  # the slowest hop between this tier and the GPU, e.g. "pcie5-x16"
    link_bandwidth_bytes_per_s: float  # per direction, achievable
    link_latency_us: float  # per transfer: DMA setup + hop latency

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def path_bandwidth_bytes_per_s(self, to_gpu: bool = True) -> float:
        """Bandwidth of a transfer to (``to_gpu``) or from the GPU: the slowest hop."""
        medium = self.read_bandwidth_bytes_per_s if to_gpu else self.write_bandwidth_bytes_per_s
        return min(medium, self.link_bandwidth_bytes_per_s)

    def transfer_us(self, nbytes: int, to_gpu: bool = True) -> float:
        """Time to move ``nbytes`` between this tier and HBM (one transfer)."""
        bandwidth = self.path_bandwidth_bytes_per_s(to_gpu)
        if bandwidth <= 0:
            return math.inf
        return self.latency_us + self.link_latency_us + nbytes / bandwidth * 1e6


@dataclass(frozen=True)
class HardwareProfile:
    """A GPU and its memory tiers.  Treat the dicts as read-only."""

    name: str
    description: str
    peak_dense_bf16_flops_per_s: float
    achievable_flops_fraction: float
    hbm_bandwidth_bytes_per_s: float
    achievable_bandwidth_fraction: float
    gpu_memory_bytes: int
    tiers: dict[str, TierSpec]
    provenance: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # "section.key" -> comment
    #: the file it was read from (errors name it); not part of the profile's value
    source: str = field(default="", compare=False, repr=False)

    @property
    def effective_flops_per_s(self) -> float:
        return self.peak_dense_bf16_flops_per_s * self.achievable_flops_fraction

    @property
    def effective_hbm_bandwidth_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_bytes_per_s * self.achievable_bandwidth_fraction

    def enabled_tiers(self) -> list[TierSpec]:
        """Tiers with capacity, fastest first."""
        return [t for t in self.tiers.values() if t.enabled]

    def with_capacities(self, hbm_bytes: int | None = None, dram_bytes: int | None = None,
                        cxl_bytes: int | None = None,
                        nvme_bytes: int | None = None) -> HardwareProfile:
        """A copy with some tier capacities replaced (None keeps, 0 disables a tier).

        Raises :class:`KvsimInputError` for a negative capacity, or for enabling a tier the
        profile has no bandwidth numbers for (define it in a profile TOML first).
        """
        tiers = dict(self.tiers)
        for name, value in zip(TIER_NAMES, (hbm_bytes, dram_bytes, cxl_bytes, nvme_bytes)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad_value(None, None, f"{name}_bytes", "an integer >= 0", value)
            tier = tiers[name]
            if value > 0:
                self._check_path(tier, name)
            tiers[name] = dataclasses.replace(tier, capacity_bytes=value)
        return dataclasses.replace(self, tiers=tiers)


    def _check_path(self, tier: TierSpec, name: str) -> None:
        """A tier given capacity needs a bandwidth > 0 both ways on its path; the error names
        the profile's file and the key (a bundled profile: ``profiles/hardware/X.toml``)."""
        where = self.source or f"hardware profile {self.name!r}"
        if tier == _disabled_tier(name):
            raise KvsimInputError(
                f"no [tiers.{name}] table; expected one (its bandwidths and latencies) to "
                f"give the {name} tier a capacity ({name}_bytes, --{name}-gb)", where, None,
                f"tiers.{name}")
        for key in ("read_bandwidth_bytes_per_s", "write_bandwidth_bytes_per_s",
                    "link_bandwidth_bytes_per_s"):
            if getattr(tier, key) <= 0:
                raise bad_value(where, None, f"tiers.{name}.{key}", "a bandwidth > 0 to give "
                                f"the {name} tier a capacity ({name}_bytes, --{name}-gb)",
                                getattr(tier, key))


def _disabled_tier(name: str) -> TierSpec:
    return TierSpec(name, 0, 0.0, 0.0, 0.0, "none", 0.0, 0.0)


# --------------------------------------------------------------------------- reading

def _number(value: Any, path: Path | str, key: str, integer: bool = False) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or not math.isfinite(value):
        raise bad_value(path, None, key, "a finite number >= 0", value)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise bad_value(path, None, key, "an integer number of bytes", value)
        return int(value)
    return float(value)


def _check_keys(table: dict, allowed: tuple[str, ...], path, section: str) -> None:
    for key in table:
        if key not in allowed:
            raise KvsimInputError(f"unknown key; expected one of {', '.join(allowed)}",
                                  path, None, f"{section}.{key}")


def _scan_sources(text: str) -> dict[str, str]:
    """``section.key`` -> the comment after that key's value (without ``#``)."""
    sources: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line.split("]", 1)[0].strip("[] ")
            continue
        if "=" not in line or line.startswith("#"):
            continue
        key, rest = line.split("=", 1)
        in_string = escaped = False
        for i, ch in enumerate(rest):
            if escaped:
                escaped = False
            elif ch == "\\" and in_string:
                escaped = True
            elif ch == '"':
                in_string = not in_string
            elif ch == "#" and not in_string:
                comment = rest[i + 1:].strip()
                if comment:
                    full = f"{section}.{key.strip()}" if section else key.strip()
                    sources[full] = comment
                break
    return sources


def parse_hardware(text: str, path: Path | str) -> HardwareProfile:
    """Build a profile from TOML text; ``path`` names the file in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KvsimInputError(f"not valid TOML: {exc}", path) from None
    _check_keys(data, ("name", "description", "compute", "tiers", "provenance"), path, "")
    for key in ("name", "compute", "tiers"):
        if key not in data:
            raise KvsimInputError("missing required key", path, None, key)
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise bad_value(path, None, "name", "a non-empty string", name)
    compute = data["compute"]
    _check_keys(compute, _COMPUTE_KEYS, path, "compute")
    for key in _COMPUTE_KEYS:
        if key not in compute:
            raise KvsimInputError("missing required key", path, None, f"compute.{key}")
    values = {k: _number(compute[k], path, f"compute.{k}", integer=k.endswith("_bytes"))
              for k in _COMPUTE_KEYS}
    for key in ("achievable_flops_fraction", "achievable_bandwidth_fraction"):
        if not 0 < values[key] <= 1:
            raise bad_value(path, None, f"compute.{key}", "a fraction in (0, 1]", values[key])
    for key in ("peak_dense_bf16_flops_per_s", "hbm_bandwidth_bytes_per_s"):  # divisors
        if not values[key] > 0:  # main: 0 was a ZeroDivisionError traceback
            raise bad_value(path, None, f"compute.{key}", "a number > 0", values[key])

    raw_tiers = data["tiers"]
    _check_keys(raw_tiers, TIER_NAMES, path, "tiers")
    if "hbm" not in raw_tiers:
        raise KvsimInputError("missing required table", path, None, "tiers.hbm")
    tiers: dict[str, TierSpec] = {}
    for tname in TIER_NAMES:
        table = raw_tiers.get(tname)
        if table is None:
            tiers[tname] = _disabled_tier(tname)
            continue
        _check_keys(table, _TIER_KEYS, path, f"tiers.{tname}")
        if tname == "hbm":  # defaults: the GPU's own memory, no link
            table = {"capacity_bytes": values["gpu_memory_bytes"], "latency_us": 0.0,
                     "link": "local", "link_latency_us": 0.0,
                     "link_bandwidth_bytes_per_s": table.get("read_bandwidth_bytes_per_s",
                                                             values["hbm_bandwidth_bytes_per_s"]),
                     **table}
        for key in _TIER_KEYS:
            if key not in table:
                raise KvsimInputError("missing required key", path, None, f"tiers.{tname}.{key}")
        if not isinstance(table["link"], str):
            raise bad_value(path, None, f"tiers.{tname}.link", "a string", table["link"])
        nums = {k: _number(table[k], path, f"tiers.{tname}.{k}", integer=k == "capacity_bytes")
                for k in _TIER_NUMBER_KEYS}
        tiers[tname] = TierSpec(name=tname, link=table["link"], **nums)

    provenance = data.get("provenance", {})
    if not isinstance(provenance, dict):
        raise bad_value(path, None, "provenance", "a table", provenance)
    for key, value in provenance.items():
        if not isinstance(value, (str, int, float, bool)):
            raise bad_value(path, None, f"provenance.{key}", "a string, number or boolean",
                            value)
    return HardwareProfile(
        name=name,
        description=str(data.get("description", "")),
        tiers=tiers,
        provenance=dict(provenance),
        sources=_scan_sources(text),
        source=str(path),
        **values,
    )


def _bundled_dir():
    return resources.files("kvsim.profiles").joinpath("hardware")


def list_hardware() -> list[str]:
    """Names of the bundled hardware profiles, sorted."""
    return sorted(p.name[:-5] for p in _bundled_dir().iterdir() if p.name.endswith(".toml"))


def load_hardware(name_or_path: str | Path) -> HardwareProfile:
    """A bundled profile by name, or a profile TOML by path (e.g. a calibrated one)."""
    arg = str(name_or_path)
    path = Path(arg)
    if arg.endswith(".toml") or path.is_file():
        text = read_utf8_text(path, path)
        return parse_hardware(text, path)
    if path.is_dir():  # main: "unknown hardware profile 'adir'"
        raise KvsimInputError(f"expected a hardware profile .toml file or a bundled name, got "
                              f"a directory, {arg!r}", None, None, "gpu")
    names = list_hardware()
    if arg not in names:
        pool = sorted(names)
        close = [n for n in pool if n.startswith(arg)]  # 'h100' -> 'h100-sxm' first
        close += [n for n in difflib.get_close_matches(arg, pool, n=3, cutoff=0.5)
                  if n not in close]
        close = close[:3]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KvsimInputError(f"unknown hardware profile {arg!r}{hint} (known: "
                              f"{', '.join(names)}; or pass a .toml path)", None, None, "gpu")
    resource = _bundled_dir().joinpath(f"{arg}.toml")
    return parse_hardware(resource.read_text(encoding="utf-8"), f"profiles/hardware/{arg}.toml")


# --------------------------------------------------------------------------- writing

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write non-finite number {value!r} to TOML")
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
        return f'"{escaped}"'
    raise TypeError(f"cannot write {type(value).__name__} to a hardware profile")


def _line(key: str, value: Any, sources: dict[str, str], section: str) -> str:
    text = f"{key} = {_toml_value(value)}"
    comment = sources.get(f"{section}.{key}" if section else key)
    return f"{text}  # {comment}" if comment else text


def format_hardware(profile: HardwareProfile) -> str:
    """The TOML text of a profile (the inverse of :func:`parse_hardware`)."""
    s = profile.sources
    out = [_line("name", profile.name, s, ""), _line("description", profile.description, s, ""),
           "", "[compute]"]
    for key in _COMPUTE_KEYS:
        out.append(_line(key, getattr(profile, key), s, "compute"))
    for tname in TIER_NAMES:
        tier = profile.tiers[tname]
        if tier == _disabled_tier(tname):
            continue  # absent table == disabled tier with no numbers
        section = f"tiers.{tname}"
        out += ["", f"[{section}]"]
        for key in _TIER_KEYS:
            out.append(_line(key, getattr(tier, key), s, section))
    out += ["", "[provenance]"]
    for key, value in profile.provenance.items():
        out.append(_line(key, value, s, "provenance"))
    return "\n".join(out) + "\n"


def save_hardware(profile: HardwareProfile, path: str | Path) -> None:
    """Write ``profile`` as TOML, atomically; :func:`load_hardware` reads it back equal."""
    text = format_hardware(profile)
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
