"""Price tables: what a GPU-hour and a GB-hour of each lower KV tier cost (``kvsim plan``).

A price table is a TOML file (``profiles/prices/<name>.toml``; format in docs/plan.md):

```toml
name = "cloud-list-2024"
currency = "USD"
[gpu.h100-sxm]                      # one table per hardware profile name
usd_per_gpu_hour = 4.916
source = "where the number comes from (URL)"
date = "2024-12"
[tiers.dram]                        # dram, cxl, nvme
usd_per_gb_hour = 0.004237          # GB = 10^9 bytes, as kvsim's --dram-gb
source = "..."
date = "2024"
```

Every price must carry a ``source`` (a URL, or the word ASSUMPTION and why) and a
``date``: list prices change, and a plan is only as good as its prices.  Bundled tables are
read with :mod:`importlib.resources` from the ``kvsim.profiles`` package; a user's table is a
path.  A missing tier price is an error only when a plan gives that tier a size.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kvsim.core.errors import KvsimInputError

#: The bundled table ``kvsim plan`` uses unless ``--prices`` is given.
DEFAULT_PRICES = "cloud-list-2024"
#: Lower tiers a price table may price (kvsim.spec.sim_config.LOWER_TIERS).
PRICED_TIERS = ("dram", "cxl", "nvme")
#: Hours per month of the monthly list prices converted in the bundled tables (AWS and
#: Google bill a month as 730 hours: 365 x 24 / 12).
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Price:
    """One price: ``usd`` per unit-hour, and where it comes from."""

    usd: float
    source: str
    date: str


@dataclass(frozen=True)
class PriceTable:
    """GPU prices by hardware profile name (per GPU-hour) and lower-tier prices by tier
    (per GB-hour)."""

    name: str
    gpu: dict[str, Price] = field(default_factory=dict)
    tiers: dict[str, Price] = field(default_factory=dict)
    currency: str = "USD"
    description: str = ""
    path: str = ""

    def gpu_usd_per_hour(self, hardware: str) -> float:
        """Price of one GPU of ``hardware`` per hour; a one-line error when unpriced."""
        if hardware not in self.gpu:
            raise KvsimInputError(f"expected a price for GPU kind {hardware!r} in the price "
                                  f"table (it prices {', '.join(sorted(self.gpu)) or 'none'}); "
                                  f"add a [gpu.{hardware}] table with usd_per_gpu_hour, "
                                  "source and date", self.path or None, None, "--hardware")
        return self.gpu[hardware].usd

    def tier_usd_per_gb_hour(self, tier: str, size_gb: float) -> float:
        """Price of one GB-hour of ``tier``; 0 when the tier is unused (``size_gb == 0``),
        a one-line error when it is used and unpriced."""
        if size_gb == 0:
            return self.tiers[tier].usd if tier in self.tiers else 0.0
        if tier not in self.tiers:
            raise KvsimInputError(f"expected a price for tier {tier!r} in the price table "
                                  f"(a plan gives it {size_gb:g} GB); add [tiers.{tier}] "
                                  "with usd_per_gb_hour, source and date",
                                  self.path or None, None, f"--{tier}-gb")
        return self.tiers[tier].usd


def _price(entry, where: str, key: str, path: str) -> Price:
    if not isinstance(entry, dict):
        raise KvsimInputError(f"expected a table [{where}]", path, where, None)
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(float(value)) or float(value) < 0:
        raise KvsimInputError(f"expected {key} = a finite number >= 0, got {value!r}", path,
                              where, key)
    for k in ("source", "date"):
        if not isinstance(entry.get(k), str) or not entry[k].strip():
            raise KvsimInputError(f"expected {k} = a non-empty string (every price says "
                                  "where it comes from and when)", path, where, k)
    extra = sorted(set(entry) - {key, "source", "date"})
    if extra:
        raise KvsimInputError(f"expected only {key}, source and date, got {extra[0]!r}",
                              path, where, extra[0])
    return Price(float(value), entry["source"].strip(), entry["date"].strip())


def parse_prices(text: str, path: str | Path = "") -> PriceTable:
    """A :class:`PriceTable` from TOML text (``path`` names it in errors)."""
    path = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KvsimInputError(f"expected a TOML price table ({exc})", path, None,
                              None) from None
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise KvsimInputError("expected name = a non-empty string", path, None, "name")
    unknown = sorted(set(data) - {"name", "description", "currency", "gpu", "tiers"})
    if unknown:
        raise KvsimInputError("expected keys name, description, currency, [gpu.*], "
                              f"[tiers.*], got {unknown[0]!r}", path, None, unknown[0])
    gpu = {str(k): _price(v, f"gpu.{k}", "usd_per_gpu_hour", path)
           for k, v in sorted(data.get("gpu", {}).items())}
    tiers = {}
    for k, v in sorted(data.get("tiers", {}).items()):
        if k not in PRICED_TIERS:
            raise KvsimInputError(f"expected a tier of {', '.join(PRICED_TIERS)}, got {k!r}",
                                  path, f"tiers.{k}", k)
        tiers[k] = _price(v, f"tiers.{k}", "usd_per_gb_hour", path)
    if not gpu:
        raise KvsimInputError("expected at least one [gpu.<hardware>] price", path, None, "gpu")
    return PriceTable(name, gpu, tiers, str(data.get("currency", "USD")),
                      str(data.get("description", "")), path)


def _bundled_dir():
    return resources.files("kvsim.profiles").joinpath("prices")


def list_prices() -> list[str]:
    """Names of the bundled price tables, sorted."""
    return sorted(p.name[:-5] for p in _bundled_dir().iterdir() if p.name.endswith(".toml"))


def load_prices(name_or_path: str | Path | None = None) -> PriceTable:
    """A bundled price table by name (default :data:`DEFAULT_PRICES`) or a TOML path."""
    arg = str(name_or_path or DEFAULT_PRICES)
    path = Path(arg)
    if arg.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise KvsimInputError("expected a price table TOML file (no such file)", path,
                                  None, "--prices")
        return parse_prices(path.read_text(encoding="utf-8"), path)
    if arg not in list_prices():
        raise KvsimInputError(f"unknown price table {arg!r} (bundled: "
                              f"{', '.join(list_prices())}; or pass a .toml path)", None,
                              None, "--prices")
    res = _bundled_dir().joinpath(f"{arg}.toml")
    return parse_prices(res.read_text(encoding="utf-8"), f"profiles/prices/{arg}.toml")
